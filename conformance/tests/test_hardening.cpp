// Hardening of run folders, report folders, the command line and the run nonce, end to end
// (the torch-free parts: conformance/tests/unit/test_strict_inputs.cpp, test_hardening.cpp).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "conformance/core/plan.hpp"
#include "conformance/protocol/run_folder.hpp"
#include "conformance/run/certify.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/tests/support.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

const std::string kRepo = GRADCERT_SOURCE_DIR;

std::string python() {
  const std::string venv = kRepo + "/.venv/bin/python";
  return fs::exists(venv) ? venv : "python3";
}

RunRequest fake_request(const std::string& mode, const std::string& run_dir) {
  RunRequest r;
  r.backend = kExternalBackend;
  r.world = 2;
  r.spec.timeout.run_s = 60;
  r.command = python() + " " + kRepo + "/conformance/tests/fake_external_stack.py " + mode;
  r.exe = GRADCERT_EXE;
  r.run_dir = run_dir;
  return r;
}

struct Cli {
  int code = -1;
  bool signaled = false;
  std::string out;
};

Cli run_cli(const std::string& args) {
  Cli c;
  const std::string cmd = std::string(GRADCERT_EXE) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return c;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) c.out.append(buf.data(), n);
  const int status = pclose(p);
  c.signaled = WIFSIGNALED(status);
  c.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return c;
}

std::string nested(int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

}  // namespace

// (2) Two invocations in the same second shared a folder (exists, then create_directories).
// The race is timing-dependent: 8 rounds of 32 callers released together made HEAD's
// version hand one folder to two callers in most runs (a round caught it ~1 time in 4).
TEST(HardeningReportDir, ConcurrentCallsGetDistinctFolders) {
  const std::string root = test::fresh_dir("gradcert_reportdir", "race");
  constexpr int kThreads = 32, kRounds = 8;
  std::vector<std::string> got;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::string> mine(kThreads);
    std::vector<std::thread> threads;
    std::atomic<bool> go{false};
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] {
        while (!go) std::this_thread::yield();
        mine[i] = new_report_dir(root);
      });
    go = true;
    for (auto& t : threads) t.join();
    got.insert(got.end(), mine.begin(), mine.end());
  }
  const std::set<std::string> distinct(got.begin(), got.end());
  EXPECT_EQ(distinct.size(), got.size()) << "two callers were handed one folder";
  for (const auto& d : got) EXPECT_TRUE(fs::is_directory(d)) << d;
  ASSERT_TRUE(fs::is_symlink(root + "/latest"));
  EXPECT_TRUE(distinct.count(root + "/" + fs::read_symlink(root + "/latest").string()));
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().rfind(".latest.", 0), std::string::npos) << "temporary link left";
}

// (1) A stack that exits 0 and writes nothing into a reused run folder passed on the previous
// run's files; now the folder starts empty and the run fails naming the missing manifest.
TEST(ConformanceHardeningStale, ReusedRunFolderDoesNotPassOnOldFiles) {
  const std::string dir = test::fresh_dir("gradcert_stale", "reuse") + "/runs/fake";
  const RunReport first = run_backend(fake_request("ok", dir));
  ASSERT_TRUE(first.error.empty()) << first.error;
  ASSERT_FALSE(first.checks.empty());
  const RunReport second = run_backend(fake_request("silent", dir));
  EXPECT_EQ(second.error, "bad artifacts: " + dir + "/manifest.json: cannot be read (missing?)");
  EXPECT_TRUE(second.checks.empty());
}

// (1) The nonce: a file without it, with another run's, or (3) with a float id fails the run.
TEST(ConformanceHardeningStale, FilesMustCarryThisRunsNonceAndIntegers) {
  const std::string root = test::fresh_dir("gradcert_stale", "nonce");
  const RunReport none = run_backend(fake_request("no-nonce", root + "/a"));
  EXPECT_NE(none.error.find(root + "/a/manifest.json: field 'nonce' is missing: the file was not written by this run"),
            std::string::npos)
      << none.error;
  const RunReport other = run_backend(fake_request("other-nonce", root + "/b"));
  EXPECT_NE(other.error.find(root + "/b/rank1.json: nonce \"" + std::string(32, '0') + "\" is not this run's"),
            std::string::npos)
      << other.error;
  const RunReport ids = run_backend(fake_request("float-ids", root + "/c"));
  EXPECT_NE(ids.error.find(root + "/c/rank0.json updates[0]: field 'consumed[0][0]' must be an integer sample id, got"),
            std::string::npos)
      << ids.error;
  // (7) A deep manifest "notes" (the audit echoes it) crashed the reader; now it is named.
  const RunReport deep = run_backend(fake_request("deep-notes", root + "/d"));
  EXPECT_NE(deep.error.find(root + "/d/manifest.json: notes[0][0]"), std::string::npos) << deep.error.substr(0, 300);
  EXPECT_NE(deep.error.find(": nested deeper than 64 levels"), std::string::npos) << deep.error.substr(0, 300);
}

