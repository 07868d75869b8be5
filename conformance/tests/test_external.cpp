// Conformance of foreign stacks over the file protocol (backends/PROTOCOL.md): the PyTorch
// adapters in backends/python/ run with torchrun (Gloo, CPU) from the project venv, and a
// fake stack (conformance/tests/fake_external_stack.py) writes malformed artifacts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "conformance/tests/support.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/core/plan.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

const std::string kRepo = GRADCERT_SOURCE_DIR;

std::string venv_bin(const std::string& tool) { return kRepo + "/.venv/bin/" + tool; }

std::string fresh_dir(const std::string& name) { return test::fresh_dir("gradcert_test_ext", name); }

/// The launch command of an adapter (backends/python/README.md has the same table).
std::string torchrun(const std::string& adapter, const std::string& args = "") {
  return venv_bin("torchrun") +
         " --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 --master_port=$GRADCERT_MASTER_PORT " + kRepo +
         "/backends/python/" + adapter + (args.empty() ? "" : " " + args);
}

/// The default spec at world 2: 26 examples, B_update = 2 x 3 x 2 = 12, so the final
/// window is partial (2 examples) and rank 1 gets none in it.
RunRequest request(const std::string& command, const std::string& name) {
  RunRequest r;
  r.backend = kExternalBackend;
  r.world = 2;
  r.spec.topology.dp = 2;
  r.spec.batch.accum = 3;
  r.spec.timeout.run_s = 120;
  r.spec.timeout.collective_s = 60;
  r.command = command;
  r.exe = GRADCERT_EXE;
  r.run_dir = fresh_dir(name);
  return r;
}

using test::failures;

const CheckResult* check(const RunReport& r, const std::string& id) {
  for (const auto& c : r.checks)
    if (c.id == id) return &c;
  return nullptr;
}

#define REQUIRE_TORCHRUN()                                                                                             \
  do {                                                                                                                 \
    if (!fs::exists(venv_bin("torchrun")))                                                                             \
      GTEST_SKIP() << venv_bin("torchrun") << " is missing: run scripts/bootstrap for the venv";                       \
  } while (0)

/// Runs an adapter and expects every check to pass, grad.parity within `max_grad`.
RunReport expect_certified(RunRequest req, double max_grad) {
  const Plan plan = make_plan(effective_spec(req));
  EXPECT_TRUE(plan.windows.back().partial);
  for (const auto& mb : plan.windows.back().slots[1]) EXPECT_TRUE(mb.ids.empty()) << "rank 1 gets nothing";
  const RunReport r = run_backend(req);
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(test::ids_of(r), check_ids(/*with_memory=*/false));  // external runs measure no memory
  EXPECT_TRUE(r.passed()) << failures(r);
  // DDP keeps a whole replica per rank and digests it (NOTE [replica digests]): compared, equal.
  if (req.command.find("torch_ddp.py") != std::string::npos)
    if (const CheckResult* a = check(r, "replicas.agree")) EXPECT_EQ(a->verdict, Verdict::Pass) << a->detail;
  if (const CheckResult* g = check(r, "grad.parity")) {
    EXPECT_LE(g->figure, max_grad) << g->detail;
    std::cout << "[ figure   ] " << req.command.substr(req.command.rfind('/') + 1) << " " << dtype_name(req.spec.dtype)
              << " " << req.spec.optimizer.name << ": grad.parity " << g->figure << "\n";
  }
  return r;
}

}  // namespace

// DDP: no_sync on microsteps 0..A-2, D*S/N, a zero-loss pass for the empty final microstep.
TEST(ConformanceExternalTorch, DdpPassesEveryCheckInFloat64) {
  REQUIRE_TORCHRUN();
  expect_certified(request(torchrun("torch_ddp.py"), "ddp"), 1e-10);
}

// FSDP2 with AdamW: optimizer state lives on DTensor shards; the divide-by-D happens once.
TEST(ConformanceExternalTorch, Fsdp2PassesEveryCheckInFloat64WithAdamW) {
  REQUIRE_TORCHRUN();
  RunRequest req = request(torchrun("torch_fsdp2.py"), "fsdp2");
  req.spec.optimizer.name = "adamw";
  expect_certified(req, 1e-10);
}

// FSDP1 passes, or the adapter says why this torch cannot run it on CPU (exit 77, "SKIP:"):
// never a silent pass.
TEST(ConformanceExternalTorch, Fsdp1PassesOrSkipsWithTheReason) {
  REQUIRE_TORCHRUN();
  RunRequest req = request(torchrun("torch_fsdp1.py"), "fsdp1");
  const RunReport r = run_backend(req);
  if (!r.error.empty()) {  // the adapter's "SKIP: ..." line is in the command's log (the tail may miss it)
    std::ifstream log(req.run_dir + "/rank0.log");
    std::stringstream text;
    text << log.rdbuf() << "\n" << r.error;
    const std::string all = text.str();
    if (const auto at = all.find("SKIP:"); at != std::string::npos)
      GTEST_SKIP() << all.substr(at, all.find('\n', at) - at);
  }
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_TRUE(r.passed()) << failures(r);
  const CheckResult* g = check(r, "grad.parity");
  ASSERT_NE(g, nullptr);
  EXPECT_LE(g->figure, 1e-10) << g->detail;
}

