// Tests for the local and mpirun launchers, using /bin/sh scripts as ranks.
#include "conformance/launch/launcher.hpp"
#include "conformance/launch/zygote.hpp"
#include "conformance/tests/temp_dirs.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace gradcert {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string fresh_dir(const std::string& name) {
  std::string tmpl = (fs::temp_directory_path() / ("gradcert_launcher_" + name + "_XXXXXX")).string();
  char* made = mkdtemp(tmpl.data());
  if (!made) throw std::runtime_error("mkdtemp failed");
  test::track_dir(made);                      // removed when the test passes
  return std::string(made) + "/logs/nested";  // launch must create it
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

LaunchRequest sh_request(int world, const std::string& script, const std::string& name) {
  LaunchRequest req;
  req.world = world;
  req.argv = {"/bin/sh", "-c", script};
  req.log_dir = fresh_dir(name);
  req.timeout = std::chrono::seconds(20);
  return req;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Saves and restores the rank variables around a test.
class EnvGuard {
 public:
  EnvGuard() {
    for (const char* k : kVars) {
      const char* v = std::getenv(k);
      saved_.emplace_back(k, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(k);
    }
  }
  ~EnvGuard() {
    for (auto& [k, v] : saved_) {
      if (v)
        setenv(k.c_str(), v->c_str(), 1);
      else
        unsetenv(k.c_str());
    }
  }

 private:
  static constexpr const char* kVars[] = {"GRADCERT_RANK", "GRADCERT_WORLD", "OMPI_COMM_WORLD_RANK",
                                          "OMPI_COMM_WORLD_SIZE"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

bool mpirun_on_path() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

TEST(Launcher, AllRanksExitZero) {
  auto req = sh_request(3, "echo rank=$GRADCERT_RANK world=$GRADCERT_WORLD extra=$EXTRA", "ok");
  req.env["EXTRA"] = "hello";
  LaunchResult res = launch(req);
  EXPECT_TRUE(res.ok) << res.message;
  EXPECT_FALSE(res.timed_out);
  EXPECT_EQ(res.first_failed_rank, -1);
  ASSERT_EQ(res.ranks.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(res.ranks[r].exited);
    EXPECT_EQ(res.ranks[r].code, 0);
    EXPECT_FALSE(res.ranks[r].killed_by_launcher);
    std::string log = slurp(req.log_dir + "/rank" + std::to_string(r) + ".log");
    EXPECT_TRUE(contains(log, "rank=" + std::to_string(r) + " world=3 extra=hello")) << log;
  }
}

// Issue 36 item 8 (NOTE [rank handles]): ranks.json names each running rank's pid and log, so a
// tool outside gradcert finds a rank to stop or kill; each rank here reads it and finds its own pid.
TEST(Launcher, RanksJsonNamesEachRanksPidAndLog) {
  auto req = sh_request(2,
                        "i=0; while [ ! -s \"$LOGDIR/ranks.json\" ] && [ $i -lt 200 ]; do sleep 0.02; i=$((i+1)); "
                        "done; echo pid=$$; cat \"$LOGDIR/ranks.json\"",
                        "handles");
  req.env["LOGDIR"] = req.log_dir;
  LaunchResult res = launch(req);
  ASSERT_TRUE(res.ok) << res.message;
  const auto j = nlohmann::json::parse(slurp(req.log_dir + "/ranks.json"));
  EXPECT_EQ(j["schema"], "gradcert.ranks/1");
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const std::string log = slurp(req.log_dir + "/rank" + std::to_string(r) + ".log");
    EXPECT_TRUE(contains(log, "pid=" + std::to_string(j["ranks"][r]["pid"].get<int>()) + "\n")) << log;
    EXPECT_EQ(j["ranks"][r]["log"], req.log_dir + "/rank" + std::to_string(r) + ".log");
  }
  EXPECT_EQ(j["pgid"], j["ranks"][0]["pid"]);  // rank 0 leads the ranks' process group
}

// A failure message (NOTE [disk full]) holding a write that failed with ENOSPC gets a first line
// naming it, the file and its filesystem (gradcert's writers and Python's OSError alike).
TEST(Launcher, AFullDiskIsNamedFirst) {
  const std::string ours = "rank 0 exited with code 2\n--- rank 0 log tail ---\ngradcert rank 0: error: "
                           "/tmp/nowhere/u2.params.safetensors.tmp.31: cannot write: No space left on device";
  const std::string a = name_full_disk(ours);
  EXPECT_EQ(
      a.rfind("the disk is full (ENOSPC): writing /tmp/nowhere/u2.params.safetensors.tmp.31 failed on filesystem /", 0),
      0u)
      << a;
  EXPECT_NE(a.find(" free of "), std::string::npos) << a;
  EXPECT_NE(a.find("\n" + ours), std::string::npos) << a;
  const std::string b = name_full_disk("OSError: [Errno 28] No space left on device: '/tmp/nowhere/rank1.json'");
  EXPECT_EQ(b.rfind("the disk is full (ENOSPC): writing /tmp/nowhere/rank1.json failed on filesystem /", 0), 0u) << b;
  EXPECT_EQ(name_full_disk("rank 1 exited with code 3"), "rank 1 exited with code 3");
}

TEST(Launcher, KilledRankStopsTheOthers) {
  auto req = sh_request(2, "if [ $GRADCERT_RANK = 1 ]; then sleep 0.3; kill -9 $$; fi; sleep 60", "kill");
  auto t0 = Clock::now();
  LaunchResult res = launch(req);
  double wall = seconds_since(t0);
  std::printf("[ wall ] kill test: %.2f s\n", wall);
  EXPECT_FALSE(res.ok);
  EXPECT_FALSE(res.timed_out);
  EXPECT_LT(wall, 3.0);
  EXPECT_EQ(res.first_failed_rank, 1);
  EXPECT_TRUE(contains(res.message, "rank 1")) << res.message;
  EXPECT_TRUE(contains(res.message, "SIGKILL")) << res.message;
  EXPECT_TRUE(contains(res.message, "rank 0 still running (stopped by the launcher)")) << res.message;
  ASSERT_EQ(res.ranks.size(), 2u);
  EXPECT_EQ(res.ranks[1].signal, 9);
  EXPECT_FALSE(res.ranks[1].killed_by_launcher);
  EXPECT_TRUE(res.ranks[0].killed_by_launcher);
}

TEST(Launcher, ExitCodeAndLogTailInMessage) {
  auto req = sh_request(2,
                        "if [ $GRADCERT_RANK = 0 ]; then echo first line; echo 'bad thing happened' >&2; "
                        "exit 3; fi; sleep 60",
                        "code");
  auto t0 = Clock::now();
  LaunchResult res = launch(req);
  std::printf("[ wall ] exit-code test: %.2f s\n", seconds_since(t0));
  EXPECT_FALSE(res.ok);
  EXPECT_EQ(res.first_failed_rank, 0);
  EXPECT_TRUE(contains(res.message, "rank 0")) << res.message;
  EXPECT_TRUE(contains(res.message, "code 3")) << res.message;
  EXPECT_TRUE(contains(res.message, "--- rank 0 log tail ---")) << res.message;
  EXPECT_TRUE(contains(res.message, "bad thing happened")) << res.message;
  EXPECT_EQ(res.message.find('\n'), res.message.find("\n--- rank 0 log tail")) << res.message;
  ASSERT_EQ(res.ranks.size(), 2u);
  EXPECT_TRUE(res.ranks[0].exited);
  EXPECT_EQ(res.ranks[0].code, 3);
  EXPECT_TRUE(res.ranks[1].killed_by_launcher);
}

TEST(Launcher, TimeoutStopsAllRanks) {
  auto req = sh_request(2, "sleep 60", "timeout");
  req.timeout = std::chrono::milliseconds(500);
  auto t0 = Clock::now();
  LaunchResult res = launch(req);
  double wall = seconds_since(t0);
  std::printf("[ wall ] timeout test: %.2f s\n", wall);
  EXPECT_FALSE(res.ok);
  EXPECT_TRUE(res.timed_out);
  EXPECT_LT(wall, 5.0);
  EXPECT_TRUE(contains(res.message, "timeout")) << res.message;
  EXPECT_TRUE(contains(res.message, "ranks 0, 1 still running")) << res.message;
  ASSERT_EQ(res.ranks.size(), 2u);
  EXPECT_TRUE(res.ranks[0].killed_by_launcher);
  EXPECT_TRUE(res.ranks[1].killed_by_launcher);
}

TEST(Launcher, TimeoutKillsRanksIgnoringSigterm) {
  auto req = sh_request(1, "trap '' TERM; while :; do sleep 0.05; done", "ignore_term");
  req.timeout = std::chrono::milliseconds(300);
  auto t0 = Clock::now();
  LaunchResult res = launch(req);
  double wall = seconds_since(t0);
  std::printf("[ wall ] SIGTERM-ignoring timeout test: %.2f s\n", wall);
  EXPECT_TRUE(res.timed_out);
  EXPECT_LT(wall, 4.0);
  ASSERT_EQ(res.ranks.size(), 1u);
  EXPECT_EQ(res.ranks[0].signal, 9);
}

TEST(Launcher, MissingExecutableReportsExit127) {
  LaunchRequest req;
  req.world = 1;
  req.argv = {"/nonexistent/gradcert_no_such_binary"};
  req.log_dir = fresh_dir("noexec");
  LaunchResult res = launch(req);
  EXPECT_FALSE(res.ok);
  EXPECT_EQ(res.first_failed_rank, 0);
  EXPECT_TRUE(contains(res.message, "code 127")) << res.message;
  EXPECT_TRUE(contains(res.message, "gradcert_no_such_binary")) << res.message;
}

TEST(Launcher, RankAndWorldFromEnv) {
  EnvGuard guard;
  EXPECT_THROW(rank_and_world_from_env(), std::runtime_error);
  try {
    rank_and_world_from_env();
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "GRADCERT_RANK")) << e.what();
  }

  setenv("GRADCERT_RANK", "1", 1);
  setenv("GRADCERT_WORLD", "4", 1);
  EXPECT_EQ(rank_and_world_from_env(), std::make_pair(1, 4));

  // GRADCERT_* wins over OMPI_*.
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  EXPECT_EQ(rank_and_world_from_env(), std::make_pair(1, 4));
  unsetenv("GRADCERT_RANK");
  unsetenv("GRADCERT_WORLD");
  EXPECT_EQ(rank_and_world_from_env(), std::make_pair(2, 3));
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");

  auto expect_error = [](const char* rank, const char* world, const std::string& needle) {
    setenv("GRADCERT_RANK", rank, 1);
    if (world)
      setenv("GRADCERT_WORLD", world, 1);
    else
      unsetenv("GRADCERT_WORLD");
    try {
      auto rw = rank_and_world_from_env();
      ADD_FAILURE() << "no error for rank=" << rank << " world=" << (world ? world : "(unset)") << ", got " << rw.first
                    << "/" << rw.second;
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(contains(e.what(), needle)) << e.what();
    }
  };
  expect_error("abc", "2", "GRADCERT_RANK='abc'");
  expect_error("1x", "2", "GRADCERT_RANK='1x'");
  expect_error("", "2", "GRADCERT_RANK=''");
  expect_error(" 1", "2", "GRADCERT_RANK=' 1'");
  expect_error("0", "two", "GRADCERT_WORLD='two'");
  expect_error("-1", "2", "GRADCERT_RANK=-1");
  expect_error("2", "2", "GRADCERT_RANK=2");
  expect_error("0", "0", "GRADCERT_WORLD=0");
  expect_error("0", nullptr, "GRADCERT_WORLD");
  expect_error("99999999999", "2", "GRADCERT_RANK='99999999999'");

  unsetenv("GRADCERT_RANK");
  unsetenv("GRADCERT_WORLD");
  setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  try {
    rank_and_world_from_env();
    ADD_FAILURE() << "no error for OMPI rank 5 of 2";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "OMPI_COMM_WORLD_RANK=5")) << e.what();
  }
}

