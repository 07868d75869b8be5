// Local (fork/exec) and mpirun launchers for rank processes.
#include "conformance/launch/launcher.hpp"

#include "conformance/launch/zygote.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

extern char** environ;

namespace gradcert {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kPollInterval = std::chrono::milliseconds(10);
constexpr auto kTermGrace = std::chrono::seconds(2);

// NOTE [interrupt] SIGINT / SIGTERM to gradcert only record the signal here (the handler does
// nothing else, so it is async-signal-safe); every launcher loop sees it within one poll,
// stops its ranks as on a timeout and returns with LaunchResult::interrupted set, and the
// command writes a report marked interrupted and exits 128 + the signal (130 / 143).
std::atomic<int> g_interrupt{0};

extern "C" void record_interrupt(int sig) { g_interrupt.store(sig); }

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string fmt_seconds(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    case SIGCONT: return "SIGCONT";
    default: break;
  }
  const char* desc = strsignal(sig);
  return desc ? std::string(desc) : "signal " + std::to_string(sig);
}

// "rank 1" or "ranks 0, 2".
std::string join_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

std::string env_key(const std::string& entry) {
  auto eq = entry.find('=');
  return eq == std::string::npos ? entry : entry.substr(0, eq);
}

// The inherited environment with `overrides` applied and `removed` keys dropped.
std::vector<std::string> build_env(const std::vector<std::pair<std::string, std::string>>& overrides,
                                   const std::vector<std::string>& removed = {}) {
  std::vector<std::string> out;
  auto overridden = [&](const std::string& key) {
    for (const auto& kv : overrides)
      if (kv.first == key) return true;
    for (const auto& r : removed)
      if (r == key) return true;
    return false;
  };
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    if (!overridden(env_key(entry))) out.push_back(std::move(entry));
  }
  for (const auto& kv : overrides) out.push_back(kv.first + "=" + kv.second);
  return out;
}

std::vector<char*> c_array(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void write_all(int fd, const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t w = ::write(fd, s, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// Forks one child into process group `pgid` (0: a new group led by the child), with
// stdout/stderr on `log_fd`. Only async-signal-safe calls between fork and exec.
pid_t spawn(char* const* argv, char* const* envp, int log_fd, pid_t pgid, pid_t parent) {
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::setpgid(0, pgid);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT}) ::signal(sig, SIG_DFL);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      if (devnull != 0) ::close(devnull);
    }
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execvpe(argv[0], argv, envp);
    int err = errno;
    write_all(2, "gradcert launcher: execvp ");
    write_all(2, argv[0]);
    write_all(2, " failed: ");
    write_all(2, std::strerror(err));
    write_all(2, "\n");
    ::_exit(127);
  }
  ::setpgid(pid, pgid == 0 ? pid : pgid);  // also done in the child; races are harmless
  return pid;
}

int open_log(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
  if (fd < 0)
    throw std::runtime_error("cannot open log " + path + ": " + std::strerror(errno));
  return fd;
}

// Returns 0 or the errno of the failed write.
int write_bytes(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return w < 0 ? errno : EIO;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

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

void record_status(RankExit& r, int status) {
  if (WIFEXITED(status)) {
    r.exited = true;
    r.code = WEXITSTATUS(status);
    r.signal = 0;
  } else if (WIFSIGNALED(status)) {
    r.exited = false;
    r.signal = WTERMSIG(status);
  }
}

bool failed(const RankExit& r) { return !r.exited || r.code != 0; }

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

// The pids of every process below this one (children, theirs, ...), from /proc.
std::vector<pid_t> descendants() {
  std::map<pid_t, std::vector<pid_t>> children;
  if (DIR* d = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(d)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      std::ifstream in("/proc/" + std::string(e->d_name) + "/stat");
      std::string stat;
      std::getline(in, stat);
      const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
      if (paren == std::string::npos) continue;
      std::istringstream rest(stat.substr(paren + 1));
      std::string state;
      pid_t ppid = 0;
      if (rest >> state >> ppid && state != "Z") children[ppid].push_back(pid);  // a zombie is only reaped
    }
    ::closedir(d);
  }
  std::vector<pid_t> out, todo = {::getpid()};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (pid_t c : children[p])
      if (c != zygote_pid()) out.push_back(c), todo.push_back(c);  // NOTE [zygote]: gradcert's own, not the launch's
  }
  return out;
}

