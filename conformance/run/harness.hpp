// The harness: plan -> reference -> launched backend ranks -> artifacts -> checks, and the
// same checks again on a run folder's artifacts (check_run).
#pragma once
#include <memory>
#include <string>

#include "conformance/core/result.hpp"
#include "conformance/launch/launcher.hpp"
#include "conformance/run/run_plan.hpp"

namespace gradcert {

/// Runs the backend and its checks. Bad input (unknown backend, topology it cannot run,
/// unknown mutant, bad spec) throws std::invalid_argument or SpecError. A failed run
/// (a rank died, hung, or wrote bad artifacts) does not throw: RunReport::error says
/// what happened and names the rank or file.
RunReport run_backend(const RunRequest& request);
/// The same for a request already planned (make_run_plan): nothing is derived again.
RunReport run_backend(const RunPlan& run);

/// run_backend in two halves: launch_run prepares the run folder and runs the ranks (throwing
/// as run_backend does for bad input); check_launched reads their artifacts and runs the checks.
/// `certify` runs one run's checks while the next (planted-bug) run's ranks train (NOTE
/// [checks beside the next launch] in certify.cpp). `early_reference` false: no reference
/// thread is started beside the ranks (NOTE [early reference]).
struct LaunchedRun;
struct LaunchedRunDeleter {
  void operator()(LaunchedRun* run) const;
};
using LaunchedRunPtr = std::unique_ptr<LaunchedRun, LaunchedRunDeleter>;
LaunchedRunPtr launch_run(const RunRequest& request, bool early_reference = true);
LaunchedRunPtr launch_run(const RunPlan& run, bool early_reference = true);
RunReport check_launched(LaunchedRunPtr run);

/// Whether the checks of `run` start no process (a built-in backend checked against the C++
/// reference): only such checks may run while a launch is in progress, since a launch ends by
/// killing every process left below gradcert (NOTE [orphans]).
bool checks_start_no_process(const RunPlan& run);

/// The report's identity fields of a run (backend, topology, dtype, updates, ...), no checks yet.
RunReport report_of(const RunPlan& run);

/// A crashed stack's Python traceback (torchrun's own summary says only that a child failed):
/// the first traceback in the command's output `log`, up to 40 lines, with the log's path; "" if none.
std::string stack_traceback(const std::string& log);
/// A launch of one command that starts its own ranks (an external stack, an observed job) failed:
/// the launcher's message with "rank 0" said as `who` (its log tail as `output`), and the command's
/// first traceback.
std::string command_failure(const std::string& message, const std::string& who, const std::string& output,
                            const std::string& run_dir);

/// A run folder to check again (`gradcert check`).
struct CheckRequest {
  std::string run_dir;    ///< a folder `gradcert run` (run.json, spec.json, plan.json, the artifacts) or `observe` made
  std::string spec_path;  ///< "" = the folder's spec.json; otherwise a spec whose plan must be the run's
  std::string work_dir;   ///< created; receives the Python reference's artifacts and log (never the run folder)
};

/// Checks the artifacts already in a run folder without launching anything: the run's
/// backend, topology, planted bug and nonce come from its run.json (NOTE [run record]), the
/// reference is recomputed, and the checks, diagnosis and memory / throughput figures are
/// those `run_backend` computes (NOTE [checking a run folder]); the report says
/// checked_from. A folder that is not a run's, an unknown backend, or a plan.json /
/// dataset.json the spec does not make throws (std::invalid_argument, SpecError or
/// ArtifactError naming the file); missing or bad artifacts set RunReport::error naming the file.
struct CheckedRun {
  Spec spec;                                    ///< the spec the run was checked on (its topology applied)
  LauncherKind launcher = LauncherKind::Local;  ///< the run's
  RunReport report;
};
CheckedRun check_run(const CheckRequest& request);

/// The environment section: torch version, git commit, host, time, and the device the ranks ran
/// on (device_summary).
Environment make_environment(uint64_t seed, int world, LauncherKind launcher, const std::string& device = "cpu");
/// The device of a run in words: "cpu", or for `--device cuda` the GPUs this machine has, the
/// process group built-in ranks use there (NOTE [collectives on a device]) and TF32 on or off.
std::string device_summary(const Spec& spec, int world, bool builtin);

/// The path of the running executable (/proc/self/exe).
std::string self_exe();

}  // namespace gradcert
