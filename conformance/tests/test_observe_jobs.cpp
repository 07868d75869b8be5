// `gradcert observe` on the job shapes people write beyond the first examples (issue: observe the
// jobs people actually run): a plain loop that computes its loss outside the model with nothing but
// `gradcert.watch(model, optimizer)` (examples/observe/loss_outside.py), a PEFT LoRA fine-tune under
// the HF Trainer (examples/observe/hf_peft.py); and a job that dies, quoted by its own exception.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "conformance/core/files.hpp"
#include "conformance/tests/support.hpp"

using namespace gradcert;

namespace {

const std::string kRepo = GRADCERT_SOURCE_DIR;

// `gradcert observe --updates K` on examples/observe/<example> under torchrun (2 ranks).
test::CliResult observe(const std::string& out, int updates, const std::string& example, const std::string& job_args) {
  return test::run_cli("observe --out " + out + " --updates " + std::to_string(updates) + " -- " + kRepo +
                       "/.venv/bin/torchrun --standalone --nproc_per_node 2 " + example + " " + job_args);
}

nlohmann::json run_of(const std::string& out) {
  return nlohmann::json::parse(read_text_file(out + "/report.json"))["runs"][0];
}

const nlohmann::json& check_of(const nlohmann::json& run, const std::string& id) {
  static const nlohmann::json absent = {{"verdict", "absent"}, {"figure", -1}};
  for (const auto& c : run["checks"])
    if (c["id"] == id) return c;
  return absent;
}

const std::string kLossOutside = kRepo + "/examples/observe/loss_outside.py";

}  // namespace

