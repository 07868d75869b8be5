// Conformance: resumed runs (NOTE [resume] in conformance/run/harness.cpp). Every built-in
// strategy trains K updates, saves, stops every rank and resumes in a new process group at the
// same world; strategies load each other's checkpoints (NOTE [checkpoint format]); every
// planted checkpoint bug is caught by the check that names it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "backends/catalog.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/protocol/safetensors.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/tests/support.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

// The default spec (B_update 12 at D = 2, 26 examples: windows of 12, 12 and a partial 2),
// AdamW (moments and a step counter to lose), float64.
RunRequest resumed(const std::string& backend, int world, int at, const std::string& name, int tp = 1, int pp = 1) {
  RunRequest r;
  r.backend = backend;
  r.world = world;
  r.tp = tp;
  r.pp = pp;
  r.spec.topology = {world / (tp * pp), tp, pp};
  r.spec.optimizer.name = "adamw";
  r.spec.resume.at = at;
  r.spec.timeout.run_s = 120;
  r.exe = GRADCERT_EXE;
  r.run_dir = test::fresh_dir("gradcert_resume", name);
  return r;
}

const CheckResult* check_of(const RunReport& r, const std::string& id) {
  for (const auto& c : r.checks)
    if (c.id == id) return &c;
  return nullptr;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// Each strategy resumes at K = 2, so the second leg runs the partial final window (its N
// recounted after the resume); the checks run over both legs as one run.
TEST(ConformanceResume, EveryStrategyResumesAtTheSameWorldAndPassesEveryCheck) {
  struct Case {
    std::string backend;
    int world, tp, pp;
  };
  for (const Case& c : {Case{"single", 1, 1, 1}, Case{"ddp", 2, 1, 1}, Case{"zero1", 2, 1, 1}, Case{"zero2", 2, 1, 1},
                        Case{"zero3", 2, 1, 1}, Case{"fsdp", 2, 1, 1}, Case{"tp", 2, 2, 1}, Case{"pp", 2, 1, 2}}) {
    const RunRequest req = resumed(c.backend, c.world, 2, "ok_" + c.backend, c.tp, c.pp);
    const RunReport r = run_backend(req);
    EXPECT_TRUE(r.passed()) << c.backend << ": " << test::failures(r);
    const CheckResult* cp = check_of(r, "resume.checkpoint");
    ASSERT_NE(cp, nullptr) << c.backend;
    EXPECT_EQ(cp->verdict, Verdict::Pass) << cp->detail;
    for (const char* id : {"grad.parity", "params.parity", "batch.sample_ledger", "targets.window_count"})
      ASSERT_NE(check_of(r, id), nullptr) << c.backend << " " << id;
    EXPECT_EQ(r.resume_at, 2);
    // The first leg measured its save on every rank: the pause and a peak the budget holds.
    int saves = 0;
    for (const auto& p : r.memory.peaks)
      if (p.phase == "checkpoint save") {
        ++saves;
        EXPECT_GT(p.peak_bytes, 0) << c.backend << " rank " << p.rank;
        EXPECT_LE(p.seconds, r.throughput.save_pause_seconds) << c.backend;
      }
    EXPECT_EQ(saves, c.world) << c.backend;
    for (const char* f : {"leg1.manifest.json", "leg2.manifest.json", "leg1.rank0.json", "checkpoint/checkpoint.json",
                          "checkpoint/rank0.safetensors"})
      EXPECT_TRUE(fs::exists(req.run_dir + "/" + f)) << c.backend << ": " << f;
  }
}

// The same strategy resumed computes bit for bit what it computes uninterrupted (float64):
// nothing of the state is lost or rounded through the checkpoint.
TEST(ConformanceResume, AResumedRunIsBitIdenticalToTheUninterruptedOne) {
  for (const std::string backend : {"ddp", "fsdp", "zero3"}) {
    RunRequest whole = resumed(backend, 2, 0, "whole_" + backend);
    RunRequest legs = resumed(backend, 2, 1, "legs_" + backend);
    const RunReport a = run_backend(whole), b = run_backend(legs);
    ASSERT_TRUE(a.passed()) << test::failures(a);
    ASSERT_TRUE(b.passed()) << test::failures(b);
    const auto params = [&](const RunRequest& r, int u) {
      if (backend == "ddp") return bytes_of(r.run_dir + "/u" + std::to_string(u) + ".params.safetensors");
      return bytes_of(r.run_dir + "/u" + std::to_string(u) + ".rank0.params.safetensors") +
             bytes_of(r.run_dir + "/u" + std::to_string(u) + ".rank1.params.safetensors");
    };
    for (int u = 1; u < 3; ++u) EXPECT_EQ(params(whole, u), params(legs, u)) << backend << " update " << u;
  }
}

// A checkpoint is layout-independent: a replicated strategy's loads into a sharded one and
// back, in float64 (AdamW), float32 (SGD with momentum) and bfloat16 (float32 masters).
TEST(ConformanceResume, StrategiesLoadEachOthersCheckpoints) {
  struct Case {
    std::string from, to;
    DType dtype;
    std::string optimizer;
  };
  for (const Case& c : {Case{"ddp", "fsdp", DType::Float64, "adamw"}, Case{"fsdp", "zero1", DType::Float64, "adamw"},
                        Case{"zero3", "ddp", DType::Float32, "sgd"}, Case{"zero2", "fsdp", DType::BFloat16, "adamw"}}) {
    RunRequest req = resumed(c.from, 2, 2, "reshard_" + c.from + "_" + c.to);
    req.spec.resume.backend = c.to;
    req.spec.dtype = c.dtype;
    req.spec.optimizer.name = c.optimizer;
    if (c.optimizer == "sgd") req.spec.optimizer.momentum = 0.9;
    const RunReport r = run_backend(req);
    EXPECT_TRUE(r.passed()) << c.from << " -> " << c.to << ": " << test::failures(r);
    EXPECT_EQ(r.resume_backend, c.to);
    EXPECT_NE(run_label(r).find("resumed@2->" + c.to), std::string::npos) << run_label(r);
  }
}

// Resharding across worlds: the second leg runs on another number of ranks with the same
// B_update (2 -> 3: accumulation 3 -> 2; 3 -> 2: micro batch 2 -> 3), loading the first leg's
// shards through the canonical tensors; every check runs over both worlds as one run.
TEST(ConformanceResume, ShardedStrategiesReshardAcrossWorlds) {
  struct Case {
    std::string from, to;
    int world, world2;
  };
  for (const Case& c : {Case{"fsdp", "fsdp", 2, 3}, Case{"fsdp", "fsdp", 3, 2}, Case{"zero3", "zero3", 2, 3},
                        Case{"zero3", "zero3", 3, 2}, Case{"ddp", "fsdp", 2, 3}}) {
    // World 3: B_update 18 of 26 examples, two windows: resume after the first.
    RunRequest req = resumed(c.from, c.world, c.world == 2 ? 2 : 1,
                             "worlds_" + c.from + std::to_string(c.world) + "_" + c.to + std::to_string(c.world2));
    req.spec.resume.backend = c.to;
    req.spec.resume.world = c.world2;
    const RunReport r = run_backend(req);
    EXPECT_TRUE(r.passed()) << c.from << " " << c.world << " -> " << c.to << " " << c.world2 << ": "
                            << test::failures(r);
    EXPECT_EQ(r.resume_world, c.world2);
    EXPECT_TRUE(fs::exists(req.run_dir + "/leg2.rank" + std::to_string(c.world2 - 1) + ".json")) << req.run_dir;
  }
  // No batch split of B_update 12 over D = 5 keeps the micro batch or the accumulation steps.
  RunRequest odd = resumed("fsdp", 2, 2, "worlds_odd");
  odd.spec.resume.world = 5;
  try {
    (void)run_backend(odd);
    ADD_FAILURE() << "world 5 ran";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("resume.world"), std::string::npos) << e.what();
  }
}

