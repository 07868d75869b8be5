#include "backends/worker.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <thread>
#include <unistd.h>

#include "backends/backend.hpp"
#include "backends/launcher.hpp"
#include "conformance/alloc_tracker.hpp"
#include "conformance/dataset.hpp"
#include "conformance/memory_profile.hpp"

namespace gradcert {

namespace {

void maybe_fault(int rank, int update) {
  const char* f = std::getenv("GRADCERT_FAULT");
  if (!f) return;
  char kind[16] = {0};
  int r = -1, u = -1;
  if (std::sscanf(f, "%15[a-z]:%d:%d", kind, &r, &u) != 3 || r != rank || u != update) return;
  const std::string k = kind;
  std::cerr << "gradcert rank " << rank << ": GRADCERT_FAULT " << f << " fired" << std::endl;
  if (k == "kill") ::raise(SIGKILL);
  if (k == "exit") std::_Exit(3);
  if (k == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// GRADCERT_FAULT="truncate:R:U": rank R cuts the last 8 bytes off u<U>.grads.safetensors.
void maybe_corrupt(const std::string& dir, int rank, int update) {
  const char* f = std::getenv("GRADCERT_FAULT");
  int r = -1, u = -1;
  if (!f || std::sscanf(f, "truncate:%d:%d", &r, &u) != 2 || r != rank || u != update) return;
  const std::string path = dir + "/u" + std::to_string(update) + ".grads.safetensors";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 8);
}

// Every rank is a client of the store the harness serves (NOTE [store] in harness.cpp).
c10::intrusive_ptr<c10d::Store> make_store(int world, int port, double timeout_s) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = false;
  opts.numWorkers = world;
  opts.waitWorkers = false;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
}

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
void measure_buckets(RankContext& ctx, const WorkerArgs& args, RankMemory& out) {
  const Plan* planned = ctx.plan;
  for (auto bucket : {LengthBucket::Short, LengthBucket::Typical, LengthBucket::Long}) {
    const Plan probe = bucket_plan(*ctx.spec, *planned, bucket, 2);
    ctx.plan = &probe;
    MemoryPhases phases(bucket_name(bucket), ctx.rank);
    phases.start();
    auto backend = make_backend(args.backend);
    backend->setup(ctx);
    phases.mark("load");
    ctx.memory = &phases;
    ctx.phase_prefix = "first ";
    backend->run_update(ctx, 0);
    ctx.memory = nullptr;

    phases.start();
    {
      const std::string file = args.run_dir + "/rank" + std::to_string(ctx.rank) + ".checkpoint.pt";
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

}  // namespace

int worker_main(const WorkerArgs& args) {
  int rank = -1;
  try {
    auto [r, world] = rank_and_world_from_env();
    rank = r;
    torch::set_num_threads(1);
    install_tracking_allocator();  // before any tensor, so every storage is counted
    const Spec spec = load_spec(args.run_dir + "/spec.json");
    const Plan plan = make_plan(spec);
    auto backend = make_backend(args.backend);
    backend->validate(plan, world, args.inject);
    backend->validate_model(spec.model, plan);

    RankContext ctx;
    ctx.spec = &spec;
    ctx.plan = &plan;
    ctx.rank = rank;
    ctx.world = world;
    ctx.inject = args.inject;
    if (world > 1) make_process_groups(ctx, make_store(world, args.store_port, spec.timeout.collective_s));
    backend->setup(ctx);

    std::vector<RankUpdateRecord> records;
    std::vector<ManifestUpdate> manifest;
    for (const auto& w : plan.windows) {
      maybe_fault(rank, w.update);
      ctx.untimed_seconds = 0;
      const auto t0 = std::chrono::steady_clock::now();
      RankUpdate u = backend->run_update(ctx, w.update);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - ctx.untimed_seconds;
      records.push_back(u.record);
      if (rank == 0) {
        write_update_tensors(args.run_dir, w.update, u.grads, u.params_after);
        manifest.push_back({w.update, u.loss, u.valid_targets, secs});
      }
      maybe_corrupt(args.run_dir, rank, w.update);
    }
    write_rank_record(args.run_dir, rank, plan.dp_rank_of(rank), records);
    if (rank == 0) write_manifest(args.run_dir, args.backend, world, manifest);

    RankMemory memory;
    memory.rank = rank;
    {
      std::vector<torch::Tensor> state;
      for (const auto& [name, t] : backend->state_tensors()) state.push_back(t);
      memory.model_state_tensors = static_cast<int64_t>(state.size());
      if (!state.empty()) memory.model_state_bytes = distinct_storage_bytes(state);
    }
    backend.reset();  // the planned run's state is freed before the probes load theirs
    measure_buckets(ctx, args, memory);
    memory.process_high_water_bytes = process_high_water_bytes();
    write_rank_memory(args.run_dir, memory);
    if (ctx.pg) {
      // Every rank's files are written before any rank leaves.
      ctx.pg->barrier()->wait();
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gradcert rank " << rank << ": error: " << e.what() << std::endl;
    return 2;
  }
}

}  // namespace gradcert
