#include "backends/runtime/replica.hpp"

#include "backends/runtime/checkpoint.hpp"
#include "backends/runtime/comm.hpp"

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <cmath>

#include "backends/runtime/alloc_tracker.hpp"
#include "conformance/core/dataset.hpp"

namespace gradcert {

std::vector<std::vector<int64_t>> consumed_ids(const Plan& plan, const Window& w, int dp_rank, Mutant mutant) {
  std::vector<std::vector<int64_t>> out(plan.accum);
  if (mutant != Mutant::SamplerPadDuplicate || !w.partial) {
    for (int a = 0; a < plan.accum; ++a) out[a] = w.slots[dp_rank][a].ids;
    return out;
  }
  // NOTE [sampler-pad-duplicate] A distributed sampler with drop_last=False pads its
  // index list with its own head so that every replica gets a full batch (torch's
  // DistributedSampler pads to a multiple of the replicas); here the partial window is
  // padded to a whole global microbatch (D x B_micro), so examples are seen twice.
  std::vector<int64_t> padded = w.ids;
  const size_t global_micro = static_cast<size_t>(plan.dp) * plan.micro;
  const size_t target = (w.ids.size() + global_micro - 1) / global_micro * global_micro;
  for (size_t i = 0; padded.size() < target; ++i) padded.push_back(w.ids[i % w.ids.size()]);
  for (size_t k = 0; k < padded.size(); ++k) {
    const int a = static_cast<int>(k / (static_cast<size_t>(plan.dp) * plan.micro));
    const int r = static_cast<int>((k / plan.micro) % plan.dp);
    if (r == dp_rank && a < plan.accum) out[a].push_back(padded[k]);
  }
  return out;
}

int64_t counted_targets(const Batch& b, Mutant mutant) {
  if (b.empty()) return 0;
  if (mutant == Mutant::PadAsTarget)
    return b.labels.ne(kIgnoreIndex).logical_or(b.input.eq(kPadToken)).sum().item<int64_t>();
  return b.valid_targets;
}

std::pair<double, int64_t> allreduce_sum(RankContext& ctx, double x, int64_t n) {
  auto group = dp_group(ctx);
  if (!group) return {x, n};
  auto t = torch::tensor({x, static_cast<double>(n)}, torch::kFloat64);
  all_reduce_sum(*group, t);
  return {t[0].item<double>(), static_cast<int64_t>(std::llround(t[1].item<double>()))};
}

double loss_scale(Mutant mutant, int dp, int accum, int64_t window_targets, int64_t micro_targets,
                  int64_t rank_targets) {
  auto inv = [](double d) { return d > 0 ? 1.0 / d : 0.0; };
  if (mutant == Mutant::LocalMean) return inv(static_cast<double>(rank_targets));
  if (mutant == Mutant::MicroMean) return inv(static_cast<double>(micro_targets) * accum);
  if (mutant == Mutant::DoubleAccumDivision) return dp * inv(static_cast<double>(window_targets) * accum);
  return dp * inv(static_cast<double>(window_targets));
}

void ReplicaState::setup(RankContext& ctx) {
  model_ = make_model(ctx.spec->model, initial_params(*ctx.spec, ctx.initial_file), scalar_type(ctx.spec->dtype));
}

double WindowWork::scale(const RankContext& ctx, int a, int dp) const {
  return loss_scale(ctx.mutant, dp, ctx.plan->accum, window_targets, batches[a].valid_targets, local_targets);
}

RankUpdate WindowWork::start_update(int update) const {
  RankUpdate out;
  out.record.update = update;
  out.record.consumed = consumed;
  out.record.valid_targets = local_targets;
  out.valid_targets = window_targets;
  return out;
}

void reduce_global_loss(RankContext& ctx, RankUpdate& out) {
  const double S = allreduce_sum(ctx, out.record.loss_sum, 0).first;
  out.loss = out.valid_targets > 0 ? S / static_cast<double>(out.valid_targets) : 0.0;
}

WindowWork prepare_window(RankContext& ctx, int update, int64_t& last_full_targets) {
  const Plan& plan = *ctx.plan;
  const Window& w = plan.windows.at(update);
  WindowWork work;
  work.consumed = consumed_ids(plan, w, plan.dp_rank_of(ctx.rank), ctx.mutant);
  for (const auto& ids : work.consumed) {
    work.batches.push_back(collate(*ctx.spec, ids));
    work.local_targets += counted_targets(work.batches.back(), ctx.mutant);
  }
  // N for the whole window: every DP rank's count, summed (zero-example ranks join too).
  work.window_targets = allreduce_sum(ctx, 0.0, work.local_targets).second;
  if (ctx.mutant == Mutant::StaleWindowCount && w.partial && last_full_targets >= 0)
    work.window_targets = last_full_targets;
  if (!w.partial) last_full_targets = work.window_targets;
  return work;
}

RankUpdate ReplicaState::accumulate(RankContext& ctx, int update) {
  const WindowWork work = prepare_window(ctx, update, last_full_window_targets_);
  RankUpdate out = work.start_update(update);

  model_->zero_grad(/*set_to_none=*/false);
  for (auto& p : model_->parameters())
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  for (size_t a = 0; a < work.batches.size(); ++a) {
    const Batch& b = work.batches[a];
    if (b.empty()) continue;
    auto S = loss_sum(model_, b);
    ctx.mark("forward");
    (S * work.scale(ctx, static_cast<int>(a), ctx.plan->dp)).backward();
    out.record.loss_sum += S.item<double>();
    ctx.mark("backward");
  }
  return out;
}

void RankContext::mark(const std::string& phase) const {
  if (memory) memory->mark(phase_prefix + phase);
}

void append_params_and_grads(NamedTensors& out, const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  for (const auto& [name, p] : params) {
    out.emplace_back("param." + name, p);
    if (p.grad().defined()) out.emplace_back("grad." + name, p.grad());
  }
}

void ParamStepper::append_state(NamedTensors& out) const {
  for (const auto& [name, m] : masters_) out.emplace_back("master." + name, m);
  for (const auto& [name, slot] : slots_) {
    if (slot.m.defined()) out.emplace_back("optim." + name + ".m", slot.m);
    if (slot.v.defined()) out.emplace_back("optim." + name + ".v", slot.v);
  }
}

NamedTensors ReplicaState::state_tensors() {
  NamedTensors out;
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : model_->named_parameters()) params.emplace_back(p.key(), p.value());
  append_params_and_grads(out, params);
  stepper_.append_state(out);
  return out;
}

