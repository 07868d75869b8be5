// The HTML writer of a migration audit: report.html beside audit.json. The verdict banner with
// the environment and the command that reproduces the audit; the differences; the two sides
// side by side (what each stack is, its checks against the float64 reference with each figure
// drawn against its tolerance, per update B_update / N / loss / step time); per tensor and
// update, after vs before and each side vs the reference, in model order; memory and the
// migration notes.
#include <cmath>
#include <map>
#include <sstream>

#include "conformance/core/format.hpp"
#include "reports/html.hpp"
#include "reports/report.hpp"
#include "reports/views.hpp"

namespace gradcert {

using namespace reports;
using namespace reports::html;

namespace {

std::string audit_command(const AuditReport& r) {
  const RunReport& b = r.before;
  if (r.before_side.backend == "observed")  // `gradcert audit-jobs`: the sides are the user's own commands
    return "gradcert audit-jobs --updates " + std::to_string(b.updates) + " --before " +
           shell_word(r.before_side.command) + " --after " + shell_word(r.after_side.command);
  std::string c = "gradcert audit --before " + shell_word(r.before_side.name) + " --after " +
                  shell_word(r.after_side.name) + " --world " + std::to_string(b.topology.world()) + " --dtype " +
                  shell_word(b.dtype) + " --optimizer " + shell_word(b.optimizer);
  auto inject = [&](const AuditSide& s, const char* flag) {
    if (!s.inject.empty() && s.name.find("+inject=") == std::string::npos)
      c += std::string(" ") + flag + " " + shell_word(s.inject);
  };
  inject(r.before_side, "--before-inject");
  inject(r.after_side, "--after-inject");
  if (!b.run_dir.empty()) c += " --spec " + shell_word(b.run_dir + "/spec.json");
  if (r.environment.launcher != "local" && !r.environment.launcher.empty())
    c += " --launcher " + shell_word(r.environment.launcher);
  return c;
}

std::string verdict_badge(const RunReport& r) {
  const std::string v = run_verdict(r);
  return badge(v, v);
}

std::string opt_bytes(const std::optional<double>& b) { return b ? human_bytes(*b) : "not reported"; }

std::string side_card(const char* which, const AuditSide& s, const RunReport& r, const AuditSideFacts& f) {
  std::ostringstream o;
  o << "<div class=\"side\" data-side=\"" << which << "\"><h3>" << which << ": " << esc(side_title(s)) << " "
    << verdict_badge(r) << "</h3>\n<p class=\"note\">" << esc(side_facts_line(s, f)) << "</p>\n<table>\n";
  auto row = [&](const char* k, const std::string& v) { o << "<tr><th>" << k << "</th><td>" << v << "</td></tr>\n"; };
  row("backend",
      "<code>" + esc(s.backend) + "</code>" + (s.command.empty() ? "" : " <code>" + esc(s.command) + "</code>"));
  row("run", esc(run_label(r)) + " · " + std::to_string(r.updates) + " updates · B_update " +
                 std::to_string(r.update_batch) + " · " + esc(seconds(r.wall_seconds)) + " s");
  row("step time (median)", esc(seconds(f.step_seconds_median)) + " s");
  if (f.target_tokens_per_s) row("target tokens/s", esc(fixed(*f.target_tokens_per_s, "%.1f")));
  row("peak memory",
      esc(opt_bytes(f.peak_memory_bytes)) +
          (f.peak_memory_kind.empty() ? "" : " <span class=\"muted\">(" + esc(f.peak_memory_kind) + ")</span>"));
  row("model state", esc(opt_bytes(f.model_state_bytes)));
  if (!r.run_dir.empty()) row("run folder", "<code>" + esc(r.run_dir) + "</code>");
  o << "</table>\n";
  if (!r.error.empty()) o << "<p class=\"bad\">the run failed:</p><pre>" << esc(r.error) << "</pre>\n";
  o << "</div>\n";
  return o.str();
}

std::string cell_class(const RunReport& r, const CheckResult* c) { return c ? check_class(r, *c) : "skip"; }

std::string checks_table(const AuditReport& r) {
  std::ostringstream o;
  o << "<table class=\"checks\">\n<thead><tr><th>check</th><th>before</th><th>against the tolerance</th><th>after</th>"
       "<th>against the tolerance</th><th>tolerance</th><th>verdict (before / after)</th></tr></thead>\n<tbody>\n";
  for (const auto& id : check_ids(r)) {
    const CheckResult *cb = find_check(r.before, id), *ca = find_check(r.after, id);
    // A side's failed check is a failure here even on a planted side: the audit asks for parity.
    auto cls = [&](const RunReport& side, const CheckResult* c) {
      const std::string k = cell_class(side, c);
      return k == "caught" ? std::string("fail") : k;
    };
    const std::string vb = verdict_or(r.before, cb), va = verdict_or(r.after, ca);
    o << "<tr><td><code>" << esc(id) << "</code></td>" << figure_cells(cb, cls(r.before, cb))
      << figure_cells(ca, cls(r.after, ca)) << "<td class=\"num\">" << esc(tolerance_or(cb, ca)) << "</td><td>"
      << badge(vb, vb) << " / " << badge(va, va) << "</td></tr>\n";
  }
  o << "</tbody>\n</table>\n";
  for (const auto* s : {&r.before, &r.after})
    if (!s->error.empty())
      o << "<p class=\"bad\">" << (s == &r.before ? "before" : "after") << " run failed:</p><pre>" << esc(s->error)
        << "</pre>\n";
  return o.str();
}

std::string updates_table(const AuditReport& r) {
  std::ostringstream o;
  o << "<table>\n<thead><tr><th>update</th><th>B_update before</th><th>after</th><th>N before</th><th>after</th>"
       "<th>loss before</th><th>after</th><th>step s before</th><th>after</th></tr></thead>\n<tbody>\n";
  for (const auto& u : r.updates) {
    const double scale = std::max(std::fabs(u.loss_before), std::fabs(u.loss_after));
    const bool loss_differs = scale > 0 && std::fabs(u.loss_after - u.loss_before) > r.tolerance * scale;
    auto cell = [](const std::string& v, bool differs) {
      return std::string("<td class=\"num") + (differs ? " differs" : "") + "\">" + v + "</td>";
    };
    o << "<tr><td class=\"num\">" << u.update << "</td>" << cell(std::to_string(u.batch_before), false)
      << cell(std::to_string(u.batch_after), u.batch_after != u.batch_before) << cell(std::to_string(u.n_before), false)
      << cell(std::to_string(u.n_after), u.n_after != u.n_before) << cell(fixed(u.loss_before, "%.10e"), false)
      << cell(fixed(u.loss_after, "%.10e"), loss_differs) << cell(seconds(u.step_before), false)
      << cell(seconds(u.step_after), false) << "</tr>\n";
  }
  o << "</tbody>\n</table>\n<p class=\"note\">Red: the after side differs from the before side (loss: beyond the "
       "tolerance, relative).</p>\n";
  return o.str();
}

std::string tensors_section(const AuditReport& r) {
  std::ostringstream o;
  std::map<std::string, std::string> shared;  // tensor names, written once per page
  if (!r.compared) {
    o << "<p class=\"note\">not compared: a side's run produced no artifacts to compare.</p>\n";
  } else {
    o << "<h3>after vs before</h3>\n<p class=\"note\">Per update, the relative L2 difference of each tensor's "
         "gradient (and parameters after the step) between the two sides, the before side as the baseline, in model "
         "order.</p>\n"
      << tensor_charts(as_figures(r.diffs), r.tolerance, "audit-diff", "after vs before", &shared);
  }
  o << "<h3>each side vs the float64 reference</h3>\n<div class=\"pair\">\n";
  for (const auto* s : {&r.before, &r.after}) {
    const bool before = s == &r.before;
    o << "<div class=\"side\" data-side=\"" << (before ? "before" : "after") << "\"><h3>"
      << (before ? "before: " : "after: ") << esc(side_title(before ? r.before_side : r.after_side)) << "</h3>\n";
    if (!s->error.empty())
      o << "<p class=\"note\">the run did not complete: " << esc(first_line(s->error)) << "</p>\n";
    else
      o << tensor_charts(s->tensor_errors, r.tolerance, before ? "side-before" : "side-after", "vs the reference",
                         &shared);
    o << "</div>\n";
  }
  o << "</div>\n";
  if (r.compared && !r.diffs.empty()) {
    o << "<details><summary>worst over updates, per tensor (after vs before)</summary>\n<table>\n<thead><tr><th>tensor"
         "</th><th>grad rel L2</th><th>grad max abs</th><th>param rel L2</th><th>param max abs</th></tr></thead>\n"
         "<tbody>\n";
    for (const auto& d : worst_per_tensor(r)) {
      auto cell = [&](double x, bool rel) {
        return std::string("<td class=\"num") + (rel && !(x <= r.tolerance) ? " differs" : "") + "\">" +
               esc(figure_text(x)) + "</td>";
      };
      o << "<tr><td><code>" << esc(d.name) << "</code></td>" << cell(d.grad_rel, true) << cell(d.grad_max_abs, false)
        << cell(d.param_rel, true) << cell(d.param_max_abs, false) << "</tr>\n";
    }
    o << "</tbody>\n</table>\n</details>\n";
  }
  return o.str();
}

std::string notes_section(const AuditReport& r) {
  if (r.notes.empty()) return "<p class=\"note\">no migration notes for these two stacks.</p>\n";
  std::ostringstream o;
  o << "<table>\n<thead><tr><th>this run</th><th>change</th><th>before</th><th>after</th><th>why</th></tr></thead>\n"
       "<tbody>\n";
  for (const auto& n : r.notes)
    o << "<tr><td>" << (n.applies ? badge("pass", "exercised") : badge("skip", "not exercised")) << "</td><td>"
      << esc(n.topic) << " <code>" << esc(n.id) << "</code></td><td>" << esc(n.before) << "</td><td>" << esc(n.after)
      << "</td><td class=\"detail\">" << esc(n.why) << "</td></tr>\n";
  o << "</tbody>\n</table>\n";
  return o.str();
}

}  // namespace

std::string audit_html(const AuditReport& r) {
  const std::string cls = r.run_failed() ? "interrupted" : r.preserved() ? "pass" : "fail";
  const RunReport& b = r.before;
  std::string sentence = r.verdict_text();
  if (cls == "interrupted") {
    const RunReport& failed = r.before.error.empty() ? r.after : r.before;
    sentence = std::string(&failed == &r.before ? "the before" : "the after") +
               " side's run did not complete: " + first_line(failed.error);
  } else if (cls == "fail") {
    sentence += " between the two sides (or against the reference)";
  }
  std::vector<std::string> facts = {"world <b>" + std::to_string(b.topology.world()) + "</b> (dp " +
                                        std::to_string(b.topology.dp) + ", tp " + std::to_string(b.topology.tp) +
                                        ", pp " + std::to_string(b.topology.pp) + ")",
                                    "dtype <b>" + esc(b.dtype) + "</b>",
                                    "optimizer <b>" + esc(b.optimizer) + "</b>",
                                    "updates <b>" + std::to_string(b.updates) + "</b>",
                                    "B_update <b>" + std::to_string(b.update_batch) + "</b>",
                                    "parity tolerance <b>" + esc(figure_text(r.tolerance)) + "</b>"};
  for (auto& f : environment_facts(r.environment, /*with_world=*/false)) facts.push_back(f);
  const std::string title =
      "gradcert audit: " + side_title(r.before_side) + " \xe2\x86\x92 " + side_title(r.after_side);
  std::ostringstream differences;
  if (r.differences.empty()) {
    differences << "<p>"
                << (r.compared ? "none: both sides pass every check and agree with each other within the "
                                 "tolerance."
                               : "none listed, but the two runs were not compared.")
                << "</p>\n";
  } else {
    differences << "<ul class=\"differences\">\n";
    for (const auto& d : r.differences) differences << "<li>" << esc(d) << "</li>\n";
    differences << "</ul>\n";
  }
  std::ostringstream sides;
  sides << "<div class=\"pair\">\n"
        << side_card("before", r.before_side, r.before, r.before_facts)
        << side_card("after", r.after_side, r.after, r.after_facts) << "</div>\n";
  std::ostringstream memory;
  memory << "<p>" << esc(r.memory) << "</p>\n<p class=\"note\">step time (median over updates): before "
         << esc(seconds(r.before_facts.step_seconds_median)) << " s, after "
         << esc(seconds(r.after_facts.step_seconds_median)) << " s</p>\n";
  std::ostringstream body;
  body << banner(cls, title, sentence, facts, {audit_command(r)}, "(the before side's run folder keeps the spec.json)")
       << "<nav><a href=\"#differences\">differences</a><a href=\"#sides\">the two sides</a><a href=\"#checks\">checks"
          "</a><a href=\"#updates\">per update</a><a href=\"#tensors\">per tensor</a><a href=\"#memory\">memory</a>"
          "<a href=\"#notes\">migration notes</a><a href=\"#spec\">spec</a></nav>\n"
       << section("differences", "Differences", differences.str()) << section("sides", "The two sides", sides.str())
       << section("checks", "Checks against the float64 reference, side by side", checks_table(r))
       << section("updates", "Per update, side by side",
                  r.compared ? updates_table(r) : "<p class=\"note\">not compared.</p>\n")
       << section("tensors", "Per tensor, per update", tensors_section(r))
       << section("memory", "Memory and step time", memory.str())
       << section("notes", "What commonly changes in this migration", notes_section(r))
       << section("spec-section", "Spec", spec_block(r.spec_json))
       << "<p class=\"note\">generated by gradcert · audit.json beside this file (schema gradcert.audit/1) carries the "
          "same figures</p>\n";
  return page(title + " — " + (cls == "pass" ? "preserved" : cls), body.str());
}

}  // namespace gradcert
