// Where each parameter of the tiny LM lives: the one source for the backends' splits
// (pipeline stages, FSDP units, TP slices) and for the memory estimator. Torch-free.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/memory_types.hpp"
#include "conformance/core/spec.hpp"

namespace gradcert {

/// How backends/tp.cpp splits a parameter over the TP ranks.
enum class TpSplit {
  Replicated,  ///< every TP rank holds all of it (embeddings, norms, row-parallel biases, the head)
  Column,      ///< output features split (fc weight and bias)
  ColumnQkv,   ///< q|k|v: each of the three chunks column-split (every TP rank holds H/TP heads)
  Row,         ///< input features split (proj and fc_out weights)
};

/// One parameter of the tiny LM in canonical order (conformance/model: TinyLM).
struct ParamPlace {
  std::string name;  ///< canonical name ("blocks.0.qkv.weight")
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int block = -1;         ///< its block, or -1 (embeddings, ln_f, head)
  std::string fsdp_unit;  ///< "embed" | "blocks.<i>" | "head" (backends/fsdp.cpp)
  TpSplit tp = TpSplit::Replicated;
};

/// Every parameter of the tiny LM of `m`, in canonical order.
std::vector<ParamPlace> tiny_lm_layout(const ModelSpec& m);

/// The FSDP unit of a canonical parameter name: "blocks.<i>", "embed" (wte, wpe) or "head" (ln_f, lm_head).
std::string fsdp_unit_of(const std::string& param);
/// The TP split of a canonical parameter name.
TpSplit tp_split_of(const std::string& param);
/// Blocks [first, end) of pipeline stage `stage` of `pp` (stage 0 also holds the embeddings,
/// the last stage ln_f and the head).
std::pair<int, int> stage_blocks(int layers, int pp, int stage);

/// Parameter counts of the tiny LM, derived from tiny_lm_layout (no torch needed).
struct TinyLMCounts {
  int64_t embeddings = 0;  ///< wte + wpe
  int64_t block = 0;       ///< one block
  int64_t blocks = 0;      ///< all blocks
  int64_t final_norm = 0;  ///< ln_f
  int64_t head = 0;        ///< lm_head (no bias)
  int64_t total = 0;
  int layers = 0;
  int64_t tp_split = 0;           ///< parameters TP splits (Column or Row); the rest is replicated
  int64_t largest_fsdp_unit = 0;  ///< the largest FSDP unit (embed, a block, or head)
  /// Parameters of pipeline stage `stage` of `pp` (stage_blocks, embeddings first, head last).
  int64_t stage(int pp, int stage) const;
};
TinyLMCounts tiny_lm_counts(const ModelSpec& m);

/// The estimator's input for `strategy` on the spec's tiny LM, for global rank `rank` of
/// the spec's topology: the ONE place `gradcert estimate --model` and memory.lower_bound
/// both take their counts from (TP split, FSDP / ZeRO-3 unit, the rank's PP stage). The
/// recipe is left to the caller.
EstimateInput tiny_lm_estimate_input(const Spec& spec, Sharding strategy, int rank);

}  // namespace gradcert
