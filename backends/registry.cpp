// The list of built-in strategies and the mutants each can run with.
#include <algorithm>
#include <stdexcept>

#include "backends/registry.hpp"

namespace gradcert {

std::vector<std::string> backend_names() { return {"single", "ddp"}; }

std::vector<std::string> mutant_names(const std::string& backend) {
  // local-mean is the correct rule at D = 1; the others need several ranks.
  if (backend == "single") return {"micro-mean", "stale-window-count", "double-accum-division", "pad-as-target"};
  if (backend == "ddp")
    return {"local-mean",    "micro-mean",   "stale-window-count",   "double-accum-division",
            "pad-as-target", "missing-final-sync", "sampler-pad-duplicate"};
  return {};
}

}  // namespace gradcert
