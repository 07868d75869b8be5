#include "conformance/run/worker.hpp"

#include "conformance/protocol/variables.hpp"

#include "backends/catalog.hpp"
#include "backends/runtime/checkpoint.hpp"
#include "backends/runtime/comm.hpp"
#include "conformance/memory/memory.hpp"
#include "conformance/protocol/inputs.hpp"
#include "conformance/run/probes.hpp"

#include "conformance/run/rank_store.hpp"

#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>

#include <algorithm>
#include <optional>
#include <chrono>
#include <cstdio>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <limits>
#include <thread>
#include <unistd.h>

#include "backends/runtime/strategy.hpp"
#include "conformance/launch/launcher.hpp"
#include "conformance/launch/zygote.hpp"
#include "backends/runtime/alloc_tracker.hpp"
#include "conformance/core/dataset.hpp"

namespace gradcert {

namespace {

// The digest of NOTE [replica digests]: FNV-1a (64 bit) over the tensor's dtype, shape and exact bytes.
// Only compared between ranks of one run (the same code on every rank), never across
// implementations, so any exact digest serves; a different value is a different tensor.
std::string tensor_digest(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().contiguous().cpu();
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  const auto dtype = static_cast<int>(c.scalar_type());
  mix(reinterpret_cast<const unsigned char*>(&dtype), sizeof dtype);
  for (int64_t d : c.sizes()) mix(reinterpret_cast<const unsigned char*>(&d), sizeof d);
  mix(static_cast<const unsigned char*>(c.data_ptr()), c.numel() * c.element_size());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void maybe_fault(int rank, int update) {
  const char* f = std::getenv(vars::kFault);
  if (!f) return;
  char kind[16] = {0};
  int r = -1, u = -1;
  if (std::sscanf(f, "%15[a-z]:%d:%d", kind, &r, &u) != 3 || r != rank || u != update) return;
  const std::string k = kind;
  std::cerr << "gradcert rank " << rank << ": GRADCERT_FAULT " << f << " fired" << std::endl;
  if (k == "kill") ::raise(SIGKILL);
  if (k == "exit") std::_Exit(3);
  if (k == "leave") std::_Exit(0);  // leaves its peers in the next collective
  if (k == "stop") ::raise(SIGSTOP);
  if (k == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// GRADCERT_FAULT="truncate:R:U": rank R cuts the last 8 bytes off u<U>.grads.safetensors (its
// own shard file in a sharded run).
void maybe_corrupt(const std::string& dir, int rank, int update, bool sharded) {
  const char* f = std::getenv(vars::kFault);
  int r = -1, u = -1;
  if (!f || std::sscanf(f, "truncate:%d:%d", &r, &u) != 2 || r != rank || u != update) return;
  const std::string path =
      dir + "/" + (sharded ? shard_file(update, rank, "grads") : "u" + std::to_string(update) + ".grads.safetensors");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 8);
}

// GRADCERT_FAULT="nanloss:R:U": rank R reports a NaN loss sum for update U (and, rank 0, a NaN
// loss); "nangrad:R:U": rank R's gradient of update U gets a NaN in the last element of its last
// tensor (rank 0 of an unsharded run writes it): the non-finite findings (NOTE [non-finite values]).
void maybe_poison(RankUpdate& u, int rank, int update) {
  const char* f = std::getenv(vars::kFault);
  char kind[16] = {0};
  int r = -1, at = -1;
  if (!f || std::sscanf(f, "%15[a-z]:%d:%d", kind, &r, &at) != 3 || r != rank || at != update) return;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (std::string(kind) == "nanloss") {
    u.record.loss_sum = nan;
    if (rank == 0) u.loss = nan;
  } else if (std::string(kind) == "nangrad" && !u.grads.empty()) {
    HostTensor& t = u.grads.rbegin()->second;
    t.hold();
    if (!t.held.empty()) t.held.back() = nan;
  }
}

// The windows a resumed leg consumes from update `first` on: the plan's, from the sampler
// position the checkpoint saved (`next`, a window index; `next` = first unless a planted
// sampler bug moved it), renumbered as updates first, first + 1, ... A position past the
// plan's end takes the windows of later epochs from a longer plan of the same spec.
Plan resumed_sampler(const Spec& spec, const Plan& plan, int first, int next) {
  if (next == first) return plan;
  Spec longer = spec;
  longer.updates = next + static_cast<int>(plan.windows.size()) - first;
  const Plan source = make_plan(longer);
  Plan out = plan;
  for (size_t u = static_cast<size_t>(first); u < out.windows.size(); ++u) {
    out.windows[u] = source.windows.at(static_cast<size_t>(next) + u - static_cast<size_t>(first));
    out.windows[u].update = static_cast<int>(u);
  }
  return out;
}

// A built-in rank on `--device cuda` (NOTE [compute device]): its GPU is cuda:<rank mod GPUs>;
// TF32 (cuBLAS and cuDNN) as the spec says, off by default; NCCL with a GPU per rank, else Gloo
// (NOTE [collectives on a device]).
void place_rank(const Spec& spec, RankContext& ctx) {
  if (spec.device != "cuda") return;
  const int gpus = static_cast<int>(at::accelerator::deviceCount());
  if (gpus < 1)
    throw std::runtime_error("device cuda: rank " + std::to_string(ctx.rank) +
                             " sees no CUDA device (CUDA_VISIBLE_DEVICES?)");
  const int index = ctx.rank % gpus;
  at::accelerator::setDeviceIndex(static_cast<c10::DeviceIndex>(index));
  set_compute_device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index)));
  at::globalContext().setAllowTF32CuBLAS(spec.tf32);
  at::globalContext().setAllowTF32CuDNN(spec.tf32);
  ctx.process_group = process_group_kind(true, ctx.world, gpus);
}

// NOTE [step time on a device] A step's seconds: the host clock on the CPU; on a GPU, CUDA events
// recorded on the rank's current stream before and after the update (the end event waited
// for), so the time covers the kernels the host only queued. Both subtract the untimed
// artifact assembly (host clock; its copies to the host synchronise the device).
class StepClock {
 public:
  StepClock() {
    if (!compute_device().is_cuda()) return;
    begin_.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    end_.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  }
  void start() {
    t0_ = std::chrono::steady_clock::now();
    if (begin_) begin_->record(at::accelerator::getCurrentStream(compute_device().index()));
  }
  double seconds(double untimed) {
    if (!end_) return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count() - untimed;
    end_->record(at::accelerator::getCurrentStream(compute_device().index()));
    end_->synchronize();
    return begin_->elapsedTime(*end_) / 1000.0 - untimed;
  }