// The planted bug: each rank divides by its own targets. grad.parity must catch it.
TEST(ConformanceExternalTorch, DdpLocalMeanFailsGradParity) {
  REQUIRE_TORCHRUN();
  const RunReport r = run_backend(request(torchrun("torch_ddp.py", "--mutant local-mean"), "ddp_mutant"));
  ASSERT_TRUE(r.error.empty()) << r.error;
  const CheckResult* g = check(r, "grad.parity");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->verdict, Verdict::Fail) << "figure " << g->figure;
  EXPECT_GT(g->figure, 1e-2);
  EXPECT_FALSE(r.passed());
}

// Sampler audit: DistributedSampler(drop_last=False) over 25 examples on 2 replicas pads
// rank 1's list with example 0; the ledger names it, and the gradients are judged on
// the ids really consumed (so they pass).
TEST(ConformanceExternalTorch, SamplerAuditReportsPaddedDuplicates) {
  REQUIRE_TORCHRUN();
  RunRequest req = request(torchrun("torch_ddp.py"), "sampler");
  req.spec.dataset.size = 25;
  req.sampler_audit = true;
  const RunReport r = run_backend(req);
  ASSERT_TRUE(r.error.empty()) << r.error;
  const CheckResult* ledger = check(r, "batch.sample_ledger");
  ASSERT_NE(ledger, nullptr);
  EXPECT_EQ(ledger->verdict, Verdict::Fail);
  EXPECT_NE(ledger->detail.find("ids 0 consumed more than once"), std::string::npos) << ledger->detail;
  const CheckResult* g = check(r, "grad.parity");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->verdict, Verdict::Pass) << g->detail;
}

namespace {

struct Malformed {
  std::string mode;
  std::string names;  ///< what the error must name besides the file ("" for the file only)
};

void PrintTo(const Malformed& m, std::ostream* os) { *os << m.mode; }

class ConformanceExternalMalformed : public testing::TestWithParam<Malformed> {};

}  // namespace

TEST_P(ConformanceExternalMalformed, FailsTheRunNamingFileAndTensor) {
  const Malformed& m = GetParam();
  const std::string py = fs::exists(venv_bin("python")) ? venv_bin("python") : "python3";
  const RunReport r =
      run_backend(request(py + " " + kRepo + "/conformance/tests/fake_external_stack.py " + m.mode, "fake_" + m.mode));
  ASSERT_FALSE(r.error.empty()) << "malformed artifacts were accepted";
  EXPECT_TRUE(r.checks.empty()) << "no verdicts from unreadable artifacts";
  EXPECT_FALSE(r.passed());
  EXPECT_NE(r.error.find("u0.grads.safetensors"), std::string::npos) << r.error;
  if (!m.names.empty()) EXPECT_NE(r.error.find(m.names), std::string::npos) << r.error;
}

