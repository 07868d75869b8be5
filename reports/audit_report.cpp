#include "reports/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"

namespace gradcert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 0.1 ? "%.4f" : "%.3f", s);
  return b;
}

}  // namespace

// ---------------------------------------------------------------- writers

namespace {

/// Worst figure per tensor over the updates (the console and Markdown tables).
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

std::string side_facts_line(const AuditSide& s, const AuditSideFacts& f) {
  std::string line = side_title(s) + ": ";
  if (s.backend == kExternalBackend) {
    std::string v;
    for (const auto& [k, val] : f.versions) v += (v.empty() ? "" : ", ") + k + " " + val;
    line += "external stack" + (v.empty() ? std::string() : " [" + v + "]");
    if (!f.notes.empty()) line += "; notes: " + f.notes;
  } else {
    line += "built-in gradcert backend (C++ on Gloo)";
    if (s.label == "fsdp") line += "; gradcert's own FSDP, not PyTorch FSDP1/FSDP2";
  }
  if (!s.inject.empty()) line += "; planted bug: " + s.inject;
  return line;
}

json side_json(const AuditSide& s, const RunReport& r, const AuditSideFacts& f) {
  json checks = json::array();
  for (const auto& c : r.checks)
    checks.push_back({{"id", c.id}, {"verdict", verdict_name(c.verdict)}, {"figure", json_number(c.figure)},
                      {"tolerance", json_number(c.tolerance)}, {"detail", c.detail}});
  json j = {{"name", s.name},
            {"label", s.label},
            {"backend", s.backend},
            {"command", s.command.empty() ? json(nullptr) : json(s.command)},
            {"inject", s.inject.empty() ? json(nullptr) : json(s.inject)},
            {"topology", {{"dp", r.topology.dp}, {"tp", r.topology.tp}, {"pp", r.topology.pp}}},
            {"dtype", r.dtype},
            {"optimizer", r.optimizer},
            {"updates", r.updates},
            {"update_batch", r.update_batch},
            {"verdict", run_verdict(r)},
            {"run_dir", r.run_dir},
            {"wall_seconds", r.wall_seconds},
            {"checks", checks},
            {"versions", f.versions},
            {"notes", f.notes.empty() ? json(nullptr) : json(f.notes)},
            {"step_seconds_median", f.step_seconds_median},
            {"peak_memory_bytes", f.peak_memory_bytes ? json(*f.peak_memory_bytes) : json(nullptr)},
            {"model_state_bytes", f.model_state_bytes ? json(*f.model_state_bytes) : json(nullptr)},
            {"target_tokens_per_s", f.target_tokens_per_s ? json(*f.target_tokens_per_s) : json(nullptr)}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}


std::string pad(const std::string& s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

std::string figure_or(const CheckResult* c) { return c ? figure_text(c->figure) : "-"; }
std::string verdict_or(const RunReport& r, const CheckResult* c) {
  if (!r.error.empty()) return "error";
  return c ? verdict_name(c->verdict) : "-";
}

}  // namespace

std::string audit_json(const AuditReport& r) {
  const auto& e = r.environment;
  json updates = json::array(), tensors = json::array(), worst = json::array(), notes = json::array();
  for (const auto& u : r.updates)
    updates.push_back({{"update", u.update},
                       {"update_batch", {{"before", u.batch_before}, {"after", u.batch_after}}},
                       {"valid_targets", {{"before", u.n_before}, {"after", u.n_after}}},
                       {"loss", {{"before", json_number(u.loss_before)}, {"after", json_number(u.loss_after)}}},
                       {"step_seconds", {{"before", u.step_before}, {"after", u.step_after}}}});
  auto tensor_json = [](const AuditTensorDiff& d, bool with_update) {
    json j = {{"name", d.name},
              {"grad", {{"rel_l2", json_number(d.grad_rel)}, {"max_abs", json_number(d.grad_max_abs)}}},
              {"params", {{"rel_l2", json_number(d.param_rel)}, {"max_abs", json_number(d.param_max_abs)}}}};
    if (with_update) j["update"] = d.update;
    return j;
  };
  for (const auto& d : r.diffs) tensors.push_back(tensor_json(d, true));
  for (const auto& d : worst_per_tensor(r)) worst.push_back(tensor_json(d, false));
  for (const auto& n : r.notes)
    notes.push_back({{"id", n.id}, {"topic", n.topic}, {"before", n.before}, {"after", n.after},
                     {"applies", n.applies}, {"why", n.why}});
  json j = {{"schema", "gradcert.audit/1"},
            {"environment", {{"torch", e.torch}, {"device", e.device}, {"world", e.world}, {"launcher", e.launcher},
                             {"git", e.git}, {"seed", e.seed}, {"host", e.host}, {"started", e.started}}},
            {"spec", json::parse(r.spec_json.empty() ? "{}" : r.spec_json, nullptr, false)},
            {"before", side_json(r.before_side, r.before, r.before_facts)},
            {"after", side_json(r.after_side, r.after, r.after_facts)},
            {"tolerance", json_number(r.tolerance)},
            {"compared", r.compared},
            {"updates", updates},
            {"tensors", tensors},
            {"tensors_worst", worst},
            {"step_seconds_median", {{"before", r.before_facts.step_seconds_median},
                                     {"after", r.after_facts.step_seconds_median}}},
            {"memory", r.memory},
            {"migration_notes", notes},
            {"differences", r.differences},
            {"verdict", r.run_failed() ? "error" : r.preserved() ? "preserved" : "differences"},
            {"verdict_text", r.verdict_text()}};
  return j.dump(1) + "\n";
}

std::string audit_table(const AuditReport& r) {
  std::ostringstream o;
  const auto& b = r.before;
  o << "# gradcert audit: before " << side_title(r.before_side) << " -> after " << side_title(r.after_side)
    << ", world " << b.topology.world() << " (dp " << b.topology.dp << " tp " << b.topology.tp << " pp "
    << b.topology.pp << "), " << b.dtype << " " << b.optimizer << ", " << b.updates << " updates, B_update "
    << b.update_batch << "\n";
  o << "#  " << side_facts_line(r.before_side, r.before_facts) << "\n";
  o << "#  " << side_facts_line(r.after_side, r.after_facts) << "\n";
  o << "#check                    " << pad("before", 10, true) << pad("after", 10, true) << pad("tolerance", 11, true)
    << "  verdict (before / after)\n";
  for (const auto& id : check_ids(r)) {
    const CheckResult *cb = find_check(r.before, id), *ca = find_check(r.after, id);
    const CheckResult* any = cb ? cb : ca;
    o << " " << pad(id, 24) << " " << pad(figure_or(cb), 10, true) << pad(figure_or(ca), 10, true)
      << pad(any && any->tolerance != 0 ? figure_text(any->tolerance) : "exact", 11, true) << "  "
      << verdict_or(r.before, cb) << " / " << verdict_or(r.after, ca) << "\n";
  }
  for (const auto* s : {&r.before, &r.after})
    if (!s->error.empty())
      o << "# " << (s == &r.before ? "before" : "after") << " run failed: " << first_line(s->error) << "\n";
  if (r.compared) {
    o << "#update  B_update (before/after)  N (before/after)   loss before   loss after   step s before/after\n";
    for (const auto& u : r.updates) {
      char line[256];
      std::snprintf(line, sizeof line, " %-7d %9lld / %-9lld %7lld / %-7lld %13.6e %12.6e   %s / %s\n", u.update,
                    static_cast<long long>(u.batch_before), static_cast<long long>(u.batch_after),
                    static_cast<long long>(u.n_before), static_cast<long long>(u.n_after), u.loss_before,
                    u.loss_after, seconds(u.step_before).c_str(), seconds(u.step_after).c_str());
      o << line;
    }
    o << "#tensor (after vs before, worst update)  grad rel L2  grad max abs  param rel L2  param max abs\n";
    for (const auto& d : worst_per_tensor(r))
      o << " " << pad(d.name, 38) << " " << pad(figure_text(d.grad_rel), 11, true) << " " << pad(figure_text(d.grad_max_abs), 13, true)
        << " " << pad(figure_text(d.param_rel), 13, true) << " " << pad(figure_text(d.param_max_abs), 14, true) << "\n";
    o << "# tolerance (spec, " << b.dtype << "): " << figure_text(r.tolerance) << "\n";
    o << "# step time (median over updates): before " << seconds(r.before_facts.step_seconds_median)
      << " s, after " << seconds(r.after_facts.step_seconds_median) << " s";
    if (r.before_facts.step_seconds_median > 0 && r.after_facts.step_seconds_median > 0) {
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, " (after/before x%.2f)",
                    r.after_facts.step_seconds_median / r.before_facts.step_seconds_median);
      o << ratio;
    }
    if (r.before_facts.target_tokens_per_s || r.after_facts.target_tokens_per_s) {
      auto rate = [](const std::optional<double>& x) { return x ? figure_text(std::round(*x)) : std::string("-"); };
      o << "; target tokens/s " << rate(r.before_facts.target_tokens_per_s) << " / "
        << rate(r.after_facts.target_tokens_per_s);
    }
    o << "\n# " << r.memory << "\n";
  }
  if (!r.notes.empty()) {
    o << "# what commonly changes in this migration ([x] exercised by this run, [ ] not):\n";
    for (const auto& n : r.notes) {
      o << "#  [" << (n.applies ? "x" : " ") << "] " << n.id << ": " << n.topic << "\n";
      if (!n.before.empty()) o << "#        before: " << n.before << "\n";
      if (!n.after.empty()) o << "#        after:  " << n.after << "\n";
      o << "#        " << n.why << "\n";
    }
  }
  if (r.preserved()) {
    o << "# verdict: the migration preserves training semantics\n# OK\n";
  } else {
    o << "# verdict: " << r.verdict_text() << "\n";
    for (const auto& d : r.differences) o << "#  - " << d << "\n";
    o << "# FAILED\n";
  }
  return o.str();
}

std::string audit_markdown(const AuditReport& r) {
  std::ostringstream o;
  const auto& b = r.before;
  o << "# gradcert migration audit: `" << r.before_side.name << "` -> `" << r.after_side.name << "`\n\n";
  o << "**Verdict: " << (r.preserved() ? "the migration preserves training semantics" : r.verdict_text()) << "**\n\n";
  if (!r.differences.empty()) {
    for (const auto& d : r.differences) o << "- " << d << "\n";
    o << "\n";
  }
  o << "World " << b.topology.world() << " (dp " << b.topology.dp << ", tp " << b.topology.tp << ", pp "
    << b.topology.pp << "), " << b.dtype << ", " << b.optimizer << ", " << b.updates << " updates, B_update "
    << b.update_batch << "; parity tolerance " << figure_text(r.tolerance) << ". torch " << r.environment.torch << ", git "
    << r.environment.git << ", " << r.environment.started << ".\n\n";
  o << "- before: " << side_facts_line(r.before_side, r.before_facts) << "\n";
  o << "- after: " << side_facts_line(r.after_side, r.after_facts) << "\n\n";
  o << "## Checks against the float64 reference\n\n| check | before | after | tolerance | verdict (before / after) |\n"
       "|---|---|---|---|---|\n";
  for (const auto& id : check_ids(r)) {
    const CheckResult *cb = find_check(r.before, id), *ca = find_check(r.after, id);
    const CheckResult* any = cb ? cb : ca;
    o << "| `" << id << "` | " << figure_or(cb) << " | " << figure_or(ca) << " | "
      << (any && any->tolerance != 0 ? figure_text(any->tolerance) : "exact") << " | " << verdict_or(r.before, cb) << " / "
      << verdict_or(r.after, ca) << " |\n";
  }
  for (const auto* s : {&r.before, &r.after})
    if (!s->error.empty())
      o << "\n" << (s == &r.before ? "Before" : "After") << " run failed:\n\n```\n" << s->error << "\n```\n";
  if (r.compared) {
    o << "\n## Per update\n\n| update | B_update before / after | N before / after | loss before | loss after | "
         "step s before / after |\n|---|---|---|---|---|---|\n";
    for (const auto& u : r.updates) {
      char l1[64], l2[64];
      std::snprintf(l1, sizeof l1, "%.10e", u.loss_before);
      std::snprintf(l2, sizeof l2, "%.10e", u.loss_after);
      o << "| " << u.update << " | " << u.batch_before << " / " << u.batch_after << " | " << u.n_before << " / "
        << u.n_after << " | " << l1 << " | " << l2 << " | " << seconds(u.step_before) << " / "
        << seconds(u.step_after) << " |\n";
    }
    o << "\nStep time (median): before " << seconds(r.before_facts.step_seconds_median) << " s, after "
      << seconds(r.after_facts.step_seconds_median) << " s. " << r.memory << ".\n";
    o << "\n## Per tensor: after vs before (worst over updates)\n\n| tensor | grad rel L2 | grad max abs | "
         "param rel L2 | param max abs |\n|---|---|---|---|---|\n";
    for (const auto& d : worst_per_tensor(r))
      o << "| `" << d.name << "` | " << figure_text(d.grad_rel) << " | " << figure_text(d.grad_max_abs) << " | " << figure_text(d.param_rel)
        << " | " << figure_text(d.param_max_abs) << " |\n";
  }
  if (!r.notes.empty()) {
    o << "\n## What commonly changes in this migration\n\n| | change | before | after | this run |\n"
         "|---|---|---|---|---|\n";
    for (const auto& n : r.notes)
      o << "| " << (n.applies ? "exercised" : "not exercised") << " | " << n.topic << " (`" << n.id << "`) | "
        << n.before << " | " << n.after << " | " << n.why << " |\n";
  }
  return o.str();
}

std::string audit_junit(const AuditReport& r) {
  std::ostringstream cases;
  int tests = 0, failures = 0, errors = 0;
  auto add = [&](const std::string& cls, const std::string& name, const std::string& kind, const std::string& msg) {
    ++tests;
    cases << "  <testcase classname=\"" << xml_escape(cls) << "\" name=\"" << xml_escape(name) << "\"";
    if (kind.empty()) {
      cases << "/>\n";
      return;
    }
    (kind == "error" ? errors : failures)++;
    cases << ">\n    <" << kind << " message=\"" << xml_escape(first_line(msg)) << "\">" << xml_escape(msg) << "</"
          << kind << ">\n  </testcase>\n";
  };
  for (const auto* s : {&r.before, &r.after}) {
    const std::string cls = "audit." + std::string(s == &r.before ? "before." : "after.") +
                            (s == &r.before ? r.before_side.name : r.after_side.name);
    if (!s->error.empty()) add(cls, "run", "error", s->error);
    for (const auto& c : s->checks)
      add(cls, c.id, c.verdict == Verdict::Fail ? "failure" : "",
          c.detail + " (figure " + figure_text(c.figure) + ", tolerance " + figure_text(c.tolerance) + ")");
  }
  if (r.compared) {
    std::map<std::string, std::string> found;  // "grads", "params", "window_count", "update_size", "loss"
    for (const auto& d : r.differences) {
      const std::string key = d.find("gradients differ") != std::string::npos   ? "grads"
                              : d.find("parameters differ") != std::string::npos ? "params"
                              : d.find("N differs") != std::string::npos         ? "window_count"
                              : d.find("B_update differs") != std::string::npos  ? "update_size"
                              : d.find("loss differs") != std::string::npos      ? "loss"
                              : d.find("tensor") != std::string::npos            ? "tensors"
                                                                                 : "";
      if (!key.empty()) found[key] += (found[key].empty() ? "" : "\n") + d;
    }
    for (const char* k : {"grads", "params", "window_count", "update_size", "loss", "tensors"})
      add("audit.between", k, found.count(k) ? "failure" : "", found.count(k) ? found[k] : "");
  }
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"gradcert.audit\" tests=\"" << tests
    << "\" failures=\"" << failures << "\" errors=\"" << errors << "\">\n"
    << cases.str() << "</testsuite>\n";
  return o.str();
}

void write_audit_files(const AuditReport& r, const std::string& dir) {
  fs::create_directories(dir);
  write_file_atomic(dir + "/audit.json", audit_json(r));
  write_file_atomic(dir + "/audit.md", audit_markdown(r));
  write_file_atomic(dir + "/junit.xml", audit_junit(r));
}

}  // namespace gradcert