 private:
  std::optional<c10::Event> begin_, end_;
  std::chrono::steady_clock::time_point t0_;
};

// The rank's context: the spec and plan, its initial weights, its device and (world > 1) its
// process groups through the harness's store.
void open_context(const WorkerArgs& args, const Spec& spec, const Plan& plan, int rank, int world, RankContext& ctx) {
  ctx.spec = &spec;
  ctx.plan = &plan;
  // The harness wrote it (NOTE [initial weights once]); a worker started without one draws.
  if (std::filesystem::is_regular_file(args.run_dir + "/initial.safetensors"))
    ctx.initial_file = args.run_dir + "/initial.safetensors";
  ctx.rank = rank;
  ctx.world = world;
  ctx.mutant = parse_mutant(args.inject);
  place_rank(spec, ctx);
  if (world > 1) {  // every rank is a client of the store the harness serves (NOTE [store] in harness.cpp)
    if (args.store.empty())
      throw std::invalid_argument("worker: --store is required when the world has more than one rank");
    make_process_groups(ctx, connect_rank_store(args.store, std::chrono::milliseconds(static_cast<int64_t>(
                                                                spec.timeout.collective_s * 1000))));
  }
}

// A resumed run's second leg (NOTE [resume] in harness.cpp, NOTE [checkpoints]): loads the
// checkpoint, points ctx at the fast-forwarded sampler and returns the first update to run.
int resume_leg(const WorkerArgs& args, const Spec& spec, const Plan& plan, RankContext& ctx, Backend& backend,
               const std::string& nonce, Plan& sampler) {
  const int end = static_cast<int>(plan.windows.size());
  const CheckpointRecord cp = load_checkpoint(ctx, backend, args.resume_from, nonce);
  const int first = cp.updates_done;
  if (first < 1 || first >= end)
    throw std::invalid_argument(args.resume_from + "/checkpoint.json: updates_done " + std::to_string(first) +
                                " is outside the plan's 1.." + std::to_string(end - 1));
  ctx.step_shift = cp.optimizer_step - cp.updates_done;
  int next = cp.next_epoch * plan.windows_per_epoch + cp.next_index_in_epoch;
  const int epoch_start = plan.windows[first].epoch * plan.windows_per_epoch;
  // The planted load bugs: the step counter not restored; the sampler not fast-forwarded
  // (its epoch starts over) or moved on to the next epoch.
  if (ctx.mutant == Mutant::ResumeStepReset) ctx.step_shift = -cp.updates_done;
  if (ctx.mutant == Mutant::ResumeSamplerRestart) next = epoch_start;
  if (ctx.mutant == Mutant::ResumeSamplerSkip) next = epoch_start + plan.windows_per_epoch;
  sampler = resumed_sampler(spec, plan, first, next);
  ctx.plan = &sampler;
  return first;
}

// What the rank's updates leave for its record and rank 0's manifest.
struct UpdatesRun {
  std::vector<RankUpdateRecord> records;
  std::vector<ManifestUpdate> manifest;
  bool sharded = false;
};

// Updates [first, end) of the sampler's windows, each timed and its artifacts written.
UpdatesRun run_updates(const WorkerArgs& args, RankContext& ctx, Backend& backend, const Plan& sampler, int first,
                       int end) {
  UpdatesRun out;
  StepClock clock;
  for (int update = first; update < end; ++update) {
    const Window& w = sampler.windows[update];
    maybe_fault(ctx.rank, w.update);
    ctx.untimed_seconds = 0;
    clock.start();
    RankUpdate u = backend.run_update(ctx, w.update);
    const double secs = clock.seconds(ctx.untimed_seconds);
    maybe_poison(u, ctx.rank, w.update);
    {
      UntimedScope untimed(ctx);  // NOTE [replica digests]: outside the timed step
      if (strategy_info(args.backend).no_replica_digests.empty())
        for (auto& [name, t] : backend.replica_params()) u.record.replicas[name] = tensor_digest(t);
    }
    out.records.push_back(u.record);
    out.sharded = u.sharded;
    // A sharded strategy: every rank writes what it holds, in parallel (NOTE [shard artifacts]).
    if (u.sharded) write_rank_shards(args.run_dir, w.update, ctx.rank, u.grad_shards, u.param_shards);
    if (ctx.rank == 0) {
      if (!u.sharded) write_update_tensors(args.run_dir, w.update, u.grads, u.params_after);
      out.manifest.push_back({w.update, u.loss, u.valid_targets, secs});
    }
    maybe_corrupt(args.run_dir, ctx.rank, w.update, u.sharded);
  }
  return out;
}

// A first leg's checkpoint after update save_at, with the save's pause and peak on this rank
// (NOTE [resume]): the tracked storage it allocates plus the host copies of its pieces.
void save_leg(const WorkerArgs& args, const Plan& plan, RankContext& ctx, Backend& backend, const std::string& nonce) {
  CheckpointRecord rec;
  rec.backend = args.backend;
  rec.world = ctx.world;
  rec.updates_done = args.save_at;
  rec.optimizer_step = args.save_at;
  rec.next_epoch = plan.windows[args.save_at].epoch;
  rec.next_index_in_epoch = plan.windows[args.save_at].index_in_epoch;
  rec.nonce = nonce;
  MemoryPhases phases("resume", ctx.rank, compute_device().is_cuda() ? compute_device().index() : -1);
  phases.start();
  const int64_t host = save_checkpoint(ctx, backend, args.run_dir + "/" + kCheckpointDir, rec);
  phases.mark("checkpoint save");
  RankMemory saved;
  saved.rank = ctx.rank;
  saved.peaks = phases.phases();
  for (auto& p : saved.peaks) p.peak_bytes += host;
  std::filesystem::create_directories(args.run_dir + "/leg1.memory");
  write_rank_memory(args.run_dir + "/leg1.memory", saved);
}

}  // namespace

