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
  t.values = std::move(v);
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
      b.grads["a.weight"].values[0] += 1e-17;
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
  for (auto& v : f.run[1].grads["a.weight"].values) v *= 2;  // e.g. a missing 1/D
  const auto c = f.check("grad.parity");
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_NEAR(c.figure, 1.0, 1e-12);
  EXPECT_NE(c.detail.find("update 1 a.weight"), std::string::npos) << c.detail;
}

TEST(Checks, TinyGradientErrorOnOneElementIsSeen) {
  Fixture f;
  f.run[2].grads["b.bias"].values[0] += 1e-9;
  EXPECT_EQ(f.check("grad.parity").verdict, Verdict::Fail);
}

TEST(Checks, NanGradientFails) {
  Fixture f;
  f.run[0].grads["b.bias"].values[0] = std::nan("");
  const auto c = f.check("grad.parity");
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_TRUE(std::isnan(c.figure));
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
  f.run[2].params_after["b.bias"].values[0] = -1.001;
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
  EXPECT_EQ(f.check("batch.update_size").verdict, Verdict::Fail);
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
