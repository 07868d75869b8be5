// The mpirun launcher: one mpirun for all ranks; the failing rank read from mpirun's log.
#include "conformance/launch/rank_group.hpp"

#include <fcntl.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace gradcert::launch_detail {
namespace {

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

// mpirun's own argv: one process per rank, each rank's variables passed with -x.
std::vector<std::string> mpirun_argv(const LaunchRequest& req) {
  std::vector<std::string> argv = {"mpirun",
                                   "-np",
                                   std::to_string(req.world),
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "--bind-to",
                                   "none",
                                   "-x",
                                   "GRADCERT_WORLD=" + std::to_string(req.world)};
  for (const auto& kv : req.env) {
    argv.push_back("-x");
    argv.push_back(kv.first + "=" + kv.second);
  }
  for (const auto& a : req.argv) argv.push_back(a);
  return argv;
}

// mpirun's environment: the request's variables, root allowed.
std::vector<std::string> mpirun_env(const LaunchRequest& req) {
  std::vector<std::pair<std::string, std::string>> overrides;
  for (const auto& kv : req.env) overrides.emplace_back(kv.first, kv.second);
  overrides.emplace_back("GRADCERT_WORLD", std::to_string(req.world));
  overrides.emplace_back("OMPI_ALLOW_RUN_AS_ROOT", "1");
  overrides.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  // An inherited GRADCERT_RANK would override the rank mpirun gives each process.
  return build_env(overrides, {"GRADCERT_RANK"});
}

// The result once mpirun ended (or was stopped): every rank carries mpirun's outcome (it reports
// no per-rank status); the failing rank is read from its log.
LaunchResult mpirun_outcome(const LaunchRequest& req, LaunchResult res, const RankExit& m, double elapsed,
                            const std::string& log, const Logs& capped) {
  const int world = req.world;
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
    res.message = "mpirun: all " + std::to_string(world) + " ranks exited with code 0 after " + fmt_seconds(elapsed);
    return res;
  }
  res.first_failed_rank = failed_rank_in_mpirun_log(read_file(log), world);
  std::string how =
      m.exited ? "mpirun exited with code " + std::to_string(m.code)
               : "mpirun was killed by signal " + std::to_string(m.signal) + " (" + signal_name(m.signal) + ")";
  how += " after " + fmt_seconds(elapsed);
  if (res.first_failed_rank >= 0)
    res.message = "rank " + std::to_string(res.first_failed_rank) + " failed under mpirun (" + how + ")";
  else
    res.message = how;
  res.message += tail_section("mpirun", log, capped);
  return res;
}

}  // namespace

LaunchResult launch_mpirun(const LaunchRequest& req) {
  const int world = req.world;
  std::vector<std::string> argv_s = mpirun_argv(req), env_s = mpirun_env(req);
  std::vector<char*> argv_c = c_array(argv_s), env_c = c_array(env_s);

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
  return mpirun_outcome(req, res, g.exits[0], elapsed, log, capped);
}

}  // namespace gradcert::launch_detail
