// pp: pipeline parallelism. The blocks are split into PP contiguous stages (stage 0 also
// holds the embeddings, the last stage the final norm, LM head and loss); each stage keeps
// only its own parameters. The window's A microbatches run on the spec's schedule
// (pipeline.schedule): 1F1B (default) or GPipe (every forward, then every backward);
// activations go to the next stage and their gradients back over c10d send/recv. With world > PP
// it is PP x DP: each stage's gradients are averaged over its DP group. Stages of a replica
// consume the same examples; shapes are known to both ends from the plan, so an empty
// microbatch is skipped by both.
#include <tuple>

#include "backends/catalog.hpp"
#include "backends/runtime/comm.hpp"
#include "backends/runtime/flat.hpp"
#include "backends/runtime/replica.hpp"
#include "conformance/layout/layout.hpp"

namespace gradcert {

class PpBackend : public Backend {
 public:
  std::string name() const override { return "pp"; }
  void validate(const Plan& plan, int world, Mutant mutant) const override {
    if (plan.tp != 1) throw std::invalid_argument("backend pp needs TP = 1 (TP x PP is not built in)");
    Backend::validate(plan, world, mutant);
  }
  void validate_model(const ModelSpec& m, const Plan& plan) const override {
    if (m.layers < plan.pp)
      throw std::invalid_argument("backend pp: model.layers (" + std::to_string(m.layers) + ") must be at least PP (" +
                                  std::to_string(plan.pp) + ")");
  }

  void setup(RankContext& ctx) override {
    const Plan& plan = *ctx.plan;
    me_ = coords_of(plan, ctx.rank);
    std::tie(first_block_, end_block_) = stage_blocks(ctx.spec->model.layers, plan.pp, me_.pp);
    last_stage_ = me_.pp == plan.pp - 1;
    const TensorMap init = initial_params(*ctx.spec, ctx.initial_file);
    layout_ = FlatLayout::of(init);
    model_ = make_model(ctx.spec->model, init, scalar_type(ctx.spec->dtype));
    torch::NoGradGuard ng;
    for (auto& p : model_->named_parameters()) {
      if (owns(p.key()))
        owned_.emplace_back(p.key(), p.value());
      else
        p.value().set_data(torch::empty({0}, p.value().options()));  // another stage's
    }
  }

  RankUpdate run_update(RankContext& ctx, int update) override {
    const Plan& plan = *ctx.plan;
    const WindowWork work = prepare_window(ctx, update, last_full_targets_);
    RankUpdate out = work.start_update(update);
    for (auto& [name, p] : owned_) p.mutable_grad() = torch::zeros_like(p);

    const bool first = me_.pp == 0, last = me_.pp == plan.pp - 1;
    const int prev = first ? -1 : global_rank_of(plan, {me_.dp, 0, me_.pp - 1});
    const int next = last ? -1 : global_rank_of(plan, {me_.dp, 0, me_.pp + 1});
    const auto dtype = scalar_type(ctx.spec->dtype);
    const int A = plan.accum;
    std::vector<torch::Tensor> inputs(A), outputs(A);
    std::vector<c10::intrusive_ptr<c10d::Work>> sends;  // waited once the schedule is done
    double stage_loss = 0;

    auto forward = [&](int a) {
      const Batch& b = work.batches[a];
      torch::Tensor x;
      if (first) {
        x = embed_tokens(model_, b.input);
      } else {
        const std::vector<int64_t> shape = {b.input.size(0), b.input.size(1), ctx.spec->model.d_model};
        x = recv(ctx, torch::empty(shape, torch::TensorOptions().dtype(dtype).device(compute_device())), prev,
                 tag(update, a, 0));
        x.requires_grad_();
      }
      inputs[a] = x;
      for (int k = first_block_; k < end_block_; ++k) x = model_->blocks[k]->as<Block>()->forward(x);
      if (last) {
        auto S = head_loss_sum(model_, x, b.labels);
        stage_loss += S.item<double>();
        outputs[a] = S * work.scale(ctx, a, plan.dp);
      } else {
        sends.push_back(send(ctx, x.detach(), next, tag(update, a, 0)));
        outputs[a] = x;
      }
      ctx.mark("forward");
    };
    auto backward = [&](int a) {
      if (last)
        outputs[a].backward();
      else
        outputs[a].backward(recv(ctx, torch::empty_like(outputs[a]), next, tag(update, a, 1)));
      if (!first) sends.push_back(send(ctx, inputs[a].grad(), prev, tag(update, a, 1)));
      inputs[a] = outputs[a] = torch::Tensor();  // 1F1B frees a microbatch's activations here
      ctx.mark("backward");
    };

    // Both ends know which microbatches are empty (the plan), so both skip them.
    std::vector<int> micro;
    for (int a = 0; a < A; ++a)
      if (!work.batches[a].empty()) micro.push_back(a);
    const int M = static_cast<int>(micro.size());
    if (ctx.spec->pipeline.schedule == "gpipe") {
      // GPipe: every forward, then every backward in reverse.
      for (int i = 0; i < M; ++i) forward(micro[i]);
      for (int i = M - 1; i >= 0; --i) backward(micro[i]);
    } else {
      // 1F1B: stage s runs PP - 1 - s warm-up forwards, then alternates one forward and
      // one backward, then drains the backwards; at most PP - s microbatches in flight.
      // Sends are asynchronous and receives blocking, which keeps the schedule deadlock-free.
      const int warmup = std::min(plan.pp - 1 - me_.pp, M);
      for (int i = 0; i < warmup; ++i) forward(micro[i]);
      for (int i = warmup; i < M; ++i) {
        forward(micro[i]);
        backward(micro[i - warmup]);
      }
      for (int i = M - warmup; i < M; ++i) backward(micro[i]);
    }
    for (auto& w : sends) w->wait();

    // The loss lives on the last stages: sum it over the world (other stages add 0).
    out.record.loss_sum = stage_loss;
    double S = stage_loss;
    if (ctx.pg) {
      auto t = torch::tensor({stage_loss}, torch::kFloat64);
      all_reduce_sum(*ctx.pg, t);
      S = t[0].item<double>();
    }
    out.loss = out.valid_targets > 0 ? S / static_cast<double>(out.valid_targets) : 0.0;

    std::vector<torch::Tensor> params;
    for (auto& [name, p] : owned_) params.push_back(p);
    average_gradients(ctx, params);
    ctx.mark("backward");
    out.sharded = true;
    out.grad_shards = pieces(ctx, true);
    ctx.mark("artifacts");
    stepper_.step(ctx, update, owned_);
    ctx.mark("optimizer step");
    out.param_shards = pieces(ctx, false);
    return out;
  }

