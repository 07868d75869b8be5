// fsdp: fully sharded data parallel with per-layer units (embeddings, each block, the head).
// Each unit's flat parameter is split in D shards. A unit is all-gathered right before
// its forward and again before its backward, freed after each use, and its gradient is
// reduce-scattered right after its backward, every microstep. Backward re-runs the unit's
// forward from its saved input (the gathered weights are not kept between passes).
#include <algorithm>

#include "backends/catalog.hpp"
#include "backends/runtime/checkpoint.hpp"
#include "backends/runtime/flat.hpp"
#include "backends/runtime/replica.hpp"
#include "conformance/layout/layout.hpp"

namespace gradcert {

namespace {

struct Unit {
  std::string name;  ///< "embed", "blocks.<i>", "head"
  std::vector<std::pair<std::string, torch::Tensor>> params;
  std::unique_ptr<FlatShard> shard;
  torch::Tensor master;      ///< this rank's shard (padded; float32 for bfloat16 runs)
  torch::Tensor weights;     ///< the shard in the run dtype that is gathered (master itself unless bfloat16)
  torch::Tensor grad_shard;  ///< accumulated over the window's microsteps
  OptimizerSlot slot;
  torch::Tensor stale;  ///< stale-gathered-params: the first gather, reused forever
};

}  // namespace

class FsdpBackend : public Backend {
 public:
  std::string name() const override { return "fsdp"; }
  void validate(const Plan& plan, int world, Mutant mutant) const override {
    if (plan.tp != 1 || plan.pp != 1) throw std::invalid_argument("backend fsdp needs TP = PP = 1");
    Backend::validate(plan, world, mutant);
  }

  void setup(RankContext& ctx) override {
    const TensorMap init = initial_params(*ctx.spec, ctx.initial_file);
    model_ = make_model(ctx.spec->model, init, scalar_type(ctx.spec->dtype));
    layout_ = FlatLayout::of(init);
    const auto master_type = ctx.spec->dtype == DType::BFloat16 ? torch::kFloat32 : scalar_type(ctx.spec->dtype);
    std::map<std::string, Unit*> by_name;
    for (auto& p : model_->named_parameters()) {
      const std::string u = fsdp_unit_of(p.key());
      if (!by_name.count(u)) {
        units_.push_back(std::make_unique<Unit>());
        units_.back()->name = u;
        by_name[u] = units_.back().get();
      }
      by_name[u]->params.emplace_back(p.key(), p.value());
    }
    for (auto& u : units_) {
      // A unit's parameters are contiguous in the flat layout (NOTE [flat layout]); keep
      // them in layout order so a concatenation of their gradients matches the shards.
      std::sort(u->params.begin(), u->params.end(),
                [&](const auto& x, const auto& y) { return layout_.at(x.first).offset < layout_.at(y.first).offset; });
      int64_t begin = layout_.total, end = 0;
      for (auto& [name, t] : u->params) {
        const auto& e = layout_.at(name);
        begin = std::min(begin, e.offset);
        end = std::max(end, e.offset + e.numel);
      }
      u->shard = std::make_unique<FlatShard>(begin, end - begin, ctx.plan->dp, ctx.plan->dp_rank_of(ctx.rank));
      auto flat = torch::zeros({end - begin}, torch::TensorOptions().dtype(master_type).device(compute_device()));
      for (auto& [name, t] : u->params) {
        const auto& e = layout_.at(name);
        flat.slice(0, e.offset - begin, e.offset - begin + e.numel).copy_(t.detach().reshape({-1}).to(master_type));
      }
      u->master = torch::zeros({u->shard->shard}, torch::TensorOptions().dtype(master_type).device(compute_device()));
      u->master.slice(0, 0, u->shard->hi() - u->shard->lo()).copy_(flat.slice(0, u->shard->lo(), u->shard->hi()));
      u->weights = u->master.to(scalar_type(ctx.spec->dtype));  // aliases master unless bfloat16
      free(*u);
    }
  }

