// Shared pieces of replica-style strategies (single, ddp): a full model per rank that
// accumulates D*S/N-scaled gradients over the window's microsteps.
#pragma once
#include <map>
#include <string>

#include "backends/runtime/strategy.hpp"

namespace gradcert {

/// The ids rank `dp_rank` consumes in each microstep of window `w`, after any planted
/// sampler bug (sampler-pad-duplicate repeats leading examples to even out a partial window).
std::vector<std::vector<int64_t>> consumed_ids(const Plan& plan, const Window& w, int dp_rank, Mutant mutant);

/// The valid targets a rank counts in one collated microbatch: b.valid_targets, or under
/// the pad-as-target mutant every non-ignored label plus every pad position.
int64_t counted_targets(const Batch& b, Mutant mutant);

/// Sum-allreduce of a double (and an int64 packed beside it) over the DP group; identity at D = 1.
std::pair<double, int64_t> allreduce_sum(RankContext& ctx, double x, int64_t n);

/// One window as a DP rank sees it: what it consumes, collated, and the N it uses.
struct WindowWork {
  std::vector<std::vector<int64_t>> consumed;  ///< ids per microstep
  std::vector<Batch> batches;                  ///< one per microstep (possibly empty)
  int64_t local_targets = 0;                   ///< n_r, as counted (see counted_targets)
  int64_t window_targets = 0;                  ///< N: n_r summed over the DP group
  /// The factor on S_{r,a} for microstep a (the D*S/N rule or the planted variant).
  double scale(const RankContext& ctx, int a, int dp) const;
  /// A RankUpdate for `update` carrying what this rank consumed and the N it uses.
  RankUpdate start_update(int update) const;
};

/// Sets out.loss to the global token mean: the loss sums of the DP group over out's N.
void reduce_global_loss(RankContext& ctx, RankUpdate& out);

/// Collates the window for this rank and computes N by a sum-allreduce of local counts over
/// the DP group (every rank joins, even with no examples). `last_full_targets` carries the
/// previous full window's N for the stale-window-count mutant.
WindowWork prepare_window(RankContext& ctx, int update, int64_t& last_full_targets);

/// Averages the gradients of `params` over the DP group as one flat buffer: divide by D,
/// then SUM (Gloo has no AVG). Skipped under the missing-final-sync mutant.
void average_gradients(RankContext& ctx, const std::vector<torch::Tensor>& params);

/// Appends "param.<p>" and "grad.<p>" (when defined) for each named parameter.
void append_params_and_grads(NamedTensors& out, const std::vector<std::pair<std::string, torch::Tensor>>& params);

/// Optimizer steps for named parameters: per-parameter state; float32 master weights
/// for bfloat16 runs.
class ParamStepper {
 public:
  void step(const RankContext& ctx, int update, const std::vector<std::pair<std::string, torch::Tensor>>& params);
  /// Appends its state: "master.<p>" (bfloat16 runs), "optim.<p>.m" / ".v".
  void append_state(NamedTensors& out) const;
  /// What it steps for parameter `p` (the float32 master in bfloat16 runs, created from p if
  /// missing; else p itself) and its slot, created as the optimizer keeps it with `allocate`.
  torch::Tensor stepped(const RankContext& ctx, const std::string& name, const torch::Tensor& p);
  OptimizerSlot& slot(const RankContext& ctx, const std::string& name, const torch::Tensor& like, bool allocate);
  /// Whole parameters as StatePieces (NOTE [checkpoints]), each saved when `saves`.
  std::vector<StatePiece> state(const RankContext& ctx,
                                const std::vector<std::pair<std::string, torch::Tensor>>& params, bool saves,
                                bool allocate);
  /// bfloat16 runs: rounds the (loaded) masters into the parameters.
  void round_into(const RankContext& ctx, const std::vector<std::pair<std::string, torch::Tensor>>& params);

 private:
  std::map<std::string, OptimizerSlot> slots_;
  std::map<std::string, torch::Tensor> masters_;
};

/// A full replica: model, optimizer slots, the window's accumulation.
class ReplicaState {
 public:
  void setup(RankContext& ctx);
  /// Zeroes gradients and accumulates every microstep of `update` with the D*S/N rule
  /// (or the planted variant). Computes N by summing local valid-target counts over ranks.
  RankUpdate accumulate(RankContext& ctx, int update);
  /// Averages gradients over all ranks through ctx.pg: divide by D, then SUM (Gloo has
  /// no AVG), as one flat buffer. Also sums the loss over ranks into out.loss.
  void sync(RankContext& ctx, RankUpdate& out);
  /// One optimizer step on every parameter.
  void step(RankContext& ctx, int update);
  /// Fills out.grads / out.params_after (rank 0 only) and the global loss at world 1.
  void collect(RankContext& ctx, RankUpdate& out);

  TinyLM& model() { return model_; }
  /// Parameters and gradients as held, and the stepper's state.
  NamedTensors state_tensors();
  /// The replica's parameters by canonical name.
  NamedTensors replica_params();
  /// Checkpoints (NOTE [checkpoints]): every parameter whole; global rank 0 saves.
  std::vector<StatePiece> checkpoint_state(RankContext& ctx, bool allocate);
  void after_load(RankContext& ctx);

 private:
  TinyLM model_{nullptr};
  ParamStepper stepper_;
  int64_t last_full_window_targets_ = -1;
  TensorMap grads_before_step_;
};

/// The D*S/N rule and its planted variants: the factor that multiplies the local loss
/// sum S_{r,a} of (rank r, microstep a) before backward.
double loss_scale(Mutant mutant, int dp, int accum, int64_t window_targets, int64_t micro_targets,
                  int64_t rank_targets);

}  // namespace gradcert
