// `gradcert observe -- CMD`: a user's own training job (examples/observe/ddp_loop.py, plain
// PyTorch DDP under torchrun with its own data, sampler, accumulation, AdamW, warm-up and
// clipping) certified on what it did; its planted loss bugs diagnosed; a crashed, stopped or
// short job and a job without the integration each end in an error that says which.
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "conformance/run/observe.hpp"
#include "conformance/tests/support.hpp"

using namespace gradcert;

namespace {

const std::string kRepo = GRADCERT_SOURCE_DIR;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `gradcert observe` on the example under torchrun (2 ranks, a free rendezvous port), the
// example started through `script` (the example itself or the fault fixture).
test::CliResult observe(const std::string& out, const std::string& gradcert_args, const std::string& script,
                        const std::string& job_args) {
  return test::run_cli("observe --out " + out + " " + gradcert_args + " -- " + kRepo +
                       "/.venv/bin/torchrun --standalone --nproc_per_node 2 " + script + " " + job_args);
}

const std::string kExample = kRepo + "/examples/observe/ddp_loop.py";
const std::string kFaults = kRepo + "/conformance/tests/observe_faults.py";

std::string verdict_of(const nlohmann::json& run, const std::string& id) {
  for (const auto& c : run["checks"])
    if (c["id"] == id) return c["verdict"];
  return "absent";
}

// `gradcert check` of the observed run folder under `out` gives the verdict, check verdicts and
// figures, and diagnosis the observe run gave (NOTE [observe record]); returns check's exit code.
int expect_check_agrees(const std::string& out) {
  const auto c = test::run_cli("check " + out + "/runs/observed --out " + out + "/check");
  const auto seen = nlohmann::json::parse(slurp(out + "/report.json"))["runs"][0];
  const auto again = nlohmann::json::parse(slurp(out + "/check/report.json"))["runs"][0];
  EXPECT_EQ(again["verdict"], seen["verdict"]) << c.out;
  EXPECT_EQ(again["checks"].size(), seen["checks"].size()) << c.out;
  for (size_t i = 0; i < seen["checks"].size() && i < again["checks"].size(); ++i) {
    EXPECT_EQ(again["checks"][i]["id"], seen["checks"][i]["id"]) << c.out;
    EXPECT_EQ(again["checks"][i]["verdict"], seen["checks"][i]["verdict"]) << seen["checks"][i]["id"] << "\n" << c.out;
    const auto &x = seen["checks"][i]["figure"], &y = again["checks"][i]["figure"];
    if (x.is_number() && y.is_number())  // the reference is recomputed: equal up to its last bits
      EXPECT_NEAR(y.get<double>(), x.get<double>(), 1e-6 * std::abs(x.get<double>()) + 1e-30)
          << seen["checks"][i]["id"];
    else
      EXPECT_EQ(y, x) << seen["checks"][i]["id"] << "\n" << c.out;
  }
  EXPECT_EQ(again["diagnosis"]["best"]["id"], seen["diagnosis"]["best"]["id"]) << c.out;
  EXPECT_NE(c.out.find("no rank launched"), std::string::npos) << c.out;
  return c.code;
}

ObservedExample example(const std::string& key, std::vector<int64_t> tokens, std::vector<int64_t> labels) {
  return {key, std::move(tokens), std::move(labels)};
}

}  // namespace

