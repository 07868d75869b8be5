// zero3: ZeRO stage 3 — + parameters sharded: gathered for compute at each update, freed after the step.
#include "backends/zero.hpp"

namespace gradcert {

class Zero3Backend : public Backend {
 public:
  std::string name() const override { return "zero3"; }
  void validate(const Plan& plan, int world, const std::string& inject) const override {
    if (plan.tp != 1 || plan.pp != 1) throw std::invalid_argument("backend zero3 needs TP = PP = 1");
    Backend::validate(plan, world, inject);
  }
  void setup(RankContext& ctx) override { state_.setup(ctx); }
  RankUpdate run_update(RankContext& ctx, int update) override { return state_.run_update(ctx, update); }
  NamedTensors state_tensors() override { return state_.state_tensors(); }

 private:
  ZeroState state_{3};
};

std::unique_ptr<Backend> make_zero3_backend() { return std::make_unique<Zero3Backend>(); }

}  // namespace gradcert
