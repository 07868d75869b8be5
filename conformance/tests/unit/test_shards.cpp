// Shard artifacts (NOTE [shard artifacts]), torch-free: every rank's pieces of a tensor, as row-major
// ranges or boxes, are read back as the whole tensor; a gap, an overlap or a piece outside its
// tensor is an error naming the tensor, the elements and the files; another replica group that
// holds other values fails replicas.agree, naming the group and its file.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "conformance/checks/checks.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/core/spec.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/tests/temp_dirs.hpp"

using namespace gradcert;

namespace {

const std::string kNonce = "0123456789abcdef0123456789abcdef";

// The model of these tests: w [3, 4] and b [5], float64; update u's values are w = u + (0..11),
// b = 100 * u + (0..4) (gradients) and their negatives (parameters).
double value(const std::string& t, int u, int64_t i, bool params) {
  const double v = t == "w" ? u + i : 100.0 * u + i;
  return params ? -v : v;
}

ShardPiece flat(const std::string& t, std::vector<int64_t> shape, int64_t begin, int64_t end, int u, bool params,
                int replica = 0) {
  ShardPiece p;
  p.tensor = t;
  p.shape = shape;
  p.replica = replica;
  p.flat_begin = begin;
  p.data.shape = {end - begin};
  for (int64_t i = begin; i < end; ++i) p.data.held.push_back(value(t, u, i, params));
  return p;
}

// The box of w at `at` with extent `box` (w is [3, 4]).
ShardPiece w_box(std::vector<int64_t> at, std::vector<int64_t> box, int u, bool params) {
  ShardPiece p;
  p.tensor = "w";
  p.shape = {3, 4};
  p.offset = at;
  p.data.shape = box;
  for (int64_t r = 0; r < box[0]; ++r)
    for (int64_t c = 0; c < box[1]; ++c) p.data.held.push_back(value("w", u, (at[0] + r) * 4 + at[1] + c, params));
  return p;
}

using Pieces = std::function<std::vector<ShardPiece>(int rank, int update, bool params)>;

struct ShardRun {
  Plan plan;
  std::string dir;
  TensorMap expected;

  explicit ShardRun(const std::string& name)
      : plan(make_plan(Spec{})), dir(test::scratch_dir("gradcert_shards") + "/" + name) {
    std::filesystem::create_directories(dir);
    for (auto [n, shape] : {std::pair<std::string, std::vector<int64_t>>{"w", {3, 4}}, {"b", {5}}}) {
      HostTensor t;
      t.name = n;
      t.shape = shape;
      expected[n] = t;
    }
  }
  std::vector<BackendUpdate> write_and_read(const Pieces& pieces) {
    std::vector<ManifestUpdate> manifest;
    for (int r = 0; r < plan.world(); ++r) {
      std::vector<RankUpdateRecord> records;
      for (const auto& w : plan.windows) {
        write_rank_shards(dir, w.update, r, pieces(r, w.update, false), pieces(r, w.update, true));
        RankUpdateRecord rec;
        rec.update = w.update;
        rec.consumed = std::vector<std::vector<int64_t>>(plan.accum);
        records.push_back(rec);
        if (r == 0) manifest.push_back({w.update, 1.0, w.valid_targets, 0.1});
      }
      write_rank_record(dir, r, plan.dp_rank_of(r), records, kNonce);
    }
    write_manifest(dir, "test", plan.world(), manifest, kNonce, /*shards=*/true);
    return read_run(dir, plan, plan.world(), expected, DType::Float64, kNonce);
  }
  std::string error_of(const Pieces& pieces) {
    try {
      write_and_read(pieces);
    } catch (const ArtifactError& e) {
      return e.what();
    }
    return "(no error)";
  }
};

std::vector<double> values_of(const HostTensor& t) {
  const TensorValues v = t.read();
  return {v.begin(), v.end()};
}

std::vector<double> want(const std::string& t, int64_t n, int u, bool params) {
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(value(t, u, i, params));
  return out;
}

}  // namespace