// Over two epochs (6 updates): a resume after the last update of epoch 0 (K = 3), and one in
// the middle of epoch 1, whose final window is partial (K = 4).
TEST(ConformanceResume, AResumeAtAnEpochsEndAndInsideAPartialWindowsEpochPass) {
  for (int at : {3, 4})
    for (const std::string backend : {"ddp", "fsdp"}) {
      RunRequest req = resumed(backend, 2, at, "epochs_" + backend + "_" + std::to_string(at));
      req.spec.updates = 6;
      const RunReport r = run_backend(req);
      EXPECT_TRUE(r.passed()) << backend << " at " << at << ": " << test::failures(r);
    }
}

// Each planted checkpoint bug, on a replicated, a sharded and a pipelined strategy: caught,
// by the check whose message names what was lost.
TEST(ConformanceResume, EachResumeMutantIsCaughtByTheCheckThatNamesIt) {
  struct Case {
    std::string backend;
    int world, tp, pp;
  };
  for (const Case& c : {Case{"ddp", 2, 1, 1}, Case{"fsdp", 2, 1, 1}, Case{"pp", 2, 1, 2}}) {
    for (const auto& m : mutant_names(c.backend)) {
      if (!needs_resume(parse_mutant(m))) continue;
      RunRequest req = resumed(c.backend, c.world, 2, c.backend + "_" + m, c.tp, c.pp);
      req.inject = m;
      const RunReport r = run_backend(req);
      ASSERT_TRUE(r.error.empty()) << c.backend << " " << m << ": " << r.error;
      const auto caught = r.detected_by();
      const auto has = [&](const std::string& id) {
        return std::find(caught.begin(), caught.end(), id) != caught.end();
      };
      const CheckResult* cp = check_of(r, "resume.checkpoint");
      ASSERT_NE(cp, nullptr) << m;
      if (m == "resume-optimizer-unsaved") {
        // An incomplete checkpoint ends the run after the first leg (NOTE [resume]).
        EXPECT_EQ(caught, std::vector<std::string>{"resume.checkpoint"}) << test::failures(r);
        EXPECT_NE(cp->detail.find("tensor 'optim."), std::string::npos) << cp->detail;
        EXPECT_NE(cp->detail.find("are in no shard"), std::string::npos) << cp->detail;
      } else if (m == "resume-step-reset") {
        // The checkpoint is right; the load forgets the counter: the first step after the resume is wrong.
        EXPECT_EQ(cp->verdict, Verdict::Pass) << cp->detail;
        EXPECT_TRUE(has("params.parity")) << c.backend << ": " << test::failures(r);
      } else if (m == "resume-sampler-restart" || m == "resume-sampler-skip") {
        EXPECT_EQ(cp->verdict, Verdict::Pass) << cp->detail;
        EXPECT_TRUE(has("batch.sample_ledger")) << c.backend << " " << m << ": " << test::failures(r);
      } else if (m == "resume-shard-unwritten") {
        EXPECT_EQ(caught, std::vector<std::string>{"resume.checkpoint"}) << test::failures(r);
        EXPECT_NE(cp->detail.find("rank 1 wrote no rank1.safetensors"), std::string::npos) << cp->detail;
        EXPECT_NE(cp->detail.find("are in no shard"), std::string::npos) << cp->detail;  // and which tensor
      } else {
        ADD_FAILURE() << "no expectation for mutant " << m;
      }
    }
  }
}

