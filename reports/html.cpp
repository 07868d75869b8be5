// The HTML writer of runs and certifications: report.html, one self-contained file (inline CSS
// and SVG, no request of any kind) beside report.json. Sections: the verdict banner with the
// environment and the command that reproduces the run; the check table, each figure drawn
// against its tolerance on a log scale; per run and update, the per-tensor errors in model
// order; the mutant detection matrix; memory per rank, phase and length bucket against the
// estimate's lower bound and the budget; throughput and scaling against single across runs.
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "conformance/core/format.hpp"
#include "conformance/memory/memory.hpp"
#include "reports/html.hpp"
#include "reports/report.hpp"
#include "reports/svg.hpp"
#include "reports/views.hpp"

namespace gradcert {

using namespace reports;
using namespace reports::html;

namespace {

// A run is as expected when a correct run passed or a planted bug was caught.
bool as_expected(const RunReport& r) {
  if (!r.error.empty()) return false;
  return r.inject.empty() ? r.passed() : !r.detected_by().empty();
}

std::string run_badge(const RunReport& r) {
  if (!r.error.empty()) return badge("error", "error");
  if (!r.inject.empty()) return r.detected_by().empty() ? badge("missed", "not caught") : badge("caught", "caught");
  return r.passed() ? badge("pass", "pass") : badge("fail", "fail");
}

std::string run_id(size_t i) { return "run-" + std::to_string(i); }

// ---- checks

std::string check_rows(const RunReport& r, size_t index, const std::string& launcher) {
  std::ostringstream o;
  o << "<tr class=\"run\" id=\"" << run_id(index) << "\"><td colspan=\"6\">" << run_badge(r) << " " << esc(run_label(r))
    << " <span class=\"muted\">· " << r.updates << " updates · B_update " << r.update_batch << " · "
    << esc(seconds(r.wall_seconds)) << " s</span> <a href=\"#tensors-" << run_id(index)
    << "\">per tensor</a><br><code class=\"muted\">" << esc(run_command(r, launcher)) << "</code></td></tr>\n";
  if (!r.error.empty()) {
    o << "<tr><td>run</td><td class=\"num\">-</td><td></td><td>-</td><td>" << badge("error", "error")
      << "</td><td class=\"detail\"><pre>" << esc(r.error) << "</pre></td></tr>\n";
    return o.str();
  }
  for (const auto& c : r.checks) {
    const std::string cls = check_class(r, c);
    o << "<tr><td><code>" << esc(c.id) << "</code></td>" << figure_cells(&c, cls) << "<td class=\"num\">"
      << esc(tolerance_text(c)) << "</td><td>" << badge(cls, verdict_cell(r, c)) << "</td><td class=\"detail\">"
      << esc(c.detail) << "</td></tr>\n";
  }
  return o.str();
}

std::string checks_table(const Report& r, bool mutants) {
  std::ostringstream o;
  o << "<table class=\"checks\">\n<thead><tr><th>check</th><th>figure</th><th>against the tolerance (log; 10 "
       "decades below it to 2 above; | = tolerance)</th><th>tolerance</th><th>verdict</th><th>detail</th></tr>"
       "</thead>\n<tbody>\n";
  for (size_t i = 0; i < r.runs.size(); ++i)
    if (r.runs[i].inject.empty() != mutants) o << check_rows(r.runs[i], i, r.environment.launcher);
  o << "</tbody>\n</table>\n";
  return o.str();
}

std::string checks_section(const Report& r) {
  size_t correct = 0, mutants = 0;
  for (const auto& run : r.runs) (run.inject.empty() ? correct : mutants)++;
  std::ostringstream o;
  o << "<p class=\"note\">Each check reports its worst figure (over updates, ranks and tensors; parity against the "
       "float64 reference) and the tolerance it is held to; the bar is the figure on a log scale ending 2 decades "
       "above the tolerance (the line), so a bar past the line fails. Exact checks (tolerance 0) must read 0. A "
       "planted bug's failed check reads "
       "<b>caught</b>.</p>\n";
  if (correct > 0 || mutants == 0) o << checks_table(r, false);
  if (mutants > 0 && correct == 0) o << checks_table(r, true);
  if (mutants > 0 && correct > 0) {
    bool missed = false;
    for (const auto& run : r.runs) missed = missed || (!run.inject.empty() && !as_expected(run));
    o << "<details" << (missed ? " open" : "") << "><summary>the checks of the " << mutants
      << " planted-bug runs</summary>\n"
      << checks_table(r, true) << "</details>\n";
  }
  return o.str();
}

// ---- per tensor

std::string tensors_section(const Report& r) {
  std::ostringstream o;
  o << "<p class=\"note\">Per update, the relative L2 error of each tensor's gradient (and of the parameters after "
       "the step) against the float64 reference, in the order the model runs: embeddings, each block, then the final "
       "norm and the head, so an error in the embeddings, one block or the head stands out.</p>\n";
  const bool open_all = r.runs.size() <= 3;
  std::map<std::string, std::string> shared;  // tensor names, written once per page
  // Correct runs first, then the planted bugs.
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < r.runs.size(); ++i) {
      const RunReport& run = r.runs[i];
      if (run.inject.empty() != (pass == 0)) continue;
      const CheckResult* g = find_check(run, "grad.parity");
      const double tol = g ? g->tolerance : 0;
      const bool open = open_all || (run.inject.empty() && !as_expected(run));
      o << "<details id=\"tensors-" << run_id(i) << "\" class=\"tensors\"" << (open ? " open" : "") << "><summary>"
        << run_badge(run) << " " << esc(run_label(run));
      if (g) o << " <span class=\"muted\">· grad.parity " << esc(figure_text(g->figure)) << "</span>";
      o << "</summary>\n";
      if (!run.error.empty())
        o << "<p class=\"note\">the run did not complete: " << esc(first_line(run.error)) << "</p>\n";
      else
        o << tensor_charts(run.tensor_errors, tol, "tensor", "vs the float64 reference", &shared);
      o << "</details>\n";
    }
  return o.str();
}

// ---- mutants

std::string mutants_section(const Report& r) {
  std::vector<std::string> mutants, backends;
  std::map<std::pair<std::string, std::string>, std::vector<const RunReport*>> cell;
  size_t runs = 0, caught = 0;
  for (const auto& run : r.runs) {
    if (run.inject.empty()) continue;
    ++runs;
    caught += as_expected(run) ? 1 : 0;
    if (std::find(mutants.begin(), mutants.end(), run.inject) == mutants.end()) mutants.push_back(run.inject);
    if (std::find(backends.begin(), backends.end(), run.backend) == backends.end()) backends.push_back(run.backend);
    cell[{run.inject, run.backend}].push_back(&run);
  }
  if (runs == 0)
    return "<p class=\"note\">no planted bugs in this report (<code>gradcert certify</code> runs the matrix; "
           "<code>gradcert run --inject MUTANT</code> one of them).</p>\n";
  std::ostringstream o;
  o << "<p><b" << (caught == runs ? "" : " class=\"bad\"") << ">" << caught << " of " << runs
    << "</b> planted-bug runs were caught. Each cell names the checks that failed (caught it); "
       "<b>not caught</b> is a hole in the suite; an empty cell: the mutant does not apply to that backend.</p>\n";
  o << "<div class=\"chartbox\"><table class=\"matrix\" data-chart=\"mutant-matrix\">\n"
       "<thead><tr><th>mutant \\ backend</th>";
  for (const auto& b : backends) o << "<th>" << esc(b) << "</th>";
  o << "</tr></thead>\n<tbody>\n";
  for (const auto& m : mutants) {
    o << "<tr><td class=\"mutant\"><code>" << esc(m) << "</code></td>";
    for (const auto& b : backends) {
      auto it = cell.find({m, b});
      if (it == cell.end()) {
        o << "<td class=\"na\"></td>";
        continue;
      }
      std::string cls = "caught", text;
      for (const RunReport* run : it->second) {
        std::string one;
        if (!run->error.empty()) {
          if (cls != "missed") cls = "error";
          one = "run failed";
        } else if (run->detected_by().empty()) {
          cls = "missed";
          one = "not caught";
        } else {
          one = detected_by_text(*run, "<br>");
        }
        if (it->second.size() > 1)
          one = "<i>" + esc(run_label(*run).substr(run->backend.size() + 1)) + ":</i><br>" + one;
        text += (text.empty() ? "" : "<hr>") + one;
      }
      o << "<td class=\"" << cls << "\" title=\"" << esc(m + " on " + b) << "\">" << text << "</td>";
    }
    o << "</tr>\n";
  }
  o << "</tbody>\n</table></div>\n";
  return o.str();
}

// ---- memory

std::string bytes_label(double b) { return human_bytes(b); }

// The binary unit (B, KiB, MiB, ...) of the largest value, so axis steps are round in it.
double byte_unit(const std::vector<svg::Group>& groups, const std::vector<svg::Line>& lines) {
  double max = 0;
  for (const auto& g : groups)
    for (double v : g.bars)
      if (std::isfinite(v)) max = std::max(max, v);
  for (const auto& l : lines) max = std::max(max, l.value);
  double unit = 1;
  while (max >= 1024 * unit && unit < 1e15) unit *= 1024;
  return unit;
}

std::string memory_section(const Report& r) {
  const auto runs = memory_runs(r);
  if (runs.empty())
    return "<p class=\"note\">no memory evidence: only the built-in backends measure memory (the file protocol "
           "v1 has no memory file).</p>\n";
  std::ostringstream o;
  o << "<p class=\"note\">Per rank and length bucket, the measured peak of each phase (tracked CPU storage, or the "
       "CUDA allocator's allocated peak) against the estimate's per-rank lower bound (model state + the largest "
       "gathered unit) and the budget (<code>memory.budget_bytes</code>). The estimate excludes: ";
  const auto ex = excluded_from_estimate();
  for (size_t i = 0; i < ex.size(); ++i) o << (i ? "; " : "") << esc(ex[i]);
  o << ".</p>\n<div class=\"memgrid\">\n";
  for (const auto& m : runs) {
    std::vector<std::string> phases;
    std::vector<std::pair<int, std::string>> keys;
    std::map<std::pair<int, std::string>, std::map<std::string, double>> peak;
    for (const auto& p : m.peaks) {
      if (std::find(phases.begin(), phases.end(), p.phase) == phases.end()) phases.push_back(p.phase);
      const std::pair<int, std::string> key{p.rank, p.bucket};
      if (!peak.count(key)) keys.push_back(key);
      peak[key][p.phase] = static_cast<double>(p.peak_bytes);
    }
    std::stable_sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) {
      return std::make_pair(a.first, bucket_order(a.second)) < std::make_pair(b.first, bucket_order(b.second));
    });
    std::vector<svg::Group> groups;
    for (const auto& k : keys) {
      svg::Group g{"rank " + std::to_string(k.first) + "|" + k.second, {}};
      for (const auto& ph : phases) {
        auto it = peak[k].find(ph);
        g.bars.push_back(it == peak[k].end() ? NAN : it->second);
      }
      groups.push_back(g);
    }
    std::vector<svg::Line> lines;
    if (m.has_estimate) lines.push_back({"lower bound", static_cast<double>(m.estimate.total()), "bound"});
    if (m.budget_bytes > 0) lines.push_back({"budget", m.budget_bytes, "budget"});
    const PhasePeak* w = worst_of(m.peaks);
    // The chart's width (svg::grouped_bars): a wide one takes the whole row of the grid.
    const double group_width = std::max(7.0 * static_cast<double>(phases.size()) + 14, 46.0);
    const bool wide = 82 + static_cast<double>(groups.size()) * group_width > 560;
    o << "<div class=\"memrun" << (wide ? " wide" : "") << "\"><h3>" << esc(m.backend)
      << " <span class=\"muted\">· world " << m.world << "</span></h3>\n<p class=\"note\">";
    if (m.has_estimate)
      o << "model state: estimate " << esc(cell_bytes(m.estimate.model_state())) << " ("
        << esc(m.estimate.input.recipe.name) << ", " << esc(sharding_name(m.estimate.input.strategy)) << "), measured "
        << esc(cell_bytes(m.measured_model_state_bytes)) << "; lower bound " << esc(cell_bytes(m.estimate.total()))
        << "; ";
    o << "budget " << (m.budget_bytes > 0 ? esc(human_bytes(m.budget_bytes)) : "none");
    if (w)
      o << "; worst peak " << esc(cell_bytes(w->peak_bytes)) << " (rank " << w->rank << ", " << esc(w->bucket)
        << " bucket, " << esc(w->phase) << ")"
        << (m.budget_bytes > 0 && static_cast<double>(w->peak_bytes) > m.budget_bytes
                ? " <span class=\"bad\">over the budget</span>"
                : "");
    o << "</p>\n<div class=\"legend\">";
    for (size_t i = 0; i < phases.size(); ++i)
      o << "<span><i class=\"sw s" << i % 8 << "\"></i>" << esc(phases[i]) << "</span>";
    if (m.has_estimate) o << "<span><i class=\"sw dash bound\"></i>lower bound</span>";
    if (m.budget_bytes > 0) o << "<span><i class=\"sw dash\"></i>budget</span>";
    o << "</div>\n<div class=\"chartbox\">"
      << svg::grouped_bars("memory",
                           "measured peak per rank, length bucket and phase of " + m.backend +
                               ", against the lower bound and the budget",
                           groups, lines, bytes_label, byte_unit(groups, lines))
      << "</div></div>\n";
  }
  o << "</div>\n";
  return o.str();
}

