// zero2: ZeRO stage 2: + gradients reduce-scattered: each rank receives (and keeps) only its shard of
// the averaged gradient; the full local gradients are freed after the reduce-scatter.
#include "backends/catalog.hpp"
#include "backends/zero.hpp"

namespace gradcert {

namespace {

// The descriptor's parts, each named (NOTE [strategy descriptor] in backends/catalog.hpp).
StrategyTraits zero2_traits() {
  StrategyTraits t;
  t.reduce_scatter = true;
  t.sharded_state = true;
  return t;
}

std::unique_ptr<Backend> make_zero2() { return std::make_unique<ZeroBackend>(2); }

}  // namespace

const StrategyInfo& zero2_strategy() {
  static const StrategyInfo info = [] {
    StrategyInfo s;
    s.name = "zero2";
    s.sharding = Sharding::ZeRO2;
    s.traits = zero2_traits();
    s.reduction = "ZeRO-2: reduce-scatter of the flat gradient into shards, divide by D";
    s.sync = "accumulates locally, one reduction after microstep A-1";
    s.primary = {2, 1, 1};
    s.make = make_zero2;
    return s;
  }();
  return info;
}

}  // namespace gradcert
