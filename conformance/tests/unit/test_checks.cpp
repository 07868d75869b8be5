// Unit tests: each check passes on a faithful artifact and fails on a planted wrong one,
// so no check can pass vacuously. Also the report writers.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "conformance/checks/checks.hpp"
#include "conformance/tests/temp_dirs.hpp"
#include "reports/report.hpp"

using namespace gradcert;

namespace {

HostTensor tensor(const std::string& name, std::vector<double> v) {
  HostTensor t;
  t.name = name;
  t.shape = {static_cast<int64_t>(v.size())};
  t.held = std::move(v);
  return t;
}

struct Fixture {
  Spec spec;
  Plan plan;
  std::vector<ReferenceUpdate> ref;
  std::vector<BackendUpdate> run;

  // A faithful run of the default plan: consumed ids from the plan, the reference's
  // N, loss, gradients and parameters (nudged by rounding-sized noise).
  Fixture() : plan(make_plan(spec)) {
    for (const auto& w : plan.windows) {
      ReferenceUpdate r;
      r.update = w.update;
      r.loss = 2.5 + w.update;
      r.valid_targets = w.valid_targets;
      r.grads["a.weight"] = tensor("a.weight", {0.5, -1.0, 2.0 + w.update});
      r.grads["b.bias"] = tensor("b.bias", {0.25});
      r.params_after["a.weight"] = tensor("a.weight", {1.0, 2.0, 3.0});
      r.params_after["b.bias"] = tensor("b.bias", {-1.0});
      ref.push_back(r);
      BackendUpdate b;
      b.update = w.update;
      b.loss = r.loss * (1 + 1e-16);
      b.valid_targets = r.valid_targets;
      b.grads = r.grads;
      b.grads["a.weight"].held[0] += 1e-17;
      b.params_after = r.params_after;
      for (int rank = 0; rank < plan.dp; ++rank) {
        RankRecord rr;
        rr.rank = rank;
        rr.dp_rank = rank;
        rr.replicas = {{"a.weight", "d0" + std::to_string(w.update)}, {"b.bias", "d1"}};  // identical replicas
        for (const auto& mb : w.slots[rank]) rr.consumed.push_back(mb.ids);
        b.ranks.push_back(rr);
      }
      run.push_back(b);
    }
  }
  std::vector<CheckResult> checks() const { return run_checks(plan, spec.dataset.size, ref, run, 1e-10); }
  CheckResult check(const std::string& id) const {
    for (const auto& c : checks())
      if (c.id == id) return c;
    ADD_FAILURE() << "no check " << id;
    return {};
  }
};

}  // namespace

TEST(Checks, FaithfulRunPassesEveryCheck) {
  Fixture f;
  for (const auto& c : f.checks()) EXPECT_EQ(c.verdict, Verdict::Pass) << c.id << ": " << c.detail;
  std::vector<std::string> ids;
  for (const auto& c : f.checks()) ids.push_back(c.id);
  EXPECT_EQ(ids, check_ids(/*with_memory=*/false, /*with_target_counts=*/false));
}

TEST(Checks, ScaledGradientFailsGradParity) {
  Fixture f;
  for (auto& v : f.run[1].grads["a.weight"].held) v *= 2;  // e.g. a missing 1/D
  const auto c = f.check("grad.parity");
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_NEAR(c.figure, 1.0, 1e-12);
  EXPECT_NE(c.detail.find("update 1 a.weight"), std::string::npos) << c.detail;
}

TEST(Checks, TinyGradientErrorOnOneElementIsSeen) {
  Fixture f;
  f.run[2].grads["b.bias"].held[0] += 1e-9;
  EXPECT_EQ(f.check("grad.parity").verdict, Verdict::Fail);
}

TEST(Checks, NanGradientFails) {
  Fixture f;
  f.run[0].grads["b.bias"].held[0] = std::nan("");
  const auto c = f.check("grad.parity");
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_TRUE(std::isnan(c.figure));
}