// ---- throughput

std::string throughput_section(const Report& r) {
  const auto runs = throughput_runs(r);
  if (runs.empty()) return "<p class=\"note\">no throughput: no correct run completed.</p>\n";
  std::vector<svg::Panel> panels = {{"target tokens/s", "%.0f", -1},
                                    {"speedup vs single", "%.2f", 1},
                                    {"efficiency (speedup / D)", "%.2f", 1},
                                    {"GPU-hours ratio (D / speedup)", "%.2f", 1}};
  std::vector<svg::Row> rows;
  for (const auto& t : runs)
    rows.push_back({t.backend,
                    {t.target_tokens_per_s, t.has_baseline ? t.scaling.speedup : NAN,
                     t.has_baseline ? t.scaling.efficiency : NAN, t.has_baseline ? t.scaling.gpu_hours_ratio : NAN}});
  std::ostringstream o;
  o << "<p class=\"note\">Timed updates after one warmup. Scaling is on valid target tokens/s against "
       "<code>single</code> with the same spec, dtype and optimizer (the dashed line: 1 = single); \"-\": no "
       "baseline. CPU ranks over Gloo on loopback: communication dominates, so speedups below 1 are expected "
       "there.</p>\n<div class=\"chartbox\">"
    << svg::bar_panels("throughput", "throughput and scaling against single, across runs", panels, rows) << "</div>\n";
  o << "<table>\n<thead><tr><th>run</th><th>ranks</th><th>input tok/s</th><th>target tok/s</th><th>step "
       "(median)</th><th>saving pause</th><th>peak</th><th>speedup</th><th>efficiency</th><th>GPU-hours "
       "ratio</th></tr></thead>\n<tbody>\n";
  for (const auto& t : runs) {
    auto scaled = [&](double x) { return t.has_baseline ? fixed(x, "%.2f") : std::string("-"); };
    o << "<tr><td>" << esc(t.backend) << "</td><td class=\"num\">" << t.devices << "</td><td class=\"num\">"
      << fixed(t.input_tokens_per_s, "%.1f") << "</td><td class=\"num\">" << fixed(t.target_tokens_per_s, "%.1f")
      << "</td><td class=\"num\">" << fixed(t.step_seconds * 1e3, "%.2f ms") << "</td><td class=\"num\">"
      << (t.save_pause_seconds < 0 ? "-" : fixed(t.save_pause_seconds * 1e3, "%.2f ms")) << "</td><td class=\"num\">"
      << esc(cell_bytes(t.peak_bytes)) << "</td><td class=\"num\">" << scaled(t.scaling.speedup)
      << "</td><td class=\"num\">" << scaled(t.scaling.efficiency) << "</td><td class=\"num\">"
      << scaled(t.scaling.gpu_hours_ratio) << "</td></tr>\n";
  }
  o << "</tbody>\n</table>\n";
  for (const auto& t : runs)
    if (!t.note.empty()) o << "<p class=\"note\">" << esc(t.backend) << ": " << esc(t.note) << "</p>\n";
  return o.str();
}

}  // namespace

