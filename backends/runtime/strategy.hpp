// The narrow interface every built-in strategy implements, one file per strategy.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "conformance/protocol/artifacts.hpp"
#include "backends/runtime/mutants.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/core/topology.hpp"
#include "conformance/model/model.hpp"

namespace gradcert {

class MemoryPhases;  // backends/runtime/alloc_tracker.hpp

/// Model state as a backend holds it, by name ("param.<p>", "grad.<p>", "master.<p>",
/// "optim.<p>.m", ...; sharded strategies name shards), for memory.lower_bound and the
/// checkpoint written in the "save" phase.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// What a rank knows while it runs.
struct RankContext {
  const Spec* spec = nullptr;
  const Plan* plan = nullptr;
  /// The run's initial.safetensors, which every setup loads (NOTE [initial weights once]); empty:
  /// the weights are drawn from the spec.
  std::string initial_file;
  int rank = 0, world = 1;
  /// All ranks (null when world == 1). Collectives on it time out after spec.timeout.collective_s.
  c10::intrusive_ptr<c10d::Backend> pg;
  /// The D data-parallel peers (same TP and PP coordinates); null when D == 1. When null
  /// and D == world, pg serves (see dp_group()).
  c10::intrusive_ptr<c10d::Backend> dp_pg;
  /// The TP peers of this replica and stage; null when TP == 1.
  c10::intrusive_ptr<c10d::Backend> tp_pg;
  /// What the groups are: "gloo" or "nccl" (process_group_kind, NOTE [collectives on a device]).
  std::string process_group = "gloo";
  /// The planted bug to run with (Mutant::None for none; backends/runtime/mutants.hpp).
  Mutant mutant = Mutant::None;
  /// The worker's phase recorder while it measures memory (null otherwise), and the prefix
  /// of the phase names it records ("first " on a backend's first update).
  MemoryPhases* memory = nullptr;
  std::string phase_prefix;
  /// Closes the phase that just ran ("forward", "backward", "optimizer step"; "artifacts"
  /// for assembling the checks' full tensors, which the worker does not report). A phase
  /// may close several times per update (per microstep): the worker keeps its maximum.
  void mark(const std::string& phase) const;
  /// Seconds this update spent building the checks' full tensors; the worker subtracts
  /// them from the step time (artifacts are gathered outside the timed step).
  double untimed_seconds = 0;
  /// The optimizer's step counter at `update` (from 1): update + 1, unless a loaded
  /// checkpoint's counter says otherwise (NOTE [checkpoints]).
  int64_t step_of(int update) const { return update + 1 + step_shift; }
  int64_t step_shift = 0;
};

/// One piece of model state a rank holds, for checkpoints (NOTE [checkpoints] in
/// backends/runtime/checkpoint.cpp): where it lies in its canonical parameter, and views of
/// the backend's own tensors there, so saving reads them and loading writes into them.
struct StatePiece {
  std::string tensor;           ///< the canonical parameter name
  std::vector<int64_t> shape;   ///< its global shape
  int64_t flat_begin = -1;      ///< >= 0: the row-major range [flat_begin, flat_begin + param.numel())
  std::vector<int64_t> offset;  ///< otherwise: the box param.sizes() at these offsets
  bool saves = true;            ///< this rank writes it (one replica saves; every holder loads)
  /// What the optimizer steps (the float32 master in bfloat16 runs) and its slots (undefined
  /// where the optimizer keeps none, or not yet).
  torch::Tensor param, m, v;
};

/// Adds the wall time of its scope to ctx.untimed_seconds.
class UntimedScope {
 public:
  explicit UntimedScope(RankContext& ctx) : ctx_(ctx), t0_(std::chrono::steady_clock::now()) {}
  ~UntimedScope() {
    ctx_.untimed_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  RankContext& ctx_;
  std::chrono::steady_clock::time_point t0_;
};

/// The data-parallel group of a rank (null when D == 1).
c10::intrusive_ptr<c10d::Backend> dp_group(const RankContext& ctx);

/// Creates ctx.pg, ctx.dp_pg and ctx.tp_pg over one c10d store (ctx.process_group's kind, with
/// the spec's collective timeout). Every rank calls it; each joins only its own groups.
/// Defined in backends/runtime/comm.cpp.
void make_process_groups(RankContext& ctx, const c10::intrusive_ptr<c10d::Store>& store);

/// What one rank produced for one update. Full canonical tensors are needed on rank 0 only.
struct RankUpdate {
  RankUpdateRecord record;
  double loss = 0;            ///< the backend's global loss
  int64_t valid_targets = 0;  ///< the N it used
  TensorMap grads, params_after;
  /// Shard artifacts (NOTE [shard artifacts]): when set, every rank writes these pieces (its
  /// own, possibly none) instead of rank 0 writing full `grads` / `params_after`.
  bool sharded = false;
  std::vector<ShardPiece> grad_shards, param_shards;
};

/// A training strategy. Defaults fail with a named message, so a backend overrides only
/// what it supports.
class Backend {
 public:
  virtual ~Backend() = default;
  /// The name used on the command line and in reports.
  virtual std::string name() const = 0;
  /// Throws std::invalid_argument when this strategy cannot run the topology or mutant.
  virtual void validate(const Plan& plan, int world, Mutant mutant) const;
  /// Throws std::invalid_argument naming the model.* field this strategy cannot split.
  virtual void validate_model(const ModelSpec&, const Plan&) const {}
  /// Builds the model (from initial_params) and optimizer state on this rank.
  virtual void setup(RankContext& ctx) = 0;
  /// Runs one optimizer update (all microsteps of window `update`) on this rank.
  virtual RankUpdate run_update(RankContext& ctx, int update) = 0;
  /// Every tensor of model state this rank holds between updates: parameters as held
  /// (full, sharded, or a stage's), gradients, master weights or shards, optimizer slots
  /// (memory.lower_bound). The default throws naming the strategy: every strategy reports it.
  virtual NamedTensors state_tensors();
  /// The canonical parameters this rank holds whole after the step (a DDP replica: all of
  /// them), digested into rank<g>.json for replicas.agree (NOTE [replica digests]); empty
  /// where this rank holds none whole. Not called for a strategy whose StrategyInfo declares
  /// no_replica_digests (NOTE [strategy descriptor]); the default throws naming the strategy.
  virtual NamedTensors replica_params();
  /// The state this rank holds, as pieces of canonical tensors (NOTE [checkpoints]). With
  /// `allocate_slots`, optimizer slots the optimizer would keep are created (zeros) first, so
  /// a load can fill them. The default throws: the backend cannot save or load.
  virtual std::vector<StatePiece> checkpoint_state(RankContext& ctx, bool allocate_slots);
  /// After a load wrote into checkpoint_state's views: rebuild what derives from them (the
  /// compute weights from masters, gathered parameters). Every rank calls it.
  virtual void after_load(RankContext&) {}
};

}  // namespace gradcert
