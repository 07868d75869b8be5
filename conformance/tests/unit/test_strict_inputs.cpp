// Hardening of every input gradcert reads: strict JSON (duplicate keys, depth, excerpts),
// the spec's ranges, and the protocol's rank records and manifest (integers are integers,
// the run's nonce). Each test failed before its fix (see the issue's item in the comment).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "conformance/core/files.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/core/spec.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/protocol/inputs.hpp"
#include "conformance/tests/temp_dirs.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

std::string nested(int depth, const std::string& leaf = "1") {
  return std::string(depth, '[') + leaf + std::string(depth, ']');
}

std::string spec_error(const std::string& text) {
  try {
    parse_spec(text, "spec.json");
  } catch (const SpecError& e) {
    return e.what();
  }
  return "(no error)";
}

// A complete, valid run folder for the default spec (world 2) with one tiny tensor.
struct RunFolder {
  std::string dir;
  Plan plan = make_plan(Spec{});
  TensorMap shapes;
  std::string nonce = "0123456789abcdef0123456789abcdef";

  explicit RunFolder(const std::string& name) : dir(test::temp_dir("gradcert_unit_run", name)) {
    HostTensor t;
    t.name = "w";
    t.shape = {2};
    t.held = {0.5, -0.25};
    shapes[t.name] = t;
    std::vector<ManifestUpdate> m;
    for (const auto& w : plan.windows) {
      write_update_tensors(dir, w.update, shapes, shapes);
      m.push_back({w.update, 1.5, w.valid_targets, 0.01});
    }
    write_manifest(dir, "unit", plan.world(), m, nonce);
    for (int g = 0; g < plan.world(); ++g) {
      std::vector<RankUpdateRecord> recs;
      for (const auto& w : plan.windows) {
        RankUpdateRecord r;
        r.update = w.update;
        for (const auto& mb : w.slots[plan.dp_rank_of(g)]) r.consumed.push_back(mb.ids);
        recs.push_back(r);
      }
      write_rank_record(dir, g, plan.dp_rank_of(g), recs, nonce);
    }
  }
  std::vector<BackendUpdate> read() const { return read_run(dir, plan, plan.world(), shapes, DType::Float64, nonce); }
  // Error text of reading after replacing the first `from` in `file` by `to`.
  std::string error_after(const std::string& file, const std::string& from, const std::string& to) const {
    const std::string path = dir + "/" + file;
    std::string text = read_text_file(path);
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from << " not in " << file;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    std::ofstream(path, std::ios::trunc) << text;
    return read_error();
  }
  // Error text of reading after editing `file` as JSON.
  template <class Edit>
  std::string error_after_edit(const std::string& file, Edit edit) const {
    const std::string path = dir + "/" + file;
    nlohmann::json j = nlohmann::json::parse(read_text_file(path));
    edit(j);
    std::ofstream(path, std::ios::trunc) << j.dump(1);
    return read_error();
  }
  std::string read_error() const {
    try {
      read();
    } catch (const ArtifactError& e) {
      return e.what();
    }
    return "(no error)";
  }
};

}  // namespace

// (5) nlohmann keeps the last of two equal keys; the strict parser names the key and path.
TEST(StrictJson, RejectsDuplicateKeysNamingThePath) {
  nlohmann::json j;
  auto p = parse_json_strict(R"({"a": 1, "b": [0, {"c": 1, "c": 2}]})", j);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->kind, JsonProblem::Kind::DuplicateKey);
  EXPECT_EQ(p->path, "b[1].c");
  EXPECT_EQ(p->key, "c");
  EXPECT_FALSE(parse_json_strict(R"({"a": {"c": 1}, "b": {"c": 2}})", j)) << "same key in sibling objects";
}

