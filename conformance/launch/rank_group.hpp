// Internal to conformance/launch: the process-group machinery that the local and the mpirun
// launchers share (spawning, the capped rank logs, the group of rank processes, stopping and
// reaping, failure-message tails). Not part of the launch API (launcher.hpp).
#pragma once
#include "conformance/launch/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
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
  std::string tail;    // output after the head: the last kLogTail..2 kLogTail bytes
  std::string recent;  // the last kLogRecent..2 kLogRecent bytes of all output
  int write_error = 0;  // errno of the first failed write to the log file

  void write(const char* p, size_t n) {
    if (const int err = write_bytes(file, p, n); err && !write_error) write_error = err;
  }

  void take(const char* p, size_t n) {
    recent.append(p, n);
    if (recent.size() > 2 * kLogRecent) recent.erase(0, recent.size() - kLogRecent);
    if (total < kLogHead) {
      const size_t head = std::min<uint64_t>(n, kLogHead - total);
      write(p, head);
      total += head;
      p += head;
      n -= head;
    }
    total += n;
    tail.append(p, n);
    if (tail.size() > 2 * kLogTail) tail.erase(0, tail.size() - kLogTail);
  }

  // Reads what the pipe holds now (at most `budget` bytes); closes it at end of output.
  void drain(size_t budget) {
    char buf[64 << 10];
    while (in >= 0 && budget > 0) {
      const ssize_t n = ::read(in, buf, std::min(sizeof buf, budget));
      if (n > 0) {
        take(buf, static_cast<size_t>(n));
        budget -= static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      ::close(in);  // end of output (or an error reading it)
      in = -1;
    }
  }

  void finish() {
    drain(SIZE_MAX);
    if (in >= 0) ::close(in), in = -1;
    if (file < 0) return;
    const uint64_t after_head = total > kLogHead ? total - kLogHead : 0;
    const size_t kept = static_cast<size_t>(std::min<uint64_t>(after_head, kLogTail));
    if (after_head > kept) {
      const std::string marker = "\n[... " + std::to_string(after_head - kept) + " bytes cut ...]\n";
      write(marker.data(), marker.size());
    }
    write(tail.data() + tail.size() - kept, kept);
    tail.clear();
    ::close(file);
    file = -1;
  }
};

// The logs of one launch: each rank's pipe, drained while the launcher waits.
struct Logs {
  std::vector<CappedLog> logs;

  ~Logs() {
    for (auto& l : logs) l.finish();
  }

  // Opens `path` and a pipe for it; returns the pipe's write end (for the child).
  int add(const std::string& path) {
    CappedLog l;
    l.path = path;
    l.file = open_log(path);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      const int err = errno;
      ::close(l.file);
      throw std::runtime_error("cannot make a pipe for log " + path + ": " + std::strerror(err));
    }
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    l.in = fds[0];
    logs.push_back(std::move(l));
    return fds[1];
  }

  // Waits up to `timeout` for output on any pipe and takes what came.
  // Drains what the ranks wrote, waiting up to `timeout`; returns early when a log has data or
  // one of `wake` (a rank's pidfd: it exited) is readable.
  void wait(std::chrono::milliseconds timeout, const std::vector<int>& wake = {}) {
    std::vector<pollfd> fds;
    std::vector<CappedLog*> of;
    for (auto& l : logs)
      if (l.in >= 0) fds.push_back({l.in, POLLIN, 0}), of.push_back(&l);
    for (int fd : wake) fds.push_back({fd, POLLIN, 0});
    if (fds.empty()) {
      std::this_thread::sleep_for(timeout);
      return;
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return;
    for (size_t i = 0; i < of.size(); ++i)
      if (fds[i].revents) of[i]->drain(4 << 20);
  }

  void finish() {
    for (auto& l : logs) l.finish();
  }

  // The log written for `path`, or nullptr.
  const CappedLog* find(const std::string& path) const {
    for (const auto& l : logs)
      if (l.path == path) return &l;
    return nullptr;
  }
};

inline void record_status(RankExit& r, int status) {
  if (WIFEXITED(status)) {
    r.exited = true;
    r.code = WEXITSTATUS(status);
    r.signal = 0;
  } else if (WIFSIGNALED(status)) {
    r.exited = false;
    r.signal = WTERMSIG(status);
  }
}

inline bool failed(const RankExit& r) { return !r.exited || r.code != 0; }

