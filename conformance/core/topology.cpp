#include "conformance/core/topology.hpp"

namespace gradcert {

Coords coords_of(const Plan& plan, int r) { return {r / (plan.tp * plan.pp), r % plan.tp, (r / plan.tp) % plan.pp}; }

int global_rank_of(const Plan& plan, Coords c) { return c.dp * plan.tp * plan.pp + c.pp * plan.tp + c.tp; }

}  // namespace gradcert
