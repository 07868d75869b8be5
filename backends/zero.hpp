// ZeRO stages 1-3 (DeepSpeed's partitioning) over one flat parameter space split in D shards.
#pragma once
#include <memory>

#include "backends/runtime/flat.hpp"
#include "backends/runtime/replica.hpp"

namespace gradcert {

/// A replica whose optimizer state (stage 1), gradients (stage 2) and parameters (stage 3)
/// are partitioned over the D data-parallel ranks. Each rank steps only its shard, with
/// master weights for that shard; updated shards are all-gathered into the model.
class ZeroState {
 public:
  explicit ZeroState(int stage) : stage_(stage) {}
  void setup(RankContext& ctx);
  RankUpdate run_update(RankContext& ctx, int update);
  /// The model's parameters and gradients as held, the master shard, the weight shard
  /// (stage 3), the gradient shard (stages 2-3) and the optimizer slots of the shard.
  NamedTensors state_tensors();
  /// Stages 1-2: the all-gathered full parameters every rank holds (replicas.agree); stage 3
  /// frees them after the step: none.
  NamedTensors replica_params() { return stage_ < 3 ? replica_.replica_params() : NamedTensors{}; }
  /// Checkpoints (NOTE [checkpoints]): every DP rank saves its master shard and the shard's slots.
  std::vector<StatePiece> checkpoint_state(RankContext& ctx, bool allocate);
  void after_load(RankContext& ctx);

 private:
  void gather_params(RankContext& ctx);
  void free_params();

  int stage_;
  ReplicaState replica_;
  FlatLayout layout_;
  std::unique_ptr<FlatShard> shard_;
  torch::Tensor master_;  ///< this rank's parameter shard (padded; float32 for bfloat16 runs)
  /// Stage 3: the shard in the run dtype that is all-gathered (master_ itself unless bfloat16).
  torch::Tensor weights_;
  /// Stages 2-3: this rank's reduce-scattered gradient shard, kept until the next update.
  torch::Tensor grad_shard_;
  OptimizerSlot slot_;
};

/// The backend of one ZeRO stage: zero1.cpp, zero2.cpp and zero3.cpp each make one.
class ZeroBackend : public Backend {
 public:
  explicit ZeroBackend(int stage) : stage_(stage), state_(stage) {}
  std::string name() const override { return "zero" + std::to_string(stage_); }
  void validate(const Plan& plan, int world, Mutant mutant) const override {
    if (plan.tp != 1 || plan.pp != 1) throw std::invalid_argument("backend " + name() + " needs TP = PP = 1");
    Backend::validate(plan, world, mutant);
  }
  void setup(RankContext& ctx) override { state_.setup(ctx); }
  RankUpdate run_update(RankContext& ctx, int update) override { return state_.run_update(ctx, update); }
  NamedTensors state_tensors() override { return state_.state_tensors(); }
  NamedTensors replica_params() override { return state_.replica_params(); }
  std::vector<StatePiece> checkpoint_state(RankContext& ctx, bool allocate) override {
    return state_.checkpoint_state(ctx, allocate);
  }
  void after_load(RankContext& ctx) override { state_.after_load(ctx); }

 private:
  int stage_;
  ZeroState state_;
};

}  // namespace gradcert
