// The JSON writer: report.json (schema gradcert.report/1, with its "memory" and
// "throughput" sections) and audit.json (schema gradcert.audit/1).
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "conformance/core/format.hpp"
#include "conformance/memory/memory.hpp"
#include "reports/memory_report.hpp"
#include "reports/report.hpp"
#include "reports/views.hpp"

namespace gradcert {

using nlohmann::json;
using namespace reports;

namespace {

json check_json(const CheckResult& c) {
  json j = {{"id", c.id},
            {"verdict", verdict_name(c.verdict)},
            {"figure", json_number(c.figure)},
            {"tolerance", json_number(c.tolerance)},
            {"detail", c.detail}};
  if (c.noise_floor >= 0) {  // NOTE [noise floor]: what the tolerance was set from
    j["noise_floor"] = json_number(c.noise_floor);
    j["floor_factor"] = json_number(c.floor_factor);
  }
  return j;
}

json checks_json(const RunReport& r) {
  json checks = json::array();
  for (const auto& c : r.checks) checks.push_back(check_json(c));
  return checks;
}

json topology_json(const TopologySpec& t) { return {{"dp", t.dp}, {"tp", t.tp}, {"pp", t.pp}}; }

json environment_json(const Environment& e) {
  return {{"torch", e.torch}, {"device", e.device}, {"world", e.world}, {"launcher", e.launcher},
          {"git", e.git},     {"seed", e.seed},     {"host", e.host},   {"started", e.started}};
}

json or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }
json or_null(const std::optional<double>& x) { return x ? json(*x) : json(nullptr); }

// ---- memory and throughput sections

json bytes_or_null(int64_t b) { return b < 0 ? json(nullptr) : json(b); }
json number_or_null(double x) { return std::isfinite(x) && x >= 0 ? json(x) : json(nullptr); }

json estimate_json(const MemoryEstimate& e) {
  const auto& x = e.input;
  return {{"recipe", x.recipe.name},
          {"breakdown", x.recipe.breakdown()},
          {"bytes_per_param", x.recipe.per_param()},
          {"strategy", sharding_name(x.strategy)},
          {"world", x.world},
          {"dp", e.dp},
          {"tp", x.tp},
          {"pp", x.pp},
          {"params", x.params},
          {"trainable", x.trainable < 0 ? x.params : x.trainable},
          {"rank_params", e.rank_params},
          {"weights", e.weights},
          {"grads", e.grads},
          {"master", e.master},
          {"moments", e.moments},
          {"gathered_unit", e.gathered_unit},
          {"model_state", e.model_state()},
          {"lower_bound", e.total()},
          {"formulas", e.formulas}};
}

// ---- audit

json side_json(const AuditSide& s, const RunReport& r, const AuditSideFacts& f) {
  json j = {{"name", s.name},
            {"label", s.label},
            {"backend", s.backend},
            {"command", or_null(s.command)},
            {"inject", or_null(s.inject)},
            {"topology", topology_json(r.topology)},
            {"dtype", r.dtype},
            {"optimizer", r.optimizer},
            {"updates", r.updates},
            {"update_batch", r.update_batch},
            {"verdict", run_verdict(r)},
            {"run_dir", r.run_dir},
            {"wall_seconds", r.wall_seconds},
            {"checks", checks_json(r)},
            {"versions", f.versions},
            {"notes", or_null(f.notes)},
            {"step_seconds_median", f.step_seconds_median},
            {"peak_memory_bytes", or_null(f.peak_memory_bytes)},
            {"model_state_bytes", or_null(f.model_state_bytes)},
            {"target_tokens_per_s", or_null(f.target_tokens_per_s)}};
  if (!r.error.empty()) j["error"] = r.error;
  if (r.interrupted) j["interrupted"] = true;
  return j;
}

json tensor_json(const AuditTensorDiff& d, bool with_update) {
  json j = {{"name", d.name},
            {"grad", {{"rel_l2", json_number(d.grad_rel)}, {"max_abs", json_number(d.grad_max_abs)}}},
            {"params", {{"rel_l2", json_number(d.param_rel)}, {"max_abs", json_number(d.param_max_abs)}}}};
  if (with_update) j["update"] = d.update;
  return j;
}

}  // namespace

