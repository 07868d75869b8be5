// The reference: one process, every example of an update in one concatenated batch, float64.
#pragma once
#include <vector>

#include "conformance/core/plan.hpp"
#include "conformance/protocol/artifacts.hpp"

namespace gradcert {

/// Runs the reference over plan.windows in order (float64, CPU), starting from
/// initial_params(spec). The topology of the plan does not matter, only each window's ids.
std::vector<ReferenceUpdate> run_reference(const Spec& spec, const Plan& plan);

}  // namespace gradcert
