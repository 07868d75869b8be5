// Internal to conformance/launch: the process-group machinery that the local and the mpirun
// launchers share (spawning, the capped rank logs, the group of rank processes, stopping and
// reaping, failure-message tails). Not part of the launch API (launcher.hpp).
#pragma once
#include "conformance/launch/launcher.hpp"

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gradcert::launch_detail {

using Clock = std::chrono::steady_clock;

constexpr auto kPollInterval = std::chrono::milliseconds(10);
constexpr auto kTermGrace = std::chrono::seconds(2);

// NOTE [interrupt] SIGINT / SIGTERM to gradcert only record the signal here (the handler does
// nothing else, so it is async-signal-safe); every launcher loop sees it within one poll,
// stops its ranks as on a timeout and returns with LaunchResult::interrupted set, and the
// command writes a report marked interrupted and exits 128 + the signal (130 / 143).
extern std::atomic<int> g_interrupt;

double seconds_since(Clock::time_point start);
std::string fmt_seconds(double s);  // "1.5 s"
std::string signal_name(int sig);
std::string join_ranks(const std::vector<int>& ranks);  // "rank 1" or "ranks 0, 2"
/// The inherited environment with `overrides` applied and `removed` keys dropped.
std::vector<std::string> build_env(const std::vector<std::pair<std::string, std::string>>& overrides,
                                   const std::vector<std::string>& removed = {});
std::vector<char*> c_array(std::vector<std::string>& strings);
/// Forks one child into process group `pgid` (0: a new group led by the child), with
/// stdout/stderr on `log_fd`. Only async-signal-safe calls between fork and exec.
pid_t spawn(char* const* argv, char* const* envp, int log_fd, pid_t pgid, pid_t parent);
int open_log(const std::string& path);
/// Returns 0 or the errno of the failed write.
int write_bytes(int fd, const char* p, size_t n);

// NOTE [log cap] A rank's stdout and stderr reach its log through a pipe the launcher drains
// (every poll waits on the pipes, so a chatty rank is not slowed): the first kLogHead bytes are
// written as they come, after that only the last kLogTail bytes are kept, and when the rank's
// output ends the log gets "[... N bytes cut ...]" and that tail. A stack that prints 1.5 GB
// leaves a log of about 2 MiB with its start (the configuration) and its end (the error).
// The last 64 KiB are also kept in memory: when the log cannot be written (a full disk), the
// failure message quotes them, so a rank's "No space left on device" is not lost with it.
constexpr size_t kLogHead = 1 << 20, kLogTail = 1 << 20, kLogRecent = 64 << 10;

struct CappedLog {
  std::string path;
  int in = -1;    // the pipe's read end (-1 once the output ended)
  int file = -1;  // the log file
  uint64_t total = 0;
  std::string tail;     // output after the head: the last kLogTail..2 kLogTail bytes
  std::string recent;   // the last kLogRecent..2 kLogRecent bytes of all output
  int write_error = 0;  // errno of the first failed write to the log file

  void write(const char* p, size_t n);
  void take(const char* p, size_t n);
  /// Reads what the pipe holds now (at most `budget` bytes); closes it at end of output.
  void drain(size_t budget);
  /// Drains the rest, writes the "[... N bytes cut ...]" marker and the tail, closes the log.
  void finish();
};

// The logs of one launch: each rank's pipe, drained while the launcher waits.
struct Logs {
  std::vector<CappedLog> logs;

  ~Logs() { finish(); }
  /// Opens `path` and a pipe for it; returns the pipe's write end (for the child).
  int add(const std::string& path);
  /// Drains what the ranks wrote, waiting up to `timeout`; returns early when a log has data or
  /// one of `wake` (a rank's pidfd: it exited) is readable.
  void wait(std::chrono::milliseconds timeout, const std::vector<int>& wake = {});
  void finish();
  /// The log written for `path`, or nullptr.
  const CappedLog* find(const std::string& path) const;
};

void record_status(RankExit& r, int status);
inline bool failed(const RankExit& r) { return !r.exited || r.code != 0; }

// Tracks a set of children in one process group.
struct Group {
  std::vector<pid_t> pids;  // index = rank (slot); -1 once reaped
  std::vector<RankExit> exits;
  pid_t pgid = -1;
  Logs* logs = nullptr;  // drained while waiting
  Clock::time_point start = Clock::now();
  std::vector<double> stopped_at;  // seconds when seen stopped (SIGSTOP, ...), -1 while running
  std::vector<int> stop_signal;

  // NOTE [pidfd wake] A rank's exit wakes the launcher at once (a pidfd turns readable when its
  // process ends): without it, the end of every launch waited for the next 10 ms poll, and a
  // default-spec run is about 100 ms. Where pidfd_open is refused, the poll interval serves.
  std::vector<int> pidfds;  // index = rank (slot); -1 when none

  Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group();

  void resize(size_t n);
  void track(size_t slot, pid_t pid);
  void forget(size_t slot);
  /// Waits up to `d` for a rank's exit (its pidfd) or its output (the logs, drained).
  void wait(std::chrono::milliseconds d);
  /// Reaps whatever has ended, and notes ranks stopped or continued; returns the slots
  /// reaped, in slot order.
  std::vector<int> poll();
  std::vector<int> running() const;
  void signal_group(int sig) const;
  /// SIGTERM (and SIGCONT, so a stopped rank gets it), up to 2 s grace, SIGKILL, reap all.
  /// Returns the slots that were stopped.
  std::vector<int> stop();
};

std::vector<pid_t> descendants();  // every process below this one, from /proc
int kill_descendants();            // NOTE [orphans]; returns how many it killed
std::string how_it_ended(const RankExit& r, double secs);
std::string last_lines(const std::string& data, int max_lines);
/// The log's last lines for a failure message; from memory when the log could not be written.
std::string tail_section(const std::string& label, const std::string& path, const Logs& logs);
std::string leftovers_text(int n);  // "; 2 more processes it started killed", or ""
/// Stops everything on SIGINT / SIGTERM (NOTE [interrupt]); `who` names what was stopped
/// ("" for the group's ranks).
LaunchResult interrupted_result(Group& g, Logs& logs, const std::string& who);

LaunchResult launch_local(const LaunchRequest& req);   // launcher.cpp
LaunchResult launch_mpirun(const LaunchRequest& req);  // mpirun_launcher.cpp

}  // namespace gradcert::launch_detail
