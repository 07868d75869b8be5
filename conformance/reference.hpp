// The reference: one process, every example of an update in one concatenated batch, float64.
#pragma once
#include <vector>

#include "conformance/plan.hpp"
#include "conformance/tensors.hpp"

namespace gradcert {

/// What the reference computed for one update.
struct ReferenceUpdate {
  int update = 0;
  double loss = 0;            ///< L = sum of token losses / N (0 when N = 0)
  int64_t valid_targets = 0;  ///< N, recounted from the concatenated batch's labels
  TensorMap grads;            ///< grad L (zero when N = 0)
  TensorMap params_after;     ///< parameters after the optimizer step
};

/// Runs the reference over plan.windows in order (float64, CPU), starting from
/// initial_params(spec). The topology of the plan does not matter, only each window's ids.
std::vector<ReferenceUpdate> run_reference(const Spec& spec, const Plan& plan);

}  // namespace gradcert