// Issue 36 item 4 (NOTE [non-finite values]): a NaN loss sum was "a malformed rank record"; now
// train.finite, first in the report, names the update, the rank or the tensor and its element,
// and says whether the reference diverged too. A finite run has no such check (the test above).
TEST(Checks, NonFiniteValuesAreATrainingFinding) {
  Fixture f;
  f.run[1].ranks[1].has_loss_sum = true;
  f.run[1].ranks[1].loss_sum = std::nan("");
  f.run[2].grads["a.weight"].held[2] = HUGE_VAL;
  const auto all = f.checks();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front().id, "train.finite");
  EXPECT_EQ(all.front().verdict, Verdict::Fail);
  EXPECT_EQ(all.front().figure, 2);
  EXPECT_NE(all.front().detail.find("first non-finite value: update 1, rank 1: loss_sum nan; 2 in all; the "
                                    "reference's is finite there: the stack computed it"),
            std::string::npos)
      << all.front().detail;

  Fixture g;
  g.run[0].grads["a.weight"].held[1] = std::nan("");
  EXPECT_NE(g.check("train.finite").detail.find("update 0: the gradient of a.weight is nan at [1] (1 of 3 elements)"),
            std::string::npos)
      << g.check("train.finite").detail;

  Fixture h;  // the spec's own training diverges: the reference's loss is not finite either
  h.ref[1].loss = h.run[1].loss = HUGE_VAL;
  EXPECT_NE(h.check("train.finite").detail.find("the reference's loss there is inf too: the spec's own training"),
            std::string::npos)
      << h.check("train.finite").detail;
}

TEST(Checks, MissingOrMisshapenTensorFails) {
  Fixture f;
  f.run[0].grads.erase("b.bias");
  auto c = f.check("grad.parity");
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_NE(c.detail.find("b.bias"), std::string::npos);
  Fixture g;
  g.run[0].params_after["a.weight"].shape = {1, 3};
  c = g.check("params.parity");
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_NE(c.detail.find("a.weight"), std::string::npos) << c.detail;
}

TEST(Checks, WrongParametersFailParamsParity) {
  Fixture f;
  f.run[2].params_after["b.bias"].held[0] = -1.001;
  EXPECT_EQ(f.check("params.parity").verdict, Verdict::Fail);
  EXPECT_EQ(f.check("grad.parity").verdict, Verdict::Pass);
}

TEST(Checks, WrongWindowCountFails) {
  Fixture f;
  f.run[2].valid_targets = f.ref[0].valid_targets;  // stale: the full window's N in the partial one
  const auto c = f.check("targets.window_count");
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_NE(c.detail.find("update 2"), std::string::npos) << c.detail;
}

TEST(Checks, LocalMeanLossFailsGlobalMean) {
  Fixture f;
  f.run[0].loss = 0.6;
  f.ref[0].loss = 0.8;
  EXPECT_EQ(f.check("loss.global_mean").verdict, Verdict::Fail);
}

TEST(Checks, DuplicatedSampleFailsLedgerAndUpdateSize) {
  Fixture f;
  const int64_t dup = f.plan.windows[0].ids[0];
  f.run[2].ranks[1].consumed[0].push_back(dup);  // sampler padding repeats an example
  const auto ledger = f.check("batch.sample_ledger");
  EXPECT_EQ(ledger.verdict, Verdict::Fail);
  EXPECT_NE(ledger.detail.find(std::to_string(dup)), std::string::npos) << ledger.detail;
  // Who consumed it, and the cause the pattern shows: the repeat is in the epoch's last window.
  EXPECT_NE(ledger.detail.find("rank 1 update 2 microstep 0"), std::string::npos) << ledger.detail;
  EXPECT_NE(ledger.detail.find("update 0 microstep"), std::string::npos) << ledger.detail;
  EXPECT_NE(ledger.detail.find("DistributedSampler(drop_last=False)"), std::string::npos) << ledger.detail;
  EXPECT_EQ(f.check("batch.update_size").verdict, Verdict::Fail);
}

TEST(Checks, RepeatBeforeTheEpochsLastWindowIsNotBlamedOnPadding) {
  Fixture f;
  f.run[1].ranks[0].consumed[0].push_back(f.plan.windows[0].ids[0]);
  const auto ledger = f.check("batch.sample_ledger");
  EXPECT_EQ(ledger.verdict, Verdict::Fail);
  EXPECT_NE(ledger.detail.find("rank 0 update 1 microstep 0"), std::string::npos) << ledger.detail;
  EXPECT_EQ(ledger.detail.find("DistributedSampler"), std::string::npos) << ledger.detail;
}

TEST(Checks, DroppedSampleFailsLedger) {
  Fixture f;
  f.run[1].ranks[0].consumed[2].pop_back();
  EXPECT_EQ(f.check("batch.sample_ledger").verdict, Verdict::Fail);
  EXPECT_EQ(f.check("batch.update_size").verdict, Verdict::Fail);
}

