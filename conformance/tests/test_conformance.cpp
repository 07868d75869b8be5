// Conformance: real rank processes over Gloo, checked against the float64 reference.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <tuple>

#include "conformance/tests/support.hpp"
#include "backends/catalog.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/core/plan.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) { return test::fresh_dir("gradcert_test", name); }

RunRequest request(const std::string& backend, int world, int accum, DType dtype, const std::string& name, int tp = 1,
                   int pp = 1) {
  RunRequest r;
  r.backend = backend;
  r.world = world;
  r.tp = tp;
  r.pp = pp;
  r.spec.batch.accum = accum;
  r.spec.dtype = dtype;
  r.spec.topology = {world / (tp * pp), tp, pp};
  // Two full windows and a partial one of a single example: only DP rank 0 gets any.
  r.spec.dataset.size = static_cast<int>(2 * update_batch_size(r.spec.batch.micro, accum, r.spec.topology.dp) + 1);
  r.spec.timeout.run_s = 120;
  r.exe = GRADCERT_EXE;
  r.run_dir = fresh_dir(name);
  return r;
}

using test::failures;

struct Case {
  std::string backend;
  int world, accum;
  DType dtype;
  std::string optimizer;
  int tp = 1, pp = 1;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.backend + "_w" + std::to_string(c.world) + (c.tp > 1 ? "_tp" + std::to_string(c.tp) : "") +
         (c.pp > 1 ? "_pp" + std::to_string(c.pp) : "") + "_a" + std::to_string(c.accum) + "_" + dtype_name(c.dtype) +
         "_" + c.optimizer;
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name({c, 0}); }

class ConformanceMatrix : public testing::TestWithParam<Case> {};

}  // namespace

TEST_P(ConformanceMatrix, PassesEveryCheckAgainstTheReference) {
  const Case& c = GetParam();
  RunRequest req = request(c.backend, c.world, c.accum, c.dtype, case_name({c, 0}), c.tp, c.pp);
  req.spec.optimizer.name = c.optimizer;
  const Plan plan = make_plan(effective_spec(req));
  const Window& last = plan.windows.back();
  ASSERT_TRUE(last.partial);
  ASSERT_GE(plan.windows.size(), 3u) << ">= 2 updates before the partial one";
  if (plan.dp > 1) {
    for (const auto& mb : last.slots[plan.dp - 1]) ASSERT_TRUE(mb.ids.empty()) << "the last DP rank gets nothing";
  }

  const RunReport r = run_backend(req);
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(test::ids_of(r), check_ids(/*with_memory=*/true));  // every check of the table
  EXPECT_TRUE(r.passed()) << failures(r);
  for (const auto& check : r.checks)
    if (check.id == "grad.parity" && c.dtype == DType::Float64) EXPECT_LE(check.figure, 1e-10);
}

INSTANTIATE_TEST_SUITE_P(
    Conformance, ConformanceMatrix,
    testing::Values(Case{"single", 1, 1, DType::Float64, "sgd"}, Case{"single", 1, 3, DType::Float64, "sgd"},
                    Case{"ddp", 2, 1, DType::Float64, "sgd"}, Case{"ddp", 2, 3, DType::Float64, "sgd"},
                    Case{"ddp", 3, 1, DType::Float64, "sgd"}, Case{"ddp", 3, 3, DType::Float64, "sgd"},
                    Case{"single", 1, 3, DType::Float64, "adamw"}, Case{"ddp", 2, 3, DType::Float64, "adamw"},
                    Case{"ddp", 3, 3, DType::Float64, "adamw"}, Case{"single", 1, 3, DType::Float32, "sgd"},
                    Case{"ddp", 2, 3, DType::Float32, "sgd"}, Case{"ddp", 3, 1, DType::Float32, "adamw"},
                    Case{"ddp", 2, 3, DType::BFloat16, "sgd"}),
    case_name);

