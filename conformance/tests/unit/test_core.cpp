// Unit tests: spec, plan, dataset and the seed's accounting examples.
#include <gtest/gtest.h>

#include <set>

#include "conformance/core/accounting.hpp"
#include "conformance/core/dataset.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/core/sha256.hpp"
#include "conformance/core/spec.hpp"

using namespace gradcert;

namespace {

std::string spec_error_field(const std::string& json) {
  try {
    parse_spec(json);
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find(e.field), std::string::npos) << e.what();
    return e.field;
  }
  return "(no error)";
}

}  // namespace

TEST(Spec, EmptyObjectTakesEveryDefault) {
  const Spec s = parse_spec("{}");
  EXPECT_EQ(s.batch.micro, 2);
  EXPECT_EQ(s.batch.accum, 3);
  EXPECT_EQ(s.dtype, DType::Float64);
  EXPECT_EQ(spec_to_json(s), spec_to_json(Spec{}));
}

TEST(Spec, RoundTripsThroughJson) {
  Spec s;
  s.seed = 99;
  s.batch.accum = 5;
  s.dtype = DType::BFloat16;
  s.optimizer.name = "adamw";
  EXPECT_EQ(spec_to_json(parse_spec(spec_to_json(s))), spec_to_json(s));
}

TEST(Spec, UnknownFieldIsNamed) {
  EXPECT_EQ(spec_error_field(R"({"batch": {"micro": 2, "acum": 3}})"), "batch.acum");
  EXPECT_EQ(spec_error_field(R"({"sead": 1})"), "sead");
}

TEST(Spec, IllTypedFieldIsNamed) {
  EXPECT_EQ(spec_error_field(R"({"batch": {"micro": "two"}})"), "batch.micro");
  EXPECT_EQ(spec_error_field(R"({"dataset": {"shuffle": 1}})"), "dataset.shuffle");
  EXPECT_EQ(spec_error_field(R"({"dtype": "float16"})"), "dtype");
  EXPECT_EQ(spec_error_field(R"({"model": 3})"), "model");
  EXPECT_EQ(spec_error_field(R"({"seed": -1})"), "seed");
  EXPECT_EQ(spec_error_field(R"({"batch": {"micro": 2.5}})"), "batch.micro");
}

TEST(Spec, OutOfRangeValueIsNamed) {
  EXPECT_EQ(spec_error_field(R"({"batch": {"accum": 0}})"), "batch.accum");
  EXPECT_EQ(spec_error_field(R"({"model": {"d_model": 10, "heads": 3}})"), "model.heads");
  EXPECT_EQ(spec_error_field(R"({"dataset": {"long_max": 99}})"), "dataset.long_max");
  EXPECT_EQ(spec_error_field(R"({"optimizer": {"name": "lion"}})"), "optimizer.name");
  EXPECT_EQ(spec_error_field(R"({"tolerance": {"float64": 0}})"), "tolerance.float64");
  EXPECT_EQ(spec_error_field(R"({"tolerance": {"floor_factor": 0.5}})"), "tolerance.floor_factor");
  EXPECT_EQ(spec_error_field(R"({"pipeline": {"schedule": "zb-v"}})"), "pipeline.schedule");
}

TEST(Spec, BadJsonAndMissingFileAreNamed) {
  try {
    parse_spec("{\"seed\": ", "my.json");
    FAIL() << "no error";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("my.json"), std::string::npos) << e.what();
  }
  try {
    load_spec("/nonexistent/spec.json");
    FAIL() << "no error";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/spec.json"), std::string::npos) << e.what();
  }
}

TEST(Dataset, SamplesAreDeterministicAndMasked) {
  Spec s;
  for (int64_t id = 0; id < s.dataset.size; ++id) {
    const Sample a = make_sample(s, id), b = make_sample(s, id);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.labels, b.labels);
    ASSERT_EQ(a.tokens.size(), a.labels.size());
    EXPECT_EQ(a.labels.back(), kIgnoreIndex) << "the last position has no next token";
    for (size_t t = 0; t + 1 < a.tokens.size(); ++t) {
      if (static_cast<int>(t) + 1 < a.prompt_len)
        EXPECT_EQ(a.labels[t], kIgnoreIndex) << "prompt is masked";
      else
        EXPECT_EQ(a.labels[t], a.tokens[t + 1]);
    }
    for (auto tok : a.tokens) EXPECT_NE(tok, kPadToken);
  }
  Spec other = s;
  other.seed = s.seed + 1;
  EXPECT_NE(make_sample(s, 3).tokens, make_sample(other, 3).tokens);
}

TEST(Dataset, CoversEveryLengthBucketAndAllPromptExamples) {
  Spec s;
  s.dataset.size = 400;
  std::set<LengthBucket> buckets;
  int all_prompt = 0;
  for (int64_t id = 0; id < s.dataset.size; ++id) {
    const Sample x = make_sample(s, id);
    buckets.insert(x.bucket);
    all_prompt += x.valid_targets() == 0;
    const int len = static_cast<int>(x.tokens.size());
    if (x.bucket == LengthBucket::Long) EXPECT_GE(len, s.dataset.long_min);
    if (x.bucket == LengthBucket::Short) EXPECT_LE(len, s.dataset.short_max);
  }
  EXPECT_EQ(buckets.size(), 3u);
  EXPECT_GT(all_prompt, 0);
}

TEST(Accounting, SeedUpdateBatchTensorParallelDoesNotMultiply) {
  // 8 GPUs, TP = 2 -> DP = 4; micro 2, accum 8 -> 64 examples per update, not 128.
  const int dp = data_parallel_degree(8, 2, 1);
  EXPECT_EQ(dp, 4);
  EXPECT_EQ(update_batch_size(2, 8, dp), 64);
  EXPECT_NE(update_batch_size(2, 8, 8), 64) << "counting TP ranks as DP gives 128";
}

