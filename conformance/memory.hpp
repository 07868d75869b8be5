// Model-state memory: the lower bound from an explicit bytes-per-parameter recipe, divided
// as each strategy shards it, and the memory checks (lower bound, budget). Torch-free.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/accounting.hpp"
#include "conformance/checks.hpp"
#include "conformance/dataset.hpp"
#include "conformance/spec.hpp"

namespace gradcert {

/// Bytes per parameter of a training recipe, with what each part is, so the figure can be
/// printed as the sum it is ("2 (bf16 weights) + 2 (bf16 grads) + ... = 16").
struct Recipe {
  std::string name;
  StateRecipe bytes;  ///< weight, grad, master, moment bytes per parameter
  std::string weight_label, grad_label, master_label, moment_label;
  std::string note;   ///< where the recipe comes from / whom it describes

  /// weight + grad + master + moment bytes.
  double per_param() const { return bytes.per_param(); }
  /// "2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 8 (two fp32 moments) = 16 B/param";
  /// parts of 0 bytes are left out.
  std::string breakdown() const;
};

/// The named recipes, in a fixed order: mixed-adam (16, the default), fp32-adam (16),
/// fp32-grads-adam (18, DeepSpeed's estimator), sgd (8), sgd-momentum (12).
std::vector<Recipe> named_recipes();
/// A named recipe; throws std::invalid_argument listing the names.
Recipe recipe_by_name(const std::string& name);
/// The recipe a gradcert run uses (conformance/model.hpp, backends/strategy_common.cpp):
/// weights and grads in the run dtype, an fp32 master for bfloat16, and the optimizer's
/// slots (AdamW m and v; SGD momentum buffer) in the master's dtype, else the run dtype.
/// Named "<dtype>-<optimizer>", e.g. "float64-sgd", "float64-sgd-momentum", "bfloat16-adamw".
Recipe recipe_for_run(DType dtype, const OptimizerSpec& optimizer);

/// How a strategy places model state. See NOTE [per-rank model state] in memory.cpp.
enum class Sharding { Single, DDP, ZeRO1, ZeRO2, ZeRO3, FSDP, TP, PP };
/// "single" | "ddp" | "zero1" | "zero2" | "zero3" | "fsdp" | "tp" | "pp".
std::string sharding_name(Sharding s);
/// Parses a strategy name; throws std::invalid_argument listing the names.
Sharding parse_sharding(const std::string& name);

/// What an estimate is a function of. Counts are parameters, not bytes.
struct EstimateInput {
  int64_t params = 0;              ///< every parameter (for LoRA: base + adapters)
  int64_t trainable = -1;          ///< -1: all (full fine-tuning); else LoRA adapters only
  Recipe recipe = recipe_by_name("mixed-adam");
  Sharding strategy = Sharding::Single;
  int world = 1;                   ///< ranks = dp x tp x pp
  int tp = 1, pp = 1;              ///< model-parallel degrees (1 = none)
  int64_t layer_params = -1;       ///< parameters TP splits (inside the blocks); -1: all
  int64_t largest_unit_params = 0; ///< ZeRO-3 / FSDP: the largest unit gathered at once
  int64_t stage_params = -1;       ///< PP: this rank's stage when the layout is known (-1: the average stage)
};

/// Per-rank model-state bytes by component, for the rank that holds the most.
struct MemoryEstimate {
  EstimateInput input;
  int dp = 1;                    ///< data-parallel degree world / (tp x pp)
  int64_t rank_params = 0;       ///< parameters this rank's model part has (after TP, PP)
  int64_t rank_trainable = 0;    ///< of which trainable
  int64_t weights = 0, grads = 0, master = 0, moments = 0;
  int64_t gathered_unit = 0;     ///< ZeRO-3 / FSDP: unsharded weights + grads of the largest unit
  std::vector<std::string> formulas;  ///< one line per component: how it was computed
  std::vector<std::string> excluded;  ///< what the bound leaves out, in words

