// The pieces behind scripts/certify-stacks, torch-free: figures a stack does not expose
// (null in manifest.json), the teacher-forced diagnosis, and the findings report.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "conformance/checks/checks.hpp"
#include "conformance/checks/diagnosis.hpp"
#include "conformance/core/files.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/tests/temp_dirs.hpp"
#include "reports/findings.hpp"

using namespace gradcert;
using nlohmann::json;

namespace {

std::string manifest_text(const Plan& plan, const json& loss, const json& n, bool drop_loss_key = false) {
  json ups = json::array();
  for (const auto& w : plan.windows) {
    json u = {{"update", w.update},       {"loss", loss},
              {"valid_targets", n},       {"step_seconds", 0.1},
              {"grads", "g.safetensors"}, {"params", "p.safetensors"}};
    if (drop_loss_key) u.erase("loss");
    ups.push_back(u);
  }
  return json{{"schema", "gradcert.artifacts/1"}, {"world", plan.dp}, {"nonce", "n0"}, {"updates", ups}}.dump();
}

HostTensor t1(std::vector<double> v) {
  HostTensor t;
  t.name = "w";
  t.shape = {static_cast<int64_t>(v.size())};
  t.held = std::move(v);
  return t;
}

}  // namespace

// (NOTE [stack figures]) null = not exposed (the checks skip); an absent key is still an error.
TEST(StackFigures, NullLossAndCountAreNotExposedAbsentIsAnError) {
  const Spec spec;
  const Plan plan = make_plan(spec);
  auto e = parse_manifest_json(manifest_text(plan, nullptr, nullptr), "m.json", plan, plan.dp, "n0");
  ASSERT_EQ(e.size(), plan.windows.size());
  EXPECT_FALSE(e[0].scalars.has_loss);
  EXPECT_FALSE(e[0].scalars.has_valid_targets);
  e = parse_manifest_json(manifest_text(plan, 2.5, 7), "m.json", plan, plan.dp, "n0");
  EXPECT_TRUE(e[0].scalars.has_loss);
  EXPECT_EQ(e[0].scalars.valid_targets, 7);
  EXPECT_THROW(parse_manifest_json(manifest_text(plan, 2.5, 7, true), "m.json", plan, plan.dp, "n0"), ArtifactError);
}

TEST(StackFigures, ChecksSkipUpdatesWithoutTheFigureAndStillFailAWrongOne) {
  std::vector<ReferenceUpdate> ref(2);
  std::vector<BackendUpdate> run(2);
  for (int u = 0; u < 2; ++u) {
    ref[u].loss = 3.0, ref[u].valid_targets = 10;
    run[u].loss = 3.0, run[u].valid_targets = 10;
    run[u].has_loss = run[u].has_valid_targets = false;
  }
  EXPECT_EQ(check_window_count(ref, run).verdict, Verdict::Skip);
  EXPECT_EQ(check_global_mean_loss(ref, run, 1e-10).verdict, Verdict::Skip);
  run[1].has_valid_targets = true, run[1].valid_targets = 11;  // exposed in one update, and wrong
  const auto c = check_window_count(ref, run);
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_NE(c.detail.find("N not exposed in updates 0"), std::string::npos) << c.detail;
  run[1].has_loss = true, run[1].loss = 3.3;
  EXPECT_EQ(check_global_mean_loss(ref, run, 1e-10).verdict, Verdict::Fail);
}

