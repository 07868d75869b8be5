// The memory checks: model state against the estimate's lower bound, and peaks against a budget.
#include <cstdio>
#include <string>

#include "conformance/checks/checks.hpp"
#include "conformance/core/format.hpp"

namespace gradcert {

CheckResult check_memory_lower_bound(int64_t measured, int64_t estimate) {
  CheckResult c;
  c.id = "memory.lower_bound";
  c.tolerance = 0.02;
  if (measured <= 0 || estimate <= 0) {
    c.verdict = Verdict::Skip;
    c.detail = "model-state bytes not measured";
    return c;
  }
  const double m = static_cast<double>(measured), e = static_cast<double>(estimate);
  c.figure = (m - e) / e;
  const std::string figures = "measured " + std::to_string(measured) + " B (" + human_bytes(m) + "), estimate " +
                              std::to_string(estimate) + " B (" + human_bytes(e) + ")";
  if (m < e * (1 - 1e-12)) {
    c.verdict = Verdict::Fail;
    c.detail = figures + ": below the lower bound (the recipe does not describe this run, or state is missing)";
  } else if (c.figure > c.tolerance) {
    c.verdict = Verdict::Fail;
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.2f%%", 100 * c.figure);
    c.detail = figures + ": " + pct + " above the bound (extra copies of model state)";
  } else {
    c.verdict = Verdict::Pass;
    c.detail = figures;
  }
  return c;
}

CheckResult check_memory_budget(const std::vector<PhasePeak>& peaks, double budget_bytes) {
  CheckResult c;
  c.id = "memory.budget";
  c.tolerance = budget_bytes > 0 ? budget_bytes : 0;
  if (!(budget_bytes > 0)) {
    c.verdict = Verdict::Skip;
    c.detail = "no memory budget set";
    return c;
  }
  if (peaks.empty()) {
    c.verdict = Verdict::Skip;
    c.detail = "no peaks measured";
    return c;
  }
  const PhasePeak* worst = &peaks.front();
  for (const auto& p : peaks)
    if (p.peak_bytes > worst->peak_bytes) worst = &p;
  c.figure = static_cast<double>(worst->peak_bytes);
  const bool over = c.figure > budget_bytes;
  c.verdict = over ? Verdict::Fail : Verdict::Pass;
  c.detail = "rank " + std::to_string(worst->rank) + ", " + worst->bucket + " bucket, " + worst->phase + ": " +
             human_bytes(c.figure) + (over ? " > " : " <= ") + "budget " + human_bytes(budget_bytes) +
             (human_bytes(c.figure) == human_bytes(budget_bytes)
                  ? " (" + std::to_string(worst->peak_bytes) + " B vs " + g3_text(budget_bytes) + " B)"
                  : "") +
             (worst->device == "cpu" ? "" : " (" + worst->device + ")");
  return c;
}

}  // namespace gradcert