// (7) A value nested 100k deep used to crash dump() and copies; now it is refused at 64.
TEST(StrictJson, BoundsDepthAndExcerptsValues) {
  nlohmann::json j;
  auto p = parse_json_strict(nested(100000), j);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->kind, JsonProblem::Kind::TooDeep);
  EXPECT_FALSE(parse_json_strict(nested(kMaxJsonDepth), j));
  EXPECT_TRUE(parse_json_strict(nested(kMaxJsonDepth + 1), j));
  const std::string big = json_excerpt(nlohmann::json(std::string(100000, 'x')));
  EXPECT_LE(big.size(), 70u);
  EXPECT_EQ(big.substr(big.size() - 3), "...");
}

// (5) Spec keys given twice: the message names the field.
TEST(StrictSpec, DuplicateKeyNamesTheField) {
  EXPECT_EQ(spec_error(R"({"batch": {"micro": 2, "micro": 4}})"),
            "spec field 'batch.micro': duplicate key 'micro' (the last would silently win)");
  EXPECT_NE(spec_error(R"({"seed": 1, "seed": 2})").find("spec field 'seed': duplicate key"), std::string::npos);
}

// (7) A deep spec value no longer crashes (it was echoed with dump()); a long one is cut.
TEST(StrictSpec, DeepOrLongValuesAreRefusedSafely) {
  const std::string deep = spec_error(R"({"batch": {"micro": )" + nested(100000) + "}}");
  EXPECT_EQ(deep.rfind("spec field 'batch.micro[0][0]", 0), 0u) << deep;
  EXPECT_NE(deep.find("...' (83 bytes): nested deeper than 64 levels"), std::string::npos) << deep;
  EXPECT_LT(deep.size(), 200u);
  const std::string longv = spec_error(R"({"batch": {"micro": ")" + std::string(1 << 20, 'x') + "\"}}");
  EXPECT_EQ(longv.rfind("spec field 'batch.micro': expected an integer, got \"xxxx", 0), 0u) << longv.substr(0, 200);
  EXPECT_LT(longv.size(), 200u);
}

// (9) Timeouts beyond the clock's range overflowed (an instant or a negative timeout), and
// 1e999 gave an un-named nlohmann error.
TEST(StrictSpec, TimeoutsAreRangeChecked) {
  EXPECT_EQ(spec_error(R"({"timeout": {"run_s": 1e10}})"),
            "spec field 'timeout.run_s': must be in [0.001, 1e6] seconds, got 1e+10");
  EXPECT_EQ(spec_error(R"({"timeout": {"collective_s": 1e300}})"),
            "spec field 'timeout.collective_s': must be in [0.001, 1e6] seconds, got 1e+300");
  EXPECT_NE(spec_error(R"({"timeout": {"run_s": 1e999}})").find("spec field 'timeout.run_s': number out of range"),
            std::string::npos);
  EXPECT_EQ(spec_error(R"({"timeout": {"run_s": 1e6, "collective_s": 0.001}})"), "(no error)");
}

// The plan reader: duplicate keys and deep nesting are named too.
TEST(StrictPlan, DuplicateKeyIsNamed) {
  Spec spec;
  std::string text = plan_to_json(make_plan(spec), spec);
  text.replace(text.find("\"update_batch\""), 0, "\"update_batch\": 1,");
  try {
    parse_plan_json(text, "plan.json");
    FAIL() << "accepted a duplicate key";
  } catch (const ArtifactError& e) {
    EXPECT_EQ(std::string(e.what()),
              "plan.json: update_batch: duplicate key 'update_batch' (the last would silently win)");
  }
}

TEST(StrictArtifacts, AValidRunFolderReads) {
  RunFolder f("valid");
  const auto run = f.read();
  ASSERT_EQ(run.size(), f.plan.windows.size());
  EXPECT_EQ(run[0].ranks.size(), 2u);
}