// NOTE [strategy matrix] Every strategy of the catalog (NOTE [strategy descriptor]), so a new one
// gets its rows without an edit here: at its certify topology with A = 1 (float64, SGD) and A = 3
// (float32, SGD), and at its first wider topology (else the primary) with A = 3 (float64, AdamW);
// each with a partial final window that leaves the last DP rank empty and >= 2 full updates.
std::vector<Case> strategy_cases() {
  std::vector<Case> out;
  for (const auto* s : strategies()) {
    const CertifyTopology& p = s->primary;
    const CertifyTopology& w = s->wider.empty() ? p : s->wider.front();
    out.push_back({s->name, p.world, 1, DType::Float64, "sgd", p.tp, p.pp});
    out.push_back({s->name, w.world, 3, DType::Float64, "adamw", w.tp, w.pp});
    out.push_back({s->name, p.world, 3, DType::Float32, "sgd", p.tp, p.pp});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(ConformanceStrategies, ConformanceMatrix, testing::ValuesIn(strategy_cases()), case_name);

class ConformanceMutants : public testing::TestWithParam<Case> {};

TEST_P(ConformanceMutants, EveryMutantIsCaughtAndTheCorrectBackendPasses) {
  const Case& c = GetParam();
  RunRequest correct = request(c.backend, c.world, 3, DType::Float64, c.backend + "_correct", c.tp, c.pp);
  const RunReport ok = run_backend(correct);
  EXPECT_TRUE(ok.passed()) << failures(ok);
  const auto mutants = mutant_names(c.backend);
  ASSERT_GE(mutants.size(), 4u);
  for (const auto& m : mutants) {
    if (needs_resume(parse_mutant(m))) continue;  // resumed runs: test_resume.cpp
    RunRequest req = request(c.backend, c.world, 3, DType::Float64, c.backend + "_" + m, c.tp, c.pp);
    req.inject = m;
    const RunReport r = run_backend(req);
    ASSERT_TRUE(r.error.empty()) << m << ": " << r.error;
    EXPECT_FALSE(r.detected_by().empty()) << "mutant " << m << " on " << c.backend << " passed every check";
  }
}

// The mutant matrix comes from the strategy catalog (backends/catalog.cpp): a new strategy gets
// its row without an edit here, at certify's mutant topology (mutant_world, else the primary's).
std::vector<Case> mutant_cases() {
  std::vector<Case> out;
  for (const StrategyInfo* s : strategies())
    out.push_back(Case{s->name, s->mutant_world > 0 ? s->mutant_world : s->primary.world, 3, DType::Float64, "sgd",
                       s->primary.tp, s->primary.pp});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Conformance, ConformanceMutants, testing::ValuesIn(mutant_cases()), case_name);

// A replica that drifts at the last update (lr x 1.01 on DP rank 1) changes nothing rank 0
// writes: every artifact check passes; only replicas.agree (NOTE [replica digests]) sees it,
// and names the rank. Correct ddp, zero1 and zero2 runs hold identical replicas on both
// ranks, as do tp (TP-replicated tensors on TP peers, slices on DP replicas) and pp (a stage
// on its DP replicas) at world 4 (compared, not skipped).
TEST(ConformanceReplicas, ADriftingReplicaIsCaughtOnlyByReplicasAgree) {
  struct Held {
    std::string backend;
    int world, tp, pp;
  };
  for (const Held& h : {Held{"ddp", 2, 1, 1}, Held{"zero1", 2, 1, 1}, Held{"zero2", 2, 1, 1}, Held{"tp", 4, 2, 1},
                        Held{"pp", 4, 1, 2}}) {
    RunRequest ok = request(h.backend, h.world, 3, DType::Float64, "replicas_ok_" + h.backend, h.tp, h.pp);
    const RunReport good = run_backend(ok);
    ASSERT_TRUE(good.error.empty()) << good.error;
    bool seen = false;
    for (const auto& c : good.checks)
      if (c.id == "replicas.agree") {
        seen = true;
        EXPECT_EQ(c.verdict, Verdict::Pass) << h.backend << ": " << c.detail;
      }
    EXPECT_TRUE(seen) << h.backend;
  }
  // Under TP the last TP rank drifts its copies of the TP-replicated tensors: the artifacts
  // take those from TP rank 0, so again only replicas.agree sees it.
  RunRequest tp = request("tp", 2, 3, DType::Float64, "replicas_drift_tp", 2, 1);
  tp.inject = "replica-drift";
  const RunReport t = run_backend(tp);
  ASSERT_TRUE(t.error.empty()) << t.error;
  EXPECT_EQ(t.detected_by(), std::vector<std::string>{"replicas.agree"});
  RunRequest req = request("ddp", 2, 3, DType::Float64, "replicas_drift");
  req.inject = "replica-drift";
  const RunReport r = run_backend(req);
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.detected_by(), std::vector<std::string>{"replicas.agree"});
  for (const auto& c : r.checks)
    if (c.id == "replicas.agree") {
      EXPECT_NE(c.detail.find("update 2"), std::string::npos) << c.detail;
      EXPECT_NE(c.detail.find("rank 1 holds other values than rank 0"), std::string::npos) << c.detail;
      std::cout << "[ detail   ] replica-drift: " << c.detail << "\n";
    }
}

TEST(ConformancePipeline, OneFOneBAndGpipeBothMatchTheReference) {
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    RunRequest req = request("pp", 4, 3, DType::Float64, "pipeline_" + schedule, 1, 4);
    req.spec.model.layers = 4;
    req.spec.pipeline.schedule = schedule;
    const RunReport r = run_backend(req);
    ASSERT_TRUE(r.error.empty()) << schedule << ": " << r.error;
    EXPECT_TRUE(r.passed()) << schedule << ": " << failures(r);
  }
}

