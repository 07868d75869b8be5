// The body of one rank process (`gradcert worker`, started by a launcher).
#pragma once
#include <string>

namespace gradcert {

/// What a rank is told on its command line; its rank and world come from the environment.
struct WorkerArgs {
  std::string run_dir;  ///< holds spec.json; the rank writes its artifacts here
  std::string backend;
  std::string inject;
  std::string store;  ///< the harness's rendezvous store (a StoreServer address; empty at world 1)
  /// A resumed run's legs (NOTE [resume] in harness.cpp): the first trains updates [0, save_at)
  /// and saves into <run_dir>/checkpoint; the second loads resume_from and trains the rest.
  int save_at = 0;
  std::string resume_from;
  /// The inputs ("" = <run_dir>/spec.json, plan.json): a second leg's are its own.
  std::string spec_file, plan_file;
};

/// Runs every update of the plan on this rank and writes its artifacts, then ends the process
/// with exit code 0 (exit_now: nothing is torn down). Returns 2 when it failed (the message,
/// prefixed "gradcert rank R:", went to stderr).
///
/// Test hook: GRADCERT_FAULT="kill:R:U" | "hang:R:U" | "exit:R:U" makes rank R kill
/// itself (SIGKILL), hang, or exit 3 at the start of update U; "truncate:R:U" makes rank
/// R cut update U's gradient file short after writing it.
int worker_main(const WorkerArgs& args);

}  // namespace gradcert
