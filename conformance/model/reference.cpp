#include "conformance/model/reference.hpp"

#include "conformance/core/dataset.hpp"
#include "conformance/model/model.hpp"

namespace gradcert {

std::vector<ReferenceUpdate> run_reference(const Spec& spec, const Plan& plan) {
  TinyLM model = make_model(spec.model, initial_params(spec), torch::kFloat64);
  std::map<std::string, OptimizerSlot> slots;
  std::vector<ReferenceUpdate> out;
  for (const auto& w : plan.windows) {
    ReferenceUpdate r;
    r.update = w.update;
    model->zero_grad(/*set_to_none=*/true);
    Batch batch = collate(spec, w.ids);
    if (!batch.empty()) {
      r.valid_targets = batch.labels.ne(kIgnoreIndex).sum().item<int64_t>();
      auto S = loss_sum(model, batch);
      if (r.valid_targets > 0) {
        auto L = S / static_cast<double>(r.valid_targets);
        L.backward();
        r.loss = L.item<double>();
      }
    }
    r.grads = grads_of(model, DType::Float64);
    for (auto& p : model->named_parameters()) {
      auto g = p.value().grad();
      optimizer_step(spec.optimizer, w.update + 1, p.value(), g.defined() ? g : torch::zeros_like(p.value()),
                     slots[p.key()]);
    }
    r.params_after = params_of(model, DType::Float64);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace gradcert
