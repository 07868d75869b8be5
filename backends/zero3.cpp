// zero3: ZeRO stage 3: + parameters sharded: gathered for compute at the start of each update, freed
// after the step; only the shard persists.
#include "backends/catalog.hpp"
#include "backends/zero.hpp"

namespace gradcert {

const StrategyInfo& zero3_strategy() {
  static const StrategyInfo info{"zero3", Sharding::ZeRO3,
                                 /*traits: data_parallel, final_allreduce, reduce_scatter, gathers_params, tp, replica digests, sharded state*/ {true, false, true, true, false, false, true},
                                 "ZeRO-3: reduce-scatter; parameters sharded and all-gathered per use",
                                 "accumulates locally, one reduction after microstep A-1",
                                 {2, 1, 1}, std::vector<CertifyTopology>{{3, 1, 1}}, 0, [] { std::unique_ptr<Backend> b = std::make_unique<ZeroBackend>(3); return b; }};
  return info;
}

}  // namespace gradcert
