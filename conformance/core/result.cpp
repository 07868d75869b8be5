#include "conformance/core/result.hpp"

namespace gradcert {

std::string verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Pass: return "pass";
    case Verdict::Fail: return "fail";
    case Verdict::Skip: return "skip";
  }
  return "skip";
}

bool RunReport::passed() const {
  if (!error.empty()) return false;
  for (const auto& c : checks)
    if (c.verdict == Verdict::Fail) return false;
  return true;
}

std::vector<std::string> RunReport::detected_by() const {
  std::vector<std::string> out;
  for (const auto& c : checks)
    if (c.verdict == Verdict::Fail) out.push_back(c.id);
  return out;
}

bool Report::passed() const {
  if (runs.empty() || interrupted) return false;
  for (const auto& r : runs) {
    if (r.inject.empty() && !r.passed()) return false;
    if (!r.inject.empty() && (!r.error.empty() || r.detected_by().empty())) return false;
  }
  return true;
}

std::string run_label(const RunReport& r) {
  std::string s = r.backend + " dp" + std::to_string(r.topology.dp);
  if (r.topology.tp > 1) s += " tp" + std::to_string(r.topology.tp);
  if (r.topology.pp > 1) s += " pp" + std::to_string(r.topology.pp);
  s += " " + r.dtype + " " + r.optimizer;
  if (r.resume_at > 0) {
    s += " resumed@" + std::to_string(r.resume_at) + (r.resume_backend != r.backend ? "->" + r.resume_backend : "");
    if (r.resume_world != r.topology.world()) s += " on " + std::to_string(r.resume_world) + " ranks";
  }
  if (!r.inject.empty()) s += " inject=" + r.inject;
  return s;
}

}  // namespace gradcert