  RankUpdate run_update(RankContext& ctx, int update) override {
    const WindowWork work = prepare_window(ctx, update, last_full_targets_);
    RankUpdate out = work.start_update(update);
    for (auto& u : units_) u->grad_shard = torch::zeros({u->shard->shard}, u->master.options());

    for (size_t a = 0; a < work.batches.size(); ++a) {
      const Batch& b = work.batches[a];
      // Forward, unit by unit, keeping only each unit's input.
      std::vector<torch::Tensor> inputs;
      torch::Tensor x;
      {
        torch::NoGradGuard ng;
        for (size_t k = 0; k + 1 < units_.size(); ++k) {
          gather(ctx, *units_[k], update);
          if (!b.empty()) {
            inputs.push_back(x);
            x = forward_unit(k, b, x);
          }
          free(*units_[k]);
        }
      }
      ctx.mark("forward");
      // Backward in reverse: re-gather, recompute the unit from its input, backprop,
      // reduce-scatter its gradient, free. Ranks with an empty microbatch join with zeros.
      torch::Tensor grad_out;
      for (size_t k = units_.size(); k-- > 0;) {
        Unit& u = *units_[k];
        gather(ctx, u, update);
        for (auto& [name, t] : u.params) t.mutable_grad() = torch::zeros_like(t);
        if (!b.empty()) {
          torch::Tensor in =
              k == 0 ? torch::Tensor() : (k + 1 == units_.size() ? x : inputs[k]).detach().requires_grad_();
          if (k + 1 == units_.size()) {
            auto S = head_loss_sum(model_, in, b.labels);
            (S * work.scale(ctx, static_cast<int>(a), ctx.plan->dp)).backward();
            out.record.loss_sum += S.item<double>();
          } else {
            forward_unit(k, b, in).backward(grad_out);
          }
          if (in.defined()) grad_out = in.grad();
        }
        reduce_scatter(ctx, u);
        free(u);
      }
      ctx.mark("backward");
    }

    reduce_global_loss(ctx, out);
    for (auto& u : units_) {
      optimizer_step(ctx.spec->optimizer, ctx.step_of(update), u->master, u->grad_shard.to(u->master.scalar_type()),
                     u->slot);
      if (u->weights.data_ptr() != u->master.data_ptr()) u->weights.copy_(u->master);
    }
    ctx.mark("optimizer step");

    // Artifacts (NOTE [shard artifacts]): each rank writes its shard of every unit.
    UntimedScope untimed(ctx);
    const auto dtype = scalar_type(ctx.spec->dtype);
    auto fill = [&](bool grads) {
      return [&, grads](const FlatPut& put) {
        for (auto& u : units_) {
          const int64_t lo = u->shard->lo(), n = u->shard->hi() - lo;
          const auto& src = grads ? u->grad_shard : u->master;
          if (n > 0) put(u->shard->begin + lo, src.slice(0, 0, n).to(dtype));
        }
      };
    };
    out.sharded = true;
    out.grad_shards = flat_pieces(layout_, ctx.spec->dtype, fill(true));
    out.param_shards = flat_pieces(layout_, ctx.spec->dtype, fill(false));
    return out;
  }

  // Per unit: the weight shard (the master shard itself unless bfloat16), the gradient
  // shard (in the master's dtype), the optimizer slots; gathered parameters
  // are freed after each use (the stale-gathered-params mutant keeps its first gather).
  NamedTensors state_tensors() override {
    NamedTensors out;
    for (auto& u : units_) {
      append_params_and_grads(out, u->params);
      out.emplace_back("master." + u->name, u->master);
      out.emplace_back("param." + u->name + ".shard", u->weights);
      if (u->grad_shard.defined()) out.emplace_back("grad." + u->name + ".shard", u->grad_shard);
      if (u->slot.m.defined()) out.emplace_back("optim." + u->name + ".m", u->slot.m);
      if (u->slot.v.defined()) out.emplace_back("optim." + u->name + ".v", u->slot.v);
      if (u->stale.defined()) out.emplace_back("stale." + u->name, u->stale);
    }
    return out;
  }

