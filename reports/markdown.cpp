// The Markdown writer: report.md (checks, mutant detection, the memory and throughput
// sections) and audit.md.
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

#include "conformance/core/format.hpp"
#include "conformance/memory/memory.hpp"
#include "reports/memory_report.hpp"
#include "reports/report.hpp"
#include "reports/views.hpp"

namespace gradcert {

using namespace reports;

std::string memory_markdown(const std::vector<MemoryRunReport>& runs) {
  std::ostringstream o;
  o << "## Memory\n\n"
    << "| backend | world | recipe | model state: estimate | measured | budget | peak (where) |\n"
    << "|---|---|---|---|---|---|---|\n";
  for (const auto& r : runs) {
    const PhasePeak* w = worst_of(r.peaks);
    o << "| " << r.backend << " | " << r.world << " | "
      << (r.has_estimate ? r.estimate.input.recipe.name + " (" + sharding_name(r.estimate.input.strategy) + ")" : "-")
      << " | " << (r.has_estimate ? cell_bytes(r.estimate.model_state()) : "-") << " | "
      << cell_bytes(r.measured_model_state_bytes) << " | "
      << (r.budget_bytes > 0 ? human_bytes(r.budget_bytes) : "none") << " | "
      << (w ? human_bytes(static_cast<double>(w->peak_bytes)) + " (rank " + std::to_string(w->rank) + ", " + w->bucket +
                  " bucket, " + w->phase + ")"
            : "-")
      << " |\n";
  }
  // Peak per phase, one column per length bucket.
  std::vector<std::string> buckets;
  for (const auto& r : runs)
    for (const auto& p : r.peaks)
      if (std::find(buckets.begin(), buckets.end(), p.bucket) == buckets.end()) buckets.push_back(p.bucket);
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const std::string& a, const std::string& b) { return bucket_order(a) < bucket_order(b); });
  if (!buckets.empty()) {
    o << "\nPeak bytes per phase (tracked CPU storage, or the CUDA allocator's allocated peak):\n\n| backend | rank "
         "| phase |";
    for (const auto& b : buckets) o << " " << b << " |";
    o << "\n|---|---|---|";
    for (size_t i = 0; i < buckets.size(); ++i) o << "---|";
    o << "\n";
    for (const auto& r : runs) {
      // Rows in the order phases were first recorded, per rank.
      std::vector<std::pair<int, std::string>> rows;
      std::map<std::tuple<int, std::string, std::string>, int64_t> cell;
      for (const auto& p : r.peaks) {
        const std::pair<int, std::string> key{p.rank, p.phase};
        if (std::find(rows.begin(), rows.end(), key) == rows.end()) rows.push_back(key);
        cell[{p.rank, p.phase, p.bucket}] = p.peak_bytes;
      }
      std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [rank, phase] : rows) {
        o << "| " << r.backend << " | " << rank << " | " << phase << " |";
        for (const auto& b : buckets) {
          auto it = cell.find({rank, phase, b});
          o << " " << (it == cell.end() ? "-" : cell_bytes(it->second)) << " |";
        }
        o << "\n";
      }
    }
  }
  o << "\nThe estimate counts model state only; excluded: ";
  const auto ex = excluded_from_estimate();
  for (size_t i = 0; i < ex.size(); ++i) o << (i ? "; " : "") << ex[i];
  o << ".\n";
  return o.str();
}

std::string throughput_markdown(const std::vector<Throughput>& runs) {
  std::ostringstream o;
  o << "## Throughput\n\n"
    << "| backend | ranks | input tok/s | target tok/s | step (median) | saving pause | peak | speedup | efficiency | "
       "GPU-hours ratio |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& t : runs) {
    o << "| " << t.backend << " | " << t.devices << " | " << fixed(t.input_tokens_per_s, "%.1f") << " | "
      << fixed(t.target_tokens_per_s, "%.1f") << " | " << fixed(t.step_seconds * 1e3, "%.2f ms") << " | "
      << (t.save_pause_seconds < 0 ? "-" : fixed(t.save_pause_seconds * 1e3, "%.2f ms")) << " | "
      << cell_bytes(t.peak_bytes) << " | " << (t.has_baseline ? fixed(t.scaling.speedup, "%.2f") : "-") << " | "
      << (t.has_baseline ? fixed(t.scaling.efficiency, "%.2f") : "-") << " | "
      << (t.has_baseline ? fixed(t.scaling.gpu_hours_ratio, "%.2f") : "-") << " |\n";
  }
  o << "\nInput tokens/s counts every non-pad input token (prompts included); target tokens/s counts valid targets "
       "only. Speedup is against `single` on the same plan; efficiency = speedup / D; GPU-hours ratio = D / "
       "speedup.\n";
  for (const auto& t : runs)
    if (!t.note.empty()) o << "- " << t.backend << ": " << t.note << "\n";
  return o.str();
}

