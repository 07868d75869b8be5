// zero2: ZeRO stage 2 — + gradients reduce-scattered: each rank receives only its shard of the averaged gradient.
#include "backends/zero.hpp"

namespace gradcert {

class Zero2Backend : public Backend {
 public:
  std::string name() const override { return "zero2"; }
  void validate(const Plan& plan, int world, const std::string& inject) const override {
    if (plan.tp != 1 || plan.pp != 1) throw std::invalid_argument("backend zero2 needs TP = PP = 1");
    Backend::validate(plan, world, inject);
  }
  void setup(RankContext& ctx) override { state_.setup(ctx); }
  RankUpdate run_update(RankContext& ctx, int update) override { return state_.run_update(ctx, update); }
  NamedTensors state_tensors() override { return state_.state_tensors(); }

 private:
  ZeroState state_{2};
};

std::unique_ptr<Backend> make_zero2_backend() { return std::make_unique<Zero2Backend>(); }

}  // namespace gradcert