void average_gradients(RankContext& ctx, const std::vector<torch::Tensor>& params) {
  auto group = dp_group(ctx);
  if (!group || ctx.mutant == Mutant::MissingFinalSync || params.empty()) return;
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad().reshape({-1}));
  std::vector<at::Tensor> flat{torch::cat(grads).div_(static_cast<double>(ctx.plan->dp))};
  all_reduce_sum(*group, flat[0]);
  int64_t offset = 0;
  for (const auto& p : params) {
    const auto n = p.numel();
    p.grad().copy_(flat[0].slice(0, offset, offset + n).view_as(p));
    offset += n;
  }
}

void ParamStepper::step(const RankContext& ctx, int update,
                        const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  torch::NoGradGuard ng;
  for (const auto& [name, p] : params) {
    if (ctx.spec->dtype != DType::BFloat16) {
      optimizer_step(ctx.spec->optimizer, ctx.step_of(update), p, p.grad(), slots_[name]);
      continue;
    }
    // NOTE [mixed precision] bfloat16 runs follow the usual recipe: bf16 weights and
    // gradients for compute, float32 master weights and optimizer state for the step.
    auto& master = masters_[name];
    if (!master.defined()) master = p.detach().to(torch::kFloat32);
    optimizer_step(ctx.spec->optimizer, ctx.step_of(update), master, p.grad().to(torch::kFloat32), slots_[name]);
    p.copy_(master);
  }
}