// (3) Integer fields given as floats or booleans were coerced (get<int>) and passed.
TEST(StrictArtifacts, FloatOrBooleanIntegersAreRefused) {
  {
    RunFolder f("float_update");
    EXPECT_EQ(f.error_after("manifest.json", "\"update\": 1,", "\"update\": 1.0,"),
              f.dir + "/manifest.json updates[1]: field 'update' must be an integer, got 1.0");
  }
  {
    RunFolder f("bool_dp_rank");
    EXPECT_EQ(f.error_after("rank1.json", "\"dp_rank\": 1", "\"dp_rank\": true"),
              f.dir + "/rank1.json: field 'dp_rank' must be an integer, got true");
  }
  {
    RunFolder f("float_rank");
    EXPECT_EQ(f.error_after("rank0.json", "\"rank\": 0", "\"rank\": 0.0"),
              f.dir + "/rank0.json: field 'rank' must be an integer, got 0.0");
  }
  {
    RunFolder f("float_id");
    const int64_t id = f.plan.windows[0].slots[0][0].ids[0];
    EXPECT_EQ(
        f.error_after_edit("rank0.json", [&](nlohmann::json& j) { j["updates"][0]["consumed"][0][0] = double(id); }),
        f.dir + "/rank0.json updates[0]: field 'consumed[0][0]' must be an integer sample id, got " +
            std::to_string(id) + ".0");
  }
  {
    RunFolder f("bool_targets");
    EXPECT_EQ(f.error_after_edit("manifest.json", [](nlohmann::json& j) { j["updates"][2]["valid_targets"] = true; }),
              f.dir + "/manifest.json updates[2]: field 'valid_targets' must be an integer, got true");
  }
  {
    RunFolder f("bool_loss");
    EXPECT_EQ(
        f.error_after_edit("manifest.json", [](nlohmann::json& j) { j["updates"][0]["loss"] = false; }),
        f.dir + "/manifest.json updates[0]: field 'loss' must be a number (or \"nan\", \"inf\", \"-inf\"), got false");
  }
}

// (5) A duplicate key in a manifest or rank record: the last used to win.
TEST(StrictArtifacts, DuplicateKeysAreRefused) {
  RunFolder f("dup_loss");
  EXPECT_EQ(f.error_after("manifest.json", "\"loss\": 1.5,", "\"loss\": 1.5, \"loss\": 0.0,"),
            f.dir + "/manifest.json: updates[0].loss: duplicate key 'loss' (the last would silently win)");
  RunFolder g("dup_consumed");
  EXPECT_NE(g.error_after("rank1.json", "\"consumed\":", "\"consumed\": [], \"consumed\":")
                .find("rank1.json: updates[0].consumed: duplicate key 'consumed'"),
            std::string::npos);
}

// (7) A deep manifest `loss` crashed the reader (dump() in the error path); now it is named.
TEST(StrictArtifacts, DeepValuesAreRefusedWithoutCrashing) {
  RunFolder f("deep_loss");
  const std::string e = f.error_after("manifest.json", "\"loss\": 1.5,", "\"loss\": " + nested(200000) + ",");
  EXPECT_EQ(e.rfind(f.dir + "/manifest.json: updates[0].loss[0][0]", 0), 0u) << e;
  EXPECT_EQ(e.substr(e.size() - 30), ": nested deeper than 64 levels") << e;
  RunFolder g("deep_rank");
  const std::string r = g.error_after("rank0.json", "\"updates\"", "\"x\": " + nested(200000) + ", \"updates\"");
  EXPECT_EQ(r.rfind(g.dir + "/rank0.json: x[0][0]", 0), 0u) << r;
}

// (1) The nonce: a file without it, or with another run's, was not produced by this run.
TEST(StrictArtifacts, NonceMustBeThisRuns) {
  {
    RunFolder f("no_nonce");
    EXPECT_EQ(f.error_after("manifest.json", "\"nonce\": \"" + f.nonce + "\",", ""),
              f.dir +
                  "/manifest.json: field 'nonce' is missing: the file was not written by this run "
                  "(GRADCERT_RUN_NONCE=" +
                  f.nonce +
                  "), or by a stack that does not echo the nonce: protocol "
                  "version 1 had none, version 2 requires it in manifest.json and every rank<g>.json "
                  "(backends/PROTOCOL.md)");
  }
  {
    RunFolder f("other_nonce");
    EXPECT_EQ(f.error_after("rank1.json", f.nonce, std::string(32, 'f')),
              f.dir + "/rank1.json: nonce \"" + std::string(32, 'f') +
                  "\" is not this run's (GRADCERT_RUN_NONCE=" + f.nonce + "): a file left from another run?");
  }
}

