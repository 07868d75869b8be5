// single: one process applies the D*S/N rule per microstep with D = 1.
#include "backends/catalog.hpp"
#include "backends/runtime/replica.hpp"

namespace gradcert {

class SingleBackend : public Backend {
 public:
  std::string name() const override { return "single"; }
  void validate(const Plan& plan, int world, Mutant mutant) const override {
    if (world != 1 || plan.dp != 1) throw std::invalid_argument("backend single runs at world 1 only");
    Backend::validate(plan, world, mutant);
  }
  void setup(RankContext& ctx) override { state_.setup(ctx); }
  NamedTensors state_tensors() override { return state_.state_tensors(); }
  std::vector<StatePiece> checkpoint_state(RankContext& ctx, bool allocate) override {
    return state_.checkpoint_state(ctx, allocate);
  }
  void after_load(RankContext& ctx) override { state_.after_load(ctx); }
  RankUpdate run_update(RankContext& ctx, int update) override {
    RankUpdate out = state_.accumulate(ctx, update);
    state_.step(ctx, update);
    state_.collect(ctx, out);
    return out;
  }

 private:
  ReplicaState state_;
};

namespace {

// The descriptor's parts, each named (NOTE [strategy descriptor] in backends/catalog.hpp).
StrategyTraits single_traits() {
  StrategyTraits t;
  t.data_parallel = false;
  return t;
}

std::unique_ptr<Backend> make_single() { return std::make_unique<SingleBackend>(); }

}  // namespace

const StrategyInfo& single_strategy() {
  static const StrategyInfo info = [] {
    StrategyInfo s;
    s.name = "single";
    s.sharding = Sharding::Single;
    s.traits = single_traits();
    s.reduction = "none (one process, D = 1)";
    s.sync = "no reduction (D = 1)";
    s.primary = {1, 1, 1};
    s.no_replica_digests = "one process (D = 1): no replicas";
    s.make = make_single;
    return s;
  }();
  return info;
}

}  // namespace gradcert