void ReplicaState::sync(RankContext& ctx, RankUpdate& out) {
  reduce_global_loss(ctx, out);
  average_gradients(ctx, model_->parameters());
  ctx.mark("backward");  // the gradient all-reduce ends the backward phase
}

void ReplicaState::step(RankContext& ctx, int update) {
  if (ctx.rank == 0) {
    UntimedScope untimed(ctx);
    grads_before_step_ = grads_of(model_, ctx.spec->dtype);
  }
  ctx.mark("artifacts");
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : model_->named_parameters()) params.emplace_back(p.key(), p.value());
  // replica-drift: the last DP rank steps its last update with lr x 1.01 (a per-rank learning
  // rate, e.g. a scheduler stepped once more on one rank); nothing is all-reduced after it.
  const bool drift = ctx.mutant == Mutant::ReplicaDrift && update + 1 == static_cast<int>(ctx.plan->windows.size()) &&
                     ctx.plan->dp > 1 && ctx.plan->dp_rank_of(ctx.rank) == ctx.plan->dp - 1;
  std::vector<torch::Tensor> before;
  if (drift)
    for (auto& [n, p] : params) before.push_back(p.detach().clone());
  stepper_.step(ctx, update, params);
  if (drift) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].second.add_(params[i].second - before[i], 0.01);
  }
  ctx.mark("optimizer step");
}

NamedTensors ReplicaState::replica_params() {
  NamedTensors out;
  for (auto& p : model_->named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

void ReplicaState::collect(RankContext& ctx, RankUpdate& out) {
  if (!dp_group(ctx))
    out.loss = out.valid_targets > 0 ? out.record.loss_sum / static_cast<double>(out.valid_targets) : 0.0;
  if (ctx.rank != 0) return;
  out.grads = std::move(grads_before_step_);
  UntimedScope untimed(ctx);
  out.params_after = params_of(model_, ctx.spec->dtype);
}

torch::Tensor ParamStepper::stepped(const RankContext& ctx, const std::string& name, const torch::Tensor& p) {
  if (ctx.spec->dtype != DType::BFloat16) return p;
  auto& master = masters_[name];
  if (!master.defined()) master = p.detach().to(torch::kFloat32);
  return master;
}

OptimizerSlot& ParamStepper::slot(const RankContext& ctx, const std::string& name, const torch::Tensor& like,
                                  bool allocate) {
  OptimizerSlot& s = slots_[name];
  if (allocate) allocate_slots(ctx.spec->optimizer, s, like);
  return s;
}

std::vector<StatePiece> ParamStepper::state(const RankContext& ctx,
                                            const std::vector<std::pair<std::string, torch::Tensor>>& params,
                                            bool saves, bool allocate) {
  std::vector<StatePiece> out;
  for (const auto& [name, p] : params) {
    StatePiece s;
    s.tensor = name;
    s.shape = p.sizes().vec();
    s.offset.assign(s.shape.size(), 0);
    s.saves = saves;
    s.param = stepped(ctx, name, p);
    const OptimizerSlot& sl = slot(ctx, name, s.param, allocate);
    s.m = sl.m;
    s.v = sl.v;
    out.push_back(std::move(s));
  }
  return out;
}

void ParamStepper::round_into(const RankContext& ctx,
                              const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  if (ctx.spec->dtype != DType::BFloat16) return;
  torch::NoGradGuard ng;
  for (const auto& [name, p] : params) p.copy_(masters_.at(name));
}

std::vector<StatePiece> ReplicaState::checkpoint_state(RankContext& ctx, bool allocate) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : model_->named_parameters()) params.emplace_back(p.key(), p.value());
  return stepper_.state(ctx, params, ctx.rank == 0, allocate);
}

void ReplicaState::after_load(RankContext& ctx) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : model_->named_parameters()) params.emplace_back(p.key(), p.value());
  stepper_.round_into(ctx, params);
}

}  // namespace gradcert
