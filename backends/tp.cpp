// tp: Megatron-style tensor parallelism. In each block, the q|k|v projection and the first
// MLP linear are column-parallel (a TP rank holds H/TP heads and d_ff/TP hidden units) and
// the attention output projection and the second MLP linear are row-parallel, followed
// by an all-reduce over the TP group. Embeddings, norms, biases after a row-parallel
// linear and the LM head are replicated. With world > TP, it is TP x DP: gradients are
// averaged over the DP group. TP ranks of a replica consume the same examples.
#include "backends/catalog.hpp"
#include "backends/runtime/checkpoint.hpp"
#include "backends/runtime/comm.hpp"
#include "backends/runtime/flat.hpp"
#include "backends/runtime/replica.hpp"
#include "conformance/layout/layout.hpp"

#include <torch/csrc/distributed/c10d/Types.hpp>

namespace gradcert {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// NOTE [tp group] The conjugate operators reach the TP group through a thread-local, as a
// custom autograd Function cannot carry a process group through the graph.
thread_local c10d::Backend* tp_group = nullptr;

torch::Tensor tp_all_reduce(const torch::Tensor& t) {
  if (!tp_group) return t.clone();  // TP = 1
  auto v = t.contiguous().clone();
  all_reduce_sum(*tp_group, v);
  return v;
}

// f: identity forward, all-reduce of the input gradient backward (before column-parallel).
struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static torch::Tensor forward(AutogradContext*, torch::Tensor x) { return x.clone(); }
  static variable_list backward(AutogradContext*, variable_list g) { return {tp_all_reduce(g[0])}; }
};

// g: all-reduce forward, identity backward (after row-parallel).
struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static torch::Tensor forward(AutogradContext*, torch::Tensor x) { return tp_all_reduce(x); }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0]}; }
};

// The (canonical slice, local tensor) pairs of one parameter on TP rank t.
std::vector<std::pair<torch::Tensor, torch::Tensor>> tp_pieces(const std::string& name, const torch::Tensor& canonical,
                                                               const torch::Tensor& local, int tp, int t) {
  const TpSplit split = tp_split_of(name);
  if (split == TpSplit::ColumnQkv) {
    const int64_t d = canonical.size(1), dl = d / tp;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
    for (int64_t j = 0; j < 3; ++j)
      out.emplace_back(canonical.narrow(0, j * d + t * dl, dl), local.narrow(0, j * dl, dl));
    return out;
  }
  if (split == TpSplit::Row) {
    const int64_t n = canonical.size(1) / tp;
    return {{canonical.narrow(1, t * n, n), local}};
  }
  if (split == TpSplit::Column) {
    const int64_t n = canonical.size(0) / tp;
    return {{canonical.narrow(0, t * n, n), local}};
  }
  return {{canonical, local}};  // replicated
}

bool tp_sharded(const std::string& name) { return tp_split_of(name) != TpSplit::Replicated; }

