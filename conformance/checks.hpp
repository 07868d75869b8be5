// Checks: pure functions of (plan, reference, artifacts) -> verdict with a figure.
#pragma once
#include <string>
#include <vector>

#include "conformance/plan.hpp"
#include "conformance/reference.hpp"
#include "conformance/tensors.hpp"

namespace gradcert {

enum class Verdict { Pass, Fail, Skip };
/// "pass" | "fail" | "skip".
std::string verdict_name(Verdict v);

/// One check's outcome: the worst figure seen, the tolerance it was held to, and a
/// one-line detail that says where (update, rank, tensor) the figure came from.
struct CheckResult {
  std::string id;
  Verdict verdict = Verdict::Skip;
  double figure = 0;
  double tolerance = 0;
  std::string detail;
};

/// What one rank reported for one update.
struct RankRecord {
  int rank = 0;     ///< global rank
  int dp_rank = 0;  ///< its data-parallel rank
  std::vector<std::vector<int64_t>> consumed;  ///< ids per microstep
};

/// What a backend produced for one update (full canonical tensors).
struct BackendUpdate {
  int update = 0;
  double loss = 0;
  int64_t valid_targets = 0;  ///< the N the backend used
  std::vector<RankRecord> ranks;
  TensorMap grads;
  TensorMap params_after;
  double step_seconds = 0;
};

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

/// Every check above, in report order.
std::vector<CheckResult> run_checks(const Plan& plan, int64_t dataset_size, const std::vector<ReferenceUpdate>& ref,
                                    const std::vector<BackendUpdate>& run, double tolerance);

/// Relative L2 error ||a - b|| / ||b|| (||a - b|| when b is zero) and max |a - b|.
/// Throws ArtifactError naming the tensor when the shapes differ.
struct TensorError {
  double relative = 0;
  double max_abs = 0;
};
TensorError compare_tensors(const HostTensor& observed, const HostTensor& expected);

}  // namespace gradcert
