// Batch, objective, memory and throughput arithmetic from the domain reference (seed).
#pragma once
#include <cstdint>
#include <vector>

namespace gradcert {

/// The global token mean sum_r S_r / sum_r n_r (0 when there are no targets).
double global_token_mean(const std::vector<double>& loss_sums, const std::vector<int64_t>& valid_targets);
/// The mean of per-rank local means (S_r / n_r), the wrong objective; ranks with no
/// targets contribute 0, as a trainer that guards the division would.
double mean_of_local_means(const std::vector<double>& loss_sums, const std::vector<int64_t>& valid_targets);

/// Model-state bytes per parameter of a recipe (weights + grads + master + optimizer moments).
struct StateRecipe {
  double weight_bytes = 2, grad_bytes = 2, master_bytes = 4, moment_bytes = 8;
  double per_param() const { return weight_bytes + grad_bytes + master_bytes + moment_bytes; }
};
/// The seed's default: mixed-precision Adam, 2 + 2 + 4 + 8 = 16 bytes per parameter.
StateRecipe mixed_precision_adam();
/// params x bytes per parameter.
double model_state_bytes(double params, const StateRecipe& recipe);
/// bytes / 2^30.
double gib(double bytes);

/// Speedup, scaling efficiency (speedup / D) and GPU-hours ratio (D / speedup) of a run on
/// `devices` against one device, from useful work per second (e.g. valid target tokens/s).
struct Scaling {
  double speedup = 0, efficiency = 0, gpu_hours_ratio = 0;
};
Scaling scaling(double single_rate, double multi_rate, int devices);

}  // namespace gradcert
