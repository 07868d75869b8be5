#include "conformance/memory_profile.hpp"

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "conformance/alloc_tracker.hpp"
#include "conformance/model.hpp"

namespace gradcert {

namespace fs = std::filesystem;

int64_t distinct_storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    const auto& storage = t.storage();
    if (seen.insert(storage.unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(storage.nbytes());
  }
  return bytes;
}

namespace {

// One process's training state, as backends/strategy_common.cpp keeps it.
struct Trainer {
  TinyLM model{nullptr};
  std::map<std::string, torch::Tensor> master;  // fp32 master weights (bfloat16 runs)
  std::map<std::string, OptimizerSlot> slots;
  int64_t steps = 0;

  std::vector<torch::Tensor> state() {
    std::vector<torch::Tensor> out;
    for (auto& p : model->named_parameters()) {
      out.push_back(p.value());
      out.push_back(p.value().grad());
    }
    for (auto& [_, m] : master) out.push_back(m);
    for (auto& [_, s] : slots) out.push_back(s.m), out.push_back(s.v);
    return out;
  }
};

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "gradcert-ckpt-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("measure_phases: cannot create a temporary folder");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

PhaseProfile measure_phases(const Spec& spec, LengthBucket bucket, int warmup, int rank) {
  PhaseProfile out;
  out.bucket = bucket_name(bucket);
  out.recipe = recipe_for_run(spec.dtype, spec.optimizer);
  out.ids = bucket_ids(spec, bucket, spec.batch.micro);
  if (!install_tracking_allocator())
    throw std::runtime_error("measure_phases: LibTorch kept another CPU allocator; peaks cannot be tracked");

  const auto dtype = scalar_type(spec.dtype);
  const TensorMap initial = initial_params(spec);
  MemoryPhases phases(out.bucket, rank);
  phases.start();

  Trainer t;
  t.model = make_model(spec.model, initial, dtype);
  if (spec.dtype == DType::BFloat16)
    for (auto& p : t.model->named_parameters()) t.master[p.key()] = p.value().detach().to(torch::kFloat32);
  phases.mark("load");

  Batch batch;
  torch::Tensor loss;
  auto forward = [&] {
    if (t.steps > 0) t.model->zero_grad(/*set_to_none=*/false);
    batch = collate(spec, out.ids);
    loss = loss_sum(t.model, batch) / static_cast<double>(std::max<int64_t>(1, batch.valid_targets));
  };
  auto backward = [&] {
    loss.backward();
    loss = torch::Tensor();
  };
  auto step = [&] {
    ++t.steps;
    torch::NoGradGuard ng;
    for (auto& p : t.model->named_parameters()) {
      auto grad = p.value().grad();
      if (!grad.defined()) grad = p.value().mutable_grad() = torch::zeros_like(p.value());
      auto m = t.master.find(p.key());
      if (m == t.master.end()) {
        optimizer_step(spec.optimizer, t.steps, p.value(), grad, t.slots[p.key()]);
      } else {
        optimizer_step(spec.optimizer, t.steps, m->second, grad.to(torch::kFloat32), t.slots[p.key()]);
        p.value().copy_(m->second);
      }
    }
  };

  forward();
  phases.mark("first forward");
  backward();
  phases.mark("first backward");
  step();
  phases.mark("first optimizer step");

  {
    TempDir dir;
    const auto file = dir.path / "checkpoint.pt";
    torch::serialize::OutputArchive archive;
    for (auto& p : t.model->named_parameters()) archive.write("model." + p.key(), p.value().detach());
    for (auto& [name, m] : t.master) archive.write("master." + name, m);
    for (auto& [name, s] : t.slots) {
      if (s.m.defined()) archive.write("optim." + name + ".m", s.m);
      if (s.v.defined()) archive.write("optim." + name + ".v", s.v);
    }
    archive.write("optim.step", torch::tensor(t.steps));
    archive.save_to(file.string());
    out.checkpoint_bytes = static_cast<int64_t>(fs::file_size(file));
    phases.mark("save");
  }
  out.save_seconds = phases.phases().back().seconds;

  for (int i = 0; i < warmup; ++i) forward(), backward(), step();
  phases.start();
  forward();
  phases.mark("forward");
  backward();
  phases.mark("backward");
  step();
  phases.mark("optimizer step");

  out.padded_length = batch.input.size(1);
  out.input_tokens = batch.input_tokens;
  out.valid_targets = batch.valid_targets;
  for (const auto& p : t.model->parameters()) out.params += p.numel();
  out.model_state_bytes = distinct_storage_bytes(t.state());
  out.phases = phases.phases();
  return out;
}

}  // namespace gradcert
