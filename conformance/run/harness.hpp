// The harness: plan -> reference -> launched backend ranks -> artifacts -> checks.
#pragma once
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

/// The environment section: torch version, git commit, host, time.
Environment make_environment(uint64_t seed, int world, LauncherKind launcher);

/// The path of the running executable (/proc/self/exe).
std::string self_exe();

}  // namespace gradcert