TEST(Launcher, FreeLocalPort) {
  int port = free_local_port();
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
}

TEST(Launcher, FileTail) {
  std::string dir = fresh_dir("tail");
  fs::create_directories(dir);
  std::string path = dir + "/f.txt";
  {
    std::ofstream out(path);
    for (int i = 1; i <= 30; ++i) out << "line " << i << "\n";
  }
  std::string tail = file_tail(path, 3);
  EXPECT_EQ(tail, "line 28\nline 29\nline 30\n");
  EXPECT_EQ(file_tail(path, 100).substr(0, 7), "line 1\n");
  EXPECT_EQ(file_tail(dir + "/missing.txt"), "");
  EXPECT_EQ(file_tail(path, 0), "");
}

TEST(Launcher, MpirunAllRanksOk) {
  if (!mpirun_on_path()) GTEST_SKIP() << "mpirun is not on PATH";
  auto req = sh_request(2, "echo r=$OMPI_COMM_WORLD_RANK w=$GRADCERT_WORLD x=$EXTRA", "mpi_ok");
  req.kind = LauncherKind::Mpirun;
  req.env["EXTRA"] = "yes";
  LaunchResult res = launch(req);
  EXPECT_TRUE(res.ok) << res.message;
  std::string log = slurp(req.log_dir + "/mpirun.log");
  EXPECT_TRUE(contains(log, "r=0 w=2 x=yes")) << log;
  EXPECT_TRUE(contains(log, "r=1 w=2 x=yes")) << log;
}