// Tracks a set of children in one process group.
struct Group {
  std::vector<pid_t> pids;      // index = rank (slot); -1 once reaped
  std::vector<RankExit> exits;
  pid_t pgid = -1;
  Logs* logs = nullptr;         // drained while waiting
  Clock::time_point start = Clock::now();
  std::vector<double> stopped_at;  // seconds when seen stopped (SIGSTOP, ...), -1 while running
  std::vector<int> stop_signal;

  // NOTE [pidfd wake] A rank's exit wakes the launcher at once (a pidfd turns readable when its
  // process ends): without it, the end of every launch waited for the next 10 ms poll, and a
  // default-spec run is about 100 ms. Where pidfd_open is refused, the poll interval serves.
  std::vector<int> pidfds;      // index = rank (slot); -1 when none

  Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group() {
    for (int fd : pidfds)
      if (fd >= 0) ::close(fd);
  }

  void resize(size_t n) {
    pids.assign(n, -1);
    pidfds.assign(n, -1);
    exits.resize(n);
    stopped_at.assign(n, -1);
    stop_signal.assign(n, 0);
  }

  void track(size_t slot, pid_t pid) {
    pids[slot] = pid;
    pidfds[slot] = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  }

  void forget(size_t slot) {
    pids[slot] = -1;
    if (pidfds[slot] >= 0) ::close(pidfds[slot]);
    pidfds[slot] = -1;
  }

  void wait(std::chrono::milliseconds d) {
    std::vector<int> wake;
    for (size_t i = 0; i < pids.size(); ++i)
      if (pids[i] > 0 && pidfds[i] >= 0) wake.push_back(pidfds[i]);
    if (logs) {
      logs->wait(d, wake);
    } else if (!wake.empty()) {
      std::vector<pollfd> fds;
      for (int fd : wake) fds.push_back({fd, POLLIN, 0});
      ::poll(fds.data(), fds.size(), static_cast<int>(d.count()));
    } else {
      std::this_thread::sleep_for(d);
    }
  }

  // Reaps whatever has ended, and notes ranks stopped or continued; returns the slots
  // reaped, in slot order.
  std::vector<int> poll() {
    std::vector<int> reaped;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0) continue;
      int status = 0;
      pid_t r;
      do {
        r = ::waitpid(pids[i], &status, WNOHANG | WUNTRACED | WCONTINUED);
      } while (r < 0 && errno == EINTR);
      if (r == 0) continue;
      if (r > 0 && WIFSTOPPED(status)) {
        if (stopped_at[i] < 0) stopped_at[i] = seconds_since(start), stop_signal[i] = WSTOPSIG(status);
        continue;
      }
      if (r > 0 && WIFCONTINUED(status)) {
        stopped_at[i] = -1;
        continue;
      }
      if (r < 0) {
        // Reaped by someone else (ECHILD): the outcome is unknown; count it as failed.
        exits[i].exited = true;
        exits[i].code = -1;
      } else {
        record_status(exits[i], status);
      }
      forget(i);
      stopped_at[i] = -1;
      reaped.push_back(static_cast<int>(i));
    }
    return reaped;
  }

  std::vector<int> running() const {
    std::vector<int> out;
    for (size_t i = 0; i < pids.size(); ++i)
      if (pids[i] > 0) out.push_back(static_cast<int>(i));
    return out;
  }

  void signal_group(int sig) const {
    if (pgid > 1) ::kill(-pgid, sig);
  }

  // SIGTERM (and SIGCONT, so a stopped rank gets it), up to 2 s grace, SIGKILL, reap all.
  // Returns the slots that were stopped.
  std::vector<int> stop() {
    std::vector<int> stopped = running();
    for (int i : stopped) exits[i].killed_by_launcher = true;
    if (stopped.empty()) {
      signal_group(SIGKILL);  // leftover processes of the group (a stack's background child)
      return stopped;
    }
    signal_group(SIGTERM);
    signal_group(SIGCONT);
    auto grace_end = Clock::now() + kTermGrace;
    while (!running().empty() && Clock::now() < grace_end) {
      wait(kPollInterval);
      poll();
    }
    signal_group(SIGKILL);  // also takes down leftover grandchildren in the group
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0) continue;
      int status = 0;
      pid_t r;
      do {
        r = ::waitpid(pids[i], &status, 0);
      } while (r < 0 && errno == EINTR);
      if (r > 0) {
        record_status(exits[i], status);
      } else {
        exits[i].exited = true;
        exits[i].code = -1;
      }
      forget(i);
    }
    return stopped;
  }
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