// The loop as most people write it: logits = model(ids), then F.cross_entropy on the shifted slice.
// gradcert learns the targets from that call and rebuilds the script's own module (no factory):
// float64, every check passes at <= 1e-10.
TEST(ConformanceObserveJobs, LossOutsideTheModelPassesWithOnlyWatch) {
  const std::string out = test::fresh_dir("gradcert_observe_jobs", "outside-pass");
  const auto r = observe(out, 3, kLossOutside, "--loss global-mean --style slice");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto run = run_of(out);
  EXPECT_EQ(run["verdict"], "pass") << r.out;
  for (const char* id :
       {"grad.parity", "params.parity", "batch.update_size", "batch.sample_ledger", "ranks.local_sums"})
    EXPECT_EQ(check_of(run, id)["verdict"], "pass") << id << "\n" << r.out;
  EXPECT_LE(check_of(run, "grad.parity")["figure"].get<double>(), 1e-10) << r.out;
  EXPECT_NE(r.out.find("the job's own module CausalLM (from its script)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("labels loss-call"), std::string::npos) << r.out;
}

// The other ways the call is written: nn.CrossEntropyLoss on [B, V, T] of .float() logits (a float32
// job: at float64 that call would round the loss to float32), and log_softmax + F.nll_loss; each
// with its planted normalisation bug failing and named.
TEST(ConformanceObserveJobs, LossOutsideTheModelBugsAreNamedWhicheverWayTheCallIsWritten) {
  for (const auto& [style, bug] :
       {std::pair<std::string, std::string>{"slice", "micro-mean"}, {"module", "local-mean"}, {"nll", "micro-mean"}}) {
    const std::string out = test::fresh_dir("gradcert_observe_jobs", "outside-" + style + "-" + bug);
    const std::string dtype = style == "module" ? " --dtype float32" : "";
    const auto r = observe(out, 2, kLossOutside, "--loss " + bug + " --style " + style + dtype);
    EXPECT_EQ(r.code, 1) << style << " " << bug << "\n" << r.out;
    EXPECT_EQ(check_of(run_of(out), "grad.parity")["verdict"], "fail") << style << "\n" << r.out;
    EXPECT_NE(r.out.find("matches " + bug), std::string::npos) << style << " " << bug << "\n" << r.out;
  }
  const std::string out = test::fresh_dir("gradcert_observe_jobs", "outside-nll-pass");
  const auto r = observe(out, 2, kLossOutside, "--loss global-mean --style nll");
  EXPECT_EQ(r.code, 0) << r.out;
}

// HF Trainer + PEFT LoRA (r=4 on q/v): the reference rebuilds the Llama from its config and puts the
// same adapters on it; the frozen base is held unchanged, only the adapters train. Float32: held to
// float32's calibrated tolerance. average_tokens_across_devices=False is named local-mean.
TEST(ConformanceObserveJobs, HfTrainerWithPeftLoraPassesAndLocalMeanIsNamed) {
  const std::string example = kRepo + "/examples/observe/hf_peft.py";
  const std::string out = test::fresh_dir("gradcert_observe_jobs", "peft-pass");
  const auto r = observe(out, 3, example, "");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto run = run_of(out);
  EXPECT_EQ(run["verdict"], "pass") << r.out;
  EXPECT_EQ(check_of(run, "params.parity")["verdict"], "pass") << r.out;
  EXPECT_NE(r.out.find("PEFT adapters (peft.peft_model.PeftModelForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("21 frozen tensors held unchanged"), std::string::npos) << r.out;
  const std::string bad = test::fresh_dir("gradcert_observe_jobs", "peft-local");
  const auto b = observe(bad, 2, example, "--average-tokens false");
  EXPECT_EQ(b.code, 1) << b.out;
  EXPECT_NE(b.out.find("matches local-mean"), std::string::npos) << b.out;
}

// A rank that dies of its own exception: the error quotes that rank's exception line and the job's
// frame, not only the launcher's summary.
TEST(ConformanceObserveJobs, JobThatDiesIsReportedWithItsOwnException) {
  const std::string out = test::fresh_dir("gradcert_observe_jobs", "raise");
  const auto r = observe(out, 3, kRepo + "/conformance/tests/observe_faults.py", "raise 1 1 -- --loss global-mean");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 1) << "a job that dies is an error, not a failed check\n" << r.out;
  EXPECT_NE(r.out.find("): rank 1 died in update 1: RuntimeError: observe_faults: rank 1 raises at update 1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("observe_faults.py, line"), std::string::npos) << r.out;
}

// FSDP1 (the "before" side of the FSDP1 -> FSDP2 migration), each block its own unit, with
// use_orig_params=True and False (flat parameters): each unit's shards gathered under the model's own
// names, so the job is certified like any other; its micro-mean loss is named.
TEST(ConformanceObserveJobs, Fsdp1JobsPassInEitherParameterModeAndTheirMicroMeanIsNamed) {
  const std::string example = kRepo + "/examples/observe/fsdp1_loop.py";
  for (const std::string mode : {"true", "false"}) {
    const std::string out = test::fresh_dir("gradcert_observe_jobs", "fsdp1-" + mode);
    const auto r = observe(out, 2, example, "--orig-params " + mode);
    ASSERT_EQ(r.code, 0) << mode << "\n" << r.out;
    const auto run = run_of(out);
    EXPECT_EQ(run["verdict"], "pass") << mode << "\n" << r.out;
    EXPECT_LE(check_of(run, "grad.parity")["figure"].get<double>(), 1e-10) << mode << "\n" << r.out;
    EXPECT_EQ(check_of(run, "params.parity")["verdict"], "pass") << mode << "\n" << r.out;
  }
  const std::string out = test::fresh_dir("gradcert_observe_jobs", "fsdp1-micro");
  const auto r = observe(out, 2, example, "--orig-params false --loss micro-mean");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("matches micro-mean"), std::string::npos) << r.out;
}

// DistributedSampler(drop_last=False) pads the epoch by repeating examples (23 rows on 2 ranks: one
// repeat): batch.sample_ledger names the example by its content and first tokens, every rank / update
// / microstep that consumed it, and the padding sampler as the cause.
TEST(ConformanceObserveJobs, PaddingSamplerRepeatIsNamedWithWhereAndWhy) {
  const std::string out = test::fresh_dir("gradcert_observe_jobs", "padding");
  const auto r = observe(out, 2, kRepo + "/examples/observe/ddp_loop.py", "--rows 23");
  EXPECT_EQ(r.code, 1) << r.out;
  const auto ledger = check_of(run_of(out), "batch.sample_ledger");
  EXPECT_EQ(ledger["verdict"], "fail") << r.out;
  const std::string detail = ledger["detail"];
  EXPECT_NE(detail.find("consumed more than once (id "), std::string::npos) << detail;
  EXPECT_NE(detail.find("(content c"), std::string::npos) << detail;
  EXPECT_NE(detail.find(", tokens "), std::string::npos) << detail;
  EXPECT_NE(detail.find("update 1 microstep"), std::string::npos) << detail;
  EXPECT_NE(detail.find("DistributedSampler(drop_last=False)"), std::string::npos) << detail;
}

namespace {

// `gradcert audit-jobs` on the FSDP1 example (use_orig_params=True) and its FSDP2 port with `port_args`.
test::CliResult audit_jobs(const std::string& out, const std::string& port_args) {
  const std::string torchrun =
      kRepo + "/.venv/bin/torchrun --standalone --nproc_per_node 2 " + kRepo + "/examples/observe/";
  return test::run_cli("audit-jobs --out " + out + " --updates 2 --before '" + torchrun + "fsdp1_loop.py' --after '" +
                       torchrun + "fsdp2_port.py " + port_args + "'");
}

}  // namespace

// The migration audit of the user's own two jobs: the FSDP1 script and its faithful FSDP2 port train
// the same model (each passes its own reference, and they agree tensor by tensor at float64).
TEST(ConformanceObserveJobs, AuditOfAnFsdp1JobAndItsFsdp2PortFindsThemEqual) {
  const std::string out = test::fresh_dir("gradcert_audit_jobs", "same");
  const auto r = audit_jobs(out, "");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[1/2] before job pass"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[2/2] after  job pass"), std::string::npos) << r.out;
}

// A port whose loss divides by each rank's own count: the audit names the side the reference blames,
// what it computes instead, and where the two part first.
TEST(ConformanceObserveJobs, AuditLocatesAPortThatDividesByTheLocalCount) {
  const std::string out = test::fresh_dir("gradcert_audit_jobs", "local");
  const auto r = audit_jobs(out, "--loss local-mean");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("the after job departs from the reference, the before job does not"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("its gradient matches local-mean"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the jobs part first at update 0"), std::string::npos) << r.out;
}

// A port whose sampler seed differs: both train correctly, on other data; the audit says where the
// data parts first, naming each side's example.
TEST(ConformanceObserveJobs, AuditLocatesAPortWhoseSamplerSeedDiffers) {
  const std::string out = test::fresh_dir("gradcert_audit_jobs", "seed");
  const auto r = audit_jobs(out, "--sampler-seed 4");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(
      r.out.find("the jobs part first in their data: update 0 rank 0 microstep 0 row 0: before consumed content c"),
      std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("departs from the reference"), std::string::npos) << r.out;
}

// LoRA in a plain loop (DDP and FSDP2 over a PeftModel, the loss outside the model, only watch): the
// Llama computes RMSNorm in float32 inside its float64 parameters, so the job is held to float32's
// calibrated tolerance and the report says why (NOTE [inner precision]); its local-mean is named.
TEST(ConformanceObserveJobs, PeftInAPlainLoopPassesUnderDdpAndFsdp2AndItsLocalMeanIsNamed) {
  const std::string example = kRepo + "/examples/observe/peft_loop.py";
  for (const std::string wrap : {"ddp", "fsdp2"}) {
    const std::string out = test::fresh_dir("gradcert_observe_jobs", "peft-loop-" + wrap);
    const auto r = observe(out, 2, example, "--wrap " + wrap);
    EXPECT_EQ(r.code, 0) << wrap << "\n" << r.out;
    EXPECT_EQ(check_of(run_of(out), "grad.parity")["tolerance"], 2e-5) << wrap << "\n" << r.out;
    EXPECT_NE(r.out.find("held to float32's calibrated tolerances (NOTE [inner precision])"), std::string::npos)
        << r.out;
  }
  const std::string out = test::fresh_dir("gradcert_observe_jobs", "peft-loop-local");
  const auto r = observe(out, 2, example, "--loss local-mean");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(run_of(out)["diagnosis"]["best"]["id"], "local-mean") << r.out;
}