// One run's checks on a thread while a planted-bug run's ranks train (NOTE [checks beside the
// next launch]) give the figures of the one-after-the-other order, and the bug is still caught.
TEST(ConformanceOverlap, ChecksBesideTheNextLaunchGiveTheSameFigures) {
  RunRequest correct = request("ddp", 2, 2, DType::Float64, "overlap_correct");
  RunRequest mutant = request("ddp", 2, 2, DType::Float64, "overlap_mutant");
  mutant.inject = "local-mean";
  ASSERT_TRUE(checks_start_no_process(make_run_plan(correct)));
  auto figures = [](const RunReport& r) {
    std::vector<std::tuple<std::string, double, std::string, double>> out;
    for (const auto& c : r.checks)
      if (c.id.rfind("memory.", 0) != 0) out.emplace_back(c.id, c.figure, verdict_name(c.verdict), c.tolerance);
    return out;
  };
  const RunReport alone_correct = run_backend(correct), alone_mutant = run_backend(mutant);
  ASSERT_TRUE(alone_correct.error.empty()) << alone_correct.error;
  ASSERT_TRUE(alone_correct.passed()) << failures(alone_correct);
  ASSERT_FALSE(alone_mutant.detected_by().empty());

  correct.run_dir = fresh_dir("overlap_correct2");
  mutant.run_dir = fresh_dir("overlap_mutant2");
  LaunchedRunPtr first = launch_run(correct);
  auto checking =
      std::async(std::launch::async, [run = std::move(first)]() mutable { return check_launched(std::move(run)); });
  LaunchedRunPtr second = launch_run(mutant, /*early_reference=*/false);  // beside the first run's checks
  const RunReport beside_correct = checking.get();
  const RunReport beside_mutant = check_launched(std::move(second));
  ASSERT_TRUE(beside_correct.error.empty()) << beside_correct.error;
  EXPECT_TRUE(beside_correct.passed()) << failures(beside_correct);
  EXPECT_EQ(figures(beside_correct), figures(alone_correct));
  EXPECT_EQ(figures(beside_mutant), figures(alone_mutant));
  EXPECT_EQ(beside_mutant.detected_by(), alone_mutant.detected_by());
}