  /// weights + grads + master + moments (what memory.lower_bound compares).
  int64_t model_state() const { return weights + grads + master + moments; }
  /// model_state + gathered_unit: the per-rank lower bound.
  int64_t total() const { return model_state() + gathered_unit; }
};

/// The per-rank lower bound. Throws std::invalid_argument on inconsistent input (world not
/// a multiple of tp x pp, single with world > 1, trainable > params, ...).
MemoryEstimate estimate_memory(const EstimateInput& in);
/// What the bound excludes (also in every MemoryEstimate).
std::vector<std::string> excluded_from_estimate();
/// The estimate as printed by `gradcert estimate`: recipe breakdown, components, the
/// "model state: 9.6e9 B = 8.94 GiB (9600000000 B)" line, and the excluded list.
std::string estimate_text(const MemoryEstimate& e);

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

/// The recipe of a built-in backend run: recipe_for_run plus what the strategy's
/// implementation keeps beyond it (NOTE [built-in model state] in memory.cpp): ZeRO-1/2
/// step a separate master shard in the run dtype; FSDP accumulates the gradient shard in
/// the master's dtype (float32 for bfloat16 runs).
Recipe recipe_for_strategy(Sharding strategy, DType dtype, const OptimizerSpec& optimizer);
/// The estimate memory.lower_bound holds global rank `rank` of a built-in backend run to:
/// the tiny LM's counts, recipe_for_strategy, the spec's topology; TP splits exactly what
/// backends/tp.cpp splits, PP counts the rank's own stage. Throws std::invalid_argument for
/// a backend that is not a built-in strategy.
MemoryEstimate estimate_for_run(const Spec& spec, const std::string& backend, int rank);

/// "8.94 GiB", "3.20 MiB", "512 B" (binary units, 2 decimals above 1 KiB).
std::string human_bytes(double bytes);
/// Scientific form, trailing zeros dropped, up to 5 significant digits: 9.6e9, 1.284e9, 5.792e3.
std::string sci(double x);

/// "short" | "typical" | "long".
std::string bucket_name(LengthBucket b);
/// The length a bucket stands for in the spec's dataset: short = p10, typical = p50, long =
/// the maximum (nearest-rank percentiles over every example's token count).
int bucket_length(const Spec& spec, LengthBucket b);
/// `count` example ids whose lengths are closest to bucket_length (examples with targets
/// first, then lower ids), ascending. count is capped at the dataset size.
std::vector<int64_t> bucket_ids(const Spec& spec, LengthBucket b, int count);

/// Peak memory of one phase (load, forward, backward, optimizer step, save, ...) on one
/// rank for one length bucket.
struct PhasePeak {
  int rank = 0;
  std::string bucket;             ///< "short" | "typical" | "long"
  std::string phase;
  std::string device = "cpu";     ///< what peak_bytes measures: "cpu" (tracked) or "cuda:N"
  int64_t peak_bytes = 0;         ///< tracked (CPU) or allocated (CUDA) peak during the phase
  int64_t current_bytes = 0;      ///< live bytes when the phase ended
  double seconds = 0;
  int64_t process_high_water_bytes = -1;  ///< VmHWM when the phase ended (-1: unknown)
  int64_t reserved_peak_bytes = -1;       ///< CUDA caching allocator reserved peak (-1: n/a)
};

/// memory.lower_bound: measured model-state bytes (exact storage sum) hold at least the
/// estimate's model_state() and at most 2% more. Figure: (measured - estimate) / estimate.
/// Skips when either is not positive (not measured).
CheckResult check_memory_lower_bound(int64_t measured_model_state_bytes, int64_t estimate_model_state_bytes);
/// memory.budget: every phase peak <= budget_bytes. Skips when budget_bytes <= 0 (no budget)
/// or there are no peaks. Figure: the largest peak; tolerance: the budget. The detail names
/// the rank, bucket and phase of the largest peak ("rank 1, long bucket, backward: 3.20 MiB
/// > budget 2.00 MiB").
CheckResult check_memory_budget(const std::vector<PhasePeak>& peaks, double budget_bytes);

}  // namespace gradcert
