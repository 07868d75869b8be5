// Property 6: shard placements. Any placement that tiles a tensor (row-major ranges or boxes
// along one dimension, spread over ranks' files in any order) reads back as the tensor, bit for
// bit; a placement that leaves an element out, or holds one twice, is refused naming the
// tensor and the elements (NOTE [shard artifacts]).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include <unistd.h>

#include "conformance/protocol/artifacts.hpp"
#include "properties/generators.hpp"

using namespace gradcert;
using namespace gradcert::props;

namespace {

/// A tensor and a placement of it: pieces (flat ranges, or boxes cut along `dim`) on ranks.
struct Placement {
  std::vector<int64_t> shape;
  std::vector<double> values;
  bool boxes = false;
  std::vector<ShardPiece> pieces;
  std::vector<int> rank_of;  ///< the rank (file) holding each piece
  int ranks = 1;
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

/// Sorted distinct cut points in (0, n) from `cuts`, giving the pieces [0, c1), [c1, c2), ...
std::vector<int64_t> bounds(int64_t n, std::vector<int64_t> cuts) {
  for (auto& c : cuts) c = 1 + c % std::max<int64_t>(n - 1, 1);
  cuts.push_back(0);
  cuts.push_back(n);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

ShardPiece piece_of(const Placement& p, const std::vector<int64_t>& piece_shape, std::vector<double> v) {
  ShardPiece s;
  s.tensor = "w";
  s.shape = p.shape;
  s.data.name = "w";
  s.data.shape = piece_shape;
  s.data.held = std::move(v);
  return s;
}

rc::Gen<Placement> placements() {
  return rc::gen::exec([] {
    Placement p;
    const int dims = *rc::gen::inRange(1, 4).as("dims");
    for (int d = 0; d < dims; ++d) p.shape.push_back(*rc::gen::inRange<int64_t>(1, 6).as("extent"));
    const int64_t n = numel_of(p.shape);
    for (int64_t i = 0; i < n; ++i) p.values.push_back(static_cast<double>(i) * 0.5 - 3.0);
    p.ranks = *rc::gen::inRange(1, 5).as("ranks");
    p.boxes = *rc::gen::arbitrary<bool>().as("boxes (else flat ranges)");
    const auto cuts = *rc::gen::container<std::vector<int64_t>>(rc::gen::inRange<int64_t>(0, 64)).as("cuts");
    if (!p.boxes) {
      const auto b = bounds(n, cuts);
      for (size_t i = 0; i + 1 < b.size(); ++i) {
        ShardPiece s = piece_of(p, {b[i + 1] - b[i]}, {p.values.begin() + b[i], p.values.begin() + b[i + 1]});
        s.flat_begin = b[i];
        p.pieces.push_back(std::move(s));
      }
    } else {  // boxes: slabs of dimension `dim`
      const int dim = *rc::gen::inRange(0, dims).as("box dim");
      const auto b = bounds(p.shape[dim], cuts);
      int64_t inner = 1;
      for (int d = dim + 1; d < dims; ++d) inner *= p.shape[d];
      const int64_t outer = n / (p.shape[dim] * inner);
      for (size_t i = 0; i + 1 < b.size(); ++i) {
        std::vector<int64_t> shape = p.shape, offset(dims, 0);
        shape[dim] = b[i + 1] - b[i];
        offset[dim] = b[i];
        std::vector<double> v;
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t k = b[i]; k < b[i + 1]; ++k)
            for (int64_t j = 0; j < inner; ++j) v.push_back(p.values[(o * p.shape[dim] + k) * inner + j]);
        ShardPiece s = piece_of(p, shape, std::move(v));
        s.offset = offset;
        p.pieces.push_back(std::move(s));
      }
    }
    for (size_t i = 0; i < p.pieces.size(); ++i) p.rank_of.push_back(*rc::gen::inRange(0, p.ranks).as("rank of piece"));
    return p;
  });
}

/// Writes each rank's pieces to its file and reads the placement back as the checks do.
TensorMap write_and_read(const Placement& p, const std::string& dir) {
  std::vector<std::string> files;
  for (int r = 0; r < p.ranks; ++r) {
    std::vector<ShardPiece> mine;
    for (size_t i = 0; i < p.pieces.size(); ++i)
      if (p.rank_of[i] == r) mine.push_back(p.pieces[i]);
    files.push_back("rank" + std::to_string(r) + ".safetensors");
    write_placed_file(dir + "/" + files.back(), mine, {});
  }
  const auto groups = read_placed(dir, files, {{"w", TensorExpectation{p.shape, DType::Float64}}}, "u0 grads");
  return groups.at(0);
}

/// One folder per process for the cases' files (emptied per case, removed at exit).
std::string scratch() {
  namespace fs = std::filesystem;
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / ("gradcert_prop_shards_" + std::to_string(::getpid()));
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / ("gradcert_prop_shards_" + std::to_string(::getpid())), ec);
    });
    return d;
  }();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace

RC_GTEST_PROP(ShardPlacement, anyTilingReadsBackAsTheTensorBitForBit, ()) {
  const Placement p = *placements();
  const TensorMap got = write_and_read(p, scratch());
  const auto values = got.at("w").read();
  RC_ASSERT(std::vector<double>(values.data(), values.data() + values.size()) == p.values);
}

RC_GTEST_PROP(ShardPlacement, aPlacementMissingAPieceIsRefusedNamingTheElements, ()) {
  Placement p = *placements();
  RC_PRE(p.pieces.size() > 1u);
  const size_t drop = *rc::gen::inRange<size_t>(0, p.pieces.size()).as("dropped piece");
  p.pieces.erase(p.pieces.begin() + static_cast<long>(drop));
  p.rank_of.erase(p.rank_of.begin() + static_cast<long>(drop));
  try {
    write_and_read(p, scratch());
    RC_FAIL("a placement without piece " + std::to_string(drop) + " was accepted");
  } catch (const ArtifactError& e) {
    const std::string m = e.what();
    RC_ASSERT(m.find("'w'") != std::string::npos || m.find(" w") != std::string::npos);
    RC_ASSERT(m.find("in no shard") != std::string::npos);
  }
}

RC_GTEST_PROP(ShardPlacement, aPlacementHoldingAnElementTwiceIsRefused, ()) {
  Placement p = *placements();
  const size_t twice = *rc::gen::inRange<size_t>(0, p.pieces.size()).as("piece held twice");
  p.pieces.push_back(p.pieces[twice]);
  p.rank_of.push_back(*rc::gen::inRange(0, p.ranks).as("its second rank"));
  try {
    write_and_read(p, scratch());
    RC_FAIL("a placement holding piece " + std::to_string(twice) + " twice was accepted");
  } catch (const ArtifactError& e) {
    const std::string m = e.what();
    RC_ASSERT(m.find("twice") != std::string::npos || m.find("more than once") != std::string::npos ||
              m.find("duplicate") != std::string::npos);
  }
}