TEST(ConformanceFailure, KilledRankFailsTheRunNamingIt) {
  RunRequest req = request("ddp", 2, 3, DType::Float64, "killed");
  req.spec.timeout.collective_s = 10;
  req.spec.timeout.run_s = 60;
  ::setenv("GRADCERT_FAULT", "kill:1:1", 1);
  const auto t0 = std::chrono::steady_clock::now();
  const RunReport r = run_backend(req);
  ::unsetenv("GRADCERT_FAULT");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.error.find("rank 1"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("SIGKILL"), std::string::npos) << r.error;
  EXPECT_LT(secs, 10.0) << "the launcher stops the group on the first failure";
  EXPECT_FALSE(r.passed());
}

TEST(ConformanceFailure, HungRankTimesOutNamingTheRanks) {
  RunRequest req = request("ddp", 2, 3, DType::Float64, "hung");
  req.spec.timeout.collective_s = 2;
  req.spec.timeout.run_s = 30;
  ::setenv("GRADCERT_FAULT", "hang:1:1", 1);
  const auto t0 = std::chrono::steady_clock::now();
  const RunReport r = run_backend(req);
  ::unsetenv("GRADCERT_FAULT");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(r.error.empty());
  EXPECT_NE(r.error.find("rank 0"), std::string::npos) << r.error;  // timed out in a collective
  EXPECT_NE(r.error.find("rank 1"), std::string::npos) << r.error;  // still running, stopped
  EXPECT_LT(secs, 20.0) << "the collective timeout ends the run, not the run timeout";
}

TEST(ConformanceFailure, ExitingRankIsNamedWithItsCode) {
  RunRequest req = request("ddp", 3, 1, DType::Float64, "exiting");
  ::setenv("GRADCERT_FAULT", "exit:2:0", 1);
  const RunReport r = run_backend(req);
  ::unsetenv("GRADCERT_FAULT");
  EXPECT_NE(r.error.find("rank 2 exited with code 3"), std::string::npos) << r.error;
}

TEST(ConformanceFailure, TruncatedArtifactIsNamed) {
  RunRequest req = request("ddp", 2, 3, DType::Float64, "truncated");
  ::setenv("GRADCERT_FAULT", "truncate:0:1", 1);
  const RunReport r = run_backend(req);
  ::unsetenv("GRADCERT_FAULT");
  EXPECT_NE(r.error.find("u1.grads.safetensors"), std::string::npos) << r.error;
  EXPECT_TRUE(r.checks.empty()) << "no verdicts from unreadable artifacts";
  EXPECT_FALSE(r.passed());
}

TEST(ConformanceBadInput, TopologyAndBackendErrorsAreNamed) {
  RunRequest req = request("ddp", 2, 1, DType::Float64, "badinput");
  req.tp = 2;
  req.world = 3;
  try {
    run_backend(req);
    FAIL() << "no error";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.field, "topology");
  }
  req = request("single", 2, 1, DType::Float64, "badinput2");
  EXPECT_THROW(run_backend(req), std::invalid_argument);
  req = request("zero4", 2, 1, DType::Float64, "badinput3");
  try {
    run_backend(req);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("zero4"), std::string::npos);
  }
  req = request("ddp", 2, 1, DType::Float64, "badinput4");
  req.inject = "not-a-bug";
  EXPECT_THROW(run_backend(req), std::invalid_argument);
}

namespace {

using test::run_cli;

std::string write_spec(const std::string& dir, const std::string& json) {
  const std::string path = dir + "/spec.json";
  std::ofstream(path) << json;
  return path;
}

}  // namespace