TEST(Checks, TensorParallelPeersCountOnceAndMustAgree) {
  Fixture f;
  for (auto& u : f.run) {
    std::vector<RankRecord> ranks;
    for (const auto& r : u.ranks) {  // two TP peers per replica
      RankRecord a = r, b = r;
      a.rank = 2 * r.dp_rank;
      b.rank = 2 * r.dp_rank + 1;
      ranks.push_back(a);
      ranks.push_back(b);
    }
    u.ranks = ranks;
  }
  EXPECT_EQ(f.check("batch.update_size").verdict, Verdict::Pass);
  EXPECT_EQ(f.check("batch.sample_ledger").verdict, Verdict::Pass);
  f.run[0].ranks[1].consumed[0].pop_back();
  EXPECT_EQ(f.check("batch.sample_ledger").verdict, Verdict::Fail);
}

TEST(Checks, MissingUpdateFailsEveryCheck) {
  Fixture f;
  f.run.pop_back();
  for (const auto& c : f.checks())
    if (c.id != "batch.sample_ledger") EXPECT_EQ(c.verdict, Verdict::Fail) << c.id;
}

TEST(Report, JsonHasTheSchemaAndJunitCountsFailures) {
  Report r;
  r.environment.torch = "2.13.0";
  r.environment.seed = 1234;
  RunReport ok;
  ok.backend = "ddp";
  ok.dtype = "float64";
  ok.optimizer = "sgd";
  ok.checks = {{"grad.parity", Verdict::Pass, 3e-16, 1e-10, "fine"}};
  RunReport bad = ok;
  bad.checks = {{"grad.parity", Verdict::Fail, 0.5, 1e-10, "update 1 <x> & \"y\""}};
  r.runs = {ok, bad};
  const auto j = nlohmann::json::parse(report_json(r));
  EXPECT_EQ(j["schema"], "gradcert.report/1");
  EXPECT_EQ(j["environment"]["seed"], 1234);
  EXPECT_EQ(j["runs"][0]["checks"][0]["id"], "grad.parity");
  EXPECT_EQ(j["runs"][0]["inject"], nullptr);
  EXPECT_EQ(j["verdict"], "fail");
  const std::string junit = report_junit(r);
  EXPECT_NE(junit.find("tests=\"2\" failures=\"1\""), std::string::npos) << junit;
  EXPECT_NE(junit.find("&lt;x&gt; &amp; &quot;y&quot;"), std::string::npos);
  EXPECT_NE(report_table(r).find("FAILED"), std::string::npos);
  r.runs = {ok};
  EXPECT_NE(report_table(r).find("# OK"), std::string::npos);
}

TEST(Report, MutantRunPassesOnlyWhenCaught) {
  Report r;
  RunReport m;
  m.backend = "ddp";
  m.inject = "local-mean";
  m.checks = {{"grad.parity", Verdict::Pass, 1e-16, 1e-10, ""}};
  r.runs = {m};
  EXPECT_FALSE(r.passed()) << "an undetected mutant fails the report";
  r.runs[0].checks[0].verdict = Verdict::Fail;
  EXPECT_TRUE(r.passed());
  const auto j = nlohmann::json::parse(report_json(r));
  EXPECT_EQ(j["mutants"][0]["detected_by"][0], "grad.parity");
}

TEST(Report, FilesAreWrittenWhole) {
  const std::filesystem::path dir = test::temp_dir("gradcert_report_test", "files");
  Report r;
  r.runs.push_back(RunReport{});
  write_report_files(r, dir.string());
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "no temporary left: " << e.path();
  }
  EXPECT_EQ(files, 4);  // report.json, report.md, junit.xml, report.html
  EXPECT_NO_THROW(nlohmann::json::parse(std::ifstream(dir / "report.json")));
}

// Teacher forcing and noise floors in the checks (NOTE [teacher forcing], NOTE [noise floor]):
// the forced reference is what the gradient checks judge, and its floors set the tolerance.
namespace {

CheckInput forced_input(const Fixture& f, const std::vector<ReferenceUpdate>& forced, double factor) {
  CheckInput in;
  in.plan = &f.plan;
  in.dataset_size = f.spec.dataset.size;
  in.reference = &f.ref;
  in.forced = &forced;
  in.run = &f.run;
  in.tolerance = 1e-10;
  in.scale_tolerance = 1e-10;
  in.floor_factor = factor;
  return in;
}

CheckResult find(const std::vector<CheckResult>& all, const std::string& id) {
  for (const auto& c : all)
    if (c.id == id) return c;
  ADD_FAILURE() << "no check " << id;
  return {};
}

}  // namespace

