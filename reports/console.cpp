// The console writer (nccl-tests style tables with an OK / FAILED footer): `gradcert run`
// and `scripts/certify` (checks, planted bugs, memory, throughput) and `gradcert audit`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

#include "conformance/core/format.hpp"
#include "reports/memory_report.hpp"
#include "reports/report.hpp"
#include "reports/views.hpp"

namespace gradcert {

using namespace reports;

std::string memory_table(const std::vector<MemoryRunReport>& runs) {
  std::ostringstream o;
  char line[512];
  const char* head = "#%-30s %11s %11s %7s %10s %10s %10s  %s\n";
  o << "#\n# memory: model state (exact storage vs the estimate's lower bound), peak per length bucket (worst rank "
       "and phase)\n";
  std::snprintf(line, sizeof line, head, "run", "estimate", "measured", "diff", "short", "typical", "long",
                "worst peak (rank, bucket, phase)");
  o << line;
  for (const auto& r : runs) {
    std::map<std::string, int64_t> by_bucket;
    for (const auto& p : r.peaks) by_bucket[p.bucket] = std::max(by_bucket[p.bucket], p.peak_bytes);
    auto bucket = [&](const char* b) {
      auto it = by_bucket.find(b);
      return it == by_bucket.end() ? std::string("-") : cell_bytes(it->second);
    };
    std::string diff = "-";
    if (r.has_estimate && r.measured_model_state_bytes > 0 && r.estimate.model_state() > 0)
      diff = fixed(100.0 * static_cast<double>(r.measured_model_state_bytes - r.estimate.model_state()) /
                       static_cast<double>(r.estimate.model_state()),
                   "%+.2f%%");
    const PhasePeak* w = worst_of(r.peaks);
    const std::string where = w ? "rank " + std::to_string(w->rank) + ", " + w->bucket + ", " + w->phase : "-";
    std::snprintf(line, sizeof line, " %-30s %11s %11s %7s %10s %10s %10s  %s\n", r.backend.c_str(),
                  r.has_estimate ? cell_bytes(r.estimate.model_state()).c_str() : "-",
                  cell_bytes(r.measured_model_state_bytes).c_str(), diff.c_str(), bucket("short").c_str(),
                  bucket("typical").c_str(), bucket("long").c_str(), where.c_str());
    o << line;
  }
  return o.str();
}

std::string throughput_table(const std::vector<Throughput>& runs) {
  std::ostringstream o;
  char line[512];
  const char* head = "#%-30s %3s %11s %11s %9s %9s %10s %7s %6s %7s\n";
  o << "#\n# throughput (timed updates after 1 warmup; scaling: valid target tokens/s vs single with the same spec, "
       "dtype and optimizer)\n";
  std::snprintf(line, sizeof line, head, "run", "ranks", "input tok/s", "target tok/s", "step ms", "save ms", "peak",
                "speedup", "eff", "GPU-h x");
  o << line;
  for (const auto& t : runs) {
    const std::string save = t.save_pause_seconds < 0 ? "-" : fixed(t.save_pause_seconds * 1e3, "%.2f");
    const std::string speedup = t.has_baseline ? fixed(t.scaling.speedup, "%.2f") : "-";
    const std::string eff = t.has_baseline ? fixed(t.scaling.efficiency, "%.2f") : "-";
    const std::string gpu_h = t.has_baseline ? fixed(t.scaling.gpu_hours_ratio, "%.2f") : "-";
    std::snprintf(line, sizeof line, " %-30s %3d %11.1f %11.1f %9.2f %9s %10s %7s %6s %7s\n", t.backend.c_str(),
                  t.devices, t.input_tokens_per_s, t.target_tokens_per_s, t.step_seconds * 1e3, save.c_str(),
                  cell_bytes(t.peak_bytes).c_str(), speedup.c_str(), eff.c_str(), gpu_h.c_str());
    o << line;
  }
  return o.str();
}

// The backend column: a resumed run's strategy with where it resumed ("ddp@2", "ddp@2>fsdp").
static std::string backend_cell(const RunReport& run) {
  if (run.resume_at == 0) return run.backend;
  return run.backend + "@" + std::to_string(run.resume_at) +
         (run.resume_backend != run.backend ? ">" + run.resume_backend : "") +
         (run.resume_world != run.topology.world() ? "/w" + std::to_string(run.resume_world) : "");
}

std::string report_table(const Report& r) {
  std::ostringstream o;
  char line[512];
  const char* head = "#%-9s %3s %3s %3s %-9s %-6s %-21s %10s %10s %7s\n";
  const char* row = " %-9s %3d %3d %3d %-9s %-6s %-21s %10s %10s %7s\n";
  std::snprintf(line, sizeof line, head, "backend", "dp", "tp", "pp", "dtype", "optim", "check", "figure", "tolerance",
                "verdict");
  o << line;
  std::snprintf(line, sizeof line, head, "", "", "", "", "", "", "", "(rel / #)", "", "");
  o << line;
  int wrong = 0;
  for (const auto& run : r.runs) {
    if (!run.inject.empty()) continue;
    if (!run.error.empty()) {
      ++wrong;
      std::snprintf(line, sizeof line, row, backend_cell(run).c_str(), run.topology.dp, run.topology.tp,
                    run.topology.pp, run.dtype.c_str(), run.optimizer.c_str(), "run", "-", "-", "ERROR");
      o << line << "   " << run.error << "\n";
      continue;
    }
    for (const auto& c : run.checks) {
      std::snprintf(line, sizeof line, row, backend_cell(run).c_str(), run.topology.dp, run.topology.tp,
                    run.topology.pp, run.dtype.c_str(), run.optimizer.c_str(), c.id.c_str(),
                    figure_text(c.figure).c_str(), tolerance_text(c).c_str(), verdict_name(c.verdict).c_str());
      o << line;
      if (c.verdict == Verdict::Fail) {
        ++wrong;
        o << "   " << c.detail << "\n";
      }
    }
  }
  for (const auto& run : r.runs)
    if (const auto d = diagnosis_text(run); !d.empty()) o << "# " << d << "\n";
  for (const auto& run : r.runs)  // NOTE [sensitivity]
    if (const auto s = sensitivity_text(run); !s.empty()) o << "# " << s << "\n";
  if (any_mutant(r)) {
    o << "#\n# planted bugs (--inject): each must fail at least one check\n";
    std::snprintf(line, sizeof line, "#%-22s %-9s %3s %-9s %s\n", "mutant", "backend", "dp", "detected", "by");
    o << line;
    for (const auto& run : r.runs) {
      if (run.inject.empty()) continue;
      const std::string by = detected_by_text(run, " ");
      const bool caught = run.error.empty() && !by.empty();
      if (!caught) ++wrong;
      std::snprintf(line, sizeof line, " %-22s %-9s %3d %-9s %s\n", run.inject.c_str(), backend_cell(run).c_str(),
                    run.topology.dp, caught ? "yes" : "NO", run.error.empty() ? by.c_str() : "(run failed)");
      o << line;
      if (!run.error.empty()) o << "   " << run.error << "\n";
    }
  }
  if (const auto m = memory_runs(r); !m.empty()) o << memory_table(m);
  if (const auto t = throughput_runs(r); !t.empty()) o << throughput_table(t);
  o << "# #wrong: " << wrong << "\n# " << (r.passed() ? "OK" : "FAILED") << "\n";
  return o.str();
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
    o << " " << pad(id, 24) << " " << pad(figure_or(cb), 10, true) << pad(figure_or(ca), 10, true)
      << pad(tolerance_or(cb, ca), 11, true) << "  " << verdict_or(r.before, cb) << " / " << verdict_or(r.after, ca)
      << "\n";
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
                    static_cast<long long>(u.n_before), static_cast<long long>(u.n_after), u.loss_before, u.loss_after,
                    seconds(u.step_before).c_str(), seconds(u.step_after).c_str());
      o << line;
    }
    o << "#tensor (after vs before, worst update)  grad rel L2  grad max abs  param rel L2  param max abs\n";
    for (const auto& d : worst_per_tensor(r))
      o << " " << pad(d.name, 38) << " " << pad(figure_text(d.grad_rel), 11, true) << " "
        << pad(figure_text(d.grad_max_abs), 13, true) << " " << pad(figure_text(d.param_rel), 13, true) << " "
        << pad(figure_text(d.param_max_abs), 14, true) << "\n";
    o << "# tolerance (spec, " << b.dtype << "): " << figure_text(r.tolerance) << "\n";
    const double before_s = r.before_facts.step_seconds_median, after_s = r.after_facts.step_seconds_median;
    o << "# step time (median over updates): before " << seconds(before_s) << " s, after " << seconds(after_s) << " s";
    if (before_s > 0 && after_s > 0) o << fixed(after_s / before_s, " (after/before x%.2f)");
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

}  // namespace gradcert