// The record's own `rank` and each update's `update` were never read before.
TEST(StrictArtifacts, RankAndUpdateIndicesAreChecked) {
  RunFolder f("wrong_rank");
  EXPECT_EQ(f.error_after("rank1.json", "\"rank\": 1", "\"rank\": 0"),
            f.dir + "/rank1.json: field 'rank' is 0, the file is rank 1's");
  RunFolder g("wrong_update");
  EXPECT_EQ(g.error_after("rank0.json", "\"update\": 1", "\"update\": 2"),
            g.dir + "/rank0.json updates[1]: field 'update' is 2, expected 1");
}

// Issue 36 item 2: oversized sizes are refused before anything is allocated (they ended in
// std::bad_alloc), naming the field, the value, the limit and the memory (NOTE [spec limits]).
TEST(StrictSpec, OversizedValuesNameTheFieldTheLimitAndTheMemory) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"dataset":{"size":1000000000}})", "spec field 'dataset.size': 1e9 exceeds the limit 1e6"},
      {R"({"updates":2147483647})", "spec field 'updates': 2.1475e9 exceeds the limit 1e6"},
      {R"({"batch":{"micro":2000000000}})", "spec field 'batch.micro': 2e9 exceeds the limit 1e6"},
      {R"({"batch":{"accum":2000000000}})", "spec field 'batch.accum': 2e9 exceeds the limit 1e6"},
      {R"({"topology":{"dp":2147483647}})", "spec field 'topology.dp': 2.1475e9 exceeds the limit 4.096e3"},
      {R"({"batch":{"micro":1000,"accum":1000}})", "B_update = B_micro x A x D"},
      {R"({"updates":1000000,"batch":{"accum":1000}})", "spec field 'updates'"}};
  for (const auto& [text, want] : cases) {
    const std::string e = spec_error(text);
    EXPECT_NE(e.find(want), std::string::npos) << text << "\n" << e;
  }
  EXPECT_NE(spec_error(R"({"dataset":{"size":1000000000}})").find("it would need about"), std::string::npos);
  EXPECT_EQ(spec_error(R"({"dataset":{"size":1000000}})"), "(no error)");  // the limit itself is allowed
}

// Issue 36 item 3: a long string in any spec field is quoted by a short prefix and its length
// (a 100 MB string was echoed whole), in the value and in an unknown key's name alike.
TEST(StrictSpec, LongStringsAreQuotedShort) {
  const std::string big(1 << 20, 'x');
  const std::string texts[] = {R"({"device":")" + big + R"("})", R"({"optimizer":{"name":")" + big + R"("}})",
                               R"({"pipeline":{"schedule":")" + big + R"("}})", R"({"dtype":")" + big + R"("})",
                               R"({")" + big + R"(":1})"};
  for (const auto& text : texts) {
    const std::string e = spec_error(text);
    EXPECT_NE(e, "(no error)");
    EXPECT_LT(e.size(), 300u) << e.substr(0, 300);
    EXPECT_NE(e.find("(1048576 bytes)"), std::string::npos) << e.substr(0, 300);
  }
}