json memory_json(const std::vector<MemoryRunReport>& runs) {
  json out_runs = json::array();
  for (const auto& r : runs) {
    json peaks = json::array();
    for (const auto& p : r.peaks)
      peaks.push_back({{"rank", p.rank},
                       {"bucket", p.bucket},
                       {"phase", p.phase},
                       {"device", p.device},
                       {"peak_bytes", p.peak_bytes},
                       {"current_bytes", p.current_bytes},
                       {"seconds", p.seconds},
                       {"process_high_water_bytes", bytes_or_null(p.process_high_water_bytes)},
                       {"reserved_peak_bytes", bytes_or_null(p.reserved_peak_bytes)}});
    const PhasePeak* w = worst_of(r.peaks);
    out_runs.push_back(
        {{"backend", r.backend},
         {"world", r.world},
         {"estimate", r.has_estimate ? estimate_json(r.estimate) : json(nullptr)},
         {"measured_model_state_bytes", bytes_or_null(r.measured_model_state_bytes)},
         {"budget_bytes", r.budget_bytes > 0 ? json(r.budget_bytes) : json(nullptr)},
         {"peaks", peaks},
         {"worst",
          w ? json{{"rank", w->rank}, {"bucket", w->bucket}, {"phase", w->phase}, {"peak_bytes", w->peak_bytes}}
            : json(nullptr)}});
  }
  return {{"runs", out_runs}, {"excluded", excluded_from_estimate()}};
}

json throughput_json(const std::vector<Throughput>& runs) {
  json out = json::array();
  for (const auto& t : runs) {
    json j = {{"backend", t.backend},
              {"devices", t.devices},
              {"warmup_updates", t.warmup_updates},
              {"timed_updates", t.timed_updates},
              {"input_tokens_per_s", t.input_tokens_per_s},
              {"target_tokens_per_s", t.target_tokens_per_s},
              {"step_seconds", t.step_seconds},
              {"save_pause_seconds", number_or_null(t.save_pause_seconds)},
              {"peak_bytes", bytes_or_null(t.peak_bytes)},
              {"speedup", t.has_baseline ? json(t.scaling.speedup) : json(nullptr)},
              {"efficiency", t.has_baseline ? json(t.scaling.efficiency) : json(nullptr)},
              {"gpu_hours_ratio", t.has_baseline ? json(t.scaling.gpu_hours_ratio) : json(nullptr)}};
    if (!t.note.empty()) j["note"] = t.note;
    out.push_back(j);
  }
  return {{"runs", out}, {"baseline", "single"}, {"scaling_on", "valid target tokens/s"}};
}

