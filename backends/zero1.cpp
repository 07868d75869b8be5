// zero1: ZeRO stage 1: optimizer state (and master weights) sharded over the D ranks: gradients are
// all-reduced in full, each rank steps only its shard, and the updated shards are all-gathered.
#include "backends/catalog.hpp"
#include "backends/zero.hpp"

namespace gradcert {

const StrategyInfo& zero1_strategy() {
  static const StrategyInfo info{"zero1", Sharding::ZeRO1,
                                 /*traits: data_parallel, final_allreduce, reduce_scatter, gathers_params, tp, replica digests, sharded state*/ {true, true, false, false, false, false, true},
                                 "ZeRO-1: all-reduce, optimizer state sharded (flat shards), parameters all-gathered",
                                 "accumulates locally, one reduction after microstep A-1",
                                 {2, 1, 1}, {}, 0, [] { std::unique_ptr<Backend> b = std::make_unique<ZeroBackend>(1); return b; }};
  return info;
}

}  // namespace gradcert
