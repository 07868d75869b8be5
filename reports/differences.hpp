// The audit's differences with a category each: which side, check or update a sentence of
// AuditReport::differences is about. The JUnit writer files each difference under its
// category (one testcase per difference). Internal to reports/.
#pragma once
#include <string>
#include <vector>

#include "conformance/core/audit_result.hpp"

namespace gradcert::reports {

enum class DifferenceKind {
  RunFailed,    ///< a side's run failed (conformance/audit/audit.cpp)
  CheckFailed,  ///< a side failed a check against the reference (audit.cpp)
  UpdateSize,   ///< B_update differs in an update (conformance/audit/compare.cpp)
  WindowCount,  ///< N differs in an update (compare.cpp)
  Loss,         ///< the loss differs in an update (compare.cpp)
  Tensors,      ///< a tensor is missing on one side, or cannot be compared, in an update (compare.cpp)
  Grads,        ///< gradients differ beyond the tolerance, worst over updates and tensors (compare.cpp)
  Params,       ///< parameters after the step differ beyond the tolerance (compare.cpp)
  Compare,      ///< the two runs' artifacts could not be compared (audit.cpp)
  Other,        ///< a sentence none of the above produce
};

/// "run_failed", "check_failed", "update_size", "window_count", "loss", "tensors", "grads",
/// "params", "compare", "other": the JUnit testcase names of audit.between.
const char* difference_kind_name(DifferenceKind k);

struct AuditDifference {
  DifferenceKind kind = DifferenceKind::Other;
  std::string side;   ///< RunFailed, CheckFailed: "before" | "after"
  std::string check;  ///< CheckFailed: the check id
  int update = -1;    ///< UpdateSize, WindowCount, Loss, Tensors: the update
  std::string text;   ///< the sentence, as in AuditReport::differences
};

/// Every difference of `r`, in order, with its category. The categories come from the
/// report's own structure: a side's difference names that side (its failed run or one of its
/// failed checks, "before (NAME): check ID failed: ..."), a per-update one starts
/// "update U: " with U an update of the report, the comparison's whole-run sentences start
/// as compare.cpp writes them; anything else is Other (never dropped).
std::vector<AuditDifference> classify_differences(const AuditReport& r);

}  // namespace gradcert::reports