TEST(Launcher, MpirunNamesFailingRank) {
  if (!mpirun_on_path()) GTEST_SKIP() << "mpirun is not on PATH";
  auto req = sh_request(2,
                        "if [ $OMPI_COMM_WORLD_RANK = 1 ]; then echo \"gradcert rank 1: boom\" >&2; "
                        "exit 2; fi; sleep 30",
                        "mpi_fail");
  req.kind = LauncherKind::Mpirun;
  auto t0 = Clock::now();
  LaunchResult res = launch(req);
  double wall = seconds_since(t0);
  std::printf("[ wall ] mpirun failure test: %.2f s\n", wall);
  EXPECT_FALSE(res.ok);
  EXPECT_FALSE(res.timed_out) << res.message;
  EXPECT_LT(wall, 20.0);
  EXPECT_EQ(res.first_failed_rank, 1) << res.message;
  EXPECT_TRUE(contains(res.message, "rank 1")) << res.message;
  EXPECT_TRUE(contains(res.message, "gradcert rank 1: boom")) << res.message;
}

// (issue 13, item 10) A rank that exits 0 while its peer still runs left the peer in a collective
// ("Connection reset by peer"); the peer's error exit used to be blamed.
TEST(Launcher, RankThatExitsZeroEarlyIsBlamed) {
  auto req = sh_request(2,
                        "if [ $GRADCERT_RANK = 1 ]; then sleep 0.3; exit 0; fi; sleep 1; "
                        "echo 'gradcert rank 0: error: Connection reset by peer' >&2; exit 2",
                        "left");
  LaunchResult res = launch(req);
  EXPECT_FALSE(res.ok);
  EXPECT_EQ(res.first_failed_rank, 1) << res.message;
  EXPECT_EQ(res.message.rfind("rank 1 exited 0 after 0.", 0), 0u) << res.message;
  EXPECT_TRUE(contains(res.message, " s before the run finished (its peers were still running); then rank 0 exited "
                                    "with code 2 after 1."))
      << res.message;
  EXPECT_TRUE(contains(res.message, "Connection reset by peer")) << res.message;
}

