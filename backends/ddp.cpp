// ddp: a full replica per rank; each backpropagates D*S_{r,a}/N per microstep, and the
// summed gradients are averaged over ranks once per window (no sync on earlier microsteps).
#include "backends/catalog.hpp"
#include "backends/runtime/replica.hpp"

namespace gradcert {

class DdpBackend : public Backend {
 public:
  std::string name() const override { return "ddp"; }
  void validate(const Plan& plan, int world, Mutant mutant) const override {
    if (plan.tp != 1 || plan.pp != 1) throw std::invalid_argument("backend ddp needs TP = PP = 1");
    Backend::validate(plan, world, mutant);
  }
  void setup(RankContext& ctx) override { state_.setup(ctx); }
  NamedTensors state_tensors() override { return state_.state_tensors(); }
  std::vector<StatePiece> checkpoint_state(RankContext& ctx, bool allocate) override {
    return state_.checkpoint_state(ctx, allocate);
  }
  void after_load(RankContext& ctx) override { state_.after_load(ctx); }
  NamedTensors replica_params() override { return state_.replica_params(); }
  RankUpdate run_update(RankContext& ctx, int update) override {
    RankUpdate out = state_.accumulate(ctx, update);
    state_.sync(ctx, out);
    state_.step(ctx, update);
    state_.collect(ctx, out);
    return out;
  }

 private:
  ReplicaState state_;
};

namespace {

// The descriptor's parts, each named (NOTE [strategy descriptor] in backends/catalog.hpp).
StrategyTraits ddp_traits() {
  StrategyTraits t;
  t.final_allreduce = true;
  t.replica_digests = true;
  return t;
}

std::unique_ptr<Backend> make_ddp() { return std::make_unique<DdpBackend>(); }

}  // namespace

const StrategyInfo& ddp_strategy() {
  static const StrategyInfo info = [] {
    StrategyInfo s;
    s.name = "ddp";
    s.sharding = Sharding::DDP;
    s.traits = ddp_traits();
    s.reduction = "one flat all-reduce per window (divide by D, then SUM)";
    s.sync = "accumulates locally, one reduction after microstep A-1";
    s.primary = {2, 1, 1};
    s.wider = {{3, 1, 1}};
    s.make = make_ddp;
    return s;
  }();
  return info;
}

}  // namespace gradcert
