// The audit's comparison of two runs on one plan: pure functions of their artifacts. Torch-free.
#pragma once
#include <string>
#include <vector>

#include "conformance/core/audit_result.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/protocol/artifacts.hpp"

namespace gradcert {

/// One side's artifacts as the audit reads them: the updates and the manifest's extras.
struct SideData {
  std::vector<BackendUpdate> updates;
  AuditSideFacts facts;
};
/// Reads a side's run folder strictly (names and shapes from its own u0.params file; the
/// harness already held them to the reference's). Throws ArtifactError naming the file.
SideData read_side(const std::string& dir, const Plan& plan, int world, DType dtype);

/// Examples consumed in one update: one record per DP rank (TP/PP peers see the same ids).
int64_t consumed_examples(const BackendUpdate& u);

/// Memory side by side ("memory before / after: peak (worst rank) ..."), or why it is not shown.
std::string memory_text(const AuditSideFacts& before, const AuditSideFacts& after);

/// The two sides per update (examples, N, loss, step time) and per tensor (gradients and
/// parameters after the step, after vs before), and every difference beyond `tolerance`
/// (relative), each a sentence naming the update and tensor.
struct RunComparison {
  std::vector<AuditUpdate> updates;
  std::vector<AuditTensorDiff> diffs;
  std::vector<std::string> differences;
};
RunComparison compare_runs(const Plan& plan, const std::vector<BackendUpdate>& before,
                           const std::vector<BackendUpdate>& after, double tolerance);

}  // namespace gradcert
