#include "conformance/run/reference_source.hpp"

#include <malloc.h>

#include <thread>

#include "conformance/run/python_reference.hpp"

namespace gradcert {

ReferenceCache& reference_cache() {
  static ReferenceCache cache;
  return cache;
}

void start_early_reference(EarlyReference& early, const RunPlan& run, int ranks) {
  const Spec& spec = run.spec;
  if (run.external() || run.observed || needs_python_reference(spec) ||
      std::thread::hardware_concurrency() <= static_cast<unsigned>(ranks))
    return;
  early.plan = run.checked;
  if (reference_cache().find(spec, early.plan)) return;
  if (!ReferenceCache::keeps(spec, early.plan)) early.spill_dir = run.request.run_dir + "/reference";
  early.free = std::async(std::launch::async, [&early, spec] {
    auto free = free_running_reference(spec, early.plan, early.spill_dir, &early.stop, RouteThreads::One);
    ::malloc_trim(0);  // what this thread's malloc arena freed goes back, not beside the main thread's
    return free;
  });
}

}  // namespace gradcert
