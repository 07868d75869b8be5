// A rank's place in the process grid: one rule for every layer.
#pragma once

#include "conformance/core/plan.hpp"

namespace gradcert {

/// A rank's coordinates. Global rank = dp x (tp x pp) + pp x tp + tp (see Plan::dp_rank_of).
struct Coords {
  int dp = 0, tp = 0, pp = 0;
};
Coords coords_of(const Plan& plan, int global_rank);
int global_rank_of(const Plan& plan, Coords c);

}  // namespace gradcert