std::string report_html(const Report& r) {
  size_t correct = 0, failed = 0, mutants = 0, missed = 0, errored = 0;
  const RunReport* first_error = nullptr;
  for (const auto& run : r.runs) {
    if (!run.error.empty()) {
      ++errored;
      if (!first_error) first_error = &run;
    }
    if (run.inject.empty()) {
      ++correct;
      failed += run.passed() ? 0 : 1;
    } else {
      ++mutants;
      missed += as_expected(run) ? 0 : 1;
    }
  }
  const std::string cls = errored > 0 ? "interrupted" : r.passed() ? "pass" : "fail";
  std::string sentence;
  if (errored > 0) {
    sentence = std::to_string(errored) + " of " + std::to_string(r.runs.size()) + " run" +
               (r.runs.size() == 1 ? "" : "s") + " did not complete; first: " + run_label(*first_error) + ": " +
               first_line(first_error->error);
  } else if (cls == "pass") {
    sentence = correct == 0 ? "" : correct == 1 ? "the run passed every check" : "every correct run passed every check";
    if (mutants > 0)
      sentence += std::string(correct ? " and " : "") +
                  (mutants == 1 ? "the planted bug was caught"
                                : "all " + std::to_string(mutants) + " planted bugs were caught");
  } else if (r.runs.size() == 1 && failed == 1) {
    const auto ids = r.runs[0].detected_by();
    sentence = "the run failed " + std::to_string(ids.size()) + " check" + (ids.size() == 1 ? "" : "s") + ": " +
               detected_by_text(r.runs[0], ", ");
  } else if (r.runs.size() == 1 && missed == 1) {
    sentence = "the planted bug " + r.runs[0].inject + " was not caught: every check passed";
  } else {
    if (failed) sentence = std::to_string(failed) + " of " + std::to_string(correct) + " correct runs failed a check";
    if (missed)
      sentence += (sentence.empty() ? "" : "; ") + std::to_string(missed) + " of " + std::to_string(mutants) +
                  " planted bugs were not caught";
  }
  const bool single = r.runs.size() == 1;
  std::vector<std::string> commands;
  std::string note;
  if (single) {
    commands.push_back(run_command(r.runs[0], r.environment.launcher));
    note = "(the run folder keeps the effective spec.json)";
  } else {
    std::string c = "gradcert certify --spec spec.json";
    if (mutants == 0) c += " --no-mutants";
    if (r.environment.launcher != "local") c += " --launcher " + shell_word(r.environment.launcher);
    commands.push_back(c);
    note = "(spec.json: the spec at the end of this page, also report.json's \"spec\"; each run's own command is in "
           "its row of the check table)";
  }
  std::vector<std::string> facts = {"runs <b>" + std::to_string(r.runs.size()) + "</b>"};
  if (mutants > 0)
    facts.push_back("planted bugs caught <b>" + std::to_string(mutants - missed) + " / " + std::to_string(mutants) +
                    "</b>");
  for (auto& f : environment_facts(r.environment)) facts.push_back(f);
  const std::string title =
      single ? "gradcert run: " + run_label(r.runs[0]) : "gradcert certify: " + std::to_string(r.runs.size()) + " runs";
  std::ostringstream body;
  // Beside the verdict: what each failing (or observed) run computed instead, and what a pass cannot see.
  std::vector<std::string> findings;
  for (const auto& run : r.runs)
    if ((single || (!run.passed() && run.inject.empty())) && findings.size() < 8)
      for (const auto& s :
           {diagnosis_headline(run).empty() ? std::string() : run_label(run) + ": " + diagnosis_headline(run),
            diagnosis_text(run), single ? sensitivity_text(run) : std::string()})
        if (!s.empty()) findings.push_back(s);
  body << banner(cls, title, sentence, facts, commands, note, findings)
       << "<nav><a href=\"#checks\">checks</a><a href=\"#tensors\">per tensor</a><a href=\"#mutants\">planted "
          "bugs</a><a href=\"#memory\">memory</a><a href=\"#throughput\">throughput</a><a href=\"#spec\">spec</a>"
          "</nav>\n"
       << section("checks", "Checks", checks_section(r))
       << section("tensors", "Per tensor, per update", tensors_section(r))
       << section("mutants", "Planted bugs: the detection matrix", mutants_section(r))
       << section("memory", "Memory", memory_section(r)) << section("throughput", "Throughput", throughput_section(r))
       << section("spec-section", "Spec", spec_block(r.spec_json))
       << "<p class=\"note\">generated by gradcert · report.json beside this file (schema gradcert.report/1) carries "
          "the same figures</p>\n";
  return page(title + " — " + (cls == "pass" ? "pass" : cls), body.str());
}

}  // namespace gradcert