// ZeRO / FSDP style (row-major ranges, split inside a tensor) and TP style (boxes: w split by columns).
TEST(ShardArtifacts, RangesAndBoxesFromEveryRankReadAsTheWholeTensor) {
  ShardRun run("tile");
  const auto updates = run.write_and_read([](int r, int u, bool params) {
    std::vector<ShardPiece> out;
    out.push_back(w_box({0, 2 * r}, {3, 2}, u, params));                                        // columns [2r, 2r + 2)
    out.push_back(r == 0 ? flat("b", {5}, 0, 3, u, params) : flat("b", {5}, 3, 5, u, params));  // b split 3 | 2
    return out;
  });
  ASSERT_EQ(updates.size(), run.plan.windows.size());
  for (size_t u = 0; u < updates.size(); ++u) {
    EXPECT_TRUE(updates[u].grads.at("w").streamed());
    EXPECT_EQ(values_of(updates[u].grads.at("w")), want("w", 12, static_cast<int>(u), false)) << u;
    EXPECT_EQ(values_of(updates[u].params_after.at("w")), want("w", 12, static_cast<int>(u), true)) << u;
    EXPECT_EQ(values_of(updates[u].grads.at("b")), want("b", 5, static_cast<int>(u), false)) << u;
    EXPECT_TRUE(updates[u].other_replicas.empty());
  }
}

TEST(ShardArtifacts, AGapNamesTheTensorTheElementsAndTheFiles) {
  ShardRun run("gap");
  const std::string e = run.error_of([](int r, int u, bool params) {
    std::vector<ShardPiece> out{flat("w", {3, 4}, r == 0 ? 0 : 6, r == 0 ? 6 : 12, u, params)};
    if (r == 0) out.push_back(flat("b", {5}, 0, 3, u, params));  // rank 1's part of b never written
    return out;
  });
  EXPECT_NE(e.find("update 0 gradients: replica 0: tensor 'b': elements [3, 5) of 5 are in no shard (files of the "
                   "group: u0.rank0.grads.safetensors, u0.rank1.grads.safetensors)"),
            std::string::npos)
      << e;
}

TEST(ShardArtifacts, AnOverlapNamesBothFiles) {
  ShardRun run("overlap");
  const std::string e = run.error_of([](int r, int u, bool params) {
    return std::vector<ShardPiece>{flat("w", {3, 4}, r == 0 ? 0 : 5, r == 0 ? 6 : 12, u, params),
                                   flat("b", {5}, r == 0 ? 0 : 3, r == 0 ? 3 : 5, u, params)};
  });
  EXPECT_NE(e.find("tensor 'w': elements [5, 6) are held twice (u0.rank0.grads.safetensors and "
                   "u0.rank1.grads.safetensors)"),
            std::string::npos)
      << e;
}

TEST(ShardArtifacts, APieceOutsideItsTensorNamesTheFieldAndFile) {
  ShardRun run("outside");
  const std::string e = run.error_of([](int r, int u, bool params) {
    return std::vector<ShardPiece>{w_box({0, 3 * r}, {3, 2}, u, params), flat("b", {5}, 0, 5, u, params, r)};
  });
  EXPECT_NE(e.find("u0.rank1.grads.safetensors placement of 'w': the box of extent 2 at offset 3 leaves "
                   "dimension 1 (4)"),
            std::string::npos)
      << e;
}

// DDP style: every rank a whole replica (group = its rank). A replica whose parameters drift at
// the last update only is caught by replicas.agree, which names its group and file.
TEST(ShardArtifacts, ReplicaGroupsMustAgreeExactly) {
  const int last = static_cast<int>(ShardRun("x").plan.windows.size()) - 1;
  for (bool drift : {false, true}) {
    ShardRun run(drift ? "drift" : "agree");
    const auto updates = run.write_and_read([&](int r, int u, bool params) {
      std::vector<ShardPiece> out{flat("w", {3, 4}, 0, 12, u, params, r), flat("b", {5}, 0, 5, u, params, r)};
      if (drift && r == 1 && u == last && params) out[1].data.held[4] *= 1.01;
      return out;
    });
    ASSERT_EQ(updates.back().other_replicas.size(), 1u);
    const CheckResult c = check_replicas_agree(updates, run.plan.windows.size());
    if (!drift) {
      EXPECT_EQ(c.verdict, Verdict::Pass) << c.detail;
      continue;
    }
    EXPECT_EQ(c.verdict, Verdict::Fail);
    EXPECT_NE(c.detail.find("update " + std::to_string(last) + " b (parameters): replica group 1 (u" +
                            std::to_string(last) + ".rank1.grads.safetensors; u" + std::to_string(last) +
                            ".rank1.params.safetensors) holds other values than the lowest group, first at element 4"),
              std::string::npos)
        << c.detail;
  }
}