// A linear layer's local weight (and bias) without a forward of its own: the TP block
// decides where the all-reduce and the bias go.
struct LocalLinearImpl : torch::nn::Module {
  LocalLinearImpl(int64_t out, int64_t in, bool with_bias) {
    weight = register_parameter("weight", torch::zeros({out, in}));
    if (with_bias) bias = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(LocalLinear);

// One block on TP rank t: canonical names, sharded shapes.
struct TpBlockImpl : torch::nn::Module {
  TpBlockImpl(const ModelSpec& m, int tp) : heads_local(m.heads / tp) {
    const int64_t d = m.d_model, dl = d / tp, fl = m.d_ff / tp;
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv = register_module("qkv", LocalLinear(3 * dl, d, false));  // column-parallel
    proj = register_module("proj", LocalLinear(d, dl, true));     // row-parallel, bias replicated
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc = register_module("fc", LocalLinear(fl, d, true));          // column-parallel
    fc_out = register_module("fc_out", LocalLinear(d, fl, true));  // row-parallel, bias replicated
  }
  torch::Tensor forward(torch::Tensor x) {
    namespace F = torch::nn::functional;
    auto h = CopyToTp::apply(ln1->forward(x));
    auto att = causal_self_attention(F::linear(h, qkv->weight), heads_local);
    x = x + ReduceFromTp::apply(F::linear(att, proj->weight)) + proj->bias;
    auto h2 = CopyToTp::apply(ln2->forward(x));
    auto hidden = torch::gelu(F::linear(h2, fc->weight, fc->bias));
    return x + ReduceFromTp::apply(F::linear(hidden, fc_out->weight)) + fc_out->bias;
  }
  int heads_local;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  LocalLinear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc_out{nullptr};
};
TORCH_MODULE(TpBlock);

// The local part of the model: canonical names, sharded shapes.
struct TpModelImpl : torch::nn::Module {
  TpModelImpl(const ModelSpec& m, int tp) {
    wte = register_module("wte", torch::nn::Embedding(m.vocab, m.d_model));
    wpe = register_module("wpe", torch::nn::Embedding(m.max_len, m.d_model));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < m.layers; ++i) blocks->push_back(TpBlock(m, tp));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({m.d_model})));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(m.d_model, m.vocab).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& input) {
    auto pos = torch::arange(input.size(1), torch::TensorOptions().dtype(torch::kLong).device(input.device()));
    auto x = wte->forward(input) + wpe->forward(pos).unsqueeze(0);
    for (const auto& b : *blocks) x = b->as<TpBlock>()->forward(x);
    return lm_head->forward(ln_f->forward(x));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TpModel);

}  // namespace

class TpBackend : public Backend {
 public:
  std::string name() const override { return "tp"; }
  void validate(const Plan& plan, int world, Mutant mutant) const override {
    if (plan.pp != 1) throw std::invalid_argument("backend tp needs PP = 1 (TP x PP is not built in)");
    if (mutant == Mutant::ReplicaDrift && plan.tp < 2)
      throw std::invalid_argument("backend tp: --inject replica-drift needs TP >= 2 (the last TP rank drifts its "
                                  "TP-replicated tensors)");
    Backend::validate(plan, world, mutant);
  }
  void validate_model(const ModelSpec& m, const Plan& plan) const override {
    if (m.heads % plan.tp != 0)
      throw std::invalid_argument("backend tp: model.heads (" + std::to_string(m.heads) +
                                  ") must be divisible by TP (" + std::to_string(plan.tp) + ")");
    if (m.d_ff % plan.tp != 0)
      throw std::invalid_argument("backend tp: model.d_ff (" + std::to_string(m.d_ff) + ") must be divisible by TP (" +
                                  std::to_string(plan.tp) + ")");
  }

  void setup(RankContext& ctx) override {
    tp_ = ctx.plan->tp;
    me_ = coords_of(*ctx.plan, ctx.rank);
    tp_group = ctx.tp_pg ? ctx.tp_pg.get() : nullptr;
    if (tp_ > 1 && !tp_group) throw std::logic_error("backend tp: no TP process group");
    const TensorMap init = initial_params(*ctx.spec, ctx.initial_file);
    layout_ = FlatLayout::of(init);
    const auto dtype = scalar_type(ctx.spec->dtype);
    model_ = TpModel(ctx.spec->model, tp_);
    model_->to(compute_device(), dtype);
    torch::NoGradGuard ng;
    for (auto& p : model_->named_parameters()) {
      auto full = from_host(init.at(p.key()), dtype);
      for (auto& [canonical, local] : tp_pieces(p.key(), full, p.value(), tp_, me_.tp)) local.copy_(canonical);
    }
  }