TEST(Checks, GradientChecksJudgeTheTeacherForcedReference) {
  Fixture f;
  // The stack drifted from the free-running reference at update 1 (its parameters and so its
  // gradient differ), but its gradient is right where it stood: the forced reference.
  std::vector<ReferenceUpdate> forced = f.ref;
  for (auto& v : f.run[1].grads["a.weight"].held) v += 1e-3;
  for (auto& v : forced[1].grads["a.weight"].held) v += 1e-3;
  forced[1].params_after = f.run[1].params_after;
  const auto all = run_checks(forced_input(f, forced, 10));
  EXPECT_EQ(find(all, "grad.parity").verdict, Verdict::Pass) << find(all, "grad.parity").detail;
  // Without the forced reference the same run fails grad.parity against the free-running one.
  EXPECT_EQ(f.check("grad.parity").verdict, Verdict::Fail);
  // A bug at the last update only is judged there, whatever the earlier updates did.
  for (auto& v : f.run.back().grads["b.bias"].held) v *= 1.5;
  const auto bug = find(run_checks(forced_input(f, forced, 10)), "grad.parity");
  EXPECT_EQ(bug.verdict, Verdict::Fail);
  EXPECT_NE(bug.detail.find("update " + std::to_string(f.run.size() - 1) + " b.bias"), std::string::npos) << bug.detail;
}

TEST(Checks, ToleranceIsFactorTimesTheNoiseFloorNeverBelowTheCalibratedOne) {
  Fixture f;
  std::vector<ReferenceUpdate> forced = f.ref;
  for (auto& r : forced) r.floor = {2e-9, 1e-9, 1e-9, 3e-9, true};
  forced[1].floor.grad = 4e-9;                     // the worst update's floor sets it
  f.run[2].grads["a.weight"].held[2] *= 1 + 1e-8;  // rel L2 ~1e-8: above 1e-10, below 10 x 4e-9
  const auto g = find(run_checks(forced_input(f, forced, 10)), "grad.parity");
  EXPECT_EQ(g.verdict, Verdict::Pass) << g.detail;
  EXPECT_DOUBLE_EQ(g.tolerance, 4e-8);
  EXPECT_DOUBLE_EQ(g.noise_floor, 4e-9);
  EXPECT_DOUBLE_EQ(g.floor_factor, 10);
  EXPECT_NE(g.detail.find("tolerance 4e-08 = max(calibrated 1e-10, 10 x noise floor 4e-09)"), std::string::npos)
      << g.detail;
  // factor 0: the calibrated tolerance alone, so the same error fails.
  const auto off = find(run_checks(forced_input(f, forced, 0)), "grad.parity");
  EXPECT_EQ(off.verdict, Verdict::Fail) << off.detail;
  EXPECT_DOUBLE_EQ(off.tolerance, 1e-10);
  // A floor below the calibrated tolerance never tightens it.
  for (auto& r : forced) r.floor = {1e-17, 1e-17, 1e-17, 1e-17, true};
  EXPECT_DOUBLE_EQ(find(run_checks(forced_input(f, forced, 10)), "grad.parity").tolerance, 1e-10);
  // No floor measured: no floor figures in the result.
  EXPECT_LT(f.check("grad.parity").noise_floor, 0);
}

TEST(Checks, TrajectoryHoldsEachUpdateToItsOwnFloor) {
  Fixture f;
  std::vector<ReferenceUpdate> forced = f.ref;
  for (size_t u = 0; u < f.ref.size(); ++u) f.ref[u].floor = {0, 0, 0, 1e-9 * std::pow(10.0, u), true};  // grows
  for (auto& v : f.run.back().params_after["a.weight"].held) v *= 1 + 1e-8;  // within 10 x the last floor
  auto c = find(run_checks(forced_input(f, forced, 10)), "params.trajectory");
  EXPECT_EQ(c.verdict, Verdict::Pass) << c.detail;
  // The same drift at update 0, whose floor is 1e-9, fails there.
  for (auto& v : f.run.front().params_after["a.weight"].held) v *= 1 + 1e-7;
  c = find(run_checks(forced_input(f, forced, 10)), "params.trajectory");
  EXPECT_EQ(c.verdict, Verdict::Fail) << c.detail;
  EXPECT_NE(c.detail.find("worst update 0 a.weight"), std::string::npos) << c.detail;
  EXPECT_DOUBLE_EQ(c.tolerance, 1e-8);
}