// (item 10) A stopped rank (SIGSTOP) leaves its peers waiting until their collective timeout;
// the peer's timeout error used to be blamed. The stopped rank is seen (WUNTRACED) and named.
TEST(Launcher, StoppedRankIsBlamed) {
  auto req = sh_request(2, "if [ $GRADCERT_RANK = 1 ]; then kill -STOP $$; sleep 60; fi; sleep 1; exit 2", "stopped");
  auto t0 = Clock::now();
  LaunchResult res = launch(req);
  EXPECT_LT(seconds_since(t0), 5.0) << "a stopped rank is continued to take its SIGTERM";
  EXPECT_EQ(res.first_failed_rank, 1) << res.message;
  EXPECT_EQ(res.message.rfind("rank 1 was stopped (SIGSTOP) after 0.", 0), 0u) << res.message;
  EXPECT_TRUE(contains(res.message, " and did not continue; then rank 0 exited with code 2")) << res.message;

  auto hung = sh_request(2, "if [ $GRADCERT_RANK = 1 ]; then kill -STOP $$; fi; sleep 60", "stopped_timeout");
  hung.timeout = std::chrono::seconds(1);
  res = launch(hung);
  EXPECT_TRUE(res.timed_out);
  EXPECT_EQ(res.first_failed_rank, 1) << res.message;
  EXPECT_EQ(res.message.rfind("timeout after 1.0 s; rank 1 was stopped (SIGSTOP) after 0.", 0), 0u) << res.message;
}

