// The list of built-in strategies and the mutants each can run with.
#include <algorithm>
#include <stdexcept>

#include "backends/catalog.hpp"

namespace gradcert {

std::vector<std::string> backend_names() { return {"single", "ddp", "zero1", "zero2", "zero3", "fsdp", "tp", "pp"}; }

std::vector<std::string> mutant_names(const std::string& backend) {
  // Every strategy shares the loss rule, so the normalisation bugs apply to all of them;
  // local-mean is the correct rule at D = 1 and so does not apply to single.
  std::vector<std::string> out = {"micro-mean", "stale-window-count", "double-accum-division", "pad-as-target"};
  if (backend == "single") return out;
  out.insert(out.begin(), "local-mean");
  out.push_back("sampler-pad-duplicate");
  if (backend == "ddp" || backend == "zero1" || backend == "tp" || backend == "pp") out.push_back("missing-final-sync");
  if (backend == "zero2" || backend == "zero3" || backend == "fsdp") out.push_back("shard-divide-factor");
  if (backend == "zero3" || backend == "fsdp") out.push_back("stale-gathered-params");
  if (backend == "tp") out.push_back("tp-counted-as-dp");
  return out;
}

std::unique_ptr<Backend> make_single_backend();
std::unique_ptr<Backend> make_ddp_backend();
std::unique_ptr<Backend> make_zero1_backend();
std::unique_ptr<Backend> make_zero2_backend();
std::unique_ptr<Backend> make_zero3_backend();
std::unique_ptr<Backend> make_fsdp_backend();
std::unique_ptr<Backend> make_tp_backend();
std::unique_ptr<Backend> make_pp_backend();

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "single") return make_single_backend();
  if (name == "ddp") return make_ddp_backend();
  if (name == "zero1") return make_zero1_backend();
  if (name == "zero2") return make_zero2_backend();
  if (name == "zero3") return make_zero3_backend();
  if (name == "fsdp") return make_fsdp_backend();
  if (name == "tp") return make_tp_backend();
  if (name == "pp") return make_pp_backend();
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown backend '" + name + "' (built-in: " + known + ")");
}

void Backend::validate(const Plan& plan, int world, const std::string& inject) const {
  if (plan.world() != world)
    throw std::invalid_argument("backend " + name() + ": the plan's topology needs world " +
                                std::to_string(plan.world()) + ", got " + std::to_string(world));
  if (!inject.empty()) {
    auto names = mutant_names(name());
    if (std::find(names.begin(), names.end(), inject) == names.end())
      throw std::invalid_argument("backend " + name() + " does not support --inject " + inject);
  }
}

}  // namespace gradcert
