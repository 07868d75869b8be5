#include "conformance/layout/layout.hpp"

#include <algorithm>

namespace gradcert {

TinyLMCounts tiny_lm_counts(const ModelSpec& m) {
  const int64_t d = m.d_model, V = m.vocab, ff = m.d_ff;
  TinyLMCounts c;
  c.embeddings = V * d + static_cast<int64_t>(m.max_len) * d;
  // ln1 (2d), qkv without bias (3d x d), proj (d x d + d), ln2 (2d), fc (d x ff + ff), fc_out (ff x d + d).
  c.block = 2 * d + 3 * d * d + (d * d + d) + 2 * d + (d * ff + ff) + (ff * d + d);
  c.blocks = c.block * m.layers;
  c.final_norm = 2 * d;
  c.head = V * d;
  c.total = c.embeddings + c.blocks + c.final_norm + c.head;
  c.layers = m.layers;
  c.block_tp_split = 3 * d * d + d * d + (d * ff + ff) + ff * d;
  return c;
}

int64_t TinyLMCounts::stage(int pp, int s) const {
  const int64_t first = static_cast<int64_t>(s) * layers / pp, end = static_cast<int64_t>(s + 1) * layers / pp;
  return (end - first) * block + (s == 0 ? embeddings : 0) + (s == pp - 1 ? final_norm + head : 0);
}

int64_t TinyLMCounts::largest_unit() const { return std::max(block, embeddings + final_norm + head); }

}  // namespace gradcert