// Two ranks, one microstep: piece gradients g0 (n=1) and g1 (n=3). The stack computed the
// local mean at update 0 and, after diverging, the global mean at update 1: with pieces at
// the stack's own parameters (teacher forced) both updates are judged and named; without,
// update 1 is not judged (the stack left the reference's parameters).
TEST(StackDiagnosis, TeacherForcedJudgesEveryUpdateAndNamesEach) {
  std::vector<UpdatePieces> pieces(2);
  std::vector<ReferenceUpdate> ref(2);
  std::vector<BackendUpdate> run(2);
  const std::vector<double> g0 = {1.0, 0.0}, g1 = {0.0, 3.0};
  for (int u = 0; u < 2; ++u) {
    auto& w = pieces[u];
    w.update = u;
    w.valid_targets = 4;
    w.meta = {{0, 0, 0.0, 1, 1}, {1, 0, 0.0, 3, 1}};
    w.grads["r0.a0.w"] = t1(g0);
    w.grads["r1.a0.w"] = t1(g1);
    ref[u].params_after["w"] = t1({1.0, 1.0});
    run[u].params_after["w"] = t1({u == 0 ? 5.0 : 1.0, 1.0});  // diverged after update 0
  }
  // local mean (D=2): (g0/1 + g1/3) / 2; global mean: (g0 + g1) / 4.
  run[0].grads["w"] = t1({0.5, 0.5});
  run[1].grads["w"] = t1({0.25, 0.75});
  const Diagnosis free_running = diagnose(pieces, ref, run, 2, 1, 1e-10, false);
  EXPECT_EQ(free_running.per_update.size(), 1u);  // only update 0
  const Diagnosis forced = diagnose(pieces, ref, run, 2, 1, 1e-10, true);
  ASSERT_EQ(forced.per_update.size(), 2u);
  EXPECT_EQ(forced.per_update[0].id, "local-mean");
  EXPECT_EQ(forced.per_update[1].id, "global-mean");
  EXPECT_NE(forced.note.find("per update: 0 local-mean"), std::string::npos) << forced.note;
  // A float32-sized wobble on the global mean: not matched at 1e-10, but separated.
  run[0].grads["w"] = t1({0.25 * (1 + 3e-8), 0.75});
  run[1].grads["w"] = t1({0.25, 0.75 * (1 - 3e-8)});
  const Diagnosis near = diagnose(pieces, ref, run, 2, 1, 1e-10, true);
  EXPECT_FALSE(near.matched);
  EXPECT_TRUE(near.separated) << near.note;
  EXPECT_EQ(near.best.id, "global-mean");
  // Far from everything: neither.
  run[0].grads["w"] = t1({-3.0, 7.0});
  const Diagnosis none = diagnose(pieces, ref, run, 2, 1, 1e-10, true);
  EXPECT_FALSE(none.matched || none.separated) << none.note;
}

namespace {

// A certify-stacks folder with one ran entry (its report, plan and manifest) and one skip.
std::string findings_dir(const std::string& ledger_verdict, const std::string& partial_best) {
  const std::string dir = test::temp_dir("gradcert_findings", ledger_verdict + "_" + partial_best);
  const std::string run_dir = dir + "/runs/a/runs/x";
  std::filesystem::create_directories(run_dir);
  std::filesystem::create_directories(dir + "/entries");
  json plan = {{"windows", json::array({{{"update", 0}, {"partial", false}}, {{"update", 1}, {"partial", true}}})}};
  write_file_atomic(run_dir + "/plan.json", plan.dump());
  json manifest = {{"versions", {{"stack_version", "transformers 9.9.9"}}},
                   {"notes", "facts"},
                   {"updates", json::array({json::object(), json::object()})}};
  write_file_atomic(run_dir + "/manifest.json", manifest.dump());
  json report = {{"runs", json::array({{{"verdict", "fail"},
                                        {"run_dir", run_dir},
                                        {"checks", json::array({{{"id", "batch.sample_ledger"},
                                                                 {"verdict", ledger_verdict},
                                                                 {"figure", 2},
                                                                 {"tolerance", 0},
                                                                 {"detail", "ids 20,21 twice"}},
                                                                {{"id", "grad.parity"},
                                                                 {"verdict", "fail"},
                                                                 {"figure", 0.5},
                                                                 {"tolerance", 1e-10},
                                                                 {"detail", "d"}}})},
                                        {"diagnosis",
                                         {{"matched", true},
                                          {"separated", false},
                                          {"best", {{"id", "micro-mean"}, {"figure", 1e-16}}},
                                          {"note", "n"},
                                          {"per_update", json::array({{{"update", 0}, {"best", "micro-mean"}},
                                                                      {{"update", 1}, {"best", partial_best}}})}}}}})}};
  write_file_atomic(dir + "/runs/a/report.json", report.dump());
  write_file_atomic(dir + "/entries/a.json", json{{"id", "s/a"},
                                                  {"stack", "s"},
                                                  {"config", "a"},
                                                  {"world", 2},
                                                  {"dtype", "float64"},
                                                  {"exit", 1},
                                                  {"out", dir + "/runs/a"}}
                                                 .dump());
  write_file_atomic(
      dir + "/entries/b.json",
      json{{"id", "s/b"}, {"stack", "s"}, {"config", "b"}, {"exit", 77}, {"skip", "no recipe in this version"}}.dump());
  return dir;
}

}  // namespace

