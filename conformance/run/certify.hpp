// The default job: every built-in backend on a spec, plus the planted-bug matrix.
#pragma once
#include <ostream>
#include <string>

#include "conformance/run/harness.hpp"

namespace gradcert {

struct CertifyOptions {
  Spec spec;
  LauncherKind launcher = LauncherKind::Local;
  bool mutants = true;  ///< also run every mutant of every backend
  std::string out_dir;  ///< the report folder; runs go under <out_dir>/runs/
  std::string exe;
};

/// The runs certify makes: single at world 1 and ddp at worlds 2 and 3 with the spec as
/// given; AdamW variants (params parity under a second optimizer); a float32 variant when
/// the spec is float64; and, with mutants, each backend's mutants on the spec.
std::vector<RunPlan> certify_matrix(const CertifyOptions& options);

/// Runs the matrix, printing one progress line per run to `progress`.
Report run_certify(const CertifyOptions& options, std::ostream& progress);

/// Creates <root>/<UTC timestamp> (unique) and points <root>/latest at it.
std::string new_report_dir(const std::string& root);

/// A folder name for one run: backend-w<world>-<dtype>-<optimizer>[-<inject>].
std::string run_dir_name(const RunPlan& run);

}  // namespace gradcert
