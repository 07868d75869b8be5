// Where each parameter of the tiny LM lives: the one source for the backends' splits
// (pipeline stages, FSDP units, TP slices) and for the memory estimator. Torch-free.
#pragma once
#include <cstdint>

#include "conformance/core/spec.hpp"

namespace gradcert {

/// Parameter counts of the tiny LM of conformance/model.hpp (no torch needed).
struct TinyLMCounts {
  int64_t embeddings = 0;  ///< wte + wpe
  int64_t block = 0;       ///< one block
  int64_t blocks = 0;      ///< all blocks (what TP splits)
  int64_t final_norm = 0;  ///< ln_f
  int64_t head = 0;        ///< lm_head (no bias)
  int64_t total = 0;
  int layers = 0;
  int64_t block_tp_split = 0;  ///< of one block, what backends/tp.cpp splits (q|k|v, proj and
                               ///< fc_out weights, fc weight and bias); the rest is replicated
  /// The largest FSDP unit when each block is a unit and the root holds the rest.
  int64_t largest_unit() const;
  /// Parameters of pipeline stage `stage` of `pp` as backends/pp.cpp splits them: blocks
  /// [stage L / pp, (stage + 1) L / pp), the embeddings on the first, ln_f and the head on the last.
  int64_t stage(int pp, int stage) const;
};
TinyLMCounts tiny_lm_counts(const ModelSpec& m);

}  // namespace gradcert
