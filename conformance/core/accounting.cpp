#include "conformance/core/accounting.hpp"

#include <cmath>
#include <stdexcept>

namespace gradcert {

static void same_length(const std::vector<double>& s, const std::vector<int64_t>& n) {
  if (s.size() != n.size()) throw std::invalid_argument("loss sums and valid-target counts differ in length");
}

double global_token_mean(const std::vector<double>& loss_sums, const std::vector<int64_t>& valid_targets) {
  same_length(loss_sums, valid_targets);
  double S = 0;
  int64_t N = 0;
  for (size_t i = 0; i < loss_sums.size(); ++i) S += loss_sums[i], N += valid_targets[i];
  return N > 0 ? S / static_cast<double>(N) : 0.0;
}

double mean_of_local_means(const std::vector<double>& loss_sums, const std::vector<int64_t>& valid_targets) {
  same_length(loss_sums, valid_targets);
  if (loss_sums.empty()) return 0;
  double acc = 0;
  for (size_t i = 0; i < loss_sums.size(); ++i)
    acc += valid_targets[i] > 0 ? loss_sums[i] / static_cast<double>(valid_targets[i]) : 0.0;
  return acc / static_cast<double>(loss_sums.size());
}

StateRecipe mixed_precision_adam() { return {}; }

double model_state_bytes(double params, const StateRecipe& recipe) { return params * recipe.per_param(); }

double gib(double bytes) { return bytes / std::pow(2.0, 30); }

Scaling scaling(double single_rate, double multi_rate, int devices) {
  if (!(single_rate > 0) || !(multi_rate > 0) || devices < 1)
    throw std::invalid_argument("scaling needs positive rates and at least one device");
  Scaling s;
  s.speedup = multi_rate / single_rate;
  s.efficiency = s.speedup / devices;
  s.gpu_hours_ratio = devices / s.speedup;
  return s;
}

}  // namespace gradcert