// (item 12) A chatty rank's log had no cap (1.5 GB); now its first and last MiB are kept.
TEST(Launcher, LogsKeepTheirFirstAndLastMiB) {
  auto req = sh_request(1, "echo FIRST; head -c 20000000 /dev/zero | tr '\\0' x; echo; echo LAST", "chatty");
  auto t0 = Clock::now();
  LaunchResult res = launch(req);
  std::printf("[ wall ] 20 MB of output: %.2f s\n", seconds_since(t0));
  EXPECT_TRUE(res.ok) << res.message;
  const std::string log = slurp(req.log_dir + "/rank0.log");
  const uint64_t printed = 6 + 20000000 + 1 + 5;
  const std::string marker = "\n[... " + std::to_string(printed - (2u << 20)) + " bytes cut ...]\n";
  EXPECT_EQ(log.size(), (2u << 20) + marker.size());
  EXPECT_EQ(log.substr(0, 6), "FIRST\n");
  EXPECT_EQ(log.substr(log.size() - 6), "\nLAST\n");
  EXPECT_EQ(log.substr(1 << 20, marker.size()), marker);
}

// (item 11) A process the command starts in the background, in its group or in a session of
// its own (setsid), outlived the launch; the launcher is a subreaper and kills them all.
TEST(Launcher, NoProcessOfTheCommandOutlivesTheLaunch) {
  auto req = sh_request(1, "", "orphans");
  const std::string pids = req.log_dir + "/../pids";
  req.argv[2] = "sleep 1000 & echo $! > " + pids + "; setsid sleep 1000 & echo $! >> " + pids + "; sleep 0.2";
  LaunchResult res = launch(req);
  EXPECT_TRUE(res.ok) << res.message;
  std::ifstream in(pids);
  int n = 0;
  for (pid_t pid; in >> pid; ++n) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    const bool alive = paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] != 'Z';
    EXPECT_FALSE(alive) << "process " << pid << " outlived the launch: " << line;
  }
  EXPECT_EQ(n, 2);
}

