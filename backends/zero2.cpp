// zero2: ZeRO stage 2: + gradients reduce-scattered: each rank receives (and keeps) only its shard of
// the averaged gradient; the full local gradients are freed after the reduce-scatter.
#include "backends/catalog.hpp"
#include "backends/zero.hpp"

namespace gradcert {

const StrategyInfo& zero2_strategy() {
  static const StrategyInfo info{"zero2", Sharding::ZeRO2,
                                 /*traits: data_parallel, final_allreduce, reduce_scatter, gathers_params, tp, replica digests, sharded state*/ {true, false, true, false, false, false, true},
                                 "ZeRO-2: reduce-scatter of the flat gradient into shards, divide by D",
                                 "accumulates locally, one reduction after microstep A-1",
                                 {2, 1, 1}, {}, 0, [] { std::unique_ptr<Backend> b = std::make_unique<ZeroBackend>(2); return b; }};
  return info;
}

}  // namespace gradcert