std::string report_markdown(const Report& r) {
  std::ostringstream o;
  const auto& e = r.environment;
  o << "# gradcert conformance report\n\n"
    << "Verdict: **" << (r.passed() ? "pass" : "FAIL") << "**  \n"
    << "torch " << e.torch << " · " << e.device << " · launcher " << e.launcher << " · seed " << e.seed << " · git "
    << e.git << " · " << e.started << "\n\n";
  for (const auto& run : r.runs)
    if (!run.checked_from.empty())
      o << "Checked again from the run folder `" << run.checked_from
        << "` (`gradcert check`): no rank was launched; the reference was recomputed.\n\n";
  o << "| run | check | figure | tolerance | verdict | detail |\n|---|---|---|---|---|---|\n";
  for (const auto& run : r.runs) {
    if (!run.error.empty()) {
      o << "| " << run_label(run) << " | run | - | - | **error** | " << first_line(run.error) << " |\n";
      continue;
    }
    for (const auto& c : run.checks)
      o << "| " << run_label(run) << " | " << c.id << " | " << figure_text(c.figure) << " | " << tolerance_text(c)
        << " | " << verdict_cell(run, c) << " | " << c.detail << " |\n";
  }
  bool said = false;  // the diagnosis (what the stack computed instead), then NOTE [sensitivity]
  for (const auto& run : r.runs)
    for (const auto& s : {diagnosis_text(run), sensitivity_text(run)})
      if (!s.empty()) o << (said ? "" : "\n") << "- " << s << "\n", said = true;
  if (any_mutant(r)) {
    o << "\n## Mutant detection\n\n| mutant | backend | detected | by |\n|---|---|---|---|\n";
    for (const auto& run : r.runs) {
      if (run.inject.empty()) continue;
      const std::string by = detected_by_text(run, ", ");
      o << "| " << run.inject << " | " << run.backend << " | " << (by.empty() ? "**no**" : "yes") << " | " << by
        << " |\n";
    }
  }
  if (const auto m = memory_runs(r); !m.empty()) o << "\n" << memory_markdown(m);
  if (const auto t = throughput_runs(r); !t.empty()) o << "\n" << throughput_markdown(t);
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
    << b.update_batch << "; parity tolerance " << figure_text(r.tolerance) << ". torch " << r.environment.torch
    << ", git " << r.environment.git << ", " << r.environment.started << ".\n\n";
  o << "- before: " << side_facts_line(r.before_side, r.before_facts) << "\n";
  o << "- after: " << side_facts_line(r.after_side, r.after_facts) << "\n\n";
  o << "## Checks against the float64 reference\n\n| check | before | after | tolerance | verdict (before / after) |\n"
       "|---|---|---|---|---|\n";
  for (const auto& id : check_ids(r)) {
    const CheckResult *cb = find_check(r.before, id), *ca = find_check(r.after, id);
    o << "| `" << id << "` | " << figure_or(cb) << " | " << figure_or(ca) << " | " << tolerance_or(cb, ca) << " | "
      << verdict_or(r.before, cb) << " / " << verdict_or(r.after, ca) << " |\n";
  }
  for (const auto* s : {&r.before, &r.after})
    if (!s->error.empty())
      o << "\n" << (s == &r.before ? "Before" : "After") << " run failed:\n\n```\n" << s->error << "\n```\n";
  if (r.compared) {
    o << "\n## Per update\n\n| update | B_update before / after | N before / after | loss before | loss after | "
         "step s before / after |\n|---|---|---|---|---|---|\n";
    for (const auto& u : r.updates)
      o << "| " << u.update << " | " << u.batch_before << " / " << u.batch_after << " | " << u.n_before << " / "
        << u.n_after << " | " << fixed(u.loss_before, "%.10e") << " | " << fixed(u.loss_after, "%.10e") << " | "
        << seconds(u.step_before) << " / " << seconds(u.step_after) << " |\n";
    o << "\nStep time (median): before " << seconds(r.before_facts.step_seconds_median) << " s, after "
      << seconds(r.after_facts.step_seconds_median) << " s. " << r.memory << ".\n";
    o << "\n## Per tensor: after vs before (worst over updates)\n\n| tensor | grad rel L2 | grad max abs | "
         "param rel L2 | param max abs |\n|---|---|---|---|---|\n";
    for (const auto& d : worst_per_tensor(r))
      o << "| `" << d.name << "` | " << figure_text(d.grad_rel) << " | " << figure_text(d.grad_max_abs) << " | "
        << figure_text(d.param_rel) << " | " << figure_text(d.param_max_abs) << " |\n";
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

}  // namespace gradcert
