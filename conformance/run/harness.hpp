// The harness: plan -> reference -> launched backend ranks -> artifacts -> checks, and the
// same checks again on a run folder's artifacts (check_run).
#pragma once
#include <memory>
#include <string>

#include "conformance/core/result.hpp"
#include "conformance/launch/launcher.hpp"

namespace gradcert {

/// One backend run to certify.
struct RunRequest {
  Spec spec;
  std::string backend;
  int world = 0;  ///< 0: spec.topology's world; otherwise dp = world / (tp x pp)
  int tp = 0, pp = 0;  ///< 0: spec.topology's
  LauncherKind launcher = LauncherKind::Local;
  std::string inject;   ///< a planted bug, "" for none
  std::string run_dir;  ///< created; receives spec.json, plan.json, artifacts, rank logs
  std::string exe;      ///< the gradcert executable the ranks run (`gradcert worker`)
  /// backend "external": the shell command that runs the foreign stack (backends/PROTOCOL.md).
  std::string command;
  /// backend "external": the stack samples on its own and reports the ids it consumed;
  /// the reference is recomputed from those ids (duplicates and gaps are findings).
  bool sampler_audit = false;
};

/// The spec with the request's topology applied (throws SpecError naming topology.*).
Spec effective_spec(const RunRequest& request);

/// Runs the backend and its checks. Bad input (unknown backend, topology it cannot run,
/// unknown mutant, bad spec) throws std::invalid_argument or SpecError. A failed run
/// (a rank died, hung, or wrote bad artifacts) does not throw: RunReport::error says
/// what happened and names the rank or file.
RunReport run_backend(const RunRequest& request);

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
RunReport check_launched(LaunchedRunPtr run);

/// Whether the checks of `request` start no process (a built-in backend checked against the C++
/// reference): only such checks may run while a launch is in progress, since a launch ends by
/// killing every process left below gradcert (NOTE [orphans]).
bool checks_start_no_process(const RunRequest& request);

/// A run folder to check again (`gradcert check`).
struct CheckRequest {
  std::string run_dir;    ///< a folder `gradcert run` made: run.json, spec.json, plan.json, the artifacts
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
  Spec spec;  ///< the spec the run was checked on (its topology applied)
  LauncherKind launcher = LauncherKind::Local;  ///< the run's
  RunReport report;
};
CheckedRun check_run(const CheckRequest& request);

/// The environment section: torch version, git commit, host, time.
Environment make_environment(uint64_t seed, int world, LauncherKind launcher);

/// The path of the running executable (/proc/self/exe).
std::string self_exe();

}  // namespace gradcert
