#include "conformance/core/throughput.hpp"

#include <algorithm>
#include <stdexcept>

namespace gradcert {

double median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

Throughput measure_throughput(const std::string& backend, int devices, const std::vector<TimedUpdate>& updates,
                              int warmup) {
  Throughput t;
  t.backend = backend;
  t.devices = devices;
  size_t first = static_cast<size_t>(std::max(0, warmup));
  if (first >= updates.size()) {
    first = 0;
    if (!updates.empty())
      t.note = "no update after " + std::to_string(warmup) + " warmup update(s): every update timed";
  }
  t.warmup_updates = static_cast<int>(first);
  double seconds = 0;
  int64_t inputs = 0, targets = 0;
  std::vector<double> steps;
  for (size_t i = first; i < updates.size(); ++i) {
    seconds += updates[i].seconds;
    inputs += updates[i].input_tokens;
    targets += updates[i].valid_targets;
    steps.push_back(updates[i].seconds);
  }
  t.timed_updates = static_cast<int>(steps.size());
  t.step_seconds = median(steps);
  if (seconds > 0) {
    t.input_tokens_per_s = static_cast<double>(inputs) / seconds;
    t.target_tokens_per_s = static_cast<double>(targets) / seconds;
  }
  return t;
}

void compare_to_single(Throughput& run, const Throughput& single) {
  run.scaling = scaling(single.target_tokens_per_s, run.target_tokens_per_s, run.devices);
  run.has_baseline = true;
}

}  // namespace gradcert
