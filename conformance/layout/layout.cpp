#include "conformance/layout/layout.hpp"

#include <algorithm>
#include <map>

namespace gradcert {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string fsdp_unit_of(const std::string& param) {
  if (param.rfind("blocks.", 0) == 0) return param.substr(0, param.find('.', 7));
  if (param.rfind("wte", 0) == 0 || param.rfind("wpe", 0) == 0) return "embed";
  return "head";
}

TpSplit tp_split_of(const std::string& param) {
  if (ends_with(param, ".qkv.weight")) return TpSplit::ColumnQkv;
  if (ends_with(param, ".fc.weight") || ends_with(param, ".fc.bias")) return TpSplit::Column;
  if (ends_with(param, ".proj.weight") || ends_with(param, ".fc_out.weight")) return TpSplit::Row;
  return TpSplit::Replicated;
}

std::pair<int, int> stage_blocks(int layers, int pp, int stage) {
  return {static_cast<int>(static_cast<int64_t>(stage) * layers / pp),
          static_cast<int>(static_cast<int64_t>(stage + 1) * layers / pp)};
}

std::vector<ParamPlace> tiny_lm_layout(const ModelSpec& m) {
  const int64_t d = m.d_model, V = m.vocab, ff = m.d_ff, T = m.max_len;
  std::vector<ParamPlace> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, int block) {
    ParamPlace p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.numel = 1;
    for (auto x : p.shape) p.numel *= x;
    p.block = block;
    p.fsdp_unit = fsdp_unit_of(p.name);
    p.tp = tp_split_of(p.name);
    out.push_back(std::move(p));
  };
  add("wte.weight", {V, d}, -1);
  add("wpe.weight", {T, d}, -1);
  for (int i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    add(b + "ln1.weight", {d}, i);
    add(b + "ln1.bias", {d}, i);
    add(b + "qkv.weight", {3 * d, d}, i);  // NOTE [no key bias] in model.cpp
    add(b + "proj.weight", {d, d}, i);
    add(b + "proj.bias", {d}, i);
    add(b + "ln2.weight", {d}, i);
    add(b + "ln2.bias", {d}, i);
    add(b + "fc.weight", {ff, d}, i);
    add(b + "fc.bias", {ff}, i);
    add(b + "fc_out.weight", {d, ff}, i);
    add(b + "fc_out.bias", {d}, i);
  }
  add("ln_f.weight", {d}, -1);
  add("ln_f.bias", {d}, -1);
  add("lm_head.weight", {V, d}, -1);
  return out;
}

TinyLMCounts tiny_lm_counts(const ModelSpec& m) {
  TinyLMCounts c;
  c.layers = m.layers;
  std::map<std::string, int64_t> units;
  for (const auto& p : tiny_lm_layout(m)) {
    c.total += p.numel;
    units[p.fsdp_unit] += p.numel;
    if (p.tp != TpSplit::Replicated) c.tp_split += p.numel;
    if (p.block >= 0) {
      c.blocks += p.numel;
      if (p.block == 0) c.block += p.numel;
    } else if (p.name.rfind("ln_f", 0) == 0) {
      c.final_norm += p.numel;
    } else if (p.name.rfind("lm_head", 0) == 0) {
      c.head += p.numel;
    } else {
      c.embeddings += p.numel;
    }
  }
  for (const auto& [name, n] : units) c.largest_fsdp_unit = std::max(c.largest_fsdp_unit, n);
  return c;
}

int64_t TinyLMCounts::stage(int pp, int s) const {
  const auto [first, end] = stage_blocks(layers, pp, s);
  return (end - first) * block + (s == 0 ? embeddings : 0) + (s == pp - 1 ? final_norm + head : 0);
}

EstimateInput tiny_lm_estimate_input(const Spec& spec, Sharding strategy, int rank) {
  const TinyLMCounts c = tiny_lm_counts(spec.model);
  const auto& t = spec.topology;
  EstimateInput in;
  in.params = c.total;
  in.strategy = strategy;
  in.world = t.world();
  in.tp = t.tp;
  in.pp = t.pp;
  in.layer_params = c.tp_split;
  // zero3 gathers the whole model at once; fsdp gathers one unit (embed, a block, head) at a time.
  in.largest_unit_params = strategy == Sharding::ZeRO3 ? c.total : c.largest_fsdp_unit;
  if (t.pp > 1) in.stage_params = c.stage(t.pp, (rank / t.tp) % t.pp);
  return in;
}

}  // namespace gradcert