  RankUpdate run_update(RankContext& ctx, int update) override {
    tp_group = ctx.tp_pg ? ctx.tp_pg.get() : nullptr;
    const WindowWork work = prepare_window(ctx, update, last_full_targets_);
    RankUpdate out = work.start_update(update);
    // The planted tp-counted-as-dp takes D as the world size, counting TP ranks as replicas.
    const int dp = ctx.mutant == Mutant::TpCountedAsDp ? ctx.world : ctx.plan->dp;

    std::vector<torch::Tensor> params;
    for (auto& p : model_->parameters()) {
      p.mutable_grad() = torch::zeros_like(p);
      params.push_back(p);
    }
    for (size_t a = 0; a < work.batches.size(); ++a) {
      const Batch& b = work.batches[a];
      if (b.empty()) continue;
      auto S = token_loss_sum(model_->forward(b.input), b.labels);
      ctx.mark("forward");
      (S * work.scale(ctx, static_cast<int>(a), dp)).backward();
      out.record.loss_sum += S.item<double>();
      ctx.mark("backward");
    }
    reduce_global_loss(ctx, out);
    average_gradients(ctx, params);
    ctx.mark("backward");

    out.sharded = true;
    out.grad_shards = pieces(ctx, true);
    ctx.mark("artifacts");
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (auto& p : model_->named_parameters()) named.emplace_back(p.key(), p.value());
    // replica-drift under TP: the last TP rank steps its copies of the TP-replicated tensors
    // with lr x 1.01 at the last update (e.g. a norm stepped by a per-rank schedule). The
    // shard artifacts take replicated tensors from TP rank 0, so only replicas.agree can see it.
    const bool drift = ctx.mutant == Mutant::ReplicaDrift && tp_ > 1 && me_.tp == tp_ - 1 &&
                       update + 1 == static_cast<int>(ctx.plan->windows.size());
    std::vector<std::pair<torch::Tensor, torch::Tensor>> before;  // (parameter, its value before the step)
    if (drift)
      for (auto& [n, p] : named)
        if (!tp_sharded(n)) before.emplace_back(p, p.detach().clone());
    stepper_.step(ctx, update, named);
    if (drift) {
      torch::NoGradGuard no_grad;
      for (auto& [p, old] : before) p.add_(p - old, 0.01);
    }
    ctx.mark("optimizer step");
    out.param_shards = pieces(ctx, false);
    return out;
  }

  // What replicas.agree compares (NOTE [replica digests]): the replicated tensors under their own
  // names (every TP peer and DP replica holds them whole: norms, embeddings, row-parallel biases,
  // the head), and each slice under its name and TP rank (the DP replicas of that slice hold it).
  NamedTensors replica_params() override {
    NamedTensors out;
    for (auto& p : model_->named_parameters())
      out.emplace_back(
          tp_sharded(p.key()) ? p.key() + " [tp " + std::to_string(me_.tp) + "/" + std::to_string(tp_) + "]" : p.key(),
          p.value());
    return out;
  }

  NamedTensors state_tensors() override {
    NamedTensors out;
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (auto& p : model_->named_parameters()) named.emplace_back(p.key(), p.value());
    append_params_and_grads(out, named);
    stepper_.append_state(out);
    return out;
  }

