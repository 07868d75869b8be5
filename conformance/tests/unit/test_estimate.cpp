// Torch-free unit tests: the model-state lower bound (every recipe and strategy, LoRA),
// the memory checks, length buckets, throughput arithmetic and the report's memory sections.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>

#include "conformance/checks/checks.hpp"
#include "conformance/core/format.hpp"
#include "conformance/core/throughput.hpp"
#include "conformance/layout/layout.hpp"
#include "conformance/memory/memory.hpp"
#include "reports/memory_report.hpp"

using namespace gradcert;

namespace {

MemoryEstimate est(int64_t params, const std::string& recipe, Sharding s, int world, int tp = 1, int pp = 1,
                   int64_t layer = -1, int64_t unit = 0, int64_t trainable = -1) {
  EstimateInput in;
  in.params = params;
  in.trainable = trainable;
  in.recipe = recipe_by_name(recipe);
  in.strategy = s;
  in.world = world;
  in.tp = tp;
  in.pp = pp;
  in.layer_params = layer;
  in.largest_unit_params = unit;
  return estimate_memory(in);
}

}  // namespace

TEST(MemoryEstimate, EveryNamedRecipe) {
  const std::map<std::string, std::pair<double, std::string>> expected = {
      {"mixed-adam", {16, "2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 8 (two fp32 moments) = 16 B/param"}},
      {"fp32-adam", {16, "4 (fp32 weights) + 4 (fp32 grads) + 8 (two fp32 moments) = 16 B/param"}},
      {"fp32-grads-adam",
       {18, "2 (bf16 weights) + 4 (fp32 grads) + 4 (fp32 master) + 8 (two fp32 moments) = 18 B/param"}},
      {"sgd", {8, "4 (fp32 weights) + 4 (fp32 grads) = 8 B/param"}},
      {"sgd-momentum", {12, "4 (fp32 weights) + 4 (fp32 grads) + 4 (fp32 momentum) = 12 B/param"}},
  };
  ASSERT_EQ(named_recipes().size(), expected.size());
  for (const auto& r : named_recipes()) {
    ASSERT_TRUE(expected.count(r.name)) << r.name;
    EXPECT_EQ(r.per_param(), expected.at(r.name).first) << r.name;
    EXPECT_EQ(r.breakdown(), expected.at(r.name).second);
    EXPECT_EQ(est(1000, r.name, Sharding::Single, 1).model_state(), 1000 * static_cast<int64_t>(r.per_param()));
  }
  EXPECT_EQ(recipe_by_name("mixed-adam").per_param(), mixed_precision_adam().per_param());
  try {
    recipe_by_name("adam");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mixed-adam, fp32-adam, fp32-grads-adam, sgd, sgd-momentum"),
              std::string::npos);
  }
}

TEST(MemoryEstimate, RecipeOfAGradcertRun) {
  auto r = [](DType d, const std::string& opt, double momentum = 0) {
    OptimizerSpec o;
    o.name = opt;
    o.momentum = momentum;
    return recipe_for_run(d, o);
  };
  EXPECT_EQ(r(DType::Float64, "sgd").breakdown(), "8 (fp64 weights) + 8 (fp64 grads) = 16 B/param");
  EXPECT_EQ(r(DType::Float64, "sgd", 0.9).per_param(), 24);
  EXPECT_EQ(r(DType::Float32, "adamw").breakdown(),
            "4 (fp32 weights) + 4 (fp32 grads) + 8 (two fp32 moments) = 16 B/param");
  EXPECT_EQ(r(DType::BFloat16, "adamw").breakdown(),
            "2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 8 (two fp32 moments) = 16 B/param");
  EXPECT_EQ(r(DType::BFloat16, "sgd", 0.9).per_param(), 12);
  EXPECT_EQ(r(DType::BFloat16, "adamw").name, "bfloat16-adamw");
  EXPECT_EQ(r(DType::Float64, "sgd", 0.9).name, "float64-sgd-momentum");
}

