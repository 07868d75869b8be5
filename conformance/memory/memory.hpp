// Model-state memory: the lower bound from an explicit bytes-per-parameter recipe, divided
// as each strategy shards it, and the memory checks (lower bound, budget). Torch-free.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/accounting.hpp"
#include "conformance/core/format.hpp"
#include "conformance/core/memory_types.hpp"
#include "conformance/layout/layout.hpp"
#include "conformance/core/dataset.hpp"
#include "conformance/core/spec.hpp"

namespace gradcert {

/// The named recipes, in a fixed order: mixed-adam (16, the default), fp32-adam (16),
/// fp32-grads-adam (18, DeepSpeed's estimator), sgd (8), sgd-momentum (12).
std::vector<Recipe> named_recipes();
/// A named recipe; throws std::invalid_argument listing the names.
Recipe recipe_by_name(const std::string& name);
/// The recipe a gradcert run uses (conformance/model/model.hpp, backends/runtime/replica.cpp):
/// weights and grads in the run dtype, an fp32 master for bfloat16, and the optimizer's
/// slots (AdamW m and v; SGD momentum buffer) in the master's dtype, else the run dtype.
/// Named "<dtype>-<optimizer>", e.g. "float64-sgd", "float64-sgd-momentum", "bfloat16-adamw".
Recipe recipe_for_run(DType dtype, const OptimizerSpec& optimizer);

/// The per-rank lower bound. Throws std::invalid_argument on inconsistent input (world not
/// a multiple of tp x pp, single with world > 1, trainable > params, ...).
MemoryEstimate estimate_memory(const EstimateInput& in);
/// What the bound excludes (also in every MemoryEstimate).
std::vector<std::string> excluded_from_estimate();
/// The estimate as printed by `gradcert estimate`: recipe breakdown, components, the
/// "model state: 9.6e9 B = 8.94 GiB (9600000000 B)" line, and the excluded list.
std::string estimate_text(const MemoryEstimate& e);

/// The recipe of a built-in backend run: recipe_for_run plus what the strategy's
/// implementation keeps beyond it (NOTE [built-in model state] in memory.cpp): ZeRO-1/2
/// step a separate master shard in the run dtype; FSDP accumulates the gradient shard in
/// the master's dtype (float32 for bfloat16 runs).
Recipe recipe_for_strategy(Sharding strategy, DType dtype, const OptimizerSpec& optimizer);
/// The estimate memory.lower_bound holds global rank `rank` of a built-in backend run to:
/// the tiny LM's counts, recipe_for_strategy, the spec's topology; TP splits exactly what
/// backends/tp.cpp splits, PP counts the rank's own stage (conformance/layout).
MemoryEstimate estimate_for_run(const Spec& spec, Sharding strategy, int rank);
/// The estimate_for_run of the rank that holds the most (what a report's estimate shows).
MemoryEstimate estimate_for_heaviest_rank(const Spec& spec, Sharding strategy);

/// "short" | "typical" | "long".
std::string bucket_name(LengthBucket b);
/// The length a bucket stands for in the spec's dataset: short = p10, typical = p50, long =
/// the maximum (nearest-rank percentiles over every example's token count).
int bucket_length(const Spec& spec, LengthBucket b);
/// `count` example ids whose lengths are closest to bucket_length (examples with targets
/// first, then lower ids), ascending. count is capped at the dataset size.
std::vector<int64_t> bucket_ids(const Spec& spec, LengthBucket b, int count);

}  // namespace gradcert
