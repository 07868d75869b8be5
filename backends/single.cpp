// single: one process applies the D*S/N rule per microstep with D = 1.
#include "backends/runtime/replica.hpp"

namespace gradcert {

class SingleBackend : public Backend {
 public:
  std::string name() const override { return "single"; }
  void validate(const Plan& plan, int world, const std::string& inject) const override {
    if (world != 1 || plan.dp != 1) throw std::invalid_argument("backend single runs at world 1 only");
    Backend::validate(plan, world, inject);
  }
  void setup(RankContext& ctx) override { state_.setup(ctx); }
  NamedTensors state_tensors() override { return state_.state_tensors(); }
  RankUpdate run_update(RankContext& ctx, int update) override {
    RankUpdate out = state_.accumulate(ctx, update);
    state_.step(ctx, update);
    state_.collect(ctx, out);
    return out;
  }

 private:
  ReplicaState state_;
};

std::unique_ptr<Backend> make_single_backend() { return std::make_unique<SingleBackend>(); }

}  // namespace gradcert