// P = 1001 so that shards round: ceil(1001 / 4) = 251. mixed-adam: w 2, g 2, m 4, o 8.
TEST(MemoryEstimate, EveryStrategyWithCeilShards) {
  struct Case {
    Sharding s;
    int world, tp, pp;
    int64_t weights, grads, master, moments, unit;
  };
  const int64_t L = 801;  // layer params (TP splits these); 200 replicated
  const Case cases[] = {
      {Sharding::Single, 1, 1, 1, 2002, 2002, 4004, 8008, 0},
      {Sharding::DDP, 4, 1, 1, 2002, 2002, 4004, 8008, 0},                      // replicated
      {Sharding::ZeRO1, 4, 1, 1, 2002, 2002, 251 * 4, 251 * 8, 0},              // optimizer state + master sharded
      {Sharding::ZeRO2, 4, 1, 1, 2002, 251 * 2, 251 * 4, 251 * 8, 0},           // + grads
      {Sharding::ZeRO3, 4, 1, 1, 251 * 2, 251 * 2, 251 * 4, 251 * 8, 100 * 4},  // + params, + unit (w + g)
      {Sharding::FSDP, 4, 1, 1, 251 * 2, 251 * 2, 251 * 4, 251 * 8, 100 * 4},
      {Sharding::ZeRO3, 1, 1, 1, 2002, 2002, 4004, 8008, 0},           // one rank: nothing to gather
      {Sharding::TP, 4, 4, 1, 401 * 2, 401 * 2, 401 * 4, 401 * 8, 0},  // ceil(801/4) + 200 = 401
      {Sharding::TP, 4, 1, 1, 2002, 2002, 4004, 8008, 0},              // TP = 1 x DP 4: a full replica
      {Sharding::PP, 4, 1, 4, 251 * 2, 251 * 2, 251 * 4, 251 * 8, 0},  // average stage ceil(1001/4)
      {Sharding::TP, 4, 2, 2, 301 * 2, 301 * 2, 301 * 4, 301 * 8, 0},  // ceil((ceil(801/2)+200)/2) = 301
      // ZeRO-1 over dp 4 of a tp-2 replica: P_r = 401 + 200 = 601, s = ceil(601/4) = 151.
      {Sharding::ZeRO1, 8, 2, 1, 601 * 2, 601 * 2, 151 * 4, 151 * 8, 0},
  };
  for (const auto& c : cases) {
    const auto e = est(1001, "mixed-adam", c.s, c.world, c.tp, c.pp, L, 100);
    const std::string what = sharding_name(c.s) + " world " + std::to_string(c.world) + " tp " + std::to_string(c.tp) +
                             " pp " + std::to_string(c.pp);
    EXPECT_EQ(e.weights, c.weights) << what;
    EXPECT_EQ(e.grads, c.grads) << what;
    EXPECT_EQ(e.master, c.master) << what;
    EXPECT_EQ(e.moments, c.moments) << what;
    EXPECT_EQ(e.gathered_unit, c.unit) << what;
    EXPECT_EQ(e.total(), c.weights + c.grads + c.master + c.moments + c.unit) << what;
    EXPECT_FALSE(e.excluded.empty());
  }
  // Sharding never raises the bound, and deeper sharding never raises it either.
  const int64_t ddp = est(1001, "mixed-adam", Sharding::DDP, 4).model_state();
  const int64_t z1 = est(1001, "mixed-adam", Sharding::ZeRO1, 4).model_state();
  const int64_t z2 = est(1001, "mixed-adam", Sharding::ZeRO2, 4).model_state();
  const int64_t z3 = est(1001, "mixed-adam", Sharding::ZeRO3, 4).model_state();
  EXPECT_GT(ddp, z1);
  EXPECT_GT(z1, z2);
  EXPECT_GT(z2, z3);
  for (const char* name : {"single", "ddp", "zero1", "zero2", "zero3", "fsdp", "tp", "pp"})
    EXPECT_EQ(sharding_name(parse_sharding(name)), name);
}

