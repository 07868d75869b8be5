// The migration audit: two training stacks (built-in backends, the PyTorch adapters, or any
// external command) run on the same plan; each is certified against the float64 reference,
// and the two are compared with each other tensor by tensor (`gradcert audit`).
// Torch-free: the runs go through run_backend (harness.hpp), the artifacts through read_run.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "conformance/core/audit_result.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/run/python_reference.hpp"

namespace gradcert {

/// Resolves a side name (see AuditSide). Throws std::invalid_argument for an unknown name,
/// a mutant the side does not plant, or an adapter whose checkout or venv is missing.
AuditSide resolve_audit_side(const std::string& name, const std::string& inject, const std::string& root);

struct AuditRequest {
  Spec spec;
  std::string before, after;                ///< side names (see AuditSide)
  std::string before_inject, after_inject;  ///< planted bugs ("" for none)
  int world = 0;                            ///< 0: the spec's topology
  LauncherKind launcher = LauncherKind::Local;
  std::string out_dir;  ///< runs go under <out_dir>/runs/
  std::string exe;      ///< the gradcert executable (ranks run `gradcert worker`)
  std::string root;     ///< the checkout for the adapters; "" = locate_repo_root(exe)
};

/// Runs both sides (one after the other) and compares them. Bad input throws
/// std::invalid_argument or SpecError; a failed run is reported (run_failed()).
AuditReport run_audit(const AuditRequest& request, std::ostream& progress);

/// The migration notes for a pair of side labels on this spec and plan (exposed for tests).
std::vector<MigrationNote> migration_notes(const std::string& before_label, const std::string& after_label,
                                           const Spec& spec, const Plan& plan);

}  // namespace gradcert
