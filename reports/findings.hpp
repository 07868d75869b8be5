// The findings of scripts/certify-stacks: one entry per (stack, version, configuration),
// read from the runs' own report.json / manifest.json / plan.json (torch-free).
#pragma once
#include <string>
#include <vector>

namespace gradcert {

struct FindingCheck {
  std::string id, verdict, detail;
  double figure = 0, tolerance = 0;
};

struct Finding {
  std::string id;  ///< matrix id, e.g. "hf-4.45/default"
  std::string stack, version, config, env, dtype;
  int world = 0, tp = 1, pp = 1;
  std::string verdict;  ///< pass | fail | error | skip
  std::string reason;   ///< skip / error: why (names the package, the error)
  int exit_code = 0;
  double seconds = 0;
  /// The objective the stack computed: the diagnosis' best candidate ("global-mean", ...),
  /// "unexplained" when none matched within the run's tolerance, "" when none ran.
  std::string diagnosis;
  std::string diagnosis_note;                           ///< gradcert's one line, figures and per-update detail included
  std::vector<std::pair<int, std::string>> per_update;  ///< update -> best candidate there
  std::string partial_window;  ///< correct | dropped | divided by the nominal A | ... (+ the examples it used)
  std::string partial_kind;    ///< the category alone (goldens compare it)
  std::string n_count;         ///< shifted | unshifted | unknown
  std::string notes;           ///< the shim's manifest notes (the stack's facts)
  std::vector<FindingCheck> checks;
};

/// Reads every <dir>/entries/*.json certify-stacks wrote (and the run folders they name).
/// Throws std::runtime_error naming the file for a malformed entry; a missing or broken
/// run report makes that entry an "error" finding, never a pass.
std::vector<Finding> read_findings(const std::string& dir);

std::string findings_json(const std::vector<Finding>& f);
std::string findings_markdown(const std::vector<Finding>& f);
std::string findings_console(const std::vector<Finding>& f);
/// One normalised line per finding (verdict, diagnosis, partial window, N, each check's
/// verdict; no figures): the approved goldens (golden/stacks/findings.txt).
std::string findings_golden(const std::vector<Finding>& f);

}  // namespace gradcert