int worker_main(const WorkerArgs& args) {
  int rank = -1;
  try {
    auto [r, world] = rank_and_world_from_env();
    rank = r;
    torch::set_num_threads(1);
    // A write to a dead peer's socket is an error to report, not a death by SIGPIPE that the
    // launcher would blame on this (healthy) rank (NOTE [blame] in the launcher).
    ::signal(SIGPIPE, SIG_IGN);
    install_tracking_allocator();  // before any tensor, so every storage is counted
    const Spec spec = load_spec(args.spec_file.empty() ? args.run_dir + "/spec.json" : args.spec_file);
    // Built-in ranks consume plan.json as any stack does (backends/PROTOCOL.md), never a
    // plan of their own: the harness wrote it from the same spec.
    const Plan plan = read_plan_file(args.plan_file.empty() ? args.run_dir + "/plan.json" : args.plan_file);
    auto backend = make_backend(args.backend);
    backend->validate(plan, world, parse_mutant(args.inject));
    backend->validate_model(spec.model, plan);

    RankContext ctx;
    open_context(args, spec, plan, rank, world, ctx);
    backend->setup(ctx);
    const char* env_nonce = std::getenv(vars::kRunNonce);  // NOTE [run nonce]
    const std::string nonce = env_nonce ? env_nonce : "";
    Plan sampler = plan;
    const int first = args.resume_from.empty() ? 0 : resume_leg(args, spec, plan, ctx, *backend, nonce, sampler);
    const int end = args.save_at > 0 ? args.save_at : static_cast<int>(plan.windows.size());
    const UpdatesRun run = run_updates(args, ctx, *backend, sampler, first, end);
    if (args.save_at > 0) save_leg(args, plan, ctx, *backend, nonce);
    // The harness gives every rank this run's nonce; the files echo it (NOTE [run nonce]).
    write_rank_record(args.run_dir, rank, plan.dp_rank_of(rank), run.records, nonce);
    if (rank == 0) write_manifest(args.run_dir, args.backend, world, run.manifest, nonce, run.sharded);

    RankMemory memory;
    memory.rank = rank;
    measure_model_state(*backend, memory);
    backend.reset();  // the planned run's state is freed before the probes load theirs
    // NOTE [no probes in mutant runs] The per-bucket probes (6 more updates, 3 fresh backends
    // and 3 checkpoints, 35-48% of a run's wall at 1e7 parameters) measure what the correct
    // backend of this spec and strategy holds at its peaks; a planted bug changes what is
    // computed, and certify runs the correct backend of the same spec beside it. So a mutant
    // run measures its model state (memory.lower_bound) but no peaks (memory.budget skips).
    // A first leg measures nothing: the second measures the run's memory (NOTE [resume]).
    if (args.save_at > 0) {
      if (ctx.pg) ctx.pg->barrier()->wait();
      exit_now(0);  // below
    }
    if (ctx.mutant == Mutant::None) measure_buckets(ctx, args.backend, args.run_dir, memory);
    memory.process_high_water_bytes = process_high_water_bytes();
    write_rank_memory(args.run_dir, memory);
    if (ctx.pg) {
      // Every rank's files are written before any rank leaves.
      ctx.pg->barrier()->wait();
    }
    // Done: every file is written and every rank has passed the barrier, so the process ends
    // here, without tearing down its process group and backends (20 ms of a 0.3 s run).
    exit_now(0);
  } catch (const std::exception& e) {
    std::cerr << "gradcert rank " << rank << ": error: " << e.what() << std::endl;
    return 2;
  }
}

}  // namespace gradcert
