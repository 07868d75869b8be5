#include "reports/differences.hpp"

#include <cctype>

namespace gradcert::reports {

const char* difference_kind_name(DifferenceKind k) {
  switch (k) {
    case DifferenceKind::RunFailed: return "run_failed";
    case DifferenceKind::CheckFailed: return "check_failed";
    case DifferenceKind::UpdateSize: return "update_size";
    case DifferenceKind::WindowCount: return "window_count";
    case DifferenceKind::Loss: return "loss";
    case DifferenceKind::Tensors: return "tensors";
    case DifferenceKind::Grads: return "grads";
    case DifferenceKind::Params: return "params";
    case DifferenceKind::Compare: return "compare";
    case DifferenceKind::Other: return "other";
  }
  return "other";
}

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// A side's own difference: its failed run, or one of its failed checks.
bool side_difference(const std::string& role, const AuditSide& side, const RunReport& run, AuditDifference& d) {
  const std::string who = role + " (" + side.name + "): ";
  if (!starts_with(d.text, who)) return false;
  const std::string rest = d.text.substr(who.size());
  if (!run.error.empty() && starts_with(rest, "run failed: ")) {
    d.kind = DifferenceKind::RunFailed;
    d.side = role;
    return true;
  }
  for (const auto& c : run.checks)
    if (c.verdict == Verdict::Fail && starts_with(rest, "check " + c.id + " failed: ")) {
      d.kind = DifferenceKind::CheckFailed;
      d.side = role;
      d.check = c.id;
      return true;
    }
  return false;
}

// "update U: ..." with U one of the report's updates.
bool update_difference(const AuditReport& r, AuditDifference& d) {
  const std::string lead = "update ";
  if (!starts_with(d.text, lead)) return false;
  size_t end = lead.size();
  while (end < d.text.size() && std::isdigit(static_cast<unsigned char>(d.text[end]))) ++end;
  if (end == lead.size() || end - lead.size() > 9 || d.text.compare(end, 2, ": ") != 0) return false;
  const int u = std::stoi(d.text.substr(lead.size(), end - lead.size()));
  bool known = false;
  for (const auto& x : r.updates) known |= x.update == u;
  if (!known) return false;
  const std::string rest = d.text.substr(end + 2);
  d.update = u;
  d.kind = starts_with(rest, "B_update differs") ? DifferenceKind::UpdateSize
           : starts_with(rest, "N differs")      ? DifferenceKind::WindowCount
           : starts_with(rest, "loss differs")   ? DifferenceKind::Loss
                                                 : DifferenceKind::Tensors;
  return true;
}

}  // namespace

std::vector<AuditDifference> classify_differences(const AuditReport& r) {
  std::vector<AuditDifference> out;
  for (const auto& text : r.differences) {
    AuditDifference d;
    d.text = text;
    if (side_difference("before", r.before_side, r.before, d) || side_difference("after", r.after_side, r.after, d) ||
        update_difference(r, d)) {
    } else if (starts_with(text, "gradients differ between the two sides")) {
      d.kind = DifferenceKind::Grads;
    } else if (starts_with(text, "parameters differ between the two sides")) {
      d.kind = DifferenceKind::Params;
    } else if (starts_with(text, "cannot compare the two runs")) {
      d.kind = DifferenceKind::Compare;
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace gradcert::reports
