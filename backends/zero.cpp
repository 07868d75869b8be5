#include "backends/zero.hpp"

#include "backends/runtime/checkpoint.hpp"
#include "backends/runtime/comm.hpp"

namespace gradcert {

namespace {

std::vector<std::pair<std::string, torch::Tensor>> params_by_name(TinyLM& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& p : model->named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

torch::Tensor flat_grads(TinyLM& model, const FlatLayout& layout) {
  std::map<std::string, torch::Tensor> grads;
  for (auto& p : model->named_parameters()) grads[p.key()] = p.value().grad();
  std::vector<torch::Tensor> parts;
  for (const auto& e : layout.entries) parts.push_back(grads.at(e.name).reshape({-1}));
  return torch::cat(parts);
}

}  // namespace

void ZeroState::setup(RankContext& ctx) {
  replica_.setup(ctx);
  const TensorMap init = initial_params(*ctx.spec, ctx.initial_file);
  layout_ = FlatLayout::of(init);
  shard_ = std::make_unique<FlatShard>(0, layout_.total, ctx.plan->dp, ctx.plan->dp_rank_of(ctx.rank));
  const auto master_type = ctx.spec->dtype == DType::BFloat16 ? torch::kFloat32 : scalar_type(ctx.spec->dtype);
  master_ = torch::zeros({shard_->shard}, torch::TensorOptions().dtype(master_type).device(compute_device()));
  std::vector<torch::Tensor> parts;
  for (const auto& e : layout_.entries) parts.push_back(from_host(init.at(e.name), master_type).reshape({-1}));
  auto flat = torch::cat(parts);
  master_.slice(0, 0, shard_->hi() - shard_->lo()).copy_(flat.slice(0, shard_->lo(), shard_->hi()));
  if (stage_ == 3) {
    weights_ = master_.to(scalar_type(ctx.spec->dtype));  // aliases master_ unless bfloat16
    free_params();
  }
}

// NOTE [zero model state] What each stage keeps between updates, per rank (s(x) = the
// padded shard ceil(x / D)): stages 1-2 hold the full weights in the run dtype and step a
// separate master shard (float32 for bfloat16 runs, else the run dtype: a copy, as
// DeepSpeed's partitioned fp32 groups are even for an fp32 model); stage 1 keeps the full
// local gradients, stage 2 frees them after the reduce-scatter and keeps the gradient
// shard; stage 3 keeps the weight shard (the master itself unless bfloat16), the gradient
// shard and no full parameters. memory.cpp's recipe_for_strategy counts exactly this.
NamedTensors ZeroState::state_tensors() {
  NamedTensors out;
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : replica_.model()->named_parameters()) params.emplace_back(p.key(), p.value());
  append_params_and_grads(out, params);
  out.emplace_back("master.shard", master_);
  if (weights_.defined()) out.emplace_back("param.shard", weights_);
  if (grad_shard_.defined()) out.emplace_back("grad.shard", grad_shard_);
  if (slot_.m.defined()) out.emplace_back("optim.shard.m", slot_.m);
  if (slot_.v.defined()) out.emplace_back("optim.shard.v", slot_.v);
  return out;
}

void ZeroState::gather_params(RankContext& ctx) {
  torch::NoGradGuard ng;
  const auto dtype = scalar_type(ctx.spec->dtype);
  auto full = shard_->all_gather(ctx, stage_ == 3 ? weights_ : master_.to(dtype));
  for (auto& [name, p] : params_by_name(replica_.model())) {
    const auto& e = layout_.at(name);
    p.set_data(full.slice(0, e.offset, e.offset + e.numel).reshape(e.shape).clone());
  }
}

void ZeroState::free_params() {
  for (auto& [name, p] : params_by_name(replica_.model())) {
    p.set_data(torch::empty({0}, p.options()));
    p.mutable_grad().reset();
  }
}

RankUpdate ZeroState::run_update(RankContext& ctx, int update) {
  const int dp = ctx.plan->dp;
  // NOTE [stale-gathered-params] The mutant keeps the parameters gathered for update 0:
  // it never frees them and never gathers again, so it computes with stale weights.
  const bool stale = ctx.mutant == Mutant::StaleGatheredParams;
  if (stage_ == 3 && !(stale && update > 0)) gather_params(ctx);

  RankUpdate out = replica_.accumulate(ctx, update);
  reduce_global_loss(ctx, out);

  torch::NoGradGuard ng;
  torch::Tensor grad_shard;
  const auto local = flat_grads(replica_.model(), layout_);
  if (stage_ == 1) {
    // Stage 1: gradients are all-reduced in full; each rank keeps its slice.
    std::vector<at::Tensor> t{local / static_cast<double>(dp)};
    if (auto g = dp_group(ctx); g && ctx.mutant != Mutant::MissingFinalSync) all_reduce_sum(*g, t[0]);
    grad_shard = torch::zeros({shard_->shard}, local.options());
    grad_shard.slice(0, 0, shard_->hi() - shard_->lo()).copy_(t[0].slice(0, shard_->lo(), shard_->hi()));
  } else {
    // Stages 2-3: reduce-scatter; the planted divided-by-d-twice divides by D twice.
    const double divisor = ctx.mutant == Mutant::ShardDivideFactor ? double(dp) * dp : double(dp);
    grad_shard = shard_->reduce_scatter(ctx, local, divisor);
    grad_shard_ = grad_shard;
    if (stage_ == 2)
      for (auto& [name, p] : params_by_name(replica_.model())) p.mutable_grad().reset();  // the shard is kept
  }
  ctx.mark("backward");  // the gradient all-reduce / reduce-scatter ends the backward phase
  optimizer_step(ctx.spec->optimizer, ctx.step_of(update), master_, grad_shard.to(master_.scalar_type()), slot_);
  if (stage_ == 3 && weights_.data_ptr() != master_.data_ptr()) weights_.copy_(master_);

  if (stage_ < 3)
    gather_params(ctx);
  else if (!stale)
    free_params();
  ctx.mark("optimizer step");

  // Artifacts (NOTE [shard artifacts]): each DP rank writes its shard of the flat gradient and
  // parameters; nothing is gathered for them.
  UntimedScope untimed(ctx);
  const int64_t lo = shard_->lo(), n = shard_->hi() - shard_->lo();
  const auto dtype = scalar_type(ctx.spec->dtype);
  out.sharded = true;
  out.grad_shards = flat_pieces(layout_, ctx.spec->dtype, [&](const FlatPut& put) {
    if (n > 0) put(lo, grad_shard.slice(0, 0, n));
  });
  out.param_shards = flat_pieces(layout_, ctx.spec->dtype, [&](const FlatPut& put) {
    if (n > 0) put(lo, master_.slice(0, 0, n).to(dtype));
  });
  return out;
}

std::vector<StatePiece> ZeroState::checkpoint_state(RankContext& ctx, bool allocate) {
  if (allocate) allocate_slots(ctx.spec->optimizer, slot_, master_);
  return flat_state(layout_, shard_->lo(), shard_->hi() - shard_->lo(), master_, slot_);
}

void ZeroState::after_load(RankContext& ctx) {
  if (stage_ == 3) {
    if (weights_.data_ptr() != master_.data_ptr()) weights_.copy_(master_);
    return;  // gathered before each update's forward
  }
  gather_params(ctx);  // stages 1-2 hold the full weights between updates
}

}  // namespace gradcert
