// The checkpoint format (NOTE [checkpoint format]), torch-free: checkpoint.json is read strictly,
// a checkpoint's tensors are assembled from any rank's pieces, and a missing rank file or piece
// is an error naming the rank, the tensor and the elements.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "conformance/core/files.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/protocol/checkpoint.hpp"
#include "conformance/tests/temp_dirs.hpp"

using namespace gradcert;

namespace {

const std::string kNonce = "0123456789abcdef0123456789abcdef";

CheckpointRecord record() {
  CheckpointRecord r;
  r.backend = "fsdp";
  r.world = 2;
  r.updates_done = 2;
  r.optimizer_step = 2;
  r.next_epoch = 0;
  r.next_index_in_epoch = 2;
  r.nonce = kNonce;
  return r;
}

// Rank r's half of param.w / optim.w.m ([4], float64): elements [2r, 2r + 2), value 10 x kind + index.
std::vector<ShardPiece> half(int r) {
  std::vector<ShardPiece> out;
  for (int kind = 0; kind < 2; ++kind) {
    ShardPiece p;
    p.tensor = kind == 0 ? "param.w" : "optim.w.m";
    p.shape = {4};
    p.flat_begin = 2 * r;
    p.data.shape = {2};
    p.data.dtype = DType::Float64;
    for (int i = 0; i < 2; ++i) p.data.held.push_back(10.0 * kind + 2 * r + i);
    out.push_back(p);
  }
  return out;
}

std::map<std::string, TensorExpectation> expect() {
  OptimizerSpec sgd;
  sgd.momentum = 0.9;
  TensorMap shapes;
  HostTensor w;
  w.name = "w";
  w.shape = {4};
  shapes.emplace("w", w);
  return checkpoint_expectation(shapes, sgd, DType::Float64);
}

}  // namespace

TEST(Checkpoint, TheExpectationFollowsTheOptimizerAndTheDtypeItSteps) {
  TensorMap shapes;
  HostTensor w;
  w.shape = {2, 3};
  shapes.emplace("w", w);
  OptimizerSpec adamw;
  adamw.name = "adamw";
  const auto a = checkpoint_expectation(shapes, adamw, DType::BFloat16);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a.at("optim.w.v").dtype, DType::Float32);  // bfloat16 runs step float32 masters
  EXPECT_EQ(a.at("param.w").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(checkpoint_expectation(shapes, OptimizerSpec{}, DType::Float32).size(), 1u);  // plain sgd: no slot
}

TEST(Checkpoint, TensorsAreAssembledFromEveryRanksPieces) {
  const std::string dir = test::temp_dir("gradcert_unit", "checkpoint_ok");
  for (int r = 0; r < 2; ++r) write_placed_file(dir + "/" + checkpoint_file(r), half(r), {});
  write_checkpoint_record(dir, record());
  const Checkpoint cp = read_checkpoint(dir, 2, expect(), kNonce);
  EXPECT_EQ(cp.record.optimizer_step, 2);
  EXPECT_EQ(cp.record.next_index_in_epoch, 2);
  const TensorValues m = cp.tensors.at("optim.w.m").read();
  EXPECT_EQ(std::vector<double>(m.begin(), m.end()), (std::vector<double>{10, 11, 12, 13}));
}

TEST(Checkpoint, AMissingRankFileNamesTheRankAndTheTensorItHeld) {
  const std::string dir = test::temp_dir("gradcert_unit", "checkpoint_missing");
  write_placed_file(dir + "/" + checkpoint_file(0), half(0), {});
  write_checkpoint_record(dir, record());
  try {
    (void)read_checkpoint(dir, 2, expect(), kNonce);
    FAIL() << "read";
  } catch (const ArtifactError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 wrote no rank1.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("tensor 'optim.w.m': elements [2, 4) of 4 are in no shard"), std::string::npos) << m;
  }
}

TEST(Checkpoint, TheRecordIsReadStrictly) {
  const std::string dir = test::temp_dir("gradcert_unit", "checkpoint_record");
  write_checkpoint_record(dir, record());
  const std::string good = read_text_file(dir + "/checkpoint.json");
  EXPECT_EQ(parse_checkpoint_record(good, "c.json", kNonce).updates_done, 2);
  auto message = [&](const std::string& text, const std::string& nonce = kNonce) -> std::string {
    try {
      (void)parse_checkpoint_record(text, "c.json", nonce);
    } catch (const ArtifactError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(good, "ffffffffffffffffffffffffffffffff").find("a checkpoint of another run"), std::string::npos);
  std::string fractional = good;
  fractional.replace(fractional.find("\"updates_done\": 2"), 17, "\"updates_done\": 2.0");
  EXPECT_NE(message(fractional).find("field 'updates_done' must be an integer"), std::string::npos)
      << message(fractional);
  std::string no_sampler = good;
  no_sampler.replace(no_sampler.find("\"sampler\""), 9, "\"sampled\"");
  EXPECT_NE(message(no_sampler).find("field 'sampler' is missing"), std::string::npos) << message(no_sampler);
}