// Records -> the run folder's parts is a pure function (NOTE [observed plan]): examples numbered
// by first appearance, each rank's consumption, the job's N in the manifest (and no rank N of
// gradcert's own counting), nothing written; a record naming a file the protocol does not is refused.
TEST(ConformanceObserve, RecordsMakeTheRunFolderWithoutFiles) {
  ObserveRequest req;
  req.argv = {"python", "train.py"};
  req.updates = 1;
  req.run_dir = test::fresh_dir("gradcert_observe", "pure") + "/never-written";
  ObservedJob job;
  job.world = 2;
  job.vocab = 16;
  job.max_len = 8;
  job.dtype = "float64";
  job.factory = "model.py:build";
  job.optimizer_class = "SGD";
  job.optimizer_kind = "sgd";
  job.job = nlohmann::json::object();
  ObservedRecords rec(1, std::vector<ObservedUpdate>(2));
  for (int g = 0; g < 2; ++g) {
    rec[0][g].rank = g;
    rec[0][g].world = 2;
    rec[0][g].grads = {"u0.grads.safetensors"};
    rec[0][g].params = {"u0.params.safetensors"};
    rec[0][g].microsteps.resize(1);
  }
  rec[0][0].microsteps[0].examples = {example("a", {1, 2, 3}, {2, 3, -100}), example("b", {4, 5}, {5, -100})};
  rec[0][0].microsteps[0].num_items_in_batch = 4;
  rec[0][1].microsteps[0].examples = {example("a", {1, 2, 3}, {2, 3, -100}), example("c", {6, 7}, {-100, -100})};
  rec[0][0].groups =
      nlohmann::json::array({{{"params", {"w"}}, {"lr", 0.1}, {"momentum", 0.0}, {"weight_decay", 0.0}}});

  const ObservedFolder f = observed_folder(req, job, rec);
  const Plan& plan = f.observed.run.plan;
  EXPECT_EQ(plan.dp, 2);
  EXPECT_EQ(plan.accum, 1);
  EXPECT_EQ(plan.micro, 2);
  ASSERT_EQ(f.samples.size(), 3u);
  EXPECT_EQ(f.samples[2].tokens, (std::vector<int64_t>{6, 7}));
  ASSERT_EQ(f.ranks.size(), 2u);
  EXPECT_EQ(f.ranks[0][0].consumed, (std::vector<std::vector<int64_t>>{{0, 1}}));
  EXPECT_EQ(f.ranks[1][0].consumed, (std::vector<std::vector<int64_t>>{{0, 2}}));
  EXPECT_EQ(f.ranks[1][0].valid_targets, -1);
  EXPECT_EQ(plan.windows.at(0).valid_targets, 2 + 2 + 1 + 0);
  ASSERT_EQ(f.manifest.size(), 1u);
  EXPECT_FALSE(f.manifest[0].has_loss);
  EXPECT_EQ(f.manifest[0].valid_targets, 4);
  EXPECT_FALSE(std::filesystem::exists(req.run_dir));

  rec[0][0].params = {"weights.safetensors"};
  try {
    (void)observed_folder(req, job, rec);
    ADD_FAILURE() << "a record naming weights.safetensors was accepted";
  } catch (const ArtifactError& e) {
    EXPECT_NE(std::string(e.what()).find("observed.rank0.u0.json: field 'params' names weights.safetensors, the "
                                         "protocol's file is u0.params.safetensors"),
              std::string::npos)
        << e.what();
  }
}