// NOTE [orphans] A stack may start processes that leave its process group (setsid, a daemon)
// or outlive the command (`sleep 1000 &`). gradcert is a child subreaper (launch() sets
// PR_SET_CHILD_SUBREAPER), so such orphans become its children instead of init's; when a
// launch ends (however it ends), every process still below gradcert is killed (SIGKILL) and
// reaped. Launches run one at a time, so all of them are the launch's. Returns how many.
int kill_descendants() {
  std::set<pid_t> killed;
  const auto give_up = Clock::now() + kTermGrace;
  for (;;) {
    const std::vector<pid_t> below = descendants();
    for (pid_t p : below)
      if (killed.insert(p).second) ::kill(p, SIGKILL);
    // Reap this process's children: the killed, and the orphans that came up to it.
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (below.empty() || Clock::now() >= give_up) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  return static_cast<int>(killed.size());
}

std::string how_it_ended(const RankExit& r, double secs) {
  if (r.exited) return "exited with code " + std::to_string(r.code) + " after " + fmt_seconds(secs);
  return "was killed by signal " + std::to_string(r.signal) + " (" + signal_name(r.signal) +
         ") after " + fmt_seconds(secs);
}

// The last `max_lines` lines of `data`.
std::string last_lines(const std::string& data, int max_lines) {
  if (data.empty() || max_lines <= 0) return "";
  size_t end = data.size();
  if (data[end - 1] == '\n') --end;  // a final newline does not start a line
  int lines = 0;
  size_t pos = end;
  while (pos > 0) {
    if (data[pos - 1] == '\n' && ++lines == max_lines) break;
    --pos;
  }
  return data.substr(pos);
}

// The log's last lines for a failure message; from memory when the log could not be written.
std::string tail_section(const std::string& label, const std::string& path, const Logs& logs) {
  const CappedLog* l = logs.find(path);
  if (l && l->write_error) {
    std::string tail = last_lines(l->recent, 20);
    if (!tail.empty() && tail.back() == '\n') tail.pop_back();
    return "\n--- " + label + " output (its log " + path + " could not be written: " + std::strerror(l->write_error) +
           ") ---\n" + tail;
  }
  std::string tail = file_tail(path, 20);
  if (tail.empty()) return "\n--- " + label + " log tail (empty) ---";
  if (tail.back() == '\n') tail.pop_back();
  return "\n--- " + label + " log tail ---\n" + tail;
}

void validate(const LaunchRequest& req) {
  if (req.world < 1) throw std::invalid_argument("launch: world must be >= 1");
  if (req.argv.empty() || req.argv[0].empty())
    throw std::invalid_argument("launch: argv is empty");
  if (req.log_dir.empty()) throw std::invalid_argument("launch: log_dir is empty");
  std::error_code ec;
  std::filesystem::create_directories(req.log_dir, ec);
  if (ec) throw std::runtime_error("launch: cannot create log_dir " + req.log_dir + ": " + ec.message());
}

// "; 2 more processes it started were killed" (NOTE [orphans]), or "".
std::string leftovers_text(int n) {
  if (n <= 0) return "";
  return "; " + std::to_string(n) + (n == 1 ? " more process" : " more processes") + " it started killed";
}

// Stops everything on SIGINT / SIGTERM (NOTE [interrupt]); `who` names what was stopped
// ("" for the group's ranks).
LaunchResult interrupted_result(Group& g, Logs& logs, const std::string& who) {
  LaunchResult res;
  res.interrupted = g_interrupt.load();
  const double secs = seconds_since(g.start);
  std::vector<int> stopped = g.stop();
  const int leftovers = kill_descendants();
  logs.finish();
  res.ranks = g.exits;
  res.message = "interrupted by " + signal_name(res.interrupted) + " after " + fmt_seconds(secs);
  if (!stopped.empty())
    res.message += "; " + (who.empty() ? join_ranks(stopped) : who) + " still running (stopped by the launcher)";
  res.message += leftovers_text(leftovers);
  return res;
}

LaunchResult launch_local(const LaunchRequest& req) {
  const int world = req.world;
  std::vector<std::pair<std::string, std::string>> base;
  for (const auto& kv : req.env) base.emplace_back(kv.first, kv.second);
  if (req.rank_env) base.emplace_back("GRADCERT_WORLD", std::to_string(world));

  // Everything the children need is built before the first fork.
  std::vector<std::string> argv_s = req.argv;
  std::vector<char*> argv_c = c_array(argv_s);
  std::vector<std::vector<std::string>> envs(world);
  std::vector<std::vector<char*>> envs_c(world);
  std::vector<std::string> logs(world);
  std::vector<int> fds(world, -1);  // the write ends of the log pipes (NOTE [log cap])
  Logs capped;
  auto close_fds = [&] {
    for (int& fd : fds)
      if (fd >= 0) ::close(fd), fd = -1;
  };
  try {
    for (int r = 0; r < world; ++r) {
      auto overrides = base;
      if (req.rank_env) overrides.emplace_back("GRADCERT_RANK", std::to_string(r));
      envs[r] = req.rank_env ? build_env(overrides) : build_env(overrides, {"GRADCERT_RANK", "GRADCERT_WORLD"});
      envs_c[r] = c_array(envs[r]);
      logs[r] = req.log_dir + "/rank" + std::to_string(r) + ".log";
      fds[r] = capped.add(logs[r]);
    }
  } catch (...) {
    close_fds();
    throw;
  }

  Group g;
  g.resize(world);
  g.logs = &capped;
  for (int r = 0; r < world; ++r) g.exits[r].rank = r;

  LaunchResult res;
  const auto start = g.start;
  const pid_t self = ::getpid();
  for (int r = 0; r < world; ++r) {
    // A built-in rank comes from the zygote when one runs (NOTE [zygote]), else fork/exec.
    pid_t pid = zygote_spawn(argv_c.data(), envs_c[r].data(), fds[r], r == 0 ? 0 : g.pgid);
    if (pid > 0) ::setpgid(pid, r == 0 ? pid : g.pgid);  // also done in the child, as in spawn
    else pid = spawn(argv_c.data(), envs_c[r].data(), fds[r], r == 0 ? 0 : g.pgid, self);
    if (pid < 0) {
      int err = errno;
      close_fds();
      g.stop();
      kill_descendants();
      capped.finish();
      res.ranks = g.exits;
      res.message = "fork failed for rank " + std::to_string(r) + ": " + std::strerror(err);
      return res;
    }
    if (r == 0) g.pgid = pid;
    g.track(static_cast<size_t>(r), pid);
  }
  close_fds();

  const auto deadline = start + req.timeout;
  int failed_rank = -1;
  double failed_at = 0;
  std::vector<double> left_at(world, -1);  // a rank that exited 0 while peers still ran
  constexpr double seconds_since_marker = -1;  // failed_at while this poll's candidates are compared
  for (;;) {
    if (g_interrupt.load()) return interrupted_result(g, capped, "");
    // NOTE [blame] Of the ranks found ended in one poll, blame the one whose end is a cause,
    // not a symptom: killed by a signal (other than SIGPIPE) before an error exit, and either
    // before SIGPIPE (a write to a dead peer's socket). Reaping order is slot order, so without
    // this a healthy rank 0 that died of its peer's death would be blamed.
    auto cause = [](const RankExit& e) { return !e.exited && e.signal != SIGPIPE ? 2 : e.exited ? 1 : 0; };
    const std::vector<int> reaped = g.poll();
    for (int r : reaped) {
      if (!failed(g.exits[r])) continue;
      if (failed_rank < 0 || (failed_at == seconds_since_marker && cause(g.exits[r]) > cause(g.exits[failed_rank]))) {
        failed_rank = r;
        failed_at = seconds_since_marker;
      }
    }
    if (failed_rank >= 0 && failed_at == seconds_since_marker) failed_at = seconds_since(start);
    if (failed_rank < 0 && !g.running().empty())
      for (int r : reaped) left_at[r] = seconds_since(start);
    if (failed_rank >= 0 || g.running().empty()) break;
    if (Clock::now() >= deadline) {
      res.timed_out = true;
      break;
    }
    g.wait(kPollInterval);
  }

  // (NOTE [blame], continued) What a peer's failure or the timeout followed is blamed before it:
  // a rank still stopped (SIGSTOP: its peers wait in a collective until its timeout), then a
  // rank that exited 0 while its peers still ran (it left them in a collective, and they fail
  // with "Connection reset by peer"). Ranks leave together, not one by one: a built-in rank's
  // last act is a barrier after every file is written (conformance/run/worker.cpp).
  int cause_rank = -1;
  std::string cause_text;
  for (int r = 0; r < world; ++r)
    if (g.stopped_at[r] >= 0 && (cause_rank < 0 || g.stopped_at[r] < g.stopped_at[cause_rank])) cause_rank = r;
  if (cause_rank >= 0) {
    cause_text = "rank " + std::to_string(cause_rank) + " was stopped (" + signal_name(g.stop_signal[cause_rank]) +
                 ") after " + fmt_seconds(g.stopped_at[cause_rank]) + " and did not continue";
  } else {
    for (int r = 0; r < world; ++r)
      if (left_at[r] >= 0 && (cause_rank < 0 || left_at[r] < left_at[cause_rank])) cause_rank = r;
    if (cause_rank >= 0)
      cause_text = "rank " + std::to_string(cause_rank) + " exited 0 after " + fmt_seconds(left_at[cause_rank]) +
                   " before the run finished (its peers were still running)";
  }

  if (res.timed_out) {
    std::vector<int> stopped = g.stop();
    const int leftovers = kill_descendants();
    capped.finish();
    res.ranks = g.exits;
    res.first_failed_rank = cause_rank;
    double limit = std::chrono::duration<double>(req.timeout).count();
    res.message = "timeout after " + fmt_seconds(limit) + "; ";
    if (cause_rank >= 0) res.message += cause_text + "; ";
    res.message += join_ranks(stopped) + " still running (stopped by the launcher)" + leftovers_text(leftovers);
    if (!stopped.empty())
      res.message += tail_section("rank " + std::to_string(stopped[0]), logs[stopped[0]], capped);
    return res;
  }
  if (failed_rank >= 0) {
    std::vector<int> stopped = g.stop();
    const int leftovers = kill_descendants();
    capped.finish();
    res.ranks = g.exits;
    res.first_failed_rank = cause_rank >= 0 ? cause_rank : failed_rank;
    const std::string failure = "rank " + std::to_string(failed_rank) + " " + how_it_ended(g.exits[failed_rank], failed_at);
    res.message = cause_rank >= 0 ? cause_text + "; then " + failure : failure;
    if (!stopped.empty()) res.message += "; " + join_ranks(stopped) + " still running (stopped by the launcher)";
    res.message += leftovers_text(leftovers);
    res.message += tail_section("rank " + std::to_string(failed_rank), logs[failed_rank], capped);
    return res;
  }
  kill_descendants();
  capped.finish();
  res.ranks = g.exits;
  res.ok = true;
  res.message = "all " + std::to_string(world) + " ranks exited with code 0 after " +
                fmt_seconds(seconds_since(start));
  return res;
}

// The first rank number following `prefix` in `text`, or -1.
int find_rank_after(const std::string& text, const std::string& prefix, char terminator, int world) {
  size_t pos = 0;
  while ((pos = text.find(prefix, pos)) != std::string::npos) {
    pos += prefix.size();
    size_t end = pos;
    while (end < text.size() && end - pos < 9 && text[end] >= '0' && text[end] <= '9') ++end;
    if (end > pos && end < text.size() && text[end] == terminator) {
      int r = std::atoi(text.substr(pos, end - pos).c_str());
      if (r >= 0 && r < world) return r;
    }
  }
  return -1;
}

// The failing rank named in an mpirun log, or -1. mpirun's own report comes first: it names
// the process it saw fail first ("mpirun noticed that process rank 1 with PID 4242 on node n
// exited on signal 9 (Killed)."; "Process name: [[12345,1],1]" for an exit code), whereas
// "gradcert rank 0: ... Connection reset by peer" may be the healthy peer's symptom, printed
// before mpirun's report.
int failed_rank_in_mpirun_log(const std::string& log, int world) {
  int r = find_rank_after(log, "noticed that process rank ", ' ', world);
  if (r >= 0) return r;
  size_t pos = log.find("Process name: [[");
  if (pos != std::string::npos) {
    size_t comma = log.find("],", pos);
    if (comma != std::string::npos && comma - pos <= 64) {
      r = find_rank_after(log.substr(comma), "],", ']', world);
      if (r >= 0) return r;
    }
  }
  return find_rank_after(log, "gradcert rank ", ':', world);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

LaunchResult launch_mpirun(const LaunchRequest& req) {
  const int world = req.world;
  std::vector<std::string> argv_s = {"mpirun",      "-np",           std::to_string(world),
                                     "--allow-run-as-root", "--oversubscribe", "--bind-to",
                                     "none",        "-x",            "GRADCERT_WORLD=" + std::to_string(world)};
  for (const auto& kv : req.env) {
    argv_s.push_back("-x");
    argv_s.push_back(kv.first + "=" + kv.second);
  }
  for (const auto& a : req.argv) argv_s.push_back(a);
  std::vector<char*> argv_c = c_array(argv_s);

  std::vector<std::pair<std::string, std::string>> overrides;
  for (const auto& kv : req.env) overrides.emplace_back(kv.first, kv.second);
  overrides.emplace_back("GRADCERT_WORLD", std::to_string(world));
  overrides.emplace_back("OMPI_ALLOW_RUN_AS_ROOT", "1");
  overrides.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  // An inherited GRADCERT_RANK would override the rank mpirun gives each process.
  std::vector<std::string> env_s = build_env(overrides, {"GRADCERT_RANK"});
  std::vector<char*> env_c = c_array(env_s);

  const std::string log = req.log_dir + "/mpirun.log";
  Logs capped;
  int fd = capped.add(log);

  Group g;
  g.resize(1);
  g.logs = &capped;
  g.exits[0].rank = -1;

  LaunchResult res;
  const auto start = g.start;
  pid_t pid = spawn(argv_c.data(), env_c.data(), fd, 0, ::getpid());
  int fork_err = errno;
  ::close(fd);
  if (pid < 0) {
    res.message = std::string("fork failed for mpirun: ") + std::strerror(fork_err);
    return res;
  }
  g.pgid = pid;
  g.track(0, pid);

  const auto deadline = start + req.timeout;
  for (;;) {
    if (g_interrupt.load()) {
      LaunchResult r = interrupted_result(g, capped, "mpirun and its ranks");
      r.ranks.assign(world, g.exits[0]);
      for (int i = 0; i < world; ++i) r.ranks[i].rank = i;
      return r;
    }
    g.poll();
    if (g.running().empty()) break;
    if (Clock::now() >= deadline) {
      res.timed_out = true;
      break;
    }
    g.wait(kPollInterval);
  }
  const double elapsed = seconds_since(start);
  if (res.timed_out) g.stop();
  kill_descendants();
  capped.finish();

  // mpirun reports no per-rank status: every rank carries mpirun's outcome.
  const RankExit& m = g.exits[0];
  res.ranks.resize(world);
  for (int r = 0; r < world; ++r) {
    res.ranks[r] = m;
    res.ranks[r].rank = r;
  }

  if (res.timed_out) {
    std::vector<int> all;
    for (int r = 0; r < world; ++r) all.push_back(r);
    double limit = std::chrono::duration<double>(req.timeout).count();
    res.message = "timeout after " + fmt_seconds(limit) + "; " + join_ranks(all) +
                  " still running under mpirun (stopped by the launcher)" + tail_section("mpirun", log, capped);
    return res;
  }
  if (m.exited && m.code == 0) {
    res.ok = true;
    res.message = "mpirun: all " + std::to_string(world) + " ranks exited with code 0 after " +
                  fmt_seconds(elapsed);
    return res;
  }
  res.first_failed_rank = failed_rank_in_mpirun_log(read_file(log), world);
  std::string how = m.exited ? "mpirun exited with code " + std::to_string(m.code)
                             : "mpirun was killed by signal " + std::to_string(m.signal) + " (" +
                                   signal_name(m.signal) + ")";
  how += " after " + fmt_seconds(elapsed);
  if (res.first_failed_rank >= 0)
    res.message = "rank " + std::to_string(res.first_failed_rank) + " failed under mpirun (" + how + ")";
  else
    res.message = how;
  res.message += tail_section("mpirun", log, capped);
  return res;
}

int parse_int_var(const char* name, const char* value) {
  std::string v(value);
  bool ok = !v.empty() && (v[0] == '-' || v[0] == '+' || (v[0] >= '0' && v[0] <= '9'));
  char* end = nullptr;
  errno = 0;
  long n = ok ? std::strtol(v.c_str(), &end, 10) : 0;
  if (!ok || errno != 0 || end == v.c_str() || *end != '\0' || n < -2147483647L || n > 2147483647L)
    throw std::runtime_error(std::string(name) + "='" + v + "' is not an integer");
  return static_cast<int>(n);
}

std::pair<int, int> rank_world_from(const char* rank_var, const char* world_var) {
  const char* rv = std::getenv(rank_var);
  const char* wv = std::getenv(world_var);
  if (!wv)
    throw std::runtime_error(std::string(rank_var) + " is set but " + world_var + " is not");
  int rank = parse_int_var(rank_var, rv);
  int world = parse_int_var(world_var, wv);
  if (world < 1)
    throw std::runtime_error(std::string(world_var) + "=" + wv + " is invalid: must be >= 1");
  if (rank < 0 || rank >= world)
    throw std::runtime_error(std::string(rank_var) + "=" + rv + " is out of range for " +
                             world_var + "=" + wv);
  return {rank, world};
}

}  // namespace

LaunchResult launch(const LaunchRequest& request) {
  validate(request);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // NOTE [orphans]
  return request.kind == LauncherKind::Mpirun ? launch_mpirun(request) : launch_local(request);
}

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = record_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int interrupt_signal() { return g_interrupt.load(); }

std::string signal_text(int sig) { return signal_name(sig); }

int free_local_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("free_local_port: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(fd);
    throw std::runtime_error(std::string("free_local_port: bind: ") + std::strerror(err));
  }
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw std::runtime_error(std::string("free_local_port: getsockname: ") + std::strerror(err));
  }
  ::close(fd);
  int port = ntohs(addr.sin_port);
  if (port <= 0) throw std::runtime_error("free_local_port: got port 0");
  return port;
}

std::string file_tail(const std::string& path, int max_lines) {
  if (max_lines <= 0) return "";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  // Only the last 1 MiB is read; logs can be large.
  constexpr std::streamoff kMaxBytes = 1 << 20;
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  if (size < 0) return "";
  std::streamoff from = size > kMaxBytes ? size - kMaxBytes : 0;
  in.seekg(from);
  std::string data(static_cast<size_t>(size - from), '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<size_t>(in.gcount()));
  return last_lines(data, max_lines);
}

std::pair<int, int> rank_and_world_from_env() {
  if (std::getenv("GRADCERT_RANK")) return rank_world_from("GRADCERT_RANK", "GRADCERT_WORLD");
  if (std::getenv("OMPI_COMM_WORLD_RANK"))
    return rank_world_from("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  throw std::runtime_error(
      "no rank in the environment: set GRADCERT_RANK and GRADCERT_WORLD or start under mpirun");
}

}  // namespace gradcert
