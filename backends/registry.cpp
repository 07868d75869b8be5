// The list of built-in strategies and the mutants each can run with.
#include <algorithm>
#include <stdexcept>

#include "backends/registry.hpp"

namespace gradcert {

std::vector<std::string> backend_names() { return {"single", "ddp", "zero1", "zero2", "zero3", "fsdp", "tp", "pp"}; }

std::vector<std::string> mutant_names(const std::string& backend) {
  // Every strategy shares the loss rule, so the normalisation bugs apply to all of them;
  // local-mean is the correct rule at D = 1 and so does not apply to single.
  std::vector<std::string> out = {"micro-mean", "stale-window-count", "double-accum-division", "pad-as-target"};
  if (backend == "single") return out;
  out.insert(out.begin(), "local-mean");
  out.push_back("sampler-pad-duplicate");
  if (backend == "ddp" || backend == "zero1" || backend == "tp" || backend == "pp") out.push_back("missing-final-sync");
  if (backend == "zero2" || backend == "zero3" || backend == "fsdp") out.push_back("shard-divide-factor");
  if (backend == "zero3" || backend == "fsdp") out.push_back("stale-gathered-params");
  if (backend == "tp") out.push_back("tp-counted-as-dp");
  return out;
}

}  // namespace gradcert