  // Checkpoints (NOTE [checkpoints]): each TP rank of DP replica 0 saves its slices of the sharded tensors, TP
  // rank 0 the replicated ones; every rank loads what it holds.
  std::vector<StatePiece> checkpoint_state(RankContext& ctx, bool allocate) override {
    std::vector<StatePiece> out;
    for (auto& p : model_->named_parameters()) {
      const auto& e = layout_.at(p.key());
      const auto canonical = torch::empty(e.shape, torch::TensorOptions().dtype(torch::kFloat64).device(torch::kMeta));
      const torch::Tensor stepped = stepper_.stepped(ctx, p.key(), p.value());
      const OptimizerSlot& slot = stepper_.slot(ctx, p.key(), stepped, allocate);
      const auto params = tp_pieces(p.key(), canonical, stepped, tp_, me_.tp);
      const auto ms = slot.m.defined() ? tp_pieces(p.key(), canonical, slot.m, tp_, me_.tp) : decltype(params){};
      const auto vs = slot.v.defined() ? tp_pieces(p.key(), canonical, slot.v, tp_, me_.tp) : decltype(params){};
      for (size_t i = 0; i < params.size(); ++i) {
        StatePiece s;
        s.tensor = p.key();
        s.shape = e.shape;
        s.offset = offset_in(canonical, params[i].first);
        s.saves = me_.dp == 0 && (tp_sharded(p.key()) || me_.tp == 0);
        s.param = params[i].second;
        if (!ms.empty()) s.m = ms[i].second;
        if (!vs.empty()) s.v = vs[i].second;
        out.push_back(std::move(s));
      }
    }
    return out;
  }
  void after_load(RankContext& ctx) override {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (auto& p : model_->named_parameters()) named.emplace_back(p.key(), p.value());
    stepper_.round_into(ctx, named);
  }

 private:
  // Where a slice of a (meta) canonical tensor starts, per dimension.
  static std::vector<int64_t> offset_in(const torch::Tensor& canonical, const torch::Tensor& slice) {
    std::vector<int64_t> at;
    int64_t rest = slice.storage_offset();
    for (int64_t d = 0; d < canonical.dim(); ++d) {
      at.push_back(rest / canonical.stride(d));
      rest %= canonical.stride(d);
    }
    return at;
  }

  // This rank's shard artifacts (NOTE [shard artifacts]): each TP rank its slices of the sharded
  // tensors (boxes at their canonical offsets), TP rank 0 the replicated tensors whole; DP
  // replica d is replica group d. Nothing is gathered.
  std::vector<ShardPiece> pieces(RankContext& ctx, bool grads) {
    UntimedScope untimed(ctx);
    torch::NoGradGuard ng;
    std::vector<ShardPiece> out;
    for (auto& p : model_->named_parameters()) {
      if (!tp_sharded(p.key()) && me_.tp != 0) continue;
      const auto& e = layout_.at(p.key());
      // A shape-only canonical tensor: where each slice of it starts is its offset.
      const auto canonical = torch::empty(e.shape, torch::TensorOptions().dtype(torch::kFloat64).device(torch::kMeta));
      const auto local = (grads ? p.value().grad() : p.value()).detach();
      for (auto& [c, l] : tp_pieces(p.key(), canonical, local, tp_, me_.tp)) {
        ShardPiece s;
        s.tensor = p.key();
        s.shape = e.shape;
        s.replica = me_.dp;
        s.offset = offset_in(canonical, c);
        s.data = to_host(p.key(), l, ctx.spec->dtype);
        out.push_back(std::move(s));
      }
    }
    return out;
  }

  int tp_ = 1;
  Coords me_;
  TpModel model_{nullptr};
  FlatLayout layout_;
  ParamStepper stepper_;
  int64_t last_full_targets_ = -1;
};

namespace {

// The descriptor's parts, each named (NOTE [strategy descriptor] in backends/catalog.hpp).
StrategyTraits tp_traits() {
  StrategyTraits t;
  t.final_allreduce = true;
  t.tensor_parallel = true;
  t.replica_digests = true;
  t.sharded_state = true;
  return t;
}

std::unique_ptr<Backend> make_tp() { return std::make_unique<TpBackend>(); }

}  // namespace

const StrategyInfo& tp_strategy() {
  static const StrategyInfo info = [] {
    StrategyInfo s;
    s.name = "tp";
    s.sharding = Sharding::TP;
    s.traits = tp_traits();
    s.reduction = "Megatron TP x DP: all-reduce over the DP group; TP-partitioned tensors";
    s.sync = "see backends/tp.cpp";
    s.primary = {2, 2, 1};
    s.wider = {{4, 2, 1}};
    s.mutant_world = 4;
    s.make = make_tp;
    return s;
  }();
  return info;
}

}  // namespace gradcert
