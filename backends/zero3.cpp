// zero3: ZeRO stage 3: + parameters sharded: gathered for compute at the start of each update, freed
// after the step; only the shard persists.
#include "backends/catalog.hpp"
#include "backends/zero.hpp"

namespace gradcert {

namespace {

// The descriptor's parts, each named (NOTE [strategy descriptor] in backends/catalog.hpp).
StrategyTraits zero3_traits() {
  StrategyTraits t;
  t.reduce_scatter = true;
  t.gathers_params = true;
  t.sharded_state = true;
  return t;
}

std::unique_ptr<Backend> make_zero3() { return std::make_unique<ZeroBackend>(3); }

}  // namespace

const StrategyInfo& zero3_strategy() {
  static const StrategyInfo info = [] {
    StrategyInfo s;
    s.name = "zero3";
    s.sharding = Sharding::ZeRO3;
    s.traits = zero3_traits();
    s.reduction = "ZeRO-3: reduce-scatter; parameters sharded and all-gathered per use";
    s.sync = "accumulates locally, one reduction after microstep A-1";
    s.primary = {2, 1, 1};
    s.wider = {{3, 1, 1}};
    s.make = make_zero3;
    return s;
  }();
  return info;
}

}  // namespace gradcert
