// Checks: pure functions of (plan, reference, artifacts) -> verdict with a figure.
#pragma once
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
/// The backend's loss is the global token mean. Figure: largest relative error.
CheckResult check_global_mean_loss(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                                   double tolerance);
/// Per tensor and update: relative L2 error of the gradient. Figure: the largest.
CheckResult check_grad_parity(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                              double tolerance);
/// Per tensor and update: relative L2 error of the parameters after the step.
CheckResult check_params_parity(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                                double tolerance);

/// memory.lower_bound: measured model-state bytes (exact storage sum) hold at least the
/// estimate's model_state() and at most 2% more. Figure: (measured - estimate) / estimate.
/// Skips when either is not positive (not measured).
CheckResult check_memory_lower_bound(int64_t measured_model_state_bytes, int64_t estimate_model_state_bytes);
/// memory.budget: every phase peak <= budget_bytes. Skips when budget_bytes <= 0 (no budget)
/// or there are no peaks. Figure: the largest peak; tolerance: the budget. The detail names
/// the rank, bucket and phase of the largest peak ("rank 1, long bucket, backward: 3.20 MiB
/// > budget 2.00 MiB").
CheckResult check_memory_budget(const std::vector<PhasePeak>& peaks, double budget_bytes);

/// Every check above, in report order.
std::vector<CheckResult> run_checks(const Plan& plan, int64_t dataset_size, const std::vector<ReferenceUpdate>& ref,
                                    const std::vector<BackendUpdate>& run, double tolerance);

}  // namespace gradcert