// The correct job (global token mean over the whole window) passes every check at float64;
// the report names what was observed.
TEST(ConformanceObserve, PlainDdpJobWithTheGlobalMeanPasses) {
  const std::string out = test::fresh_dir("gradcert_observe", "pass");
  const auto r = observe(out, "--updates 3", kExample, "--loss global-mean");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(slurp(out + "/report.json"));
  ASSERT_EQ(j["runs"].size(), 1u);
  const auto& run = j["runs"][0];
  EXPECT_EQ(run["verdict"], "pass") << r.out;
  for (const char* id : {"grad.parity", "grad.scale", "params.parity", "params.trajectory", "batch.update_size",
                         "batch.sample_ledger", "replicas.agree"})
    EXPECT_EQ(verdict_of(run, id), "pass") << id << "\n" << r.out;
  EXPECT_EQ(run["updates"], 3) << r.out;
  EXPECT_NE(r.out.find("through watch (world 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("clip_grad_norm_ max_norm 1"), std::string::npos) << r.out;
  EXPECT_EQ(expect_check_agrees(out), 0);
}

// The 2024 gradient-accumulation bug (each microbatch's own token mean, divided by A) and the
// per-rank mean both fail grad.parity, and the diagnosis names what the job computed instead.
TEST(ConformanceObserve, PlantedLossBugsFailAndAreDiagnosed) {
  for (const std::string bug : {"micro-mean", "local-mean"}) {
    const std::string out = test::fresh_dir("gradcert_observe", bug);
    const auto r = observe(out, "--updates 2", kExample, "--loss " + bug);
    EXPECT_EQ(r.code, 1) << bug << "\n" << r.out;
    const auto j = nlohmann::json::parse(slurp(out + "/report.json"));
    const auto& run = j["runs"][0];
    EXPECT_EQ(verdict_of(run, "grad.parity"), "fail") << bug << "\n" << r.out;
    EXPECT_NE(r.out.find("matches " + bug), std::string::npos) << bug << "\n" << r.out;
    EXPECT_EQ(expect_check_agrees(out), 1) << bug;
  }
}

// A rank that dies mid-run: the error names the rank and what every rank recorded.
TEST(ConformanceObserve, CrashedRankIsNamed) {
  const std::string out = test::fresh_dir("gradcert_observe", "crash");
  const auto r = observe(out, "--updates 3", kFaults, "crash 1 2 -- --loss global-mean");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 1) << "a crash is an error, not a failed check\n" << r.out;
  EXPECT_NE(r.out.find("rank 1 ended first, after recording update 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("update 2 never completed"), std::string::npos) << r.out;
}

// A rank that stops (hangs in its optimizer step): the timeout ends the run and names it. The
// timeout leaves the job room to start and record update 0 on a loaded 2-core machine (20 s did
// not, once: the job was stopped before its first record).
TEST(ConformanceObserve, StoppedRankTimesOutAndIsNamed) {
  const std::string out = test::fresh_dir("gradcert_observe", "hang");
  const auto r = observe(out, "--updates 3 --timeout 45", kFaults, "hang 1 1 -- --loss global-mean");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1 ended first"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("timeout after 45"), std::string::npos) << r.out;
}

// A job that ends cleanly before the K-th update: the error says how many it reached and what to ask.
TEST(ConformanceObserve, ShortJobSaysHowManyUpdatesItReached) {
  const std::string out = test::fresh_dir("gradcert_observe", "short");
  const auto r = observe(out, "--updates 3", kExample, "--steps 2");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("after 2 of the --updates 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--updates 2"), std::string::npos) << r.out;
}

// A command with no gradcert integration in it is never certified.
TEST(ConformanceObserve, JobWithoutTheIntegrationIsNotCertified) {
  const std::string out = test::fresh_dir("gradcert_observe", "none");
  const auto r = test::run_cli("observe --out " + out + " -- " + kRepo + "/.venv/bin/python -c 'print(1)'");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("without recording anything"), std::string::npos) << r.out;
}

namespace {

// `gradcert observe` on an example of examples/observe/ under `torchrun` from `venv`.
test::CliResult observe_example(const std::string& out, const std::string& venv, const std::string& example,
                                const std::string& job_args) {
  return test::run_cli("observe --out " + out + " --updates 3 -- " + venv +
                       "/bin/torchrun --standalone --nproc_per_node 2 " + kRepo + "/examples/observe/" + example + " " +
                       job_args);
}

nlohmann::json observed_run(const std::string& out) {
  return nlohmann::json::parse(slurp(out + "/report.json"))["runs"][0];
}

double figure_of(const nlohmann::json& run, const std::string& id) {
  for (const auto& c : run["checks"])
    if (c["id"] == id && c["figure"].is_number()) return c["figure"].get<double>();
  return -1;
}

}  // namespace

// A correct loop passes at float32 too, held to float32's calibrated tolerance (or its noise floor).
TEST(ConformanceObserve, PlainDdpJobPassesAtFloat32) {
  const std::string out = test::fresh_dir("gradcert_observe", "f32");
  const auto r = observe(out, "--updates 3", kExample, "--dtype float32");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto run = observed_run(out);
  EXPECT_EQ(run["dtype"], "float32");
  EXPECT_LT(figure_of(run, "grad.parity"), 2e-5) << r.out;
}

// HF Trainer 5.x with GPT2LMHeadModel, seen from the user's side: num_items_in_batch counts the
// unshifted labels (one target per row too many), so every gradient is N / (N + rows) too small;
// the same script with LlamaForCausalLM counts N right and passes (float32).
TEST(ConformanceObserve, HfTrainerGpt2CountsNOnUnshiftedLabelsAndLlamaDoesNot) {
  const std::string venv = kRepo + "/.venv";
  const std::string gpt2 = test::fresh_dir("gradcert_observe", "hf_gpt2");
  auto r = observe_example(gpt2, venv, "hf_trainer.py", "--arch gpt2 --out " + gpt2 + "/trainer");
  ASSERT_EQ(r.code, 1) << r.out;
  auto run = observed_run(gpt2);
  EXPECT_EQ(verdict_of(run, "targets.window_count"), "fail") << r.out;
  EXPECT_EQ(verdict_of(run, "grad.scale"), "fail") << r.out;
  EXPECT_EQ(run["diagnosis"]["best"]["id"], "unshifted-count") << r.out;
  EXPECT_NE(r.out.find("dropout turned off for the observed updates in transformer.drop p=0.1"), std::string::npos)
      << r.out;
  // The finding where people look: every report format names what the job computed instead, with its
  // figure, and the HTML's Reproduce line is the observe command that reruns the job.
  const std::string headline = "the gradient matches unshifted-count";
  const std::string junit = slurp(gpt2 + "/junit.xml"), md = slurp(gpt2 + "/report.md"),
                    html = slurp(gpt2 + "/report.html");
  EXPECT_NE(junit.find("message=\"figure"), std::string::npos) << junit;
  EXPECT_NE(junit.find(headline), std::string::npos) << junit;
  EXPECT_NE(md.find("diagnosis (observed"), std::string::npos) << md;
  EXPECT_NE(md.find("matches unshifted-count"), std::string::npos) << md;
  EXPECT_NE(html.find("id=\"findings\""), std::string::npos);
  EXPECT_NE(html.find("matches unshifted-count"), std::string::npos);
  EXPECT_NE(html.find("<pre><code>gradcert observe --out " + gpt2 + " --updates 3 -- " + venv + "/bin/torchrun"),
            std::string::npos);
  EXPECT_EQ(html.find("gradcert run --spec"), std::string::npos);

  const std::string llama = test::fresh_dir("gradcert_observe", "hf_llama");
  r = observe_example(llama, venv, "hf_trainer.py", "--arch llama --out " + llama + "/trainer");
  EXPECT_EQ(r.code, 0) << r.out;
  run = observed_run(llama);
  EXPECT_EQ(verdict_of(run, "targets.window_count"), "pass") << r.out;
  EXPECT_EQ(run["diagnosis"]["best"]["id"], "global-mean") << r.out;
}

// accelerate's documented loop with a mean loss is the micro-mean; its token-level recipe passes.
TEST(ConformanceObserve, AccelerateMeanLossIsMicroMeanAndTheTokenRecipePasses) {
  const std::string venv = kRepo + "/.venv";
  const std::string mean = test::fresh_dir("gradcert_observe", "acc_mean");
  auto r = observe_example(mean, venv, "accelerate_loop.py", "--loss mean");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(observed_run(mean)["diagnosis"]["best"]["id"], "micro-mean") << r.out;
  const std::string tg = test::fresh_dir("gradcert_observe", "acc_tg");
  r = observe_example(tg, venv, "accelerate_loop.py", "--loss token-global");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(verdict_of(observed_run(tg), "batch.update_size"), "pass") << r.out;
}

// FSDP2: every rank's DTensor shards are recorded (nothing gathered) and assembled; the correct
// loop passes at float64, its micro-mean is named.
TEST(ConformanceObserve, Fsdp2LoopPassesFromItsShardsAndItsMicroMeanIsNamed) {
  const std::string venv = kRepo + "/.venv";
  const std::string ok = test::fresh_dir("gradcert_observe", "fsdp2");
  auto r = observe_example(ok, venv, "fsdp2_loop.py", "--loss global-mean");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_LT(figure_of(observed_run(ok), "grad.parity"), 1e-10) << r.out;
  EXPECT_TRUE(std::filesystem::exists(ok + "/runs/observed/u0.rank1.grads.safetensors")) << r.out;
  const std::string bug = test::fresh_dir("gradcert_observe", "fsdp2_bug");
  r = observe_example(bug, venv, "fsdp2_loop.py", "--loss micro-mean");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(observed_run(bug)["diagnosis"]["best"]["id"], "micro-mean") << r.out;
}

// Lightning runs backward inside optimizer.step(closure): the callback takes the gradient at
// on_before_optimizer_step. Its venv is scripts/stack-env's (a skip, naming why, where it cannot install).
TEST(ConformanceObserve, LightningCallbackSeesTheGradientAfterTheClosure) {
  const auto env = test::shell(kRepo + "/scripts/stack-env lightning");
  if (env.code == 3) GTEST_SKIP() << "lightning could not be installed: " << env.out;
  ASSERT_EQ(env.code, 0) << env.out;
  const std::string venv = kRepo + "/.venv-stacks/lightning";
  const std::string mean = test::fresh_dir("gradcert_observe", "lt_mean");
  auto r = observe_example(mean, venv, "lightning_loop.py", "--loss mean");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(observed_run(mean)["diagnosis"]["best"]["id"], "micro-mean") << r.out;
  const std::string tg = test::fresh_dir("gradcert_observe", "lt_tg");
  r = observe_example(tg, venv, "lightning_loop.py", "--loss token-global");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_LT(figure_of(observed_run(tg), "grad.parity"), 1e-10) << r.out;
}
