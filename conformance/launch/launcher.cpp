// Local (fork/exec) and mpirun launchers for rank processes.
#include "conformance/launch/launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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

  // Reaps whatever has ended; returns the slots reaped, in slot order.
  std::vector<int> poll() {
    std::vector<int> reaped;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0) continue;
      int status = 0;
      pid_t r;
      do {
        r = ::waitpid(pids[i], &status, WNOHANG);
      } while (r < 0 && errno == EINTR);
      if (r == 0) continue;
      if (r < 0) {
        // Reaped by someone else (ECHILD): the outcome is unknown; count it as failed.
        exits[i].exited = true;
        exits[i].code = -1;
      } else {
        record_status(exits[i], status);
      }
      pids[i] = -1;
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

  // SIGTERM, up to 2 s grace, SIGKILL, reap all. Returns the slots that were stopped.
  std::vector<int> stop() {
    std::vector<int> stopped = running();
    for (int i : stopped) exits[i].killed_by_launcher = true;
    if (stopped.empty()) return stopped;
    signal_group(SIGTERM);
    auto grace_end = Clock::now() + kTermGrace;
    while (!running().empty() && Clock::now() < grace_end) {
      std::this_thread::sleep_for(kPollInterval);
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
      pids[i] = -1;
    }
    return stopped;
  }
};

std::string how_it_ended(const RankExit& r, double secs) {
  if (r.exited) return "exited with code " + std::to_string(r.code) + " after " + fmt_seconds(secs);
  return "was killed by signal " + std::to_string(r.signal) + " (" + signal_name(r.signal) +
         ") after " + fmt_seconds(secs);
}

std::string tail_section(const std::string& label, const std::string& path) {
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
  std::vector<int> fds(world, -1);
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
      fds[r] = open_log(logs[r]);
    }
  } catch (...) {
    close_fds();
    throw;
  }

  Group g;
  g.pids.assign(world, -1);
  g.exits.resize(world);
  for (int r = 0; r < world; ++r) g.exits[r].rank = r;

  LaunchResult res;
  const auto start = Clock::now();
  const pid_t self = ::getpid();
  for (int r = 0; r < world; ++r) {
    pid_t pid = spawn(argv_c.data(), envs_c[r].data(), fds[r], r == 0 ? 0 : g.pgid, self);
    if (pid < 0) {
      int err = errno;
      close_fds();
      g.stop();
      res.ranks = g.exits;
      res.message = "fork failed for rank " + std::to_string(r) + ": " + std::strerror(err);
      return res;
    }
    if (r == 0) g.pgid = pid;
    g.pids[r] = pid;
  }
  close_fds();

  const auto deadline = start + req.timeout;
  int failed_rank = -1;
  double failed_at = 0;
  constexpr double seconds_since_marker = -1;  // failed_at while this poll's candidates are compared
  for (;;) {
    // NOTE [blame] Of the ranks found ended in one poll, blame the one whose end is a cause,
    // not a symptom: killed by a signal (other than SIGPIPE) before an error exit, and either
    // before SIGPIPE (a write to a dead peer's socket). Reaping order is slot order, so without
    // this a healthy rank 0 that died of its peer's death would be blamed.
    auto cause = [](const RankExit& e) { return !e.exited && e.signal != SIGPIPE ? 2 : e.exited ? 1 : 0; };
    for (int r : g.poll()) {
      if (!failed(g.exits[r])) continue;
      if (failed_rank < 0 || (failed_at == seconds_since_marker && cause(g.exits[r]) > cause(g.exits[failed_rank]))) {
        failed_rank = r;
        failed_at = seconds_since_marker;
      }
    }
    if (failed_rank >= 0 && failed_at == seconds_since_marker) failed_at = seconds_since(start);
    if (failed_rank >= 0 || g.running().empty()) break;
    if (Clock::now() >= deadline) {
      res.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(kPollInterval);
  }

  if (res.timed_out) {
    std::vector<int> stopped = g.stop();
    res.ranks = g.exits;
    double limit = std::chrono::duration<double>(req.timeout).count();
    res.message = "timeout after " + fmt_seconds(limit) + "; " + join_ranks(stopped) +
                  " still running (stopped by the launcher)";
    if (!stopped.empty())
      res.message += tail_section("rank " + std::to_string(stopped[0]), logs[stopped[0]]);
    return res;
  }
  if (failed_rank >= 0) {
    std::vector<int> stopped = g.stop();
    res.ranks = g.exits;
    res.first_failed_rank = failed_rank;
    res.message = "rank " + std::to_string(failed_rank) + " " +
                  how_it_ended(g.exits[failed_rank], failed_at);
    if (!stopped.empty()) res.message += "; " + join_ranks(stopped) + " still running (stopped by the launcher)";
    res.message += tail_section("rank " + std::to_string(failed_rank), logs[failed_rank]);
    return res;
  }
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

// The failing rank named in an mpirun log, or -1.
int failed_rank_in_mpirun_log(const std::string& log, int world) {
  int r = find_rank_after(log, "gradcert rank ", ':', world);
  if (r >= 0) return r;
  // mpirun's own report: "Process name: [[12345,1],1]".
  size_t pos = log.find("Process name: [[");
  if (pos == std::string::npos) return -1;
  size_t comma = log.find("],", pos);
  if (comma == std::string::npos || comma - pos > 64) return -1;
  return find_rank_after(log.substr(comma), "],", ']', world);
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
  int fd = open_log(log);

  Group g;
  g.pids.assign(1, -1);
  g.exits.resize(1);
  g.exits[0].rank = -1;

  LaunchResult res;
  const auto start = Clock::now();
  pid_t pid = spawn(argv_c.data(), env_c.data(), fd, 0, ::getpid());
  int fork_err = errno;
  ::close(fd);
  if (pid < 0) {
    res.message = std::string("fork failed for mpirun: ") + std::strerror(fork_err);
    return res;
  }
  g.pgid = pid;
  g.pids[0] = pid;

  const auto deadline = start + req.timeout;
  for (;;) {
    g.poll();
    if (g.running().empty()) break;
    if (Clock::now() >= deadline) {
      res.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  const double elapsed = seconds_since(start);
  if (res.timed_out) g.stop();

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
                  " still running under mpirun (stopped by the launcher)" + tail_section("mpirun", log);
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
  res.message += tail_section("mpirun", log);
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
  return request.kind == LauncherKind::Mpirun ? launch_mpirun(request) : launch_local(request);
}

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
  if (data.empty()) return "";
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

std::pair<int, int> rank_and_world_from_env() {
  if (std::getenv("GRADCERT_RANK")) return rank_world_from("GRADCERT_RANK", "GRADCERT_WORLD");
  if (std::getenv("OMPI_COMM_WORLD_RANK"))
    return rank_world_from("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  throw std::runtime_error(
      "no rank in the environment: set GRADCERT_RANK and GRADCERT_WORLD or start under mpirun");
}

}  // namespace gradcert