INSTANTIATE_TEST_SUITE_P(ConformanceExternal, ConformanceExternalMalformed,
                         testing::Values(Malformed{"truncated", "tensor 'wte.weight'"},
                                         Malformed{"wrong-shape", "tensor 'blocks.0.fc.weight': shape [16,32]"},
                                         Malformed{"wrong-dtype", "tensor 'blocks.0.fc.weight': dtype float32"},
                                         Malformed{"missing-tensor", "tensor 'blocks.0.fc.weight' is missing"},
                                         // The header is refused before it is parsed: only the file can be named.
                                         Malformed{"oversized-header", "header length 209715200 exceeds"}),
                         [](const testing::TestParamInfo<Malformed>& i) {
                           std::string n = i.param.mode;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// The fake stack's well-formed artifacts read fine: the malformed cases above fail for
// the damage alone.
TEST(ConformanceExternalMalformedControl, WellFormedFakeArtifactsAreRead) {
  const std::string py = fs::exists(venv_bin("python")) ? venv_bin("python") : "python3";
  const RunReport r =
      run_backend(request(py + " " + kRepo + "/conformance/tests/fake_external_stack.py ok", "fake_ok"));
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(test::ids_of(r), check_ids(/*with_memory=*/false));  // external runs measure no memory
  EXPECT_FALSE(r.passed()) << "zero gradients are not the reference's";
}

// --- Resumed runs through torch.distributed.checkpoint (NOTE [stack checkpoints]) ------------

namespace {

/// FSDP2 (or `adapter`) at world 2 with AdamW over two epochs of the default data (3 windows
/// an epoch, the third partial), stopping after `at` updates.
RunRequest resumed(const std::string& adapter, const std::string& name, int at, int world2 = 0,
                   const std::string& args = "") {
  RunRequest req = request(torchrun(adapter, args), name);
  req.spec.optimizer.name = "adamw";
  req.spec.updates = 6;
  req.spec.resume.at = at;
  req.spec.resume.world = world2;
  return req;
}

void expect_resumed_certified(const RunRequest& req) {
  const RunReport r = run_backend(req);
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_TRUE(r.passed()) << failures(r);
  EXPECT_GT(r.throughput.save_pause_seconds, 0) << "the stack's own save pause (gradcert.json save_seconds)";
  const CheckResult* cp = check(r, "resume.checkpoint");
  ASSERT_NE(cp, nullptr);
  EXPECT_EQ(cp->verdict, Verdict::Pass) << cp->detail;
  std::cout << "[ detail   ] " << cp->detail << "\n";
  for (const char* id : {"grad.parity", "params.parity", "batch.sample_ledger"}) {
    const CheckResult* c = check(r, id);
    ASSERT_NE(c, nullptr) << id;
    EXPECT_EQ(c->verdict, Verdict::Pass) << id << ": " << c->detail;
  }
  // The second leg trained the rest: its manifest lists updates K..end.
  EXPECT_TRUE(fs::exists(req.run_dir + "/leg2.manifest.json"));
  EXPECT_TRUE(fs::exists(req.run_dir + "/checkpoint.stack/.metadata"));
}

}  // namespace

// FSDP2 saves its DTensor shards with DCP on 2 ranks and a new group of 3 loads them (DCP
// reshards): the resumed trajectory equals the uninterrupted reference. K = 2: the second leg
// starts at the partial final window of epoch 0.
TEST(ConformanceExternalResume, Fsdp2ResumesThroughDcpFromWorld2ToWorld3) {
  REQUIRE_TORCHRUN();
  expect_resumed_certified(resumed("torch_fsdp2.py", "resume_fsdp2_2to3", 2, 3));
}

// DDP saves whole tensors (DCP writes each once); FSDP2 loads them as shards.
TEST(ConformanceExternalResume, DdpCheckpointResumesInFsdp2) {
  REQUIRE_TORCHRUN();
  RunRequest req = resumed("torch_ddp.py", "resume_ddp_to_fsdp2", 1);
  req.spec.resume.command = torchrun("torch_fsdp2.py");
  expect_resumed_certified(req);
  // The folder re-checks as it ran (gradcert check: the exported checkpoint and both legs).
  const RunReport again = check_run({req.run_dir, "", fresh_dir("resume_ddp_to_fsdp2_check")}).report;
  EXPECT_TRUE(again.error.empty()) << again.error;
  EXPECT_TRUE(again.passed()) << failures(again);
  const CheckResult* cp = check(again, "resume.checkpoint");
  ASSERT_NE(cp, nullptr);
  EXPECT_EQ(cp->verdict, Verdict::Pass) << cp->detail;
}

namespace {

struct ResumeMutant {
  std::string id, check, names;  ///< the adapter's mutant, the check that must fail, what it must say
};

void PrintTo(const ResumeMutant& m, std::ostream* os) { *os << m.id; }

class ConformanceExternalResumeMutant : public testing::TestWithParam<ResumeMutant> {};

}  // namespace

// Each planted checkpoint bug of the adapters is caught by the check that names it.
TEST_P(ConformanceExternalResumeMutant, IsCaughtByTheCheckThatNamesIt) {
  REQUIRE_TORCHRUN();
  const ResumeMutant& m = GetParam();
  const RunReport r = run_backend(resumed("torch_fsdp2.py", "resume_" + m.id, 1, 0, "--mutant " + m.id));
  ASSERT_TRUE(r.error.empty()) << r.error;
  const CheckResult* c = check(r, m.check);
  ASSERT_NE(c, nullptr) << m.check << " did not run: " << failures(r);
  EXPECT_EQ(c->verdict, Verdict::Fail) << c->detail;
  EXPECT_NE(c->detail.find(m.names), std::string::npos) << c->detail;
  std::cout << "[ detail   ] " << m.id << " -> " << m.check << ": " << c->detail << "\n";
  EXPECT_FALSE(r.passed());
}

INSTANTIATE_TEST_SUITE_P(
    ConformanceExternal, ConformanceExternalResumeMutant,
    testing::Values(ResumeMutant{"resume-optimizer-unsaved", "resume.checkpoint", "'optim.blocks.0.fc.bias.m'"},
                    ResumeMutant{"resume-step-reset", "params.parity", "update 1 is the first the resumed leg ran"},
                    ResumeMutant{"resume-sampler-restart", "batch.sample_ledger", "consumed more than once"},
                    ResumeMutant{"resume-sampler-skip", "batch.sample_ledger", "never consumed"},
                    ResumeMutant{"resume-shard-unwritten", "resume.checkpoint", "rank 1 wrote no rank1.safetensors"}),
    [](const testing::TestParamInfo<ResumeMutant>& i) {
      std::string n = i.param.id;
      for (auto& c : n)
        if (c == '-') c = '_';
      return n;
    });