// (1) Built-in ranks get the nonce too, and a run folder can be reused; a foreign one cannot.
TEST(ConformanceHardeningStale, BuiltInRunsEchoTheNonceAndReuseTheirFolder) {
  RunRequest r;
  r.backend = "ddp";
  r.world = 2;
  r.exe = GRADCERT_EXE;
  r.run_dir = test::fresh_dir("gradcert_stale", "builtin") + "/runs/ddp";
  for (int k = 0; k < 2; ++k) {
    const RunReport rep = run_backend(r);
    EXPECT_TRUE(rep.passed()) << test::failures(rep);
  }
  std::ifstream in(r.run_dir + "/manifest.json");
  const std::string manifest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(manifest.find("\"nonce\": \"" + run_folder_nonce(r.run_dir) + "\""), std::string::npos);
  const std::string foreign = test::fresh_dir("gradcert_stale", "foreign");
  std::ofstream(foreign + "/notes.txt") << "mine";
  r.run_dir = foreign;
  EXPECT_THROW(run_backend(r), std::invalid_argument);
  EXPECT_TRUE(fs::exists(foreign + "/notes.txt"));
}

// (6) The estimate assumed TP sharding at TP = 1, so this correct run failed memory.lower_bound.
TEST(ConformanceHardeningTp, TpOfOneWithDataParallelPassesTheLowerBound) {
  RunRequest r;
  r.backend = "tp";
  r.world = 2;
  r.tp = 1;
  r.exe = GRADCERT_EXE;
  r.run_dir = test::fresh_dir("gradcert_tp1", "run");
  const RunReport rep = run_backend(r);
  EXPECT_TRUE(rep.passed()) << test::failures(rep);
}

// (6) --tp -2 read as unset, --world 0 / -2 became 1: every given count must be >= 1 (exit 2).
TEST(HardeningCli, CountsBelowOneAreRefusedNamingTheOption) {
  const std::string out = test::fresh_dir("gradcert_cli_counts", "out");
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"run --backend ddp --world 0", "gradcert: --world: must be >= 1, got 0"},
           {"run --backend ddp --world -2", "gradcert: --world: must be >= 1, got -2"},
           {"run --backend tp --world 2 --tp -2", "gradcert: --tp: must be >= 1, got -2"},
           {"run --backend pp --world 2 --pp 0", "gradcert: --pp: must be >= 1, got 0"},
           {"plan --world 0", "gradcert: --world: must be >= 1, got 0"},
           {"audit --before ddp --after ddp --world -1", "gradcert: --world: must be >= 1, got -1"},
           {"estimate --params 1e6 --world 0", "gradcert estimate: --world: must be >= 1, got 0"},
       }) {
    const bool has_out = args.rfind("run ", 0) == 0 || args.rfind("audit ", 0) == 0;
    const Cli c = run_cli(args + (has_out ? " --out " + out : std::string()));
    EXPECT_EQ(c.code, 2) << args << "\n" << c.out;
    EXPECT_NE(c.out.find(message), std::string::npos) << args << "\n" << c.out;
  }
  EXPECT_TRUE(fs::is_empty(out)) << "nothing ran";
}

// (7) Deep JSON in a spec crashed gradcert with SIGSEGV (the error path dumped it).
TEST(HardeningCli, DeepSpecIsAnErrorNotACrash) {
  const std::string dir = test::fresh_dir("gradcert_cli_deep", "spec");
  const std::string spec = dir + "/deep.json";
  std::ofstream(spec) << R"({"batch": {"micro": )" << nested(200000) << "}}";
  for (const std::string& args : {"run --backend single --spec " + spec + " --out " + dir + "/out",
                                  "estimate --model " + spec, "plan --spec " + spec}) {
    const Cli c = run_cli(args);
    EXPECT_FALSE(c.signaled) << args;
    EXPECT_EQ(c.code, 2) << args << "\n" << c.out.substr(0, 500);
    EXPECT_NE(c.out.find("spec field 'batch.micro[0][0]"), std::string::npos) << c.out.substr(0, 500);
    EXPECT_NE(c.out.find("nested deeper than 64 levels"), std::string::npos) << c.out.substr(0, 500);
    EXPECT_LT(c.out.size(), 2000u);
  }
}

// (8) A FIFO grads file hung gradcert after the command had exited (the run timeout no longer
// applied); a link to /dev/zero read gigabytes; a link outside the run folder was read and 8
// of its bytes echoed into the report (as a header length). Each now fails the run at once,
// naming the file and what it is.
TEST(ConformanceHardeningArtifacts, SpecialFilesAndLinksFailTheRunNamingTheFile) {
  const std::string root = test::fresh_dir("gradcert_artifact_files", "runs");
  for (const auto& [mode, what] : std::vector<std::pair<std::string, std::string>>{
           {"fifo-grads", "not a regular file (a FIFO)"},
           {"zero-link", "is a symbolic link (gradcert reads only regular files inside the run folder)"},
           {"outside-link", "is a symbolic link (gradcert reads only regular files inside the run folder)"}}) {
    const std::string dir = root + "/" + mode + "/run";
    const auto t0 = std::chrono::steady_clock::now();
    const RunReport r = run_backend(fake_request(mode, dir));
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0) << mode;
    EXPECT_EQ(r.error, "bad artifacts: " + dir + "/u0.grads.safetensors: " + what) << mode;
    EXPECT_TRUE(r.checks.empty()) << mode;
    EXPECT_EQ(r.error.find("PASSWORD"), std::string::npos) << r.error;
  }
}

