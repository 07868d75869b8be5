// The result model: what a run, a certification and its checks found. Writers in reports/
// render it; nothing here formats for a particular output.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "conformance/core/memory_types.hpp"
#include "conformance/core/spec.hpp"
#include "conformance/core/throughput.hpp"

namespace gradcert {

/// The name of the backend that runs a foreign program over the file protocol.
constexpr const char* kExternalBackend = "external";

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
  /// The run's own noise floor behind `tolerance` and the factor it was multiplied by
  /// (tolerance = max(the dtype's calibrated one, factor x floor); NOTE [noise floor] in
  /// conformance/model/reference.cpp). -1: the tolerance is not floor-based.
  double noise_floor = -1;
  double floor_factor = 0;
};

/// One tensor's error against the reference in one update: the per-tensor evidence behind
/// grad.parity and params.parity (their figures are the worst of these). Relative L2;
/// infinity when the tensor is missing on the backend's side or cannot be compared.
struct TensorFigure {
  int update = 0;
  std::string tensor;
  double grad_rel = 0;
  double param_rel = 0;
  /// <g, g_ref> / <g_ref, g_ref> for this tensor (NaN when the reference gradient is zero):
  /// a normalisation bug is a scale, rounding noise mostly orthogonal (grad.scale's per-tensor view).
  double grad_scale = std::numeric_limits<double>::quiet_NaN();
};

/// Where and with what a report was made.
struct Environment {
  std::string torch;  ///< torch version the ranks linked
  std::string device = "cpu";
  int world = 1;  ///< the largest world in the report
  std::string launcher = "local";
  std::string git;  ///< commit of the gradcert checkout ("unknown" outside git)
  uint64_t seed = 0;
  std::string host;
  std::string started;  ///< UTC, ISO 8601
};

/// One candidate objective and how far the stack's gradient is from it.
struct DiagnosisCandidate {
  std::string id, description;
  double figure = 0;  ///< worst update's ||g - g_candidate|| / ||g_correct||
  int worst_update = -1;
};
/// Which objective a stack's gradient matches (conformance/checks/diagnosis.hpp).
struct Diagnosis {
  bool ran = false;
  bool matched = false;  ///< the best candidate is within the run's parity tolerance
  /// Not matched, but the best candidate is >= 1000x closer than the runner-up: the stack
  /// computes that objective with its own rounding on top (e.g. a float32 loss inside a
  /// float64 model). NOTE [separated diagnosis] in conformance/checks/diagnosis.cpp.
  bool separated = false;
  DiagnosisCandidate best, runner_up;
  std::vector<DiagnosisCandidate> candidates;
  /// Per judged update, the candidate its gradient is closest to (worst_update = the update):
  /// e.g. the full windows global-mean and the partial one drop-partial-window.
  std::vector<DiagnosisCandidate> per_update;
  bool teacher_forced = false;  ///< pieces at the stack's own parameters (every update judged)
  std::string note;             ///< one line: "matches local-mean (...) at 3e-16; runner-up ...", or why none ran
};

/// One backend run (or a failed attempt at one) and its checks.
struct RunReport {
  std::string backend;
  TopologySpec topology;
  std::string dtype;
  std::string optimizer;
  std::string inject;  ///< "" for the correct backend
  /// A resumed run (NOTE [resume] in conformance/run/harness.cpp): the save after `resume_at`
  /// updates, and the second leg's strategy. 0: not resumed.
  int resume_at = 0;
  std::string resume_backend;
  int resume_world = 0;  ///< the second leg's world (= topology's world unless resume.world)
  int updates = 0;
  int64_t update_batch = 0;
  std::vector<CheckResult> checks;
  std::string error;    ///< set when the run itself failed (names the rank)
  int interrupted = 0;  ///< SIGINT / SIGTERM stopped this run (NOTE [interrupt] in the launcher); 0 otherwise
  std::string run_dir;
  /// The command that reruns this run where it is not `gradcert run ...` (an observed job:
  /// `gradcert observe ... -- CMD`); "" otherwise.
  std::string reproduce;
  /// `gradcert check`: the run folder whose artifacts were checked again (no rank launched); "" for a run.
  std::string checked_from;
  double wall_seconds = 0;
  /// Built-in backends: the estimate, measured model state and phase peaks (memory.* checks).
  bool has_memory = false;
  MemoryRunReport memory;
  /// Rates from the manifest's step times; scaling against `single` is set by certify.
  bool has_throughput = false;
  Throughput throughput;
  /// What the stack's gradient matches (runs whose reference has per-piece gradients).
  Diagnosis diagnosis;
  /// Optional: per update, per reference tensor (checks: tensor_errors); empty when the run
  /// produced no artifacts. The HTML report charts it in model order.
  std::vector<TensorFigure> tensor_errors;

  /// No check failed and the run did not fail.
  bool passed() const;
  /// For a mutant run: the ids of the checks that failed.
  std::vector<std::string> detected_by() const;
};

/// A whole report. Correct runs must pass; mutant runs (inject set) must be detected.
struct Report {
  Environment environment;
  std::string spec_json;
  std::vector<RunReport> runs;
  int interrupted = 0;  ///< gradcert was interrupted by this signal (SIGINT / SIGTERM); 0 otherwise

  /// Every correct run passed and every mutant run was detected.
  bool passed() const;
};

/// "ddp dp2 tp2 float64 sgd [inject=NAME]": how tables and suites name a run.
std::string run_label(const RunReport& r);

}  // namespace gradcert
