// Building blocks of sharded and model-parallel strategies: the canonical flat layout,
// shards of it, and their pieces for the shard artifacts.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "backends/runtime/strategy.hpp"

namespace gradcert {

/// The model's parameters in canonical order, flattened back to back.
struct FlatLayout {
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0, numel = 0;
  };
  std::vector<Entry> entries;
  int64_t total = 0;

  static FlatLayout of(const TensorMap& params);
  const Entry& at(const std::string& name) const;
};

/// Puts a flat-layout range: `values` (1-D) at layout offset `begin`.
using FlatPut = std::function<void(int64_t begin, const torch::Tensor& values)>;
/// This rank's pieces for the shard artifacts (NOTE [shard artifacts]): `fill` puts every range
/// of the flat layout the rank is the one owner of; each becomes one piece per tensor it spans
/// (a row-major range of that tensor, in `dtype`), in replica group 0. No collective.
std::vector<ShardPiece> flat_pieces(const FlatLayout& layout, DType dtype,
                                    const std::function<void(const FlatPut&)>& fill);
/// Whole tensors as pieces of replica group `replica` (a replica's or a pipeline stage's).
std::vector<ShardPiece> whole_pieces(const TensorMap& tensors, int replica);

/// A contiguous range [begin, begin + numel) of the flat layout split into D equal shards
/// (the last padded), as ZeRO and FSDP split a flat parameter.
struct FlatShard {
  int64_t begin = 0, numel = 0;  ///< the range in the flat layout
  int64_t shard = 0;             ///< ceil(numel / D)
  int dp = 1, dp_rank = 0;

  FlatShard(int64_t begin, int64_t numel, int dp, int dp_rank);
  /// This rank's elements: [lo, hi) relative to `begin` (may be empty at the tail).
  int64_t lo() const;
  int64_t hi() const;
  /// All-gathers every rank's shard (each `shard` long, padded) into the full range.
  torch::Tensor all_gather(RankContext& ctx, const torch::Tensor& my_shard) const;
  /// Reduce-scatters a full-range tensor with SUM after dividing by `divisor`; returns
  /// this rank's shard (`shard` long, padded).
  torch::Tensor reduce_scatter(RankContext& ctx, const torch::Tensor& full, double divisor) const;
};

/// Copies a flat range of values into the named parameters (or their gradients) it covers.
void scatter_into_params(const FlatLayout& layout, int64_t begin, const torch::Tensor& flat,
                         std::vector<std::pair<std::string, torch::Tensor>> params);

}  // namespace gradcert
