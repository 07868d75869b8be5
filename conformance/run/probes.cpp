#include "conformance/run/probes.hpp"

#include <algorithm>
#include <filesystem>

#include "backends/catalog.hpp"
#include "backends/runtime/alloc_tracker.hpp"
#include "conformance/core/dataset.hpp"
#include "conformance/memory/memory.hpp"

namespace gradcert {

namespace {

// A plan whose windows all hold examples of one length bucket: every DP rank and microstep
// gets the spec's B_micro examples closest to the bucket's length (bucket_ids).
Plan bucket_plan(const Spec& spec, const Plan& plan, LengthBucket bucket, int updates) {
  Plan probe = plan;
  probe.windows.clear();
  Microbatch mb;
  mb.ids = bucket_ids(spec, bucket, spec.batch.micro);
  for (auto id : mb.ids) {
    const Sample s = make_sample(spec, id);
    mb.input_tokens += static_cast<int64_t>(s.tokens.size());
    mb.valid_targets += s.valid_targets();
  }
  for (int u = 0; u < updates; ++u) {
    Window w;
    w.update = u;
    w.slots.assign(plan.dp, std::vector<Microbatch>(plan.accum, mb));
    for (int r = 0; r < plan.dp; ++r)
      for (int a = 0; a < plan.accum; ++a) {
        w.ids.insert(w.ids.end(), mb.ids.begin(), mb.ids.end());
        w.valid_targets += mb.valid_targets;
      }
    probe.windows.push_back(w);
  }
  return probe;
}

// Phases recorded several times in one bucket (per microstep) keep their largest peak;
// "artifacts" (assembling the checks' full tensors) is not training and is left out.
std::vector<PhasePeak> merge_phases(const std::vector<PhasePeak>& recorded) {
  std::vector<PhasePeak> out;
  for (const auto& p : recorded) {
    if (p.phase == "artifacts" || p.phase == "first artifacts") continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const PhasePeak& q) { return q.phase == p.phase; });
    if (it == out.end()) {
      out.push_back(p);
      continue;
    }
    it->seconds += p.seconds;
    it->current_bytes = p.current_bytes;
    it->peak_bytes = std::max(it->peak_bytes, p.peak_bytes);
    it->process_high_water_bytes = std::max(it->process_high_water_bytes, p.process_high_water_bytes);
  }
  return out;
}

// NOTE [memory probes] After the planned updates (whose artifacts the checks read), each
// rank measures memory per length bucket with a fresh backend on a plan of bucket
// examples: load (setup), the first update (first forward / backward / optimizer step:
// the step allocates the optimizer state), save (a real checkpoint of parameters, master
// weights and optimizer state written to the run folder, then removed: the saving pause),
// and one more update after that warmup (forward, backward, optimizer step). Every rank
// runs the same sequence, so collectives stay matched; no artifacts are written for it.
}  // namespace

void measure_buckets(RankContext& ctx, const std::string& backend_name, const std::string& scratch_dir,
                     RankMemory& out) {
  const Plan* planned = ctx.plan;
  for (auto bucket : {LengthBucket::Short, LengthBucket::Typical, LengthBucket::Long}) {
    const Plan probe = bucket_plan(*ctx.spec, *planned, bucket, 2);
    ctx.plan = &probe;
    MemoryPhases phases(bucket_name(bucket), ctx.rank, compute_device().is_cuda() ? compute_device().index() : -1);
    phases.start();
    auto backend = make_backend(backend_name);
    backend->setup(ctx);
    phases.mark("load");
    ctx.memory = &phases;
    ctx.phase_prefix = "first ";
    backend->run_update(ctx, 0);
    ctx.memory = nullptr;

    phases.start();
    {
      const std::string file = scratch_dir + "/rank" + std::to_string(ctx.rank) + ".checkpoint.pt";
      torch::serialize::OutputArchive archive;
      for (const auto& [name, t] : backend->state_tensors())
        if (name.rfind("grad.", 0) != 0) archive.write(name, t.detach());
      archive.save_to(file);
      out.checkpoint_bytes = static_cast<int64_t>(std::filesystem::file_size(file));
      std::filesystem::remove(file);
    }
    phases.mark("save");

    phases.start();
    ctx.memory = &phases;
    ctx.phase_prefix = "";
    backend->run_update(ctx, 1);
    ctx.memory = nullptr;
    for (const auto& p : merge_phases(phases.phases())) out.peaks.push_back(p);
  }
  ctx.plan = planned;
}

void measure_model_state(Backend& backend, RankMemory& out) {
  std::vector<torch::Tensor> state;
  for (const auto& [name, t] : backend.state_tensors()) state.push_back(t);
  out.model_state_tensors = static_cast<int64_t>(state.size());
  if (!state.empty()) out.model_state_bytes = distinct_storage_bytes(state);
}

}  // namespace gradcert
