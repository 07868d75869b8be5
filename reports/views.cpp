#include "reports/views.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "conformance/core/format.hpp"

namespace gradcert::reports {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string pad(const std::string& s, size_t w, bool right) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 0.1 ? "%.4f" : "%.3f", s);
  return b;
}

std::string fixed(double x, const char* format) {
  char b[48];
  std::snprintf(b, sizeof b, format, x);
  return b;
}

std::string cell_bytes(int64_t b) { return b < 0 ? "-" : human_bytes(static_cast<double>(b)); }

std::string tolerance_text(const CheckResult& c) { return c.tolerance == 0 ? "exact" : figure_text(c.tolerance); }

std::string verdict_cell(const RunReport& r, const CheckResult& c) {
  if (r.inject.empty()) return verdict_name(c.verdict);
  return c.verdict == Verdict::Fail ? "caught" : verdict_name(c.verdict);
}

bool any_mutant(const Report& r) {
  for (const auto& run : r.runs)
    if (!run.inject.empty()) return true;
  return false;
}

std::string detected_by_text(const RunReport& r, const std::string& separator) {
  std::string by;
  for (const auto& id : r.detected_by()) by += (by.empty() ? "" : separator) + id;
  return by;
}

std::vector<MemoryRunReport> memory_runs(const Report& r) {
  std::vector<MemoryRunReport> out;
  for (const auto& run : r.runs)
    if (run.inject.empty() && run.error.empty() && run.has_memory) out.push_back(run.memory);
  return out;
}

std::vector<Throughput> throughput_runs(const Report& r) {
  std::vector<Throughput> out;
  for (const auto& run : r.runs)
    if (run.inject.empty() && run.error.empty() && run.has_throughput) out.push_back(run.throughput);
  return out;
}

int bucket_order(const std::string& b) { return b == "short" ? 0 : b == "typical" ? 1 : b == "long" ? 2 : 3; }

const PhasePeak* worst_of(const std::vector<PhasePeak>& peaks) {
  const PhasePeak* w = nullptr;
  for (const auto& p : peaks)
    if (!w || p.peak_bytes > w->peak_bytes) w = &p;
  return w;
}

std::string sensitivity_text(const RunReport& r) {
  if (!r.error.empty() || !r.inject.empty()) return "";
  const CheckResult* scale = find_check(r, "grad.scale");
  if (!scale || scale->verdict == Verdict::Skip || !(scale->tolerance > 0)) return "";
  std::string s = "sensitivity (" + run_label(r) + "): a uniform gradient scale error above " +
                  figure_text(100 * scale->tolerance) + "% fails grad.scale (tolerance " +
                  figure_text(scale->tolerance);
  if (scale->noise_floor >= 0)
    s += " = max(calibrated, " + figure_text(scale->floor_factor) + " x this run's noise floor " +
         figure_text(scale->noise_floor) + ")";
  s += "); a smaller one passes unseen";
  if (const CheckResult* parity = find_check(r, "grad.parity"); parity && parity->tolerance > 0)
    s +=
        ", as does a non-uniform gradient error below grad.parity's rel L2 tolerance " + figure_text(parity->tolerance);
  return s;
}

std::string diagnosis_text(const RunReport& r) {
  return r.diagnosis.ran ? "diagnosis (" + run_label(r) + "): " + r.diagnosis.note : "";
}

std::string diagnosis_headline(const RunReport& r) {
  const Diagnosis& d = r.diagnosis;
  if (!d.ran || d.best.id.empty()) return "";
  const std::string what = d.best.id + " (" + d.best.description + ") at " + figure_text(d.best.figure);
  if (d.matched) return "the gradient matches " + what;
  if (d.separated) return "the gradient matches, beyond its own rounding, " + what;
  return "the gradient matches no known objective (closest: " + what + ")";
}

std::string run_verdict(const RunReport& r) { return !r.error.empty() ? "error" : r.passed() ? "pass" : "fail"; }

const CheckResult* find_check(const RunReport& r, const std::string& id) {
  for (const auto& c : r.checks)
    if (c.id == id) return &c;
  return nullptr;
}

std::vector<std::string> check_ids(const AuditReport& r) {
  std::vector<std::string> ids;
  for (const auto* s : {&r.before, &r.after})
    for (const auto& c : s->checks)
      if (std::find(ids.begin(), ids.end(), c.id) == ids.end()) ids.push_back(c.id);
  return ids;
}

std::string figure_or(const CheckResult* c) { return c ? figure_text(c->figure) : "-"; }

std::string verdict_or(const RunReport& r, const CheckResult* c) {
  if (!r.error.empty()) return "error";
  return c ? verdict_name(c->verdict) : "-";
}

std::string tolerance_or(const CheckResult* before, const CheckResult* after) {
  const CheckResult* any = before ? before : after;
  return any && any->tolerance != 0 ? figure_text(any->tolerance) : "exact";
}

std::string side_facts_line(const AuditSide& s, const AuditSideFacts& f) {
  std::string line = side_title(s) + ": ";
  if (s.backend == kExternalBackend) {
    std::string v;
    for (const auto& [k, val] : f.versions) v += (v.empty() ? "" : ", ") + k + " " + val;
    line += "external stack" + (v.empty() ? std::string() : " [" + v + "]");
    if (!f.notes.empty()) line += "; notes: " + f.notes;
  } else if (s.backend == "observed") {
    line += "your job under gradcert observe: `" + s.command + "`";
  } else {
    line += "built-in gradcert backend (C++ on Gloo)";
    if (s.label == "fsdp") line += "; gradcert's own FSDP, not PyTorch FSDP1/FSDP2";
  }
  if (!s.inject.empty()) line += "; planted bug: " + s.inject;
  return line;
}

std::vector<AuditTensorDiff> worst_per_tensor(const AuditReport& r) {
  std::map<std::string, AuditTensorDiff> w;
  for (const auto& d : r.diffs) {
    auto [it, fresh] = w.emplace(d.name, d);
    if (fresh) continue;
    auto& x = it->second;
    x.grad_rel = std::max(x.grad_rel, d.grad_rel);
    x.grad_max_abs = std::max(x.grad_max_abs, d.grad_max_abs);
    x.param_rel = std::max(x.param_rel, d.param_rel);
    x.param_max_abs = std::max(x.param_max_abs, d.param_max_abs);
  }
  std::vector<AuditTensorDiff> out;
  for (auto& [n, d] : w) out.push_back(d);
  return out;
}

}  // namespace gradcert::reports