TEST(Accounting, SeedLocalMeansVersusGlobalTokenMean) {
  // One rank: 1 target, loss sum 0.2; the other: 3 targets, loss sum 3.
  EXPECT_NEAR(mean_of_local_means({0.2, 3.0}, {1, 3}), 0.6, 1e-15);
  EXPECT_NEAR(global_token_mean({0.2, 3.0}, {1, 3}), 0.8, 1e-15);
}

TEST(Accounting, SeedMemoryAndScaling) {
  EXPECT_DOUBLE_EQ(mixed_precision_adam().per_param(), 16);
  EXPECT_DOUBLE_EQ(model_state_bytes(0.6e9, mixed_precision_adam()), 9.6e9);
  EXPECT_NEAR(gib(9.6e9), 8.94, 0.005);
  const Scaling s = scaling(1000, 2800, 4);
  EXPECT_NEAR(s.speedup, 2.8, 1e-12);
  EXPECT_NEAR(s.efficiency, 0.70, 1e-12);
  EXPECT_NEAR(s.gpu_hours_ratio, 1.43, 0.005);
}

TEST(Accounting, WorldMustDivideByModelParallelDegrees) {
  EXPECT_THROW(data_parallel_degree(6, 4, 1), SpecError);
  EXPECT_THROW(data_parallel_degree(4, 1, 0), SpecError);
}

TEST(Plan, IsDeterministic) {
  Spec s;
  EXPECT_EQ(plan_to_json(make_plan(s), s), plan_to_json(make_plan(s), s));
}

TEST(Plan, DefaultSpecHasPartialWindowWithAnEmptyRank) {
  Spec s;  // 26 examples, B_update = 2 x 3 x 2 = 12 -> 12, 12, 2
  const Plan p = make_plan(s);
  ASSERT_EQ(p.windows.size(), 3u);
  const Window& last = p.windows.back();
  EXPECT_TRUE(last.partial);
  EXPECT_EQ(last.ids.size(), 2u);
  int64_t rank1 = 0;
  for (const auto& mb : last.slots[1]) rank1 += static_cast<int64_t>(mb.ids.size());
  EXPECT_EQ(rank1, 0) << "rank 1 gets nothing in the final window";
  for (const auto& w : p.windows) {
    ASSERT_EQ(w.slots.size(), 2u);
    for (const auto& r : w.slots) EXPECT_EQ(r.size(), 3u) << "every rank has every microstep, even empty";
  }
}

TEST(Plan, EveryExampleOncePerEpochAndWindowsFull) {
  for (int dp : {1, 2, 3, 4})
    for (int accum : {1, 3})
      for (int size : {1, 7, 26, 48}) {
        Spec s;
        s.dataset.size = size;
        s.topology.dp = dp;
        s.batch.accum = accum;
        s.updates = 0;
        const Plan p = make_plan(s);
        std::multiset<int64_t> seen;
        for (const auto& w : p.windows) {
          int64_t count = 0;
          for (const auto& r : w.slots)
            for (const auto& mb : r) {
              count += static_cast<int64_t>(mb.ids.size());
              seen.insert(mb.ids.begin(), mb.ids.end());
            }
          EXPECT_EQ(count, static_cast<int64_t>(w.ids.size()));
          if (!w.partial) EXPECT_EQ(count, int64_t{2} * accum * dp);
        }
        EXPECT_EQ(seen.size(), static_cast<size_t>(size));
        for (int64_t id = 0; id < size; ++id) EXPECT_EQ(seen.count(id), 1u) << "id " << id;
      }
}

TEST(Plan, WindowCountIsARecountOfLabels) {
  Spec s;
  s.topology.dp = 3;
  const Plan p = make_plan(s);
  for (const auto& w : p.windows) {
    int64_t N = 0;
    for (auto id : w.ids) {
      const Sample x = make_sample(s, id);
      for (auto l : x.labels) N += l != kIgnoreIndex;
    }
    EXPECT_EQ(w.valid_targets, N) << "update " << w.update;
  }
  EXPECT_TRUE(p.windows.back().partial);
  EXPECT_NE(p.windows.back().valid_targets, p.windows.front().valid_targets);
}

TEST(Plan, TensorParallelPeersShareADataParallelRank) {
  Spec s;
  s.topology = {2, 2, 1};
  const Plan p = make_plan(s);
  EXPECT_EQ(p.world(), 4);
  EXPECT_EQ(p.update_batch, 12) << "TP does not multiply B_update";
  EXPECT_EQ(p.dp_rank_of(0), 0);
  EXPECT_EQ(p.dp_rank_of(1), 0);
  EXPECT_EQ(p.dp_rank_of(2), 1);
}

TEST(Plan, UpdatesSpanEpochsWithFreshOrder) {
  Spec s;
  s.updates = 6;
  const Plan p = make_plan(s);
  ASSERT_EQ(p.windows.size(), 6u);
  EXPECT_EQ(p.windows[3].epoch, 1);
  EXPECT_NE(p.windows[3].ids, p.windows[0].ids) << "each epoch has its own permutation";
}

// The artifacts' digests (NOTE [artifact digests]) are SHA-256: FIPS 180-4's test vectors, and a
// message fed in pieces across the 64-byte blocks.
TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 pieces;
  const std::string a(1000, 'a');
  for (int i = 0; i < 1000; ++i) pieces.update(a.data(), a.size());
  EXPECT_EQ(pieces.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
