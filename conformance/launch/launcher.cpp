// The local (fork/exec) launcher of rank processes and the launch API (launcher.hpp); the
// mpirun launcher is mpirun_launcher.cpp, the machinery both share rank_group.hpp.
#include "conformance/launch/launcher.hpp"

#include "conformance/launch/rank_group.hpp"
#include "conformance/launch/zygote.hpp"
#include "conformance/core/files.hpp"

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

#include <nlohmann/json.hpp>

extern char** environ;

namespace gradcert {
using namespace launch_detail;
namespace {

extern "C" void record_interrupt(int sig) { g_interrupt.store(sig); }

void validate(const LaunchRequest& req) {
  if (req.world < 1) throw std::invalid_argument("launch: world must be >= 1");
  if (req.argv.empty() || req.argv[0].empty()) throw std::invalid_argument("launch: argv is empty");
  if (req.log_dir.empty()) throw std::invalid_argument("launch: log_dir is empty");
  std::error_code ec;
  std::filesystem::create_directories(req.log_dir, ec);
  if (ec) throw std::runtime_error("launch: cannot create log_dir " + req.log_dir + ": " + ec.message());
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
  if (!wv) throw std::runtime_error(std::string(rank_var) + " is set but " + world_var + " is not");
  int rank = parse_int_var(rank_var, rv);
  int world = parse_int_var(world_var, wv);
  if (world < 1) throw std::runtime_error(std::string(world_var) + "=" + wv + " is invalid: must be >= 1");
  if (rank < 0 || rank >= world)
    throw std::runtime_error(std::string(rank_var) + "=" + rv + " is out of range for " + world_var + "=" + wv);
  return {rank, world};
}

}  // namespace

namespace launch_detail {
namespace {

// Everything the children need, built before the first fork: argv, each rank's environment and
// log, the write ends of the log pipes (NOTE [log cap]).
struct RankSetup {
  std::vector<std::string> argv_s;
  std::vector<char*> argv_c;
  std::vector<std::vector<std::string>> envs;
  std::vector<std::vector<char*>> envs_c;
  std::vector<std::string> logs;
  std::vector<int> fds;
  void close_fds() {
    for (int& fd : fds)
      if (fd >= 0) ::close(fd), fd = -1;
  }
};

void prepare_ranks(const LaunchRequest& req, Logs& capped, RankSetup& s) {
  const int world = req.world;
  std::vector<std::pair<std::string, std::string>> base;
  for (const auto& kv : req.env) base.emplace_back(kv.first, kv.second);
  if (req.rank_env) base.emplace_back("GRADCERT_WORLD", std::to_string(world));
  s.argv_s = req.argv;
  s.argv_c = c_array(s.argv_s);
  s.envs.resize(world);
  s.envs_c.resize(world);
  s.logs.resize(world);
  s.fds.assign(world, -1);
  try {
    for (int r = 0; r < world; ++r) {
      auto overrides = base;
      if (req.rank_env) overrides.emplace_back("GRADCERT_RANK", std::to_string(r));
      s.envs[r] = req.rank_env ? build_env(overrides) : build_env(overrides, {"GRADCERT_RANK", "GRADCERT_WORLD"});
      s.envs_c[r] = c_array(s.envs[r]);
      s.logs[r] = req.log_dir + "/rank" + std::to_string(r) + ".log";
      s.fds[r] = capped.add(s.logs[r]);
    }
  } catch (...) {
    s.close_fds();
    throw;
  }
}

// Starts every rank in one process group (rank 0 leads it); the error text of a failed fork.
std::string start_ranks(RankSetup& s, Group& g) {
  const pid_t self = ::getpid();
  for (int r = 0; r < static_cast<int>(s.fds.size()); ++r) {
    // A built-in rank comes from the zygote when one runs (NOTE [zygote]), else fork/exec.
    pid_t pid = zygote_spawn(s.argv_c.data(), s.envs_c[r].data(), s.fds[r], r == 0 ? 0 : g.pgid);
    if (pid > 0)
      ::setpgid(pid, r == 0 ? pid : g.pgid);  // also done in the child, as in spawn
    else
      pid = spawn(s.argv_c.data(), s.envs_c[r].data(), s.fds[r], r == 0 ? 0 : g.pgid, self);
    if (pid < 0) return "fork failed for rank " + std::to_string(r) + ": " + std::strerror(errno);
    if (r == 0) g.pgid = pid;
    g.track(static_cast<size_t>(r), pid);
  }
  return "";
}

// NOTE [rank handles] Once every rank has started, <log_dir>/ranks.json names each rank's pid and
// log and the ranks' process group, so that a tool outside gradcert can find a rank to stop, kill
// or trace (its output reaches its log through gradcert's pipe, NOTE [log cap], so no tool finds
// it by an open file). The local launcher only: under mpirun the ranks are mpirun's children.
// Best effort: a launch does not fail for it (a full disk is found by what the ranks write).
void write_rank_handles(const LaunchRequest& req, const Group& g, const RankSetup& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < g.pids.size(); ++r) ranks.push_back({{"rank", r}, {"pid", g.pids[r]}, {"log", s.logs[r]}});
  try {
    write_file_atomic(req.log_dir + "/ranks.json",
                      nlohmann::json{{"schema", "gradcert.ranks/1"}, {"pgid", g.pgid}, {"ranks", ranks}}.dump(1));
  } catch (const std::exception&) {}
}

// The rank that hit the full disk need not be the rank blamed (NOTE [disk full], continued: its
// peer's "Connection reset" may be reaped first); its log's tail joins the message ("" : none).
std::string full_disk_tail(const std::string& message, const RankSetup& s, const Logs& capped) {
  constexpr const char* kFull = "No space left on device";
  if (message.find(kFull) != std::string::npos) return "";
  for (size_t r = 0; r < s.logs.size(); ++r)
    if (const CappedLog* l = capped.find(s.logs[r]); l && l->recent.find(kFull) != std::string::npos)
      return tail_section("rank " + std::to_string(r) + " (it hit a full disk)", s.logs[r], capped);
  return "";
}

// How the ranks ended, as the poll loop saw it.
struct Watched {
  bool interrupted = false, timed_out = false;
  int failed_rank = -1;
  double failed_at = 0;
  std::vector<double> left_at;  // a rank that exited 0 while peers still ran
};

Watched watch_ranks(Group& g, int world, Clock::time_point deadline) {
  Watched w;
  w.left_at.assign(world, -1);
  constexpr double seconds_since_marker = -1;  // failed_at while this poll's candidates are compared
  for (;;) {
    if (g_interrupt.load()) {
      w.interrupted = true;
      return w;
    }
    // NOTE [blame] Of the ranks found ended in one poll, blame the one whose end is a cause,
    // not a symptom: killed by a signal (other than SIGPIPE) before an error exit, and either
    // before SIGPIPE (a write to a dead peer's socket). Reaping order is slot order, so without
    // this a healthy rank 0 that died of its peer's death would be blamed.
    auto cause = [](const RankExit& e) { return !e.exited && e.signal != SIGPIPE ? 2 : e.exited ? 1 : 0; };
    const std::vector<int> reaped = g.poll();
    for (int r : reaped) {
      if (!failed(g.exits[r])) continue;
      if (w.failed_rank < 0 ||
          (w.failed_at == seconds_since_marker && cause(g.exits[r]) > cause(g.exits[w.failed_rank]))) {
        w.failed_rank = r;
        w.failed_at = seconds_since_marker;
      }
    }
    if (w.failed_rank >= 0 && w.failed_at == seconds_since_marker) w.failed_at = seconds_since(g.start);
    if (w.failed_rank < 0 && !g.running().empty())
      for (int r : reaped) w.left_at[r] = seconds_since(g.start);
    if (w.failed_rank >= 0 || g.running().empty()) return w;
    if (Clock::now() >= deadline) {
      w.timed_out = true;
      return w;
    }
    g.wait(kPollInterval);
  }
}

// (NOTE [blame], continued) What a peer's failure or the timeout followed is blamed before it:
// a rank still stopped (SIGSTOP: its peers wait in a collective until its timeout), then a
// rank that exited 0 while its peers still ran (it left them in a collective, and they fail
// with "Connection reset by peer"). Ranks leave together, not one by one: a built-in rank's
// last act is a barrier after every file is written (conformance/run/worker.cpp).
std::pair<int, std::string> first_cause(const Group& g, const std::vector<double>& left_at) {
  const int world = static_cast<int>(left_at.size());
  int cause_rank = -1;
  for (int r = 0; r < world; ++r)
    if (g.stopped_at[r] >= 0 && (cause_rank < 0 || g.stopped_at[r] < g.stopped_at[cause_rank])) cause_rank = r;
  if (cause_rank >= 0)
    return {cause_rank, "rank " + std::to_string(cause_rank) + " was stopped (" +
                            signal_name(g.stop_signal[cause_rank]) + ") after " +
                            fmt_seconds(g.stopped_at[cause_rank]) + " and did not continue"};
  for (int r = 0; r < world; ++r)
    if (left_at[r] >= 0 && (cause_rank < 0 || left_at[r] < left_at[cause_rank])) cause_rank = r;
  if (cause_rank < 0) return {-1, ""};
  return {cause_rank, "rank " + std::to_string(cause_rank) + " exited 0 after " + fmt_seconds(left_at[cause_rank]) +
                          " before the run finished (its peers were still running)"};
}

}  // namespace

LaunchResult launch_local(const LaunchRequest& req) {
  const int world = req.world;
  Logs capped;
  RankSetup setup;
  prepare_ranks(req, capped, setup);
  Group g;
  g.resize(world);
  g.logs = &capped;
  for (int r = 0; r < world; ++r) g.exits[r].rank = r;

  LaunchResult res;
  const auto start = g.start;
  if (std::string error = start_ranks(setup, g); !error.empty()) {
    setup.close_fds();
    g.stop();
    kill_descendants();
    capped.finish();
    res.ranks = g.exits;
    res.message = error;
    return res;
  }
  setup.close_fds();
  write_rank_handles(req, g, setup);  // NOTE [rank handles]
  const Watched w = watch_ranks(g, world, start + req.timeout);
  if (w.interrupted) return interrupted_result(g, capped, "");
  const auto [cause_rank, cause_text] = first_cause(g, w.left_at);
  res.timed_out = w.timed_out;
  if (w.timed_out || w.failed_rank >= 0) {
    std::vector<int> stopped = g.stop();
    const int leftovers = kill_descendants();
    capped.finish();
    res.ranks = g.exits;
    if (w.timed_out) {
      res.first_failed_rank = cause_rank;
      res.message = "timeout after " + fmt_seconds(std::chrono::duration<double>(req.timeout).count()) + "; ";
      if (cause_rank >= 0) res.message += cause_text + "; ";
      res.message += join_ranks(stopped) + " still running (stopped by the launcher)" + leftovers_text(leftovers);
      if (!stopped.empty())
        res.message += tail_section("rank " + std::to_string(stopped[0]), setup.logs[stopped[0]], capped);
      return res;
    }
    res.first_failed_rank = cause_rank >= 0 ? cause_rank : w.failed_rank;
    const std::string failure =
        "rank " + std::to_string(w.failed_rank) + " " + how_it_ended(g.exits[w.failed_rank], w.failed_at);
    res.message = cause_rank >= 0 ? cause_text + "; then " + failure : failure;
    if (!stopped.empty()) res.message += "; " + join_ranks(stopped) + " still running (stopped by the launcher)";
    res.message += leftovers_text(leftovers);
    res.message += tail_section("rank " + std::to_string(w.failed_rank), setup.logs[w.failed_rank], capped);
    res.message += full_disk_tail(res.message, setup, capped);
    return res;
  }
  kill_descendants();
  capped.finish();
  res.ranks = g.exits;
  res.ok = true;
  res.message = "all " + std::to_string(world) + " ranks exited with code 0 after " + fmt_seconds(seconds_since(start));
  return res;
}

}  // namespace launch_detail

LaunchResult launch(const LaunchRequest& request) {
  validate(request);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // NOTE [orphans]
  return request.kind == LauncherKind::Mpirun ? launch_mpirun(request) : launch_local(request);
}

void install_interrupt_handlers() {
  struct sigaction sa{};
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
  if (std::getenv("OMPI_COMM_WORLD_RANK")) return rank_world_from("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  throw std::runtime_error("no rank in the environment: set GRADCERT_RANK and GRADCERT_WORLD or start under mpirun");
}

}  // namespace gradcert
