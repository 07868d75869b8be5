// Certifying the user's own model (--model / model.factory): the PyTorch adapters train
// models gradcert did not write (the tiny LM's Python twin, a GRU LM with other names, a
// Hugging Face GPT-2 from a tiny config) against the Python reference runner, and the
// diagnosis names what each planted adapter bug computes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "conformance/core/plan.hpp"
#include "conformance/model/reference.hpp"
#include "conformance/protocol/reference_artifacts.hpp"
#include "conformance/protocol/safetensors.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/tests/support.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

const std::string kRepo = GRADCERT_SOURCE_DIR;
const std::string kFactories = kRepo + "/backends/python/tests/factories.py";

bool have(const std::string& python_module) {
  const std::string cmd = kRepo + "/.venv/bin/python -c 'import " + python_module + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

std::string adapter(const std::string& name, const std::string& args = "") {
  const std::string script = name == "torch-ddp"     ? "torch_ddp.py"
                             : name == "torch-fsdp2" ? "torch_fsdp2.py"
                                                     : "torch_fsdp1.py";
  return kRepo +
         "/.venv/bin/torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 "
         "--master_port=$GRADCERT_MASTER_PORT " +
         kRepo + "/backends/python/" + script + (args.empty() ? "" : " " + args);
}

// A = 3 with a partial final window where the last DP rank gets no example: world 2 on the
// default 26 examples (windows 12, 12, 2); world 3 on 22 (windows 18, 4: ranks 1 and 2 empty).
RunRequest request(const std::string& factory, int world, const std::string& command, const std::string& name) {
  RunRequest r;
  r.backend = kExternalBackend;
  r.world = world;
  r.spec.topology.dp = world;
  r.spec.batch.accum = 3;
  if (world == 3) r.spec.dataset.size = 22;
  r.spec.model.factory = factory;
  r.spec.timeout.run_s = 240;
  r.spec.timeout.collective_s = 60;
  r.command = command;
  r.exe = GRADCERT_EXE;
  r.run_dir = test::fresh_dir("gradcert_test_model", name);
  return r;
}

const CheckResult* check(const RunReport& r, const std::string& id) {
  for (const auto& c : r.checks)
    if (c.id == id) return &c;
  return nullptr;
}

struct ModelCase {
  std::string model;  ///< FUNC in tests/factories.py, or gradcert.tiny_lm:tiny_lm
  std::string stack;  ///< adapter
  int world;
};

std::string factory_of(const std::string& model) {
  return model == "tiny_lm" ? std::string("gradcert.tiny_lm:tiny_lm") : kFactories + ":" + model;
}

class ConformanceAnyModel : public testing::TestWithParam<ModelCase> {};

}  // namespace

TEST_P(ConformanceAnyModel, AdapterPassesAtFloat64AndIsDiagnosedAsTheGlobalMean) {
  const ModelCase& c = GetParam();
  if (c.model == "gpt2_lm" && !have("transformers"))
    GTEST_SKIP() << "transformers is not installed in .venv (scripts/bootstrap installs it)";
  RunRequest req = request(factory_of(c.model), c.world, adapter(c.stack), c.model + "_" + c.stack);
  const Plan plan = make_plan(effective_spec(req));
  ASSERT_TRUE(plan.windows.back().partial);
  for (const auto& mb : plan.windows.back().slots.back()) ASSERT_TRUE(mb.ids.empty()) << "the last rank gets nothing";
  const RunReport r = run_backend(req);
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_TRUE(r.passed()) << test::failures(r);
  const CheckResult* g = check(r, "grad.parity");
  ASSERT_NE(g, nullptr);
  EXPECT_LE(g->figure, 1e-10) << g->detail;
  ASSERT_TRUE(r.diagnosis.ran) << r.diagnosis.note;
  EXPECT_TRUE(r.diagnosis.matched) << r.diagnosis.note;
  EXPECT_EQ(r.diagnosis.best.id, "global-mean") << r.diagnosis.note;
  std::cout << "[ figures ] " << c.model << " " << c.stack << " world " << c.world << ": grad.parity " << g->figure
            << "; " << r.diagnosis.note << "\n";
}

