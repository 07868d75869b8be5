// Checks: pure functions of (plan, reference, artifacts) -> verdict with a figure.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "conformance/core/plan.hpp"
#include "conformance/core/memory_types.hpp"
#include "conformance/core/result.hpp"
#include "conformance/protocol/artifacts.hpp"

namespace gradcert {

/// Examples consumed per update (from ids, one record per DP rank) = B_update, or the
/// window's own size for a partial final window. Figure: largest |observed - expected|.
CheckResult check_update_size(const Plan& plan, const std::vector<BackendUpdate>& run);
/// Every example exactly once per epoch (at most once in an epoch the run does not
/// finish); TP/PP peers of one replica must report the same ids. Figure: wrong ids.
CheckResult check_sample_ledger(const Plan& plan, int64_t dataset_size, const std::vector<BackendUpdate>& run);
/// The backend's N equals the reference's recount for every window. Figure: largest |diff|.
CheckResult check_window_count(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run);
/// replicas.agree: every tensor two or more ranks report a digest of (NOTE [replica digests])
/// is the same on all of them after every update; names the first update, tensor and the
/// rank(s) that differ from the majority. Skip when no tensor is reported by two ranks.
/// A run with another number of updates than `expected_updates` fails (an update not seen).
CheckResult check_replicas_agree(const std::vector<BackendUpdate>& run, size_t expected_updates);
/// The backend's loss is the global token mean. Figure: largest relative error.
CheckResult check_global_mean_loss(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                                   double tolerance);
/// Per tensor and update: relative L2 error of the gradient. Figure: the largest.
CheckResult check_grad_parity(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                              double tolerance);
/// Per tensor and update: relative L2 error of the parameters after the step.
CheckResult check_params_parity(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                                double tolerance);
/// params.trajectory: the stack's parameters after every update against the free-running
/// reference's own trajectory (NOTE [teacher forcing]), update u held to max(tolerance,
/// factor x its trajectory floor) (NOTE [noise floor]). Figure: the update with the largest
/// error / tolerance; its tolerance is the one reported.
CheckResult check_params_trajectory(const std::vector<ReferenceUpdate>& free_running,
                                    const std::vector<BackendUpdate>& run, double tolerance, double factor);

/// Per update and per tensor of the reference: the relative L2 error of the backend's gradient
/// and of its parameters after the step (what grad.parity and params.parity take the worst
/// of). A tensor missing on the backend's side, or one that cannot be compared (shape), reads
/// infinity; updates past the shorter of the two lists are left out. Reference order
/// (by name); the report orders them as the model does.
std::vector<TensorFigure> tensor_errors(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run);

/// memory.lower_bound: measured model-state bytes (exact storage sum) hold at least the
/// estimate's model_state() and at most 2% more. Figure: (measured - estimate) / estimate.
/// Skips when either is not positive (not measured).
CheckResult check_memory_lower_bound(int64_t measured_model_state_bytes, int64_t estimate_model_state_bytes);
/// memory.budget: every phase peak <= budget_bytes. Skips when budget_bytes <= 0 (no budget)
/// or there are no peaks. Figure: the largest peak; tolerance: the budget. The detail names
/// the rank, bucket and phase of the largest peak ("rank 1, long bucket, backward: 3.20 MiB
/// > budget 2.00 MiB").
CheckResult check_memory_budget(const std::vector<PhasePeak>& peaks, double budget_bytes);

/// Per update, the stack's gradient projected on the reference's over every tensor:
/// s = <g, g_ref> / <g_ref, g_ref>. Figure: the largest |s - 1| (updates with g_ref = 0 are
/// left out). A normalisation bug is a scale; rounding noise is mostly orthogonal to g_ref.
CheckResult check_grad_scale(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                             double tolerance);

/// Every rank's reported valid_targets = the recount of the ids it consumed, and its loss_sum
/// = the reference's S_r for its DP rank (where the reference has per-rank sums), relative
/// to max(|S_r|, 1). Figure: the largest error; the detail names the rank and update.
CheckResult check_rank_sums(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                            const std::vector<int64_t>& targets_of_id, double tolerance);

/// Built-in runs: what each rank measured of its memory, and the estimate it is held to.
struct RankMemoryEvidence {
  int rank = 0;
  int64_t measured_model_state_bytes = -1;  ///< -1: not measured
  int64_t estimate_model_state_bytes = 0;
};
struct RunMemoryEvidence {
  std::vector<RankMemoryEvidence> ranks;
  std::vector<PhasePeak> peaks;  ///< every rank, bucket and phase
  double budget_bytes = 0;       ///< 0: no budget
};

/// Everything a check is a function of.
struct CheckInput {
  const Plan* plan = nullptr;
  int64_t dataset_size = 0;
  const std::vector<ReferenceUpdate>* reference = nullptr;
  /// The teacher-forced reference (NOTE [teacher forcing]): when set, the loss, gradient and
  /// single-step parameter checks compare against it; null: they compare against `reference`
  /// too. params.trajectory always holds the stack to `reference` (free-running).
  const std::vector<ReferenceUpdate>* forced = nullptr;
  /// Tolerances are max(the calibrated one, floor_factor x the reference's noise floor) where
  /// the reference measured one (NOTE [noise floor]).
  double floor_factor = 10;
  const std::vector<BackendUpdate>* run = nullptr;
  double tolerance = 0;                       ///< the parity tolerance of the run's dtype
  double scale_tolerance = 0;                 ///< grad.scale's (0: grad.scale skips)
  const RunMemoryEvidence* memory = nullptr;  ///< null: the run measured no memory (external stacks)
  /// Valid targets of each dataset example by id (the recount ranks.local_sums holds ranks to).
  const std::vector<int64_t>* targets_of_id = nullptr;
};

/// One row of the check table: its id, what it holds, when it applies, and the check.
struct CheckEntry {
  std::string id;
  std::string holds;                   ///< one line, as in docs/checks.md's check table
  bool (*applies)(const CheckInput&);  ///< false: left out of the run's report
  CheckResult (*run)(const CheckInput&);
};
/// The checks in report order. Adding a check: a function above, a row in checks.cpp, a
/// row in docs/checks.md.
const std::vector<CheckEntry>& check_table();
/// Every applicable check of the table on `input`, in report order.
std::vector<CheckResult> run_checks(const CheckInput& input);
/// The ids of the checks that apply to a run with (`with_memory`) or without memory evidence,
/// and with (harness runs) or without the dataset's per-example target counts.
std::vector<std::string> check_ids(bool with_memory, bool with_target_counts = true);

/// NOTE [non-finite values] A NaN or infinite loss, loss sum, gradient or parameter is a training
/// finding, not a malformed record: the protocol writes a non-finite loss or loss sum as the
/// string "nan", "inf" or "-inf" (JSON has no NaN), and train.finite (listed only in a run where
/// one is found, first in the report) fails naming the first: its update, the rank (a loss sum)
/// or the tensor and its element, how many there are, and whether the reference went non-finite
/// there too (the spec's own training diverges) or the stack alone did. Tensors are scanned when a
/// check's figure is non-finite (every non-finite tensor value makes its parity figure so).
std::optional<CheckResult> check_finite(const CheckInput& input, const std::vector<CheckResult>& judged);

/// Every check above, in report order (no memory evidence).
std::vector<CheckResult> run_checks(const Plan& plan, int64_t dataset_size, const std::vector<ReferenceUpdate>& ref,
                                    const std::vector<BackendUpdate>& run, double tolerance);

}  // namespace gradcert
