// The memory vocabulary: training recipes (bytes per parameter), how a strategy places
// model state, an estimate's input and result, and measured phase peaks. Torch-free data;
// conformance/memory computes the estimates.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/accounting.hpp"

namespace gradcert {

/// Bytes per parameter of a training recipe, with what each part is, so the figure can be
/// printed as the sum it is ("2 (bf16 weights) + 2 (bf16 grads) + ... = 16").
struct Recipe {
  std::string name = "mixed-adam";
  StateRecipe bytes;  ///< weight, grad, master, moment bytes per parameter (default: the seed's 2 + 2 + 4 + 8)
  std::string weight_label = "bf16 weights", grad_label = "bf16 grads", master_label = "fp32 master",
              moment_label = "two fp32 moments";
  std::string note = "mixed-precision Adam (the seed's default)";  ///< where the recipe comes from / whom it describes

  /// weight + grad + master + moment bytes.
  double per_param() const { return bytes.per_param(); }
  /// "2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 8 (two fp32 moments) = 16 B/param";
  /// parts of 0 bytes are left out.
  std::string breakdown() const;
};

/// How a strategy places model state. See NOTE [per-rank model state] in memory.cpp.
enum class Sharding { Single, DDP, ZeRO1, ZeRO2, ZeRO3, FSDP, TP, PP };
/// "single" | "ddp" | "zero1" | "zero2" | "zero3" | "fsdp" | "tp" | "pp".
std::string sharding_name(Sharding s);
/// Parses a strategy name; throws std::invalid_argument listing the names.
Sharding parse_sharding(const std::string& name);

/// What an estimate is a function of. Counts are parameters, not bytes.
struct EstimateInput {
  int64_t params = 0;      ///< every parameter (for LoRA: base + adapters)
  int64_t trainable = -1;  ///< -1: all (full fine-tuning); else LoRA adapters only
  Recipe recipe;           ///< default: mixed-adam (the seed's)
  Sharding strategy = Sharding::Single;
  int world = 1;                    ///< ranks = dp x tp x pp
  int tp = 1, pp = 1;               ///< model-parallel degrees (1 = none)
  int64_t layer_params = -1;        ///< parameters TP splits (inside the blocks); -1: all
  int64_t largest_unit_params = 0;  ///< ZeRO-3 / FSDP: the largest unit gathered at once
  int64_t stage_params = -1;        ///< PP: this rank's stage when the layout is known (-1: the average stage)
};

/// Per-rank model-state bytes by component, for the rank that holds the most.
struct MemoryEstimate {
  EstimateInput input;
  int dp = 1;                  ///< data-parallel degree world / (tp x pp)
  int64_t rank_params = 0;     ///< parameters this rank's model part has (after TP, PP)
  int64_t rank_trainable = 0;  ///< of which trainable
  int64_t weights = 0, grads = 0, master = 0, moments = 0;
  int64_t gathered_unit = 0;          ///< ZeRO-3 / FSDP: unsharded weights + grads of the largest unit
  std::vector<std::string> formulas;  ///< one line per component: how it was computed
  std::vector<std::string> excluded;  ///< what the bound leaves out, in words

  /// weights + grads + master + moments (what memory.lower_bound compares).
  int64_t model_state() const { return weights + grads + master + moments; }
  /// model_state + gathered_unit: the per-rank lower bound.
  int64_t total() const { return model_state() + gathered_unit; }
};

/// Peak memory of one phase (load, forward, backward, optimizer step, save, ...) on one
/// rank for one length bucket.
struct PhasePeak {
  int rank = 0;
  std::string bucket;  ///< "short" | "typical" | "long"
  std::string phase;
  std::string device = "cpu";  ///< what peak_bytes measures: "cpu" (tracked) or "cuda:N"
  int64_t peak_bytes = 0;      ///< tracked (CPU) or allocated (CUDA) peak during the phase
  int64_t current_bytes = 0;   ///< live bytes when the phase ended
  double seconds = 0;
  int64_t process_high_water_bytes = -1;  ///< VmHWM when the phase ended (-1: unknown)
  int64_t reserved_peak_bytes = -1;       ///< CUDA caching allocator reserved peak (-1: n/a)
};

/// One backend run's memory: the lower bound, the exact model state, and the phase peaks.
struct MemoryRunReport {
  std::string backend;
  int world = 1;
  bool has_estimate = false;
  MemoryEstimate estimate;
  int64_t measured_model_state_bytes = -1;  ///< -1: not measured
  double budget_bytes = 0;                  ///< 0: no budget
  std::vector<PhasePeak> peaks;             ///< every rank, bucket and phase
};

}  // namespace gradcert
