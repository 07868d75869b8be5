// The process-group machinery shared by the launchers (rank_group.hpp).
#include "conformance/launch/rank_group.hpp"

#include "conformance/launch/zygote.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace gradcert::launch_detail {

std::atomic<int> g_interrupt{0};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

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
                                   const std::vector<std::string>& removed) {
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
  if (fd < 0) throw std::runtime_error("cannot open log " + path + ": " + std::strerror(errno));
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
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {}
    if (below.empty() || Clock::now() >= give_up) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  return static_cast<int>(killed.size());
}

std::string how_it_ended(const RankExit& r, double secs) {
  if (r.exited) return "exited with code " + std::to_string(r.code) + " after " + fmt_seconds(secs);
  return "was killed by signal " + std::to_string(r.signal) + " (" + signal_name(r.signal) + ") after " +
         fmt_seconds(secs);
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

// ---- the group of rank processes (Group) ----

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

Group::~Group() {
  for (int fd : pidfds)
    if (fd >= 0) ::close(fd);
}

void Group::resize(size_t n) {
  pids.assign(n, -1);
  pidfds.assign(n, -1);
  exits.resize(n);
  stopped_at.assign(n, -1);
  stop_signal.assign(n, 0);
}

void Group::track(size_t slot, pid_t pid) {
  pids[slot] = pid;
  pidfds[slot] = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

void Group::forget(size_t slot) {
  pids[slot] = -1;
  if (pidfds[slot] >= 0) ::close(pidfds[slot]);
  pidfds[slot] = -1;
}

void Group::wait(std::chrono::milliseconds d) {
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

// waitpid without blocking, EINTR retried.
static pid_t wait_nohang(pid_t pid, int& status) {
  pid_t r;
  do {
    r = ::waitpid(pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
  } while (r < 0 && errno == EINTR);
  return r;
}

std::vector<int> Group::poll() {
  std::vector<int> reaped;
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] <= 0) continue;
    int status = 0;
    const pid_t r = wait_nohang(pids[i], status);
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

std::vector<int> Group::running() const {
  std::vector<int> out;
  for (size_t i = 0; i < pids.size(); ++i)
    if (pids[i] > 0) out.push_back(static_cast<int>(i));
  return out;
}

void Group::signal_group(int sig) const {
  if (pgid > 1) ::kill(-pgid, sig);
}

std::vector<int> Group::stop() {
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

}  // namespace gradcert::launch_detail