TEST(ConformanceCli, ExitCodesAndReports) {
  const std::string dir = fresh_dir("cli");
  auto ok = run_cli("run --backend ddp --world 2 --out " + dir + "/ok");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("# OK"), std::string::npos) << ok.out;
  for (const char* f : {"report.json", "report.md", "junit.xml"}) EXPECT_TRUE(fs::exists(dir + "/ok/" + f)) << f;
  const auto j = nlohmann::json::parse(std::ifstream(dir + "/ok/report.json"));
  EXPECT_EQ(j["schema"], "gradcert.report/1");
  EXPECT_EQ(j["runs"][0]["topology"]["dp"], 2);
  EXPECT_EQ(j["verdict"], "pass");

  const auto strict = write_spec(dir, R"({"tolerance": {"float64": 1e-300, "floor_factor": 0}})");
  auto fail = run_cli("run --spec " + strict + " --backend single --out " + dir + "/strict");
  EXPECT_EQ(fail.code, 1) << fail.out;
  EXPECT_NE(fail.out.find("FAILED"), std::string::npos);

  const auto bad = write_spec(dir, R"({"batch": {"micro": 2, "acum": 3}})");
  auto bad_input = run_cli("run --spec " + bad + " --backend single --out " + dir + "/bad");
  EXPECT_EQ(bad_input.code, 2) << bad_input.out;
  EXPECT_NE(bad_input.out.find("batch.acum"), std::string::npos) << bad_input.out;

  auto unknown = run_cli("run --backend zero9 --out " + dir + "/unknown");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.out.find("zero9"), std::string::npos) << unknown.out;

  auto launcher = run_cli("run --launcher slurm --out " + dir + "/launcher");
  EXPECT_EQ(launcher.code, 2);
  EXPECT_NE(launcher.out.find("--launcher"), std::string::npos) << launcher.out;

  auto plan = run_cli("plan --world 2");
  EXPECT_EQ(plan.code, 0);
  EXPECT_NE(plan.out.find("(partial)"), std::string::npos) << plan.out;
  EXPECT_NE(plan.out.find("B_update=12"), std::string::npos) << plan.out;

  auto help = run_cli("run --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--inject"), std::string::npos);
}

namespace {

std::string slurp_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

// `gradcert run` forks its ranks from the zygote (NOTE [zygote]); they pass, and a rank killed,
// stopped or leaving early is named as an exec'd one is. GRADCERT_NO_ZYGOTE=1 execs them.
TEST(ConformanceZygote, CliRanksComeFromTheZygoteAndFailuresNameTheRank) {
  const std::string dir = fresh_dir("zygote");
  const std::string said = "this rank was forked from the zygote";
  for (const bool zygote : {true, false}) {
    if (!zygote) ::setenv("GRADCERT_NO_ZYGOTE", "1", 1);
    const std::string out = dir + (zygote ? "/zygote" : "/exec");
    const auto ok = run_cli("run --backend ddp --world 2 --out " + out);
    ::unsetenv("GRADCERT_NO_ZYGOTE");
    EXPECT_EQ(ok.code, 0) << ok.out;
    for (int r = 0; r < 2; ++r) {
      const std::string log = slurp_file(out + "/runs/ddp-w2-float64-sgd/rank" + std::to_string(r) + ".log");
      EXPECT_EQ(log.find(said) != std::string::npos, zygote) << "rank " << r << " (zygote " << zygote << "): " << log;
    }
  }
  const auto spec = write_spec(dir, R"({"timeout": {"collective_s": 3, "run_s": 60}})");
  for (const auto& [fault, blame] :
       std::vector<std::pair<std::string, std::string>>{{"kill:1:0", "rank 1 was killed by signal 9 (SIGKILL) after "},
                                                        {"stop:1:1", "rank 1 was stopped (SIGSTOP) after "},
                                                        {"leave:1:0", "rank 1 exited 0 after "}}) {
    ::setenv("GRADCERT_FAULT", fault.c_str(), 1);
    const auto t0 = std::chrono::steady_clock::now();
    const auto failed = run_cli("run --backend ddp --world 2 --spec " + spec + " --out " + dir + "/fault");
    ::unsetenv("GRADCERT_FAULT");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0) << fault;
    EXPECT_EQ(failed.code, 2) << fault << "\n" << failed.out;
    EXPECT_NE(failed.out.find(blame), std::string::npos) << fault << "\n" << failed.out;
    EXPECT_NE(failed.out.find(said), std::string::npos) << fault << ": the ranks were exec'd\n" << failed.out;
  }
}

TEST(ConformanceMpirun, DdpUnderMpirunPassesEveryCheck) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  RunRequest req = request("ddp", 2, 3, DType::Float64, "mpirun");
  req.launcher = LauncherKind::Mpirun;
  const RunReport r = run_backend(req);
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_TRUE(r.passed()) << failures(r);
}