std::string report_json(const Report& r) {
  json runs = json::array();
  for (const auto& run : r.runs) {
    json j = {{"backend", run.backend},
              {"topology", topology_json(run.topology)},
              {"dtype", run.dtype},
              {"optimizer", run.optimizer},
              {"inject", or_null(run.inject)},
              {"updates", run.updates},
              {"update_batch", run.update_batch},
              {"checks", checks_json(run)},
              {"verdict", run.passed() ? "pass" : "fail"},
              {"run_dir", run.run_dir},
              {"wall_seconds", run.wall_seconds}};
    if (!run.checked_from.empty()) j["checked_from"] = run.checked_from;
    if (run.resume_at > 0)
      j["resume"] = {{"at", run.resume_at}, {"backend", run.resume_backend}, {"world", run.resume_world}};
    if (!run.error.empty()) j["error"] = run.error;
    if (run.interrupted) j["interrupted"] = true;
    if (const auto s = sensitivity_text(run); !s.empty()) {  // NOTE [sensitivity]
      j["sensitivity"] = {{"uniform_scale_error_detected_above", json_number(find_check(run, "grad.scale")->tolerance)},
                          {"text", s}};
      if (const CheckResult* p = find_check(run, "grad.parity"))
        j["sensitivity"]["grad_parity_tolerance"] = json_number(p->tolerance);
    }
    if (!run.tensor_errors.empty()) {
      json t = json::array();
      for (const auto& f : run.tensor_errors)
        t.push_back({{"update", f.update},
                     {"tensor", f.tensor},
                     {"grad_rel", json_number(f.grad_rel)},
                     {"grad_scale", std::isnan(f.grad_scale) ? json(nullptr) : json_number(f.grad_scale)},
                     {"param_rel", json_number(f.param_rel)}});
      j["tensor_errors"] = t;
    }
    if (run.diagnosis.ran) {
      auto cand = [](const DiagnosisCandidate& c) {
        return json{{"id", c.id},
                    {"description", c.description},
                    {"figure", json_number(c.figure)},
                    {"worst_update", c.worst_update}};
      };
      json all = json::array();
      for (const auto& c : run.diagnosis.candidates) all.push_back(cand(c));
      j["diagnosis"] = {{"matched", run.diagnosis.matched},
                        {"separated", run.diagnosis.separated},
                        {"best", cand(run.diagnosis.best)},
                        {"runner_up", cand(run.diagnosis.runner_up)},
                        {"candidates", all},
                        {"note", run.diagnosis.note}};
      if (!run.diagnosis.per_update.empty()) {
        json per = json::array();
        for (const auto& c : run.diagnosis.per_update)
          per.push_back({{"update", c.worst_update}, {"best", c.id}, {"figure", json_number(c.figure)}});
        j["diagnosis"]["per_update"] = per;
        j["diagnosis"]["teacher_forced"] = run.diagnosis.teacher_forced;
      }
    }
    runs.push_back(j);
  }
  json mutants = json::array();
  for (const auto& run : r.runs)
    if (!run.inject.empty())
      mutants.push_back({{"name", run.inject},
                         {"backend", run.backend},
                         {"detected", run.error.empty() && !run.detected_by().empty()},
                         {"detected_by", run.detected_by()}});
  json out = {{"schema", "gradcert.report/1"},
              {"environment", environment_json(r.environment)},
              {"spec", r.spec_json.empty() ? json(nullptr) : json::parse(r.spec_json)},
              {"runs", runs},
              {"mutants", mutants},
              {"memory", memory_json(memory_runs(r))},
              {"throughput", throughput_json(throughput_runs(r))},
              {"verdict", r.passed() ? "pass" : "fail"}};
  if (r.interrupted) out["interrupted"] = true;  // a partial report (NOTE [interrupt])
  return out.dump(2) + "\n";
}

std::string audit_json(const AuditReport& r) {
  json updates = json::array(), tensors = json::array(), worst = json::array(), notes = json::array();
  for (const auto& u : r.updates)
    updates.push_back({{"update", u.update},
                       {"update_batch", {{"before", u.batch_before}, {"after", u.batch_after}}},
                       {"valid_targets", {{"before", u.n_before}, {"after", u.n_after}}},
                       {"loss", {{"before", json_number(u.loss_before)}, {"after", json_number(u.loss_after)}}},
                       {"step_seconds", {{"before", u.step_before}, {"after", u.step_after}}}});
  for (const auto& d : r.diffs) tensors.push_back(tensor_json(d, true));
  for (const auto& d : worst_per_tensor(r)) worst.push_back(tensor_json(d, false));
  for (const auto& n : r.notes)
    notes.push_back({{"id", n.id},
                     {"topic", n.topic},
                     {"before", n.before},
                     {"after", n.after},
                     {"applies", n.applies},
                     {"why", n.why}});
  json j = {{"schema", "gradcert.audit/1"},
            {"environment", environment_json(r.environment)},
            {"spec", json::parse(r.spec_json.empty() ? "{}" : r.spec_json, nullptr, false)},
            {"before", side_json(r.before_side, r.before, r.before_facts)},
            {"after", side_json(r.after_side, r.after, r.after_facts)},
            {"tolerance", json_number(r.tolerance)},
            {"compared", r.compared},
            {"updates", updates},
            {"tensors", tensors},
            {"tensors_worst", worst},
            {"step_seconds_median",
             {{"before", r.before_facts.step_seconds_median}, {"after", r.after_facts.step_seconds_median}}},
            {"memory", r.memory},
            {"migration_notes", notes},
            {"differences", r.differences},
            {"verdict", r.run_failed()  ? "error"
                        : r.preserved() ? "preserved"
                                        : "differences"},
            {"verdict_text", r.verdict_text()}};
  if (r.interrupted) j["interrupted"] = true;  // a partial report (NOTE [interrupt])
  return j.dump(1) + "\n";
}

}  // namespace gradcert