// Issue 36 item 5: the optimizer ranges torch.optim enforces (NOTE [optimizer ranges]); a run with
// momentum -5 used to exit 0.
TEST(StrictSpec, OptimizerValuesOutsideTorchsRangesAreRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"optimizer":{"name":"adamw","eps":-1}})", "'optimizer.eps': must be a finite number >= 0"},
      {R"({"optimizer":{"name":"adamw","beta1":1.0}})", "'optimizer.beta1': must be in [0, 1)"},
      {R"({"optimizer":{"name":"adamw","beta2":2}})", "'optimizer.beta2': must be in [0, 1)"},
      {R"({"optimizer":{"name":"sgd","momentum":-5}})", "'optimizer.momentum': must be a finite number >= 0"},
      {R"({"optimizer":{"weight_decay":-0.1}})", "'optimizer.weight_decay': must be a finite number >= 0"},
      {R"({"optimizer":{"lr":-1}})", "'optimizer.lr': must be a finite number >= 0"}};
  for (const auto& [text, want] : cases) {
    const std::string e = spec_error(text);
    EXPECT_NE(e.find(want), std::string::npos) << text << "\n" << e;
  }
  EXPECT_EQ(spec_error(R"({"optimizer":{"name":"adamw","beta1":0,"beta2":0.999,"eps":0,"momentum":0.9}})"),
            "(no error)");
}

// Issue 36 item 7: a record of a rank the run did not start (rank2.json in a world-2 run) and a
// schema-2 update listing more shard files than ranks (5,000 extra empty files) were accepted.
TEST(StrictArtifacts, StrayRankRecordsAndExtraShardFilesAreRefused) {
  RunFolder f("stray_rank");
  ASSERT_EQ(f.read_error(), "(no error)");
  std::filesystem::copy_file(f.dir + "/rank1.json", f.dir + "/rank2.json");
  const std::string e = f.read_error();
  EXPECT_NE(e.find("rank2.json: a record of rank 2, but the run's world is 2 (ranks 0..1)"), std::string::npos) << e;

  RunFolder g("extra_shards");
  const std::string e2 = g.error_after_edit("manifest.json", [](nlohmann::json& j) {
    j["schema"] = "gradcert.artifacts/2";
    for (auto& u : j["updates"]) {
      nlohmann::json files = nlohmann::json::array();
      for (int k = 0; k < 5002; ++k)
        files.push_back("u" + std::to_string(u["update"].get<int>()) + ".extra" + std::to_string(k) + ".safetensors");
      u["grads"] = u["params"] = files;
    }
  });
  EXPECT_NE(e2.find("field 'grads' lists 5002 shard files for 2 ranks (at most one per rank): "
                    "\"u0.extra2.safetensors\" is one too many"),
            std::string::npos)
      << e2;
}

// Issue 36 item 4: a non-finite loss sum or loss is written "nan" / "inf" / "-inf" (NOTE
// [non-finite values]) and read as the value, for train.finite to judge; anything else is refused.
TEST(StrictArtifacts, NonFiniteLossesAreReadAsValues) {
  RunFolder f("nonfinite");
  std::vector<RankUpdateRecord> recs;
  for (const auto& w : f.plan.windows) {
    RankUpdateRecord r;
    r.update = w.update;
    for (const auto& mb : w.slots[f.plan.dp_rank_of(1)]) r.consumed.push_back(mb.ids);
    r.loss_sum = w.update == 1 ? std::nan("") : -HUGE_VAL;
    recs.push_back(r);
  }
  write_rank_record(f.dir, 1, f.plan.dp_rank_of(1), recs, f.nonce);
  EXPECT_NE(read_text_file(f.dir + "/rank1.json").find("\"loss_sum\": \"nan\""), std::string::npos);
  const auto run = f.read();
  EXPECT_TRUE(std::isnan(run[1].ranks[1].loss_sum));
  EXPECT_EQ(run[0].ranks[1].loss_sum, -HUGE_VAL);
  const std::string e = f.error_after("rank1.json", "\"nan\"", "\"NaN?\"");
  EXPECT_NE(e.find("field 'loss_sum' must be a number (or \"nan\", \"inf\", \"-inf\"), got \"NaN?\""),
            std::string::npos)
      << e;
}