TEST(MemoryEstimate, LoraFreezesTheBaseAtWeightBytes) {
  // 0.6e9 params of which 6e6 adapter params: base weights 2 B, adapters the full 16 B.
  const auto e = est(600000000, "mixed-adam", Sharding::Single, 1, 1, 1, -1, 0, 6000000);
  EXPECT_EQ(e.weights, 1200000000);
  EXPECT_EQ(e.grads, 12000000);
  EXPECT_EQ(e.master, 24000000);
  EXPECT_EQ(e.moments, 48000000);
  EXPECT_EQ(e.model_state(), 1284000000);  // vs 9.6e9 for full fine-tuning
  const std::string text = estimate_text(e);
  EXPECT_NE(text.find("LoRA: trainable 6e6 at 16 B/param, frozen base 5.94e8 at 2 B/param (weights only)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("1.284e9 B = 1.20 GiB"), std::string::npos) << text;
  // ZeRO-3 over 4: weights ceil(6e8/4) x 2; adapters' state ceil(6e6/4); the unit has no grads.
  const auto z = est(600000000, "mixed-adam", Sharding::ZeRO3, 4, 1, 1, -1, 1000, 6000000);
  EXPECT_EQ(z.weights, 300000000);
  EXPECT_EQ(z.grads, 3000000);
  EXPECT_EQ(z.master, 6000000);
  EXPECT_EQ(z.moments, 12000000);
  EXPECT_EQ(z.gathered_unit, 2000);
  // All trainable = full fine-tuning.
  EXPECT_EQ(est(1000, "mixed-adam", Sharding::Single, 1, 1, 1, -1, 0, 1000).model_state(), 16000);
}

TEST(MemoryEstimate, RejectsInconsistentInput) {
  EXPECT_THROW(est(1000, "mixed-adam", Sharding::DDP, 3, 2), std::invalid_argument);
  EXPECT_THROW(est(1000, "mixed-adam", Sharding::Single, 2), std::invalid_argument);
  EXPECT_THROW(est(1000, "mixed-adam", Sharding::Single, 1, 1, 1, -1, 0, 1001), std::invalid_argument);
  EXPECT_THROW(est(0, "mixed-adam", Sharding::Single, 1), std::invalid_argument);
  EXPECT_THROW(parse_sharding("zero4"), std::invalid_argument);
}

TEST(MemoryEstimate, Formatting) {
  EXPECT_EQ(sci(9.6e9), "9.6e9");
  EXPECT_EQ(sci(1.284e9), "1.284e9");
  EXPECT_EQ(sci(5792), "5.792e3");
  EXPECT_EQ(sci(1), "1e0");
  EXPECT_EQ(human_bytes(9.6e9), "8.94 GiB");
  EXPECT_EQ(human_bytes(3.2 * 1024 * 1024), "3.20 MiB");
  EXPECT_EQ(human_bytes(512), "512 B");
}

TEST(MemoryEstimate, LengthBucketsFromTheDistribution) {
  const Spec spec;
  const int s = bucket_length(spec, LengthBucket::Short), t = bucket_length(spec, LengthBucket::Typical),
            l = bucket_length(spec, LengthBucket::Long);
  EXPECT_LT(s, t);
  EXPECT_LT(t, l);
  int longest = 0;
  for (int64_t id = 0; id < spec.dataset.size; ++id)
    longest = std::max(longest, static_cast<int>(make_sample(spec, id).tokens.size()));
  EXPECT_EQ(l, longest);
  const auto ids = bucket_ids(spec, LengthBucket::Long, 2);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(static_cast<int>(make_sample(spec, ids[0]).tokens.size() + make_sample(spec, ids[1]).tokens.size()) >=
                2 * t,
            true);
  EXPECT_EQ(bucket_ids(spec, LengthBucket::Short, 1000).size(), static_cast<size_t>(spec.dataset.size));
}

// ---- checks ---------------------------------------------------------------------------------

TEST(MemoryChecks, LowerBoundWithinTwoPercent) {
  EXPECT_EQ(check_memory_lower_bound(1000, 1000).verdict, Verdict::Pass);
  EXPECT_EQ(check_memory_lower_bound(1019, 1000).verdict, Verdict::Pass);
  const auto above = check_memory_lower_bound(1030, 1000);
  EXPECT_EQ(above.verdict, Verdict::Fail);
  EXPECT_NEAR(above.figure, 0.03, 1e-12);
  EXPECT_NE(above.detail.find("3.00% above"), std::string::npos) << above.detail;
  const auto below = check_memory_lower_bound(999, 1000);
  EXPECT_EQ(below.verdict, Verdict::Fail);
  EXPECT_NE(below.detail.find("below the lower bound"), std::string::npos);
  EXPECT_EQ(check_memory_lower_bound(-1, 1000).verdict, Verdict::Skip);
  EXPECT_EQ(check_memory_lower_bound(1000, 1000).id, "memory.lower_bound");
}

TEST(MemoryChecks, BudgetNamesRankBucketAndPhase) {
  std::vector<PhasePeak> peaks;
  auto add = [&](int rank, const std::string& bucket, const std::string& phase, double mib) {
    PhasePeak p;
    p.rank = rank;
    p.bucket = bucket;
    p.phase = phase;
    p.peak_bytes = static_cast<int64_t>(mib * 1024 * 1024);
    peaks.push_back(p);
  };
  add(0, "short", "forward", 1.0);
  add(1, "long", "backward", 3.2);
  add(1, "typical", "first optimizer step", 2.5);
  const auto c = check_memory_budget(peaks, 2.0 * 1024 * 1024);
  EXPECT_EQ(c.id, "memory.budget");
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_EQ(c.detail, "rank 1, long bucket, backward: 3.20 MiB > budget 2.00 MiB");
  EXPECT_EQ(check_memory_budget(peaks, 4.0 * 1024 * 1024).verdict, Verdict::Pass);
  EXPECT_EQ(check_memory_budget(peaks, 0).verdict, Verdict::Skip);
  EXPECT_EQ(check_memory_budget({}, 1e6).verdict, Verdict::Skip);
}

// ---- throughput and report sections --------------------------------------------------------

TEST(MemoryThroughput, RatesMedianAndScaling) {
  EXPECT_EQ(median({}), 0);
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  // Prompt tokens count in input tokens/s, not in target tokens/s.
  const std::vector<TimedUpdate> single = {{9.0, 1, 1}, {2.0, 100, 60}, {2.0, 100, 60}, {4.0, 100, 60}};
  const auto s = measure_throughput("single", 1, single, 1);
  EXPECT_EQ(s.warmup_updates, 1);
  EXPECT_EQ(s.timed_updates, 3);
  EXPECT_DOUBLE_EQ(s.input_tokens_per_s, 300.0 / 8.0);
  EXPECT_DOUBLE_EQ(s.target_tokens_per_s, 180.0 / 8.0);
  EXPECT_DOUBLE_EQ(s.step_seconds, 2.0);
  auto d = measure_throughput("ddp", 2, {{5.0, 1, 1}, {1.25, 100, 60}, {1.25, 100, 60}, {1.5, 100, 60}}, 1);
  compare_to_single(d, s);
  EXPECT_TRUE(d.has_baseline);
  EXPECT_DOUBLE_EQ(d.scaling.speedup, 2.0);
  EXPECT_DOUBLE_EQ(d.scaling.efficiency, 1.0);
  EXPECT_DOUBLE_EQ(d.scaling.gpu_hours_ratio, 1.0);
  const auto few = measure_throughput("x", 1, {{1.0, 10, 5}}, 2);
  EXPECT_EQ(few.timed_updates, 1);
  EXPECT_FALSE(few.note.empty());
}

TEST(MemoryReport, JsonAndMarkdownSections) {
  MemoryRunReport r;
  r.backend = "ddp";
  r.world = 2;
  r.has_estimate = true;
  r.estimate = est(5792, "sgd", Sharding::DDP, 2);
  r.measured_model_state_bytes = 46336;
  r.budget_bytes = 1 << 20;
  for (const char* b : {"long", "short"})
    for (int rank : {0, 1}) {
      PhasePeak p;
      p.rank = rank;
      p.bucket = b;
      p.phase = "backward";
      p.peak_bytes = std::string(b) == "long" ? 300000 + rank : 100000;
      r.peaks.push_back(p);
    }
  const auto j = memory_json({r});
  EXPECT_EQ(j["runs"][0]["estimate"]["model_state"], 46336);
  EXPECT_EQ(j["runs"][0]["worst"]["bucket"], "long");
  EXPECT_EQ(j["runs"][0]["worst"]["rank"], 1);
  EXPECT_EQ(j["runs"][0]["peaks"].size(), 4u);
  EXPECT_FALSE(j["excluded"].empty());
  const std::string md = memory_markdown({r});
  EXPECT_NE(md.find("## Memory"), std::string::npos);
  EXPECT_NE(md.find("| backend | rank | phase | short | long |"), std::string::npos) << md;
  EXPECT_NE(md.find("(rank 1, long bucket, backward)"), std::string::npos) << md;

  Throughput t;
  t.backend = "ddp";
  t.devices = 2;
  t.target_tokens_per_s = 10;
  const auto tj = throughput_json({t});
  EXPECT_TRUE(tj["runs"][0]["speedup"].is_null());
  EXPECT_TRUE(tj["runs"][0]["save_pause_seconds"].is_null());
  const std::string tmd = throughput_markdown({t});
  EXPECT_NE(tmd.find("## Throughput"), std::string::npos);
  EXPECT_NE(tmd.find("GPU-hours ratio"), std::string::npos);
}