TEST(Launcher, MpirunNamesKilledRankFromMpirunsOwnReport) {
  if (!mpirun_on_path()) GTEST_SKIP() << "mpirun is not on PATH";
  // Rank 0 prints its symptom first; mpirun's report names the rank that died.
  auto req = sh_request(2,
                        "if [ $OMPI_COMM_WORLD_RANK = 1 ]; then sleep 0.5; kill -9 $$; fi; "
                        "echo 'gradcert rank 0: error: Connection reset by peer' >&2; sleep 30",
                        "mpi_killed");
  req.kind = LauncherKind::Mpirun;
  LaunchResult res = launch(req);
  EXPECT_FALSE(res.ok);
  EXPECT_EQ(res.first_failed_rank, 1) << res.message;
  EXPECT_EQ(res.message.rfind("rank 1 failed under mpirun", 0), 0u) << res.message;
  EXPECT_TRUE(contains(res.message, "noticed that process rank 1 with PID")) << res.message;
}

// What a rank forked from the test's zygote runs: says who it is; in a "fail" launch rank 1 exits 3
// while rank 0 waits.
int zygote_test_entry(int argc, char** argv) {
  const char* rank = std::getenv("GRADCERT_RANK");
  std::printf("entry rank=%s arg=%s\n", rank ? rank : "?", argc > 2 ? argv[2] : "?");
  const bool fail = argc > 2 && std::string(argv[2]) == "fail";
  if (fail && rank && std::string(rank) == "0") ::sleep(10);  // still running when rank 1 fails
  return fail && rank && std::string(rank) == "1" ? 3 : 0;
}

// Ranks forked from the zygote (NOTE [zygote]) are this process's children (launch reaps them, names a
// failing rank, caps their logs) with their own environment and stdout; once it is gone,
// zygote_spawn says so (-1) and the launcher would fork/exec. Run in a forked helper, which has
// one thread (start_zygote refuses a process with more) and becomes a child subreaper.
TEST(Launcher, ZygoteForksRanksAsChildrenAndIsGivenUpOnceItDies) {
  const std::string dir = fresh_dir("zygote");
  const std::string report = fs::path(dir).parent_path().parent_path().string() + "/zygote_report.txt";
  const pid_t helper = ::fork();
  ASSERT_GE(helper, 0);
  if (helper == 0) {
    ::alarm(60);
    auto fail = [&](int code, const std::string& why) {
      std::ofstream(report) << why << std::endl;
      ::_exit(code);
    };
    if (!start_zygote(zygote_test_entry)) fail(10, "start_zygote refused a one-thread process");
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    const std::string exe = fs::read_symlink("/proc/self/exe").string();
    LaunchRequest req;
    req.world = 2;
    req.argv = {exe, "worker", "hello"};
    req.log_dir = dir;
    req.timeout = std::chrono::seconds(20);
    const LaunchResult ok = launch(req);
    if (!ok.ok) fail(11, "launch failed: " + ok.message);
    for (int r = 0; r < 2; ++r) {
      const std::string log = slurp(dir + "/rank" + std::to_string(r) + ".log");
      if (log.find("forked from the zygote") == std::string::npos ||
          log.find("entry rank=" + std::to_string(r) + " arg=hello") == std::string::npos)
        fail(12, "rank " + std::to_string(r) + " log: " + log);
    }
    req.argv = {exe, "worker", "fail"};
    const LaunchResult failed = launch(req);
    if (failed.ok || failed.first_failed_rank != 1 || failed.message.find("rank 1 exited with code 3") != 0)
      fail(13, "a rank exiting 3: " + failed.message);
    const pid_t z = zygote_pid();
    ::kill(z, SIGKILL);
    ::waitpid(z, nullptr, 0);
    std::vector<std::string> args = {exe, "worker", "hello"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    char* env[] = {nullptr};
    if (zygote_spawn(argv.data(), env, 1, 0) != -1) fail(14, "zygote_spawn did not give up on a dead zygote");
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(helper, &status, 0), helper);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "helper status " << status << ": " << slurp(report);
}

}  // namespace
}  // namespace gradcert
