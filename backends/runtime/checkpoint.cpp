#include "backends/runtime/checkpoint.hpp"

#include <filesystem>
#include <map>

namespace gradcert {

// NOTE [checkpoints] A built-in backend describes the state it holds as StatePieces: views of
// its own tensors (what the optimizer steps, and the optimizer's slots) with their place in
// the canonical parameters. Saving writes the pieces a rank `saves` (one replica of what is
// replicated) in the checkpoint format (NOTE [checkpoint format]); loading assembles each
// canonical tensor from the files, whoever wrote them, and copies every piece this rank holds
// out of it, so a checkpoint of one strategy loads into another. The optimizer's step counter
// and the sampler's position are checkpoint.json's; the worker restores them (RankContext::
// step_shift, the windows it consumes). What is rebuilt rather than saved: gradients (a leg
// ends on a window boundary, where none are pending), gathered parameters, and the compute
// weights of bfloat16 runs (rounded from the float32 masters, as each step does).

void allocate_slots(const OptimizerSpec& opt, OptimizerSlot& slot, const torch::Tensor& like) {
  for (const auto& s : optimizer_slots(opt)) {
    torch::Tensor& t = s == "m" ? slot.m : slot.v;
    if (!t.defined()) t = torch::zeros_like(like);
  }
}

std::vector<StatePiece> flat_state(const FlatLayout& layout, int64_t begin, int64_t n, const torch::Tensor& master,
                                   const OptimizerSlot& slot) {
  std::vector<StatePiece> out;
  for (const auto& e : layout.entries) {
    const int64_t a = std::max(begin, e.offset), b = std::min(begin + n, e.offset + e.numel);
    if (a >= b) continue;
    StatePiece p;
    p.tensor = e.name;
    p.shape = e.shape;
    p.flat_begin = a - e.offset;
    p.param = master.slice(0, a - begin, b - begin);
    if (slot.m.defined()) p.m = slot.m.slice(0, a - begin, b - begin);
    if (slot.v.defined()) p.v = slot.v.slice(0, a - begin, b - begin);
    out.push_back(std::move(p));
  }
  return out;
}

namespace {

ShardPiece shard_of(const StatePiece& s, const std::string& name, const torch::Tensor& values, DType dtype) {
  ShardPiece p;
  p.tensor = name;
  p.shape = s.shape;
  p.replica = 0;
  p.flat_begin = s.flat_begin;
  p.offset = s.offset;
  p.data = to_host(name, s.flat_begin >= 0 ? values.reshape({-1}) : values, dtype);
  return p;
}

}  // namespace

int64_t save_checkpoint(RankContext& ctx, Backend& backend, const std::string& dir, const CheckpointRecord& record) {
  torch::NoGradGuard ng;
  std::filesystem::create_directories(dir);
  const DType dtype = checkpoint_dtype(ctx.spec->dtype);
  std::vector<ShardPiece> pieces;
  for (const StatePiece& s : backend.checkpoint_state(ctx, /*allocate_slots=*/false)) {
    if (!s.saves) continue;
    pieces.push_back(shard_of(s, "param." + s.tensor, s.param, dtype));
    if (ctx.mutant == Mutant::ResumeOptimizerUnsaved) continue;  // the planted bug: weights only
    if (s.m.defined()) pieces.push_back(shard_of(s, "optim." + s.tensor + ".m", s.m, dtype));
    if (s.v.defined()) pieces.push_back(shard_of(s, "optim." + s.tensor + ".v", s.v, dtype));
  }
  // resume-shard-unwritten: the last rank's save never happens (its shards are lost).
  if (!(ctx.mutant == Mutant::ResumeShardUnwritten && ctx.rank == ctx.world - 1))
    write_placed_file(dir + "/" + checkpoint_file(ctx.rank), pieces,
                      {{"gradcert.checkpoint", "after update " + std::to_string(record.updates_done - 1)}});
  if (ctx.pg) ctx.pg->barrier()->wait();
  if (ctx.rank == 0) write_checkpoint_record(dir, record);
  int64_t held = 0;
  for (const auto& p : pieces) held += static_cast<int64_t>(p.data.held.size() * sizeof(double));
  return held;
}

CheckpointRecord load_checkpoint(RankContext& ctx, Backend& backend, const std::string& dir, const std::string& nonce) {
  torch::NoGradGuard ng;
  const bool fresh_optimizer = ctx.mutant == Mutant::ResumeOptimizerUnsaved;
  OptimizerSpec expect_opt = ctx.spec->optimizer;
  if (fresh_optimizer) {  // the planted bug: it neither saved nor expects any slot
    expect_opt.name = "sgd";
    expect_opt.momentum = 0;
  }
  const TensorMap shapes = initial_shapes(*ctx.spec);
  const Checkpoint cp = read_checkpoint(dir, /*world: the saver's*/ 0,
                                        checkpoint_expectation(shapes, expect_opt, ctx.spec->dtype), nonce);
  const auto type = scalar_type(checkpoint_dtype(ctx.spec->dtype));
  std::string cached_name;
  torch::Tensor cached;  // one canonical tensor at a time (pieces come grouped by tensor)
  auto canonical = [&](const std::string& name) {
    if (name != cached_name) {
      cached = from_host(cp.tensors.at(name), type);
      cached_name = name;
    }
    return cached;
  };
  for (const StatePiece& s : backend.checkpoint_state(ctx, /*allocate_slots=*/!fresh_optimizer)) {
    for (auto [kind, target] : {std::pair<std::string, torch::Tensor>{"param." + s.tensor, s.param},
                                {"optim." + s.tensor + ".m", s.m},
                                {"optim." + s.tensor + ".v", s.v}}) {
      if (!target.defined() || !cp.tensors.count(kind)) continue;
      torch::Tensor src = canonical(kind);
      if (s.flat_begin >= 0) {
        src = src.reshape({-1}).slice(0, s.flat_begin, s.flat_begin + target.numel());
      } else {
        for (size_t d = 0; d < s.offset.size(); ++d)
          src = src.narrow(static_cast<int64_t>(d), s.offset[d], target.size(d));
      }
      target.copy_(src.reshape(target.sizes()));
    }
  }
  backend.after_load(ctx);
  return cp.record;
}

}  // namespace gradcert