// `gradcert check` of a resumed run folder judges both legs and the checkpoint again.
TEST(ConformanceResume, CheckingAResumedRunFolderAgainPasses) {
  const RunRequest req = resumed("zero2", 2, 1, "check_again");
  const RunReport r = run_backend(req);
  ASSERT_TRUE(r.passed()) << test::failures(r);
  CheckRequest c;
  c.run_dir = req.run_dir;
  c.work_dir = test::fresh_dir("gradcert_resume", "check_again_work");
  const CheckedRun again = check_run(c);
  EXPECT_TRUE(again.report.passed()) << test::failures(again.report);
  const CheckResult* cp = check_of(again.report, "resume.checkpoint");
  ASSERT_NE(cp, nullptr);
  EXPECT_EQ(cp->verdict, Verdict::Pass) << cp->detail;
}

TEST(ConformanceResume, BadResumeRequestsAreRefusedNamingTheField) {
  auto refused = [](RunRequest req) -> std::string {
    try {
      (void)run_backend(req);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  RunRequest late = resumed("ddp", 2, 3, "bad_late");  // the plan has 3 updates
  EXPECT_NE(refused(late).find("resume.at (--resume-at) is 3: the plan has 3 updates"), std::string::npos)
      << refused(late);
  RunRequest unknown = resumed("ddp", 2, 1, "bad_backend");
  unknown.spec.resume.backend = "nope";
  EXPECT_NE(refused(unknown).find("nope"), std::string::npos);
  RunRequest single = resumed("ddp", 2, 1, "bad_single");
  single.spec.resume.backend = "single";  // cannot run world 2
  EXPECT_NE(refused(single).find("single"), std::string::npos) << refused(single);
  RunRequest plain = resumed("ddp", 2, 0, "bad_inject");
  plain.inject = "resume-step-reset";
  EXPECT_NE(refused(plain).find("needs --resume-at"), std::string::npos) << refused(plain);
  // An external stack's second leg is a command, a built-in one's a strategy (NOTE [stack checkpoints]).
  RunRequest external = resumed("external", 2, 1, "bad_external");
  external.command = "true";
  external.spec.resume.backend = "fsdp";
  EXPECT_NE(refused(external).find("an external stack's second leg is resume.command"), std::string::npos)
      << refused(external);
  RunRequest command = resumed("ddp", 2, 1, "bad_command");
  command.spec.resume.command = "true";
  EXPECT_NE(refused(command).find("resume.command (--resume-command) applies to --backend external"), std::string::npos)
      << refused(command);
  RunRequest audit = resumed("external", 2, 1, "bad_audit");
  audit.command = "true";
  audit.sampler_audit = true;
  EXPECT_NE(refused(audit).find("--sampler-audit with resume.at"), std::string::npos) << refused(audit);
  for (const auto& [text, field] : {std::pair<std::string, std::string>{R"({"resume": {"at": -1}})", "resume.at"},
                                    {R"({"resume": {"backend": "fsdp"}})", "resume.backend"},
                                    {R"({"resume": {"command": "x"}})", "resume.command"},
                                    {R"({"resume": {"at": 1.5}})", "resume.at"},
                                    {R"({"resume": {"when": 1}})", "resume.when"}}) {
    try {
      (void)parse_spec(text);
      ADD_FAILURE() << text << " parsed";
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << text << ": " << e.what();
    }
  }
}
