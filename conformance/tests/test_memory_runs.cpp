// Memory and throughput of real backend runs: the rank<r>.memory.json files, the
// memory.lower_bound / memory.budget checks, and the report sections.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "conformance/tests/support.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/run/harness.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) { return test::fresh_dir("gradcert_memtest", name); }

RunRequest request(const std::string& backend, int world, int tp, int pp, const std::string& optimizer,
                   const std::string& name) {
  RunRequest r;
  r.backend = backend;
  r.world = world;
  r.tp = tp;
  r.pp = pp;
  r.spec.optimizer.name = optimizer;
  r.spec.timeout.run_s = 120;
  r.exe = GRADCERT_EXE;
  r.run_dir = fresh_dir(name);
  return r;
}

const CheckResult& check(const RunReport& r, const std::string& id) {
  for (const auto& c : r.checks)
    if (c.id == id) return c;
  throw std::runtime_error("no check " + id);
}

struct Cli {
  int code;
  std::string out;
};

Cli run_cli(const std::string& args) {
  FILE* p = popen((std::string(GRADCERT_EXE) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

// The estimator's model-state figure is within 2% of the exact storage on every built-in
// backend (each rank against its own estimate: PP stages differ).
TEST(ConformanceMemory, LowerBoundHoldsOnEveryBuiltInBackend) {
  struct Case {
    std::string backend;
    int world, tp, pp;
  };
  for (const auto& c : std::vector<Case>{{"single", 1, 1, 1},
                                         {"ddp", 2, 1, 1},
                                         {"zero1", 2, 1, 1},
                                         {"zero2", 2, 1, 1},
                                         {"zero3", 2, 1, 1},
                                         {"fsdp", 3, 1, 1},
                                         {"tp", 2, 2, 1},
                                         {"pp", 2, 1, 2}})
    for (const std::string opt : {"sgd", "adamw"}) {
      const RunReport r = run_backend(request(c.backend, c.world, c.tp, c.pp, opt, c.backend + "_" + opt));
      ASSERT_TRUE(r.error.empty()) << r.error;
      ASSERT_TRUE(r.has_memory);
      const auto& lb = check(r, "memory.lower_bound");
      EXPECT_EQ(lb.verdict, Verdict::Pass) << c.backend << " " << opt << ": " << lb.detail;
      EXPECT_GE(lb.figure, 0.0);
      EXPECT_LE(lb.figure, 0.02);
      std::printf("[ memory ] %-6s world %d %-5s estimate %8lld B measured %8lld B (%+.3f%%)\n", c.backend.c_str(),
                  c.world, opt.c_str(), static_cast<long long>(r.memory.estimate.model_state()),
                  static_cast<long long>(r.memory.measured_model_state_bytes), 100 * lb.figure);
      EXPECT_EQ(check(r, "memory.budget").verdict, Verdict::Skip) << "no budget in the default spec";
    }
}

// A budget below the measured peak fails memory.budget, naming the rank, bucket and phase
// of the worst peak; every other check still passes.
TEST(ConformanceMemory, TightBudgetFailsNamingRankBucketAndPhase) {
  RunRequest req = request("ddp", 2, 1, 1, "adamw", "tight");
  req.spec.memory.budget_bytes = 64 * 1024;
  const RunReport r = run_backend(req);
  ASSERT_TRUE(r.error.empty()) << r.error;
  const auto& budget = check(r, "memory.budget");
  EXPECT_EQ(budget.verdict, Verdict::Fail);
  const PhasePeak* worst = nullptr;
  for (const auto& p : r.memory.peaks)
    if (!worst || p.peak_bytes > worst->peak_bytes) worst = &p;
  ASSERT_NE(worst, nullptr);
  const std::string where =
      "rank " + std::to_string(worst->rank) + ", " + worst->bucket + " bucket, " + worst->phase + ": ";
  EXPECT_EQ(budget.detail.rfind(where, 0), 0u) << budget.detail;
  EXPECT_NE(budget.detail.find("> budget 64.00 KiB"), std::string::npos) << budget.detail;
  for (const auto& c : r.checks)
    if (c.id != "memory.budget") EXPECT_NE(c.verdict, Verdict::Fail) << c.id << ": " << c.detail;

  // Every rank measured every phase in every length bucket.
  for (int rank = 0; rank < 2; ++rank)
    for (const std::string bucket : {"short", "typical", "long"})
      for (const std::string phase : {"load", "first forward", "first backward", "first optimizer step", "save",
                                      "forward", "backward", "optimizer step"}) {
        bool found = false;
        for (const auto& p : r.memory.peaks) found |= p.rank == rank && p.bucket == bucket && p.phase == phase;
        EXPECT_TRUE(found) << "rank " << rank << ", " << bucket << ", " << phase;
      }

  req = request("ddp", 2, 1, 1, "adamw", "roomy");
  req.spec.memory.budget_bytes = static_cast<double>(worst->peak_bytes) * 4;
  EXPECT_EQ(check(run_backend(req), "memory.budget").verdict, Verdict::Pass);
}

// On real ranks, AdamW's first step allocates the moments: its peak exceeds what was live
// after load, in every bucket and on every rank.
TEST(ConformanceMemory, FirstAdamStepRaisesThePeakAbovePostLoadOnRealRanks) {
  const RunReport r = run_backend(request("ddp", 2, 1, 1, "adamw", "firststep"));
  ASSERT_TRUE(r.error.empty()) << r.error;
  int compared = 0;
  for (const auto& load : r.memory.peaks) {
    if (load.phase != "load") continue;
    for (const auto& step : r.memory.peaks)
      if (step.phase == "first optimizer step" && step.rank == load.rank && step.bucket == load.bucket) {
        // The moments alone are twice the parameters' bytes.
        EXPECT_GE(step.peak_bytes, load.current_bytes + 2 * r.memory.estimate.weights)
            << "rank " << load.rank << ", " << load.bucket;
        ++compared;
      }
  }
  EXPECT_EQ(compared, 6);
}

// `gradcert run` with a budget in the spec file: exit 1, the failing check in the table,
// and report.json / report.md carry the memory and throughput sections.
TEST(ConformanceMemory, CliReportsMemoryAndThroughput) {
  const std::string dir = fresh_dir("cli");
  std::ofstream(dir + "/spec.json") << R"({"memory": {"budget_bytes": 65536}})";
  const auto out = run_cli("run --spec " + dir + "/spec.json --backend ddp --world 2 --out " + dir + "/out");
  EXPECT_EQ(out.code, 1) << out.out;
  EXPECT_NE(out.out.find("memory.budget"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("> budget 64.00 KiB"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("# memory:"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("# throughput"), std::string::npos) << out.out;

  const auto j = nlohmann::json::parse(std::ifstream(dir + "/out/report.json"));
  ASSERT_EQ(j["memory"]["runs"].size(), 1u);
  const auto& m = j["memory"]["runs"][0];
  EXPECT_EQ(m["estimate"]["recipe"], "float64-sgd");
  EXPECT_EQ(m["measured_model_state_bytes"], m["estimate"]["model_state"]);
  EXPECT_EQ(m["budget_bytes"], 65536.0);
  EXPECT_EQ(m["peaks"].size(), 2u * 3u * 8u);  // ranks x buckets x phases
  ASSERT_EQ(j["throughput"]["runs"].size(), 1u);
  const auto& t = j["throughput"]["runs"][0];
  EXPECT_GT(t["target_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(t["input_tokens_per_s"].get<double>(), t["target_tokens_per_s"].get<double>());
  EXPECT_GT(t["save_pause_seconds"].get<double>(), 0);
  EXPECT_EQ(t["speedup"], nullptr) << "no single run to compare with";
  std::ifstream md(dir + "/out/report.md");
  const std::string text((std::istreambuf_iterator<char>(md)), {});
  EXPECT_NE(text.find("## Memory"), std::string::npos);
  EXPECT_NE(text.find("## Throughput"), std::string::npos);
}

TEST(MemoryFiles, StrictReaderNamesTheFileAndField) {
  const std::string dir = fresh_dir("files");
  RankMemory m;
  m.rank = 1;
  m.model_state_bytes = 4096;
  m.peaks.push_back({1, "long", "backward", "cpu", 9000, 100, 0.5, -1, -1});
  write_rank_memory(dir, m);
  const RankMemory back = read_rank_memory(dir, 1);
  EXPECT_EQ(back.model_state_bytes, 4096);
  ASSERT_EQ(back.peaks.size(), 1u);
  EXPECT_EQ(back.peaks[0].phase, "backward");
  EXPECT_EQ(back.peaks[0].rank, 1);

  try {
    read_rank_memory(dir, 0);
    FAIL() << "no error for a missing file";
  } catch (const ArtifactError& e) {
    EXPECT_NE(std::string(e.what()).find("rank0.memory.json"), std::string::npos) << e.what();
  }
  std::ofstream(dir + "/rank1.memory.json")
      << R"({"schema": "gradcert.memory/1", "rank": 1, "model_state_bytes": "x"})";
  try {
    read_rank_memory(dir, 1);
    FAIL() << "no error for a bad field";
  } catch (const ArtifactError& e) {
    EXPECT_NE(std::string(e.what()).find("rank1.memory.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model_state_bytes"), std::string::npos) << e.what();
  }
}
