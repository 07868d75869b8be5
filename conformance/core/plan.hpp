// The plan: which examples go to which (update, DP rank, microstep), and N per window.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/spec.hpp"

namespace gradcert {

/// The examples one DP rank consumes in one microstep.
struct Microbatch {
  std::vector<int64_t> ids;
  int64_t input_tokens = 0;   ///< non-pad input tokens
  int64_t valid_targets = 0;  ///< n_{r,a}
};

/// One accumulation window = one optimizer update.
struct Window {
  int update = 0;  ///< global update index
  int epoch = 0;
  int index_in_epoch = 0;
  bool partial = false;      ///< fewer examples than B_update (the final window of an epoch)
  std::vector<int64_t> ids;  ///< every example of the window, in consumption order
  /// slots[r][a]: DP rank r, microstep a. Always D x A, possibly with empty microbatches.
  std::vector<std::vector<Microbatch>> slots;
  int64_t valid_targets = 0;  ///< N, recounted for this window (partial ones included)
};

/// A pure, deterministic function of the spec (its topology included).
struct Plan {
  int dp = 1, tp = 1, pp = 1;
  int micro = 1, accum = 1;
  int64_t update_batch = 0;     ///< B_micro x A x D
  int windows_per_epoch = 0;    ///< ceil(dataset / B_update): the last may be partial
  std::vector<Window> windows;  ///< one per update

  int world() const { return dp * tp * pp; }
  /// The DP rank of a global rank. Global rank = dp_rank x (tp x pp) + pp_rank x tp + tp_rank,
  /// so TP and PP peers of one replica see the same examples.
  int dp_rank_of(int global_rank) const { return global_rank / (tp * pp); }
};

/// Data-parallel degree D = world / (TP x PP). Throws SpecError naming topology.* if the
/// world is not divisible.
int data_parallel_degree(int world, int tp, int pp);
/// Examples per update without packing: B_micro x A x D (TP and PP never multiply it).
int64_t update_batch_size(int micro, int accum, int dp);

/// Builds the plan for spec.topology.
Plan make_plan(const Spec& spec);

/// A resumed run's second leg (NOTE [resume] in conformance/run/harness.cpp): the spec at
/// resume.world (TP and PP kept) with a batch split that keeps B_update (resume.micro /
/// resume.accum, or derived: the micro batch kept if it divides, else the accumulation steps).
/// Throws SpecError naming resume.* when no split keeps B_update. Without resume: `spec`.
Spec second_leg_spec(const Spec& spec);
/// The windows a resumed run trains, from the two legs' plans (make_plan(spec),
/// make_plan(second_leg_spec(spec))): the first leg's plan up to resume.at, the second leg's
/// after it (the same examples per window; their split over ranks may differ). The plan-level
/// topology is the first leg's.
Plan resumed_plan(const Spec& spec, const Plan& first, const Plan& second);

/// Human-readable plan: per update, per rank, per microstep: ids, tokens, valid targets, N.
std::string plan_to_text(const Plan& plan);
/// The plan as JSON (the external-backend protocol's plan section).
std::string plan_to_json(const Plan& plan, const Spec& spec);

}  // namespace gradcert
