// zero1: ZeRO stage 1 — optimizer state sharded: gradients all-reduced in full, each rank steps its shard, updated shards all-gathered.
#include "backends/zero.hpp"

namespace gradcert {

class Zero1Backend : public Backend {
 public:
  std::string name() const override { return "zero1"; }
  void validate(const Plan& plan, int world, const std::string& inject) const override {
    if (plan.tp != 1 || plan.pp != 1) throw std::invalid_argument("backend zero1 needs TP = PP = 1");
    Backend::validate(plan, world, inject);
  }
  void setup(RankContext& ctx) override { state_.setup(ctx); }
  RankUpdate run_update(RankContext& ctx, int update) override { return state_.run_update(ctx, update); }
  NamedTensors state_tensors() override { return state_.state_tensors(); }

 private:
  ZeroState state_{1};
};

std::unique_ptr<Backend> make_zero1_backend() { return std::make_unique<Zero1Backend>(); }

}  // namespace gradcert
