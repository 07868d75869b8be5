#include "backends/runtime/flat.hpp"

#include "backends/runtime/comm.hpp"

namespace gradcert {

c10::intrusive_ptr<c10d::Backend> dp_group(const RankContext& ctx) {
  if (ctx.dp_pg) return ctx.dp_pg;
  if (ctx.plan->dp > 1 && ctx.plan->dp == ctx.world) return ctx.pg;
  return {};
}

// NOTE [flat layout] The flat layout follows TensorMap order (by name). That keeps every
// FSDP unit contiguous: blocks.<i>.* together, then lm_head + ln_f, then wpe + wte.
FlatLayout FlatLayout::of(const TensorMap& params) {
  FlatLayout l;
  for (const auto& [name, t] : params) {
    l.entries.push_back({name, t.shape, l.total, t.numel()});
    l.total += t.numel();
  }
  return l;
}

const FlatLayout::Entry& FlatLayout::at(const std::string& name) const {
  for (const auto& e : entries)
    if (e.name == name) return e;
  throw std::invalid_argument("no parameter '" + name + "' in the flat layout");
}

std::vector<ShardPiece> flat_pieces(const FlatLayout& layout, DType dtype,
                                    const std::function<void(const FlatPut&)>& fill) {
  std::vector<ShardPiece> out;
  torch::NoGradGuard ng;
  fill([&](int64_t begin, const torch::Tensor& values) {
    const auto v = values.detach().to(torch::kFloat64).cpu().contiguous();
    const double* src = v.data_ptr<double>();
    const int64_t end = begin + v.numel();
    for (const auto& e : layout.entries) {  // the tensors [begin, end) spans
      const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
      if (lo >= hi) continue;
      ShardPiece p;
      p.tensor = e.name;
      p.shape = e.shape;
      p.flat_begin = lo - e.offset;
      p.data.name = e.name;
      p.data.shape = {hi - lo};
      p.data.dtype = dtype;
      p.data.held.assign(src + (lo - begin), src + (hi - begin));
      out.push_back(std::move(p));
    }
  });
  return out;
}

std::vector<ShardPiece> whole_pieces(const TensorMap& tensors, int replica) {
  std::vector<ShardPiece> out;
  for (const auto& [name, t] : tensors) {
    ShardPiece p;
    p.tensor = name;
    p.shape = t.shape;
    p.replica = replica;
    p.offset.assign(t.shape.size(), 0);
    p.data = t;
    out.push_back(std::move(p));
  }
  return out;
}

FlatShard::FlatShard(int64_t b, int64_t n, int d, int r)
    : begin(b), numel(n), shard((n + d - 1) / d), dp(d), dp_rank(r) {}

int64_t FlatShard::lo() const { return std::min(numel, dp_rank * shard); }
int64_t FlatShard::hi() const { return std::min(numel, (dp_rank + 1) * shard); }

torch::Tensor FlatShard::all_gather(RankContext& ctx, const torch::Tensor& my_shard) const {
  auto g = dp_group(ctx);
  if (!g) return my_shard.slice(0, 0, numel).clone();
  auto full = torch::empty({shard * dp}, my_shard.options());
  auto input = my_shard.contiguous();
  all_gather_into(*g, full, input);
  return full.slice(0, 0, numel);
}

torch::Tensor FlatShard::reduce_scatter(RankContext& ctx, const torch::Tensor& full, double divisor) const {
  auto padded = torch::zeros({shard * dp}, full.options());
  padded.slice(0, 0, numel).copy_(full);
  padded.div_(divisor);
  auto g = dp_group(ctx);
  if (!g) return padded;
  auto out = torch::empty({shard}, full.options());
  reduce_scatter_into(*g, out, padded);
  return out;
}

void scatter_into_params(const FlatLayout& layout, int64_t begin, const torch::Tensor& flat,
                         std::vector<std::pair<std::string, torch::Tensor>> params) {
  torch::NoGradGuard ng;
  const int64_t end = begin + flat.numel();
  for (auto& [name, t] : params) {
    const auto& e = layout.at(name);
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
    if (lo >= hi) continue;
    t.view({-1}).slice(0, lo - e.offset, hi - e.offset).copy_(flat.slice(0, lo - begin, hi - begin));
  }
}

}  // namespace gradcert