  // What replicas.agree compares (NOTE [replica digests]): the stage's own parameters, whole; the
  // DP replicas of a stage hold the same ones (PP peers hold other names, so nothing is compared
  // across stages).
  NamedTensors replica_params() override { return owned_; }

  // Checkpoints (NOTE [checkpoints]): DP replica 0 of each stage saves the stage's own parameters whole.
  std::vector<StatePiece> checkpoint_state(RankContext& ctx, bool allocate) override {
    return stepper_.state(ctx, owned_, me_.dp == 0, allocate);
  }
  void after_load(RankContext& ctx) override { stepper_.round_into(ctx, owned_); }

  // The stage's own parameters, their gradients and the stepper's state (other stages'
  // parameters are empty placeholders).
  NamedTensors state_tensors() override {
    NamedTensors out;
    append_params_and_grads(out, owned_);
    stepper_.append_state(out);
    return out;
  }

 private:
  bool owns(const std::string& name) const {
    if (name.rfind("blocks.", 0) == 0) {
      const int k = std::stoi(name.substr(7, name.find('.', 7) - 7));
      return k >= first_block_ && k < end_block_;
    }
    if (name.rfind("wte", 0) == 0 || name.rfind("wpe", 0) == 0) return me_.pp == 0;
    return last_stage_;  // ln_f, lm_head
  }

  static int tag(int update, int micro, int backward) { return (update * 4096 + micro) * 2 + backward; }

  static c10::intrusive_ptr<c10d::Work> send(RankContext& ctx, const torch::Tensor& t, int peer, int tag) {
    return send_to(*ctx.pg, t, peer, tag);
  }
  static torch::Tensor recv(RankContext& ctx, torch::Tensor into, int peer, int tag) {
    return recv_from(*ctx.pg, std::move(into), peer, tag);
  }

  // This rank's shard artifacts (NOTE [shard artifacts]): its stage's own tensors whole, DP
  // replica d as replica group d. Nothing is gathered.
  std::vector<ShardPiece> pieces(RankContext& ctx, bool grads) {
    UntimedScope untimed(ctx);
    std::vector<ShardPiece> out;
    for (auto& [name, p] : owned_) {
      ShardPiece s;
      s.tensor = name;
      s.shape = layout_.at(name).shape;
      s.replica = me_.dp;
      s.offset.assign(s.shape.size(), 0);
      const auto t = grads ? (p.grad().defined() ? p.grad() : torch::zeros_like(p)) : p;
      s.data = to_host(name, t.detach(), ctx.spec->dtype);
      out.push_back(std::move(s));
    }
    return out;
  }

  Coords me_;
  int first_block_ = 0, end_block_ = 0;
  bool last_stage_ = false;
  TinyLM model_{nullptr};
  FlatLayout layout_;
  std::vector<std::pair<std::string, torch::Tensor>> owned_;
  ParamStepper stepper_;
  int64_t last_full_targets_ = -1;
};

namespace {

// The descriptor's parts, each named (NOTE [strategy descriptor] in backends/catalog.hpp).
StrategyTraits pp_traits() {
  StrategyTraits t;
  t.final_allreduce = true;
  t.sharded_state = true;
  return t;
}

std::unique_ptr<Backend> make_pp() { return std::make_unique<PpBackend>(); }

}  // namespace

const StrategyInfo& pp_strategy() {
  static const StrategyInfo info = [] {
    StrategyInfo s;
    s.name = "pp";
    s.sharding = Sharding::PP;
    s.traits = pp_traits();
    s.reduction = "pipeline stages x DP: all-reduce over the DP group per stage";
    s.sync = "see backends/pp.cpp";
    s.primary = {2, 1, 2};
    s.wider = {{4, 1, 2}, {2, 1, 2, "gpipe"}};
    s.mutant_world = 4;
    s.make = make_pp;
    return s;
  }();
  return info;
}

}  // namespace gradcert
