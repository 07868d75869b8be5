// Unit tests: the model-state lower bound (every recipe and strategy, LoRA, the seed's
// 0.6e9-parameter example), the memory checks, the tracking allocator, per-phase peaks of
// one process, throughput arithmetic, and the report sections.
#include <CLI/CLI.hpp>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "backends/runtime/alloc_tracker.hpp"
#include "conformance/checks/checks.hpp"
#include "conformance/cli/estimate.hpp"
#include "conformance/layout/layout.hpp"
#include "conformance/memory/memory.hpp"
#include "backends/catalog.hpp"
#include "conformance/run/probes.hpp"
#include "conformance/model/model.hpp"
#include "conformance/model/reference.hpp"
#include "conformance/core/throughput.hpp"
#include "reports/memory_report.hpp"
#include "conformance/tests/support.hpp"

using namespace gradcert;

namespace {

std::string run_cli(const std::string& line, int& code) {
  CLI::App app{"test"};
  code = -1;
  auto* cmd = add_estimate_command(app, code);
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  app.parse(line);
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(static_cast<bool>(*cmd));
  return out + err;
}

Spec spec_with(DType dtype, const std::string& optimizer, double momentum = 0) {
  Spec s;
  s.dtype = dtype;
  s.optimizer.name = optimizer;
  s.optimizer.momentum = momentum;
  s.topology.dp = 1;
  return s;
}

// The real rank probes (conformance/run/probes.hpp, NOTE [memory probes]) run in-process
// at world 1 on the `single` backend: the model state after one planned update, then every
// length bucket's phases.
struct Probed {
  RankMemory memory;
  int64_t params = 0;
  std::vector<PhasePeak> bucket(const std::string& name) const {
    std::vector<PhasePeak> out;
    for (const auto& p : memory.peaks)
      if (p.bucket == name) out.push_back(p);
    return out;
  }
};

Probed probe(const Spec& spec) {
  EXPECT_TRUE(install_tracking_allocator());
  const Plan plan = make_plan(spec);
  RankContext ctx;
  ctx.spec = &spec;
  ctx.plan = &plan;
  Probed out;
  {
    auto backend = make_backend("single");
    backend->setup(ctx);
    (void)backend->run_update(ctx, 0);
    measure_model_state(*backend, out.memory);
  }
  const auto dir = std::filesystem::temp_directory_path() / ("gradcert_probe_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  measure_buckets(ctx, "single", dir.string(), out.memory);
  std::filesystem::remove_all(dir);
  out.params = tiny_lm_counts(spec.model).total;
  return out;
}

const PhasePeak& phase_of(const std::vector<PhasePeak>& peaks, const std::string& name) {
  for (const auto& p : peaks)
    if (p.phase == name) return p;
  throw std::runtime_error("no phase " + name);
}

}  // namespace

// ---- the lower bound ----------------------------------------------------------------------

TEST(MemoryEstimate, SeedExampleIsTheGolden) {
  EstimateInput in;
  in.params = 600000000;
  in.recipe = recipe_by_name("mixed-adam");
  const auto e = estimate_memory(in);
  EXPECT_EQ(e.model_state(), 9600000000);
  EXPECT_EQ(e.total(), 9600000000);
  EXPECT_NEAR(gib(static_cast<double>(e.model_state())), 8.94, 0.005);
  const std::string golden =
      "# gradcert estimate: model-state lower bound per rank\n"
      "recipe mixed-adam: 2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 8 (two fp32 moments) = 16 B/param\n"
      "  note: mixed-precision Adam (the seed's default)\n"
      "params 6e8 (600000000)\n"
      "strategy single, world 1 (dp 1, tp 1, pp 1); this rank's model part: 600000000 params, 600000000 trainable\n"
      "  weights: 600000000 params x 2 B = 1200000000 B\n"
      "  grads: 600000000 params x 2 B = 1200000000 B\n"
      "  master: 600000000 params x 4 B = 2400000000 B\n"
      "  moments: 600000000 params x 8 B = 4800000000 B\n"
      "model state: 9.6e9 B = 8.94 GiB (9600000000 B)\n"
      "excluded (measure them: the peak per phase and length bucket):\n"
      "  - activations (they grow with micro-batch x sequence length: see the measured peak per length bucket)\n"
      "  - logits (micro-batch x sequence x vocab, in the loss dtype)\n"
      "  - communication buffers (DDP gradient buckets, ZeRO/FSDP gather and reduce-scatter buffers; Gloo's "
      "reduce-scatter allocates a full-size extra buffer)\n"
      "  - optimizer-step temporaries (e.g. Adam's denominator, casts of gradients to the master dtype)\n"
      "  - allocator reserve (freed blocks a caching allocator keeps)\n"
      "  - fragmentation\n"
      "  - runtime context (CUDA context, kernels, libraries)\n";
  EXPECT_EQ(estimate_text(e), golden);
}

TEST(MemoryEstimate, CliPrintsTheSeedExample) {
  int code;
  const std::string out = run_cli("estimate --params 0.6e9 --recipe mixed-adam", code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("9.6e9 B = 8.94 GiB"), std::string::npos) << out;
  EXPECT_NE(out.find("2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 8 (two fp32 moments) = 16 B/param"),
            std::string::npos);
  EXPECT_NE(out.find("Gloo's reduce-scatter allocates a full-size extra buffer"), std::string::npos);
  // Default recipe is mixed-adam too.
  EXPECT_NE(run_cli("estimate --params 0.6e9", code).find("9.6e9 B = 8.94 GiB"), std::string::npos);
}

TEST(MemoryEstimate, CliRejectsBadInputWithExitTwo) {
  int code;
  EXPECT_NE(run_cli("estimate --params 1e6 --recipe adam16", code).find("unknown recipe 'adam16'"), std::string::npos);
  EXPECT_EQ(code, 2);
  EXPECT_NE(run_cli("estimate --params 1e6 --strategy zero4 --world 2", code).find("unknown backend 'zero4'"),
            std::string::npos);
  EXPECT_EQ(code, 2);
  EXPECT_NE(run_cli("estimate --params 1e6 --world 3 --tp 2", code).find("not a multiple of tp x pp"),
            std::string::npos);
  EXPECT_EQ(code, 2);
  for (const char* bad : {"", " --params -5", " --params nan", " --params 0"}) {
    EXPECT_NE(run_cli(std::string("estimate") + bad, code).find("--params: must be a positive parameter count"),
              std::string::npos)
        << bad;
    EXPECT_EQ(code, 2);
  }
}

TEST(MemoryEstimate, CliCountsTheSpecModel) {
  const auto path =
      std::filesystem::temp_directory_path() / ("gradcert_estimate_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << R"({"optimizer": {"name": "adamw"}, "dtype": "float32"})";
  int code;
  const std::string out = run_cli("estimate --model " + path.string() + " --strategy zero3", code);
  std::filesystem::remove(path);
  EXPECT_EQ(code, 0) << out;
  // 5792 params, float32 AdamW = 4 + 4 + 8 = 16 B/param, the spec's world 2 (dp 2), ZeRO-3:
  // ceil(5792 / 2) = 2896 params per rank x 16 B = 46336 B, plus what the built-in zero3
  // gathers at once (the whole model, 5792 params: the rule memory.lower_bound holds a run
  // to) x (4 + 4) B = 46336 B.
  EXPECT_NE(out.find("recipe float32-adamw: 4 (fp32 weights) + 4 (fp32 grads) + 8 (two fp32 moments) = 16"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(46336 B)"), std::string::npos) << out;
  EXPECT_NE(out.find("gathered unit: 5792 params x 8 B"), std::string::npos) << out;
  EXPECT_NE(out.find("(92672 B)"), std::string::npos) << out;
}

TEST(MemoryEstimate, TinyLMCountMatchesTheTorchModel) {
  ModelSpec other;
  other.vocab = 50;
  other.d_model = 24;
  other.heads = 3;
  other.layers = 3;
  other.d_ff = 40;
  other.max_len = 30;
  for (const ModelSpec& m : {ModelSpec{}, other}) {
    TinyLM model(m);
    int64_t total = 0, blocks = 0;
    for (const auto& p : model->named_parameters()) {
      total += p.value().numel();
      if (p.key().rfind("blocks.", 0) == 0) blocks += p.value().numel();
    }
    // The layout (conformance/layout) is the one source of names, shapes and places: it
    // lists exactly the model's parameters, in the model's order.
    const auto layout = tiny_lm_layout(m);
    const auto named = model->named_parameters();
    ASSERT_EQ(layout.size(), named.size());
    for (size_t i = 0; i < layout.size(); ++i) {
      EXPECT_EQ(layout[i].name, named[i].key());
      EXPECT_EQ(layout[i].shape, named[i].value().sizes().vec()) << layout[i].name;
    }
    const auto c = tiny_lm_counts(m);
    EXPECT_EQ(c.total, total);
    EXPECT_EQ(c.blocks, blocks);
    EXPECT_EQ(c.block * m.layers, blocks);
  }
  EXPECT_EQ(tiny_lm_counts(ModelSpec{}).total, 5792);
  EXPECT_EQ(tiny_lm_counts(ModelSpec{}).largest_fsdp_unit, 2176);  // a block (embed 896, head 544)
}

// ---- the tracking allocator ----------------------------------------------------------------

TEST(AllocTracker, InterceptsEmptyZerosClonesAndAutogradBuffers) {
  ASSERT_TRUE(install_tracking_allocator());
  ASSERT_TRUE(install_tracking_allocator());  // idempotent
  EXPECT_TRUE(tracking_allocator_installed());
  const int64_t base = current_bytes();
  {
    auto a = torch::empty({1000}, torch::kFloat64);
    EXPECT_EQ(current_bytes() - base, 8000);
    auto b = torch::zeros({250}, torch::kFloat32);
    EXPECT_EQ(current_bytes() - base, 9000);
    auto c = a.clone();
    EXPECT_EQ(current_bytes() - base, 17000);
  }
  EXPECT_EQ(current_bytes(), base);
  // Kernels use the raw interface too (float32 gelu does): it needs simple DataPtrs.
  void* raw = c10::GetCPUAllocator()->raw_allocate(4096);
  EXPECT_EQ(current_bytes() - base, 4096);
  c10::GetCPUAllocator()->raw_deallocate(raw);
  EXPECT_EQ(current_bytes(), base);
  {
    auto x = torch::randn({512}, torch::kFloat64).requires_grad_();
    const int64_t with_x = current_bytes();
    (x * x).sum().backward();
    ASSERT_TRUE(x.grad().defined());
    // The gradient buffer autograd created is live and was counted.
    EXPECT_GE(current_bytes() - with_x, 512 * 8);
    EXPECT_GE(peak_bytes() - with_x, 2 * 512 * 8);  // x*x and the gradient coexisted
  }
  EXPECT_EQ(current_bytes(), base);
  // The model's parameters and an optimizer step go through it as well.
  const int64_t before_model = current_bytes();
  {
    TinyLM model(ModelSpec{});
    EXPECT_GE(current_bytes() - before_model, tiny_lm_counts(ModelSpec{}).total * 4);  // float32 params
  }
  EXPECT_EQ(current_bytes(), before_model);
  EXPECT_GT(allocation_count(), 0);
}

TEST(AllocTracker, TrainingRunsUnchangedUnderIt) {
  // The float64 reference and float32 / bfloat16 training (kernels that use the raw
  // interface) run through the tracker, and everything they free is subtracted.
  ASSERT_TRUE(install_tracking_allocator());
  Spec spec;
  spec.optimizer.name = "adamw";
  const int64_t base = current_bytes();
  const auto ref = run_reference(spec, make_plan(spec));
  EXPECT_FALSE(ref.empty());
  for (auto d : {DType::Float32, DType::BFloat16}) (void)probe(spec_with(d, "adamw"));
  EXPECT_EQ(current_bytes(), base);
}

// The reference written to disk as it is computed (NOTE [streamed tensors]), and read back one
// tensor at a time, is the held reference bit for bit (both trajectories, every floor), and
// holds no values in memory; the two routes side by side on two threads (NOTE [routes side by
// side]) give the figures of one route after the other, held or spilled.
TEST(StreamedReference, SpilledReferencesAreStreamedAndBitIdentical) {
  // The second route in float32 and in float64 (pieces): both kinds of floor.
  for (const DType d : {DType::Float32, DType::Float64}) {
    SCOPED_TRACE(dtype_name(d));
    Spec spec;
    spec.dtype = d;
    const Plan plan = make_plan(spec);
    std::vector<BackendUpdate> run;  // a "stack" that stepped as the reference did
    for (const auto& r : run_reference(spec, plan)) {
      BackendUpdate b;
      b.update = r.update;
      b.params_after = r.params_after;
      run.push_back(std::move(b));
    }
    const References held = run_references(spec, plan, run, "", nullptr, RouteThreads::One);
    const References held_two = run_references(spec, plan, run, "", nullptr, RouteThreads::Two);
    const std::string dir = test::fresh_dir("gradcert_streamed", "reference_" + dtype_name(d));
    const References spilled = run_references(spec, plan, run, dir, nullptr, RouteThreads::Two);
    const std::string dir_one = test::fresh_dir("gradcert_streamed", "reference_one_" + dtype_name(d));
    const References spilled_one = run_references(spec, plan, run, dir_one, nullptr, RouteThreads::One);
    ASSERT_EQ(spilled.forced.size(), plan.windows.size());
    auto same = [](const std::vector<ReferenceUpdate>& a, const std::vector<ReferenceUpdate>& b, bool grads,
                   bool b_streamed = true) {
      ASSERT_EQ(a.size(), b.size());
      for (size_t u = 0; u < a.size(); ++u) {
        EXPECT_EQ(b[u].loss, a[u].loss);
        EXPECT_EQ(b[u].floor.grad, a[u].floor.grad) << u;
        EXPECT_EQ(b[u].floor.params, a[u].floor.params) << u;
        EXPECT_EQ(b[u].floor.scale, a[u].floor.scale) << u;
        EXPECT_TRUE(b[u].floor.measured);
        for (const auto* maps : {&a[u].params_after, grads ? &a[u].grads : nullptr}) {
          if (!maps) continue;
          const TensorMap& other = maps == &a[u].params_after ? b[u].params_after : b[u].grads;
          ASSERT_EQ(other.size(), maps->size());
          for (const auto& [name, t] : *maps) {
            const HostTensor& s = other.at(name);
            EXPECT_EQ(s.streamed() && s.held.empty(), b_streamed) << name;
            EXPECT_FALSE(t.streamed()) << name;
            const TensorError e = compare_tensors(s, t);
            EXPECT_EQ(e.relative, 0.0) << "update " << u << " " << name;
            EXPECT_EQ(e.max_abs, 0.0) << "update " << u << " " << name;
          }
        }
      }
    };
    same(held.forced, spilled.forced, true);
    same(held.free_running, spilled.free_running, false);
    same(held.forced, spilled_one.forced, true);
    same(held.free_running, spilled_one.free_running, false);
    same(held.forced, held_two.forced, true, /*b_streamed=*/false);
    same(held.free_running, held_two.free_running, false, /*b_streamed=*/false);
    EXPECT_GT(held.forced[1].floor.grad, 0.0);  // the floor is measured, not zero
    EXPECT_TRUE(std::filesystem::exists(dir + "/u0.forced.grads.safetensors"));
  }
}

TEST(AllocTracker, PeakIsResettablePerPhase) {
  ASSERT_TRUE(install_tracking_allocator());
  reset_peak();
  const int64_t base = current_bytes();
  EXPECT_EQ(peak_bytes(), base);
  { auto big = torch::empty({1 << 20}, torch::kUInt8); }
  EXPECT_EQ(current_bytes(), base);
  EXPECT_GE(peak_bytes(), base + (1 << 20));
  reset_peak();
  EXPECT_EQ(peak_bytes(), base);
}

TEST(AllocTracker, ProcessHighWaterMarkBesideIt) {
  const int64_t hwm = process_high_water_bytes();
  EXPECT_GT(hwm, 0);
  { auto big = torch::ones({64 << 20}, torch::kUInt8); }  // 64 MiB touched
  EXPECT_GE(process_high_water_bytes(), 64 << 20);
}

TEST(AllocTracker, DeviceStatisticsAnswerWithoutCuda) {
  const auto s = device_memory_stats(0);
  if (!torch::cuda::is_available()) {
    EXPECT_FALSE(s.available);
    EXPECT_FALSE(s.why.empty());
    EXPECT_FALSE(reset_device_peak(0));
  } else {
    EXPECT_TRUE(s.available) << s.why;
  }
}

// ---- measured peaks per phase ------------------------------------------------------------------

TEST(MemoryPhases, RecordsEveryPhaseWithASavePause) {
  const auto p = probe(spec_with(DType::Float64, "adamw"));
  for (const char* bucket : {"short", "typical", "long"}) {
    std::vector<std::string> names;
    for (const auto& x : p.bucket(bucket)) names.push_back(x.phase);
    EXPECT_EQ(names, (std::vector<std::string>{"load", "first forward", "first backward", "first optimizer step",
                                               "save", "forward", "backward", "optimizer step"}))
        << bucket;
  }
  for (const auto& x : p.memory.peaks) {
    EXPECT_EQ(x.device, "cpu");
    EXPECT_GE(x.peak_bytes, x.current_bytes) << x.phase;
    EXPECT_GT(x.process_high_water_bytes, 0);
  }
  EXPECT_GT(phase_of(p.bucket("typical"), "save").seconds, 0);
  // The checkpoint holds params and both moments (float64): at least 3 x 8 B per param.
  EXPECT_GE(p.memory.checkpoint_bytes, 3 * 8 * p.params);
}

TEST(MemoryPhases, FirstAdamStepRaisesThePeakAbovePostLoad) {
  const auto p = probe(spec_with(DType::Float64, "adamw"));
  const auto typical = p.bucket("typical");
  const auto& load = phase_of(typical, "load");
  const auto& back = phase_of(typical, "first backward");
  const auto& step = phase_of(typical, "first optimizer step");
  // Post-load memory is the params (8 B each); the first step allocates both moments.
  EXPECT_GE(load.current_bytes, 8 * p.params);
  EXPECT_GT(step.peak_bytes, load.current_bytes);
  // After the first step the rank holds params + grads + both moments (8 B each); before it,
  // the moments did not exist (the backward phase may end with a few temporaries alive).
  EXPECT_GE(step.current_bytes, load.current_bytes + 8 * p.params + 2 * 8 * p.params);
  EXPECT_LT(back.current_bytes, load.current_bytes + 8 * p.params + 2 * 8 * p.params);
  EXPECT_GE(step.peak_bytes, load.current_bytes + 2 * 8 * p.params + 8 * p.params);  // + grads
  // Later steps allocate no new state.
  EXPECT_LT(phase_of(typical, "optimizer step").current_bytes - phase_of(typical, "backward").current_bytes,
            8 * p.params);
  std::cout << "[ figures ] adamw float64 typical: post-load " << load.current_bytes << " B, first-step peak "
            << step.peak_bytes << " B, state after first step " << step.current_bytes << " B\n";
  // Plain SGD allocates no state at its first step.
  const auto sgd = probe(spec_with(DType::Float64, "sgd")).bucket("typical");
  EXPECT_LE(phase_of(sgd, "first optimizer step").current_bytes, phase_of(sgd, "first backward").current_bytes);
}

TEST(MemoryPhases, MeasuredModelStateMatchesTheEstimate) {
  const std::pair<DType, std::pair<std::string, double>> runs[] = {
      {DType::Float64, {"sgd", 0}},    {DType::Float64, {"sgd", 0.9}}, {DType::Float32, {"adamw", 0}},
      {DType::BFloat16, {"adamw", 0}}, {DType::Float64, {"adamw", 0}},
  };
  for (const auto& [dtype, opt] : runs) {
    const Spec spec = spec_with(dtype, opt.first, opt.second);
    const auto p = probe(spec);
    EstimateInput in;
    in.params = p.params;
    in.recipe = recipe_for_run(spec.dtype, spec.optimizer);
    const auto e = estimate_memory(in);
    const auto c = check_memory_lower_bound(p.memory.model_state_bytes, e.model_state());
    EXPECT_EQ(c.verdict, Verdict::Pass) << in.recipe.name << ": " << c.detail;
    EXPECT_EQ(p.memory.model_state_bytes, e.model_state()) << in.recipe.name;
    std::cout << "[ figures ] " << in.recipe.name << ": estimate " << e.model_state() << " B, measured "
              << p.memory.model_state_bytes << " B, figure " << c.figure << "\n";
  }
}

TEST(MemoryPhases, TightBudgetFailsNamingPhaseAndBucket) {
  const auto peaks = probe(spec_with(DType::Float64, "adamw")).memory.peaks;
  const PhasePeak* worst = &peaks.front();
  for (const auto& p : peaks)
    if (p.peak_bytes > worst->peak_bytes) worst = &p;
  // Activations grow with length: the long bucket's forward peaks above the short one's.
  int64_t short_fwd = 0, long_fwd = 0;
  for (const auto& p : peaks) {
    if (p.phase == "forward" && p.bucket == "short") short_fwd = p.peak_bytes;
    if (p.phase == "forward" && p.bucket == "long") long_fwd = p.peak_bytes;
  }
  EXPECT_GT(long_fwd, short_fwd);
  const auto tight = check_memory_budget(peaks, static_cast<double>(worst->peak_bytes) - 1);
  EXPECT_EQ(tight.verdict, Verdict::Fail);
  EXPECT_EQ(tight.detail.rfind("rank 0, " + worst->bucket + " bucket, " + worst->phase + ": ", 0), 0u) << tight.detail;
  EXPECT_EQ(check_memory_budget(peaks, static_cast<double>(worst->peak_bytes)).verdict, Verdict::Pass);
  std::cout << "[ figures ] " << tight.detail << "\n";
  for (const auto& p : peaks)
    std::cout << "[ figures ] " << p.bucket << " / " << p.phase << ": peak " << p.peak_bytes << " B, live "
              << p.current_bytes << " B, " << p.seconds * 1e3 << " ms\n";
}

TEST(MemoryPhases, RecorderUsesTheTrackedPeakOfEachPhase) {
  MemoryPhases rec("long", 3);
  rec.start();
  { auto a = torch::empty({1 << 16}, torch::kFloat64); }
  rec.mark("first");
  rec.mark("second");
  ASSERT_EQ(rec.phases().size(), 2u);
  EXPECT_GE(rec.phases()[0].peak_bytes - rec.phases()[0].current_bytes, 8 << 16);
  EXPECT_EQ(rec.phases()[1].peak_bytes, rec.phases()[1].current_bytes);  // reset between phases
  EXPECT_EQ(rec.worst()->phase, "first");
  EXPECT_EQ(rec.phases()[0].rank, 3);
  EXPECT_EQ(rec.phases()[0].bucket, "long");
}

// `gradcert estimate --model spec.json --strategy S` prints exactly the bound memory.lower_bound
// holds a built-in run of that spec to (the rank that holds the most), for every strategy:
// both take their counts from conformance/layout (tiny_lm_estimate_input).
TEST(MemoryEstimate, CliModelEqualsTheLowerBoundOfEveryStrategy) {
  const auto dir = std::filesystem::temp_directory_path() / ("gradcert_est_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct Case {
    std::string strategy;
    int world, tp, pp;
  };
  const Case cases[] = {{"single", 1, 1, 1}, {"ddp", 2, 1, 1},  {"zero1", 2, 1, 1}, {"zero2", 2, 1, 1},
                        {"zero3", 2, 1, 1},  {"fsdp", 3, 1, 1}, {"tp", 2, 2, 1},    {"tp", 4, 2, 1},
                        {"pp", 2, 1, 2},     {"pp", 4, 1, 2}};
  for (const auto& [dtype, optimizer] : {std::pair{DType::Float64, "sgd"}, {DType::BFloat16, "adamw"}})
    for (const auto& c : cases) {
      Spec spec = spec_with(dtype, optimizer);
      spec.model.layers = 3;  // uneven pipeline stages
      spec.topology = {c.world / (c.tp * c.pp), c.tp, c.pp};
      const std::string file = (dir / "spec.json").string();
      std::ofstream(file) << spec_to_json(spec);
      EstimateOptions o;
      o.model = file;
      o.strategy = c.strategy;
      const MemoryEstimate cli = make_estimate(o);
      int64_t bound = 0;
      for (int r = 0; r < c.world; ++r)
        bound = std::max(bound, estimate_for_run(spec, parse_sharding(c.strategy), r).model_state());
      EXPECT_EQ(cli.model_state(), bound) << c.strategy << " world " << c.world << " " << dtype_name(dtype);
      EXPECT_EQ(cli.input.recipe.name, recipe_for_strategy(parse_sharding(c.strategy), dtype, spec.optimizer).name);
    }
  std::filesystem::remove_all(dir);
}
