// Starting rank processes and watching them: a local launcher and mpirun.
#pragma once
#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace gradcert {

/// How rank processes are started.
enum class LauncherKind { Local, Mpirun };

/// One launch of `world` rank processes of the same program.
struct LaunchRequest {
  LauncherKind kind = LauncherKind::Local;
  int world = 1;
  /// argv of one rank (argv[0] is the executable path). The local launcher appends
  /// nothing; ranks learn their rank from the environment (GRADCERT_RANK,
  /// GRADCERT_WORLD; under mpirun OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE).
  std::vector<std::string> argv;
  /// Extra environment for every rank (added to the inherited environment).
  std::map<std::string, std::string> env;
  /// The local launcher tells each rank GRADCERT_RANK / GRADCERT_WORLD. False for a command
  /// that starts its own ranks (an external stack): then neither is set, and inherited ones
  /// are removed, so its environment holds only what `env` says.
  bool rank_env = true;
  /// Wall-clock limit for the whole group.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  /// Folder for per-rank logs: rank<r>.log holds that rank's stdout+stderr
  /// (for mpirun: mpirun.log holds everything).
  std::string log_dir;
};

/// How one rank ended.
struct RankExit {
  int rank = -1;
  bool exited = false;  ///< ended by exit(); `code` is valid
  int code = 0;
  int signal = 0;                   ///< ended by this signal (0 when exited)
  bool killed_by_launcher = false;  ///< we killed it after another rank failed or on timeout
};

/// The outcome of a launch.
struct LaunchResult {
  bool ok = false;  ///< every rank exited 0 before the timeout
  bool timed_out = false;
  /// SIGINT or SIGTERM when gradcert was interrupted and stopped the ranks (NOTE [interrupt]); 0 otherwise.
  int interrupted = 0;
  /// The rank blamed (NOTE [blame]): the first seen to fail, or the one whose stop or early
  /// exit the failure followed (-1: none or unknown).
  int first_failed_rank = -1;
  std::vector<RankExit> ranks;
  /// One line a user can act on, naming the rank(s): "rank 1 was killed by signal 9
  /// (SIGKILL) after 0.8 s; ranks 0 stopped by the launcher", or "timeout after 30 s;
  /// ranks 1 still running". Followed by the failed rank's log tail.
  std::string message;
};

/// Starts the ranks, waits, kills the whole group on the first failure, on timeout or on
/// SIGINT / SIGTERM (once install_interrupt_handlers ran), and reports. Never hangs past
/// `timeout` (+ a short grace for killing). Makes this process a child subreaper and, when
/// the launch ends, kills every process still below it (NOTE [orphans]). Each rank's
/// stdout+stderr is capped to its first and last MiB (NOTE [log cap]).
LaunchResult launch(const LaunchRequest& request);

/// SIGINT / SIGTERM to this process are recorded instead of ending it: a launch in progress
/// (or the next one) stops its ranks and returns `interrupted` (NOTE [interrupt]).
void install_interrupt_handlers();

/// The signal recorded by the handlers (SIGINT, SIGTERM), 0 when none arrived.
int interrupt_signal();

/// "SIGTERM", "SIGKILL", ... (strsignal's text for others).
std::string signal_text(int sig);

/// NOTE [disk full] A rank (or a stack, or a job) that hits a full disk exits with its own error
/// in its log, and its peers then fail in a collective ("Connection reset by peer"): the failure
/// message below names the rank that ended first with its log's tail, where the cause may sit
/// among other lines. When `message` holds a write that failed with ENOSPC (gradcert's writers:
/// "PATH: cannot write: No space left on device"; Python: "[Errno 28] No space left on device:
/// 'PATH'"), this returns it with a first line that says so, naming the file and its filesystem
/// (mount point, free and total bytes now); else `message` as it is.
std::string name_full_disk(const std::string& message);

/// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close).
int free_local_port();

/// The last `max_lines` lines of a file ("" if it cannot be read).
std::string file_tail(const std::string& path, int max_lines = 20);

/// This process's rank and world size from GRADCERT_RANK/GRADCERT_WORLD or, under
/// mpirun, OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE. Throws naming the variable when
/// neither is set or a value is malformed.
std::pair<int, int> rank_and_world_from_env();

}  // namespace gradcert