  // Checkpoints (NOTE [checkpoints]): every rank saves its shard of every unit (master and slots).
  std::vector<StatePiece> checkpoint_state(RankContext& ctx, bool allocate) override {
    std::vector<StatePiece> out;
    for (auto& u : units_) {
      if (allocate) allocate_slots(ctx.spec->optimizer, u->slot, u->master);
      for (auto& p :
           flat_state(layout_, u->shard->begin + u->shard->lo(), u->shard->hi() - u->shard->lo(), u->master, u->slot))
        out.push_back(std::move(p));
    }
    return out;
  }
  void after_load(RankContext&) override {
    for (auto& u : units_)
      if (u->weights.data_ptr() != u->master.data_ptr()) u->weights.copy_(u->master);
  }

 private:
  torch::Tensor forward_unit(size_t k, const Batch& b, const torch::Tensor& x) {
    return k == 0 ? embed_tokens(model_, b.input) : model_->blocks[k - 1]->as<Block>()->forward(x);
  }

  void gather(RankContext& ctx, Unit& u, int update) {
    torch::NoGradGuard ng;
    torch::Tensor full;
    if (ctx.mutant == Mutant::StaleGatheredParams && u.stale.defined() && update > 0) {
      full = u.stale;  // NOTE [stale-gathered-params]: no all-gather, last update's weights
    } else {
      full = u.shard->all_gather(ctx, u.weights);
      if (ctx.mutant == Mutant::StaleGatheredParams && (!u.stale.defined() || update == 0)) u.stale = full;
    }
    for (auto& [name, t] : u.params) {
      const auto& e = layout_.at(name);
      t.set_data(
          full.slice(0, e.offset - u.shard->begin, e.offset - u.shard->begin + e.numel).reshape(e.shape).clone());
    }
  }

  void reduce_scatter(RankContext& ctx, Unit& u) {
    torch::NoGradGuard ng;
    std::vector<torch::Tensor> parts;
    for (auto& [name, t] : u.params) parts.push_back(t.grad().reshape({-1}));
    const double dp = ctx.plan->dp;
    const double divisor = ctx.mutant == Mutant::ShardDivideFactor ? dp * dp : dp;
    u.grad_shard.add_(u.shard->reduce_scatter(ctx, torch::cat(parts), divisor).to(u.grad_shard.scalar_type()));
  }

  static void free(Unit& u) {
    for (auto& [name, t] : u.params) {
      t.set_data(torch::empty({0}, t.options()));
      t.mutable_grad().reset();
    }
  }

  TinyLM model_{nullptr};
  FlatLayout layout_;
  std::vector<std::unique_ptr<Unit>> units_;  ///< embed, blocks..., head: forward order
  int64_t last_full_targets_ = -1;
};

namespace {

// The descriptor's parts, each named (NOTE [strategy descriptor] in backends/catalog.hpp).
StrategyTraits fsdp_traits() {
  StrategyTraits t;
  t.reduce_scatter = true;
  t.gathers_params = true;
  t.sharded_state = true;
  return t;
}

std::unique_ptr<Backend> make_fsdp() { return std::make_unique<FsdpBackend>(); }

}  // namespace

const StrategyInfo& fsdp_strategy() {
  static const StrategyInfo info = [] {
    StrategyInfo s;
    s.name = "fsdp";
    s.sharding = Sharding::FSDP;
    s.traits = fsdp_traits();
    s.reduction = "gradcert's C++ FSDP: per-layer units, reduce-scatter after each unit's backward";
    s.sync = "no skipping: reduce-scatter after each unit's backward on every microstep";
    s.primary = {2, 1, 1};
    s.wider = {{3, 1, 1}};
    s.no_replica_digests = "every parameter is sharded over the DP ranks: no rank holds one whole after the step";
    s.make = make_fsdp;
    return s;
  }();
  return info;
}

}  // namespace gradcert
