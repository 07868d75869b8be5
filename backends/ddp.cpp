// ddp: a full replica per rank; each backpropagates D*S_{r,a}/N per microstep, and the
// summed gradients are averaged over ranks once per window (no sync on earlier microsteps).
#include "backends/runtime/replica.hpp"

namespace gradcert {

class DdpBackend : public Backend {
 public:
  std::string name() const override { return "ddp"; }
  void validate(const Plan& plan, int world, const std::string& inject) const override {
    if (plan.tp != 1 || plan.pp != 1) throw std::invalid_argument("backend ddp needs TP = PP = 1");
    Backend::validate(plan, world, inject);
  }
  void setup(RankContext& ctx) override { state_.setup(ctx); }
  NamedTensors state_tensors() override { return state_.state_tensors(); }
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

std::unique_ptr<Backend> make_ddp_backend() { return std::make_unique<DdpBackend>(); }

}  // namespace gradcert