INSTANTIATE_TEST_SUITE_P(Models, ConformanceAnyModel,
                         testing::Values(ModelCase{"tiny_lm", "torch-ddp", 2}, ModelCase{"gru_lm", "torch-ddp", 2},
                                         ModelCase{"gru_lm", "torch-fsdp2", 3}, ModelCase{"gpt2_lm", "torch-ddp", 2},
                                         ModelCase{"gpt2_lm", "torch-ddp", 3}, ModelCase{"gpt2_lm", "torch-fsdp2", 2},
                                         ModelCase{"gpt2_lm", "torch-fsdp2", 3},
                                         ModelCase{"tiny_lm", "torch-fsdp2", 3}),
                         [](const auto& info) {
                           std::string s =
                               info.param.model + "_" + info.param.stack + "_w" + std::to_string(info.param.world);
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// Each planted adapter bug fails AND the diagnosis names it, at float64 round-off.
TEST(ConformanceAnyModelDiagnosis, EachPlantedBugIsNamed) {
  for (const std::string m : {"local-mean", "micro-mean", "partial-nominal-accum", "unshifted-count",
                              "drop-partial-window", "first-and-last-microsteps", "last-microstep-only"}) {
    RunRequest req = request(factory_of("gru_lm"), 2, adapter("torch-ddp", "--mutant " + m), "gru_" + m);
    const RunReport r = run_backend(req);
    ASSERT_TRUE(r.error.empty()) << m << ": " << r.error;
    EXPECT_FALSE(r.passed()) << m << " passed every check";
    ASSERT_TRUE(r.diagnosis.ran) << r.diagnosis.note;
    EXPECT_EQ(r.diagnosis.best.id, m) << r.diagnosis.note;
    EXPECT_TRUE(r.diagnosis.matched) << r.diagnosis.note;
    EXPECT_LE(r.diagnosis.best.figure, 1e-12) << r.diagnosis.note;
    std::cout << "[ figures ] --mutant " << m << ": " << r.diagnosis.note << "\n";
  }
}

// bfloat16: a uniform 1.05x gradient passes grad.parity's 1.5e-1 but fails grad.scale; the
// correct stack passes both (NOTE [scale tolerances]).
TEST(ConformanceAnyModelDiagnosis, Bf16UniformScaleFailsOnTheScaleFigure) {
  for (const std::string m : {"", "--mutant grad-scale-1.05"}) {
    RunRequest req = request("", 2, adapter("torch-ddp", m), m.empty() ? "bf16_ok" : "bf16_scale");
    req.spec.dtype = DType::BFloat16;
    const RunReport r = run_backend(req);
    ASSERT_TRUE(r.error.empty()) << r.error;
    const CheckResult* s = check(r, "grad.scale");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->verdict, m.empty() ? Verdict::Pass : Verdict::Fail) << m << ": " << s->detail;
    std::cout << "[ figures ] bf16 " << (m.empty() ? "correct" : m) << ": grad.scale " << s->figure << " (tolerance "
              << s->tolerance << "), grad.parity " << check(r, "grad.parity")->figure << "\n";
  }
}

// A stack that clips the reduced gradient by its global norm passes; one that clips each
// rank's gradient before the reduction fails.
TEST(ConformanceAnyModelDiagnosis, ClippingCorrectPassesPerRankFails) {
  for (const std::string m : {"", "--mutant clip-per-rank"}) {
    RunRequest req = request("", 2, adapter("torch-ddp", m), m.empty() ? "clip_ok" : "clip_rank");
    req.spec.optimizer.max_grad_norm = 0.05;  // every update clips (norms 1.4 - 2.8)
    const RunReport r = run_backend(req);
    ASSERT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.passed(), m.empty()) << m << test::failures(r);
  }
}

// The Python reference runner on the built-in model equals the C++ reference (<= 1e-12).
TEST(ConformanceAnyModelDiagnosis, PythonReferenceEqualsTheCppReferenceOnTheTinyLM) {
  RunRequest req = request(factory_of("tiny_lm"), 2, adapter("torch-ddp"), "pyref");
  const RunReport r = run_backend(req);
  ASSERT_TRUE(r.error.empty()) << r.error;
  Spec cpp_spec = effective_spec(req);
  cpp_spec.model.factory.clear();
  const Plan plan = make_plan(cpp_spec);
  const auto cpp = run_reference(cpp_spec, plan);
  const TensorMap expected = read_safetensors(req.run_dir + "/initial.safetensors");
  const ReferenceRun py = read_reference_run(req.run_dir + "/reference", plan, expected);
  ASSERT_EQ(py.updates.size(), cpp.size());
  double worst = 0;
  for (size_t u = 0; u < cpp.size(); ++u) {
    EXPECT_NEAR(py.updates[u].loss, cpp[u].loss, 1e-12 * std::abs(cpp[u].loss));
    EXPECT_EQ(py.updates[u].valid_targets, cpp[u].valid_targets);
    for (const auto& [name, t] : cpp[u].grads) {
      worst = std::max(worst, compare_tensors(py.updates[u].grads.at(name), t).relative);
      worst =
          std::max(worst, compare_tensors(py.updates[u].params_after.at(name), cpp[u].params_after.at(name)).relative);
    }
  }
  EXPECT_LE(worst, 1e-12);
  std::cout << "[ figures ] Python vs C++ reference, tiny LM: worst relative L2 " << worst << "\n";
}

TEST(ConformanceAnyModelDiagnosis, UnknownFactoryIsBadInputNamingIt) {
  RunRequest req = request(kFactories + ":no_such_model", 2, adapter("torch-ddp"), "badfactory");
  try {
    (void)run_backend(req);
    FAIL() << "an unknown factory ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_model"), std::string::npos) << e.what();
  }
}