TEST(StackFindings, EachEntrySaysWhatTheStackComputedAndDidWithThePartialWindow) {
  const auto f = read_findings(findings_dir("fail", "partial-nominal-accum"));
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].id, "s/a");
  EXPECT_EQ(f[0].version, "transformers 9.9.9");
  EXPECT_EQ(f[0].verdict, "fail");
  EXPECT_EQ(f[0].diagnosis, "micro-mean");
  EXPECT_EQ(f[0].n_count, "shifted");
  EXPECT_EQ(f[0].partial_kind, "divided by the nominal A, examples differ");
  EXPECT_NE(f[0].partial_window.find("ids 20,21 twice"), std::string::npos) << f[0].partial_window;
  EXPECT_EQ(f[1].verdict, "skip");
  EXPECT_EQ(f[1].reason, "no recipe in this version");
  const json j = json::parse(findings_json(f));
  for (const char* key : {"stack", "version", "config", "verdict", "diagnosis"})
    EXPECT_TRUE(j["entries"][0].contains(key)) << key;
  // The golden line changes when the partial window is handled otherwise.
  const auto g = read_findings(findings_dir("pass", "global-mean"));
  EXPECT_EQ(g[0].partial_kind, "correct");
  EXPECT_NE(findings_golden(f), findings_golden(g));
}

TEST(StackFindings, AMissingReportIsAnErrorNeverAPass) {
  const std::string dir = findings_dir("pass", "global-mean");
  std::filesystem::remove(dir + "/runs/a/report.json");
  const auto f = read_findings(dir);
  EXPECT_EQ(f[0].verdict, "error");
  EXPECT_NE(f[0].reason.find("report.json"), std::string::npos) << f[0].reason;
}

// (NOTE [replica digests]) Ranks holding the same tensor must agree; the minority is named.
TEST(ReplicasAgree, TheDivergedRankAndTheFirstUpdateAreNamed) {
  std::vector<BackendUpdate> run(3);
  for (int u = 0; u < 3; ++u)
    for (int r = 0; r < 3; ++r) {
      RankRecord rr;
      rr.rank = r;
      rr.replicas["w"] = "aa";
      rr.replicas["b"] = "bb";
      run[u].ranks.push_back(rr);
    }
  EXPECT_EQ(check_replicas_agree(run, 3).verdict, Verdict::Pass);
  EXPECT_EQ(check_replicas_agree(run, 4).verdict, Verdict::Fail);  // an update not seen
  run[2].ranks[1].replicas["w"] = "zz";
  run[1].ranks[2].replicas["b"] = "yy";
  const CheckResult c = check_replicas_agree(run, 3);
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_EQ(c.figure, 2);
  EXPECT_NE(c.detail.find("update 1 b: rank 2 holds other values than rank 0, 1"), std::string::npos) << c.detail;
  for (auto& u : run)  // one holder per tensor: nothing to compare
    u.ranks.resize(1);
  EXPECT_EQ(check_replicas_agree(run, 3).verdict, Verdict::Skip);
}
