// zero1: ZeRO stage 1: optimizer state (and master weights) sharded over the D ranks: gradients are
// all-reduced in full, each rank steps only its shard, and the updated shards are all-gathered.
#include "backends/catalog.hpp"
#include "backends/zero.hpp"

namespace gradcert {

namespace {

// The descriptor's parts, each named (NOTE [strategy descriptor] in backends/catalog.hpp).
StrategyTraits zero1_traits() {
  StrategyTraits t;
  t.final_allreduce = true;
  t.sharded_state = true;
  return t;
}

std::unique_ptr<Backend> make_zero1() { return std::make_unique<ZeroBackend>(1); }

}  // namespace

const StrategyInfo& zero1_strategy() {
  static const StrategyInfo info = [] {
    StrategyInfo s;
    s.name = "zero1";
    s.sharding = Sharding::ZeRO1;
    s.traits = zero1_traits();
    s.reduction = "ZeRO-1: all-reduce, optimizer state sharded (flat shards), parameters all-gathered";
    s.sync = "accumulates locally, one reduction after microstep A-1";
    s.primary = {2, 1, 1};
    s.make = make_zero1;
    return s;
  }();
  return info;
}

}  // namespace gradcert
