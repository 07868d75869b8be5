#include "conformance/audit/audit.hpp"

#include "conformance/audit/compare.hpp"
#include "conformance/core/format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <sys/wait.h>

#include "backends/catalog.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/core/throughput.hpp"

namespace gradcert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// A side never started: gradcert was interrupted while the other ran (NOTE [interrupt]).
RunReport not_run(const RunPlan& run, int sig) {
  const RunRequest& r = run.request;
  const Spec& spec = run.spec;
  const Plan& plan = run.plan;
  RunReport out;
  out.backend = r.backend;
  out.topology = spec.topology;
  out.dtype = dtype_name(spec.dtype);
  out.optimizer = spec.optimizer.name;
  out.inject = r.inject;
  out.updates = static_cast<int>(plan.windows.size());
  out.update_batch = plan.update_batch;
  out.interrupted = sig;
  out.error = "not run: gradcert was interrupted by " + signal_text(sig) + " before this side started";
  return out;
}

// A side by name: adapters need the checkout; built-ins and external:<command> do not.
AuditSide resolve_side(const AuditRequest& q, const std::string& name, const std::string& inject) {
  std::string r = q.root;
  const std::string base = name.substr(0, name.find('+'));
  const auto names = backend_names();
  if (r.empty() && base.rfind("external:", 0) != 0 && std::find(names.begin(), names.end(), base) == names.end())
    r = locate_repo_root(q.exe);
  return resolve_audit_side(name, inject, r);
}

// A side's run plan (NOTE [run plan]) with its run folder under the audit's runs/.
RunPlan side_plan(const AuditRequest& q, const AuditSide& s, const std::string& role) {
  RunRequest r;
  r.spec = q.spec;
  r.backend = s.backend;
  r.world = q.world;
  r.launcher = q.launcher;
  r.inject = s.backend == kExternalBackend ? "" : s.inject;
  r.command = s.command;
  r.exe = q.exe;
  RunPlan run = make_run_plan(r);
  const Spec& eff = run.spec;
  std::string dir = role + "-" + s.label + "-w" + std::to_string(eff.topology.world()) + "-" + dtype_name(eff.dtype) +
                    "-" + eff.optimizer.name;
  if (!s.inject.empty()) dir += "-" + s.inject;
  run.request.run_dir = q.out_dir + "/runs/" + dir;
  return run;
}

RunReport run_side(const RunPlan& r, const AuditSide& s, const std::string& role, int k, std::ostream& progress) {
  RunReport out = run_backend(r);
  out.inject = s.inject;  // adapters: the --wrong flag (the harness sees a plain external run)
  char line[512];
  std::snprintf(line, sizeof line, "# [%d/2] %-6s %-12s world %d %-8s %-5s %s (%.1f s)\n", k, role.c_str(),
                side_title(s).c_str(), out.topology.world(), out.dtype.c_str(), out.optimizer.c_str(),
                !out.error.empty() ? "RUN FAILED" : (out.passed() ? "pass" : "FAIL"), out.wall_seconds);
  progress << line << std::flush;
  return out;
}

// The after side, unless gradcert was interrupted while the before side ran (NOTE [interrupt]).
RunReport run_after(const RunPlan& pa, const AuditSide& s, std::ostream& progress) {
  const int sig = interrupt_signal();
  if (!sig) return run_side(pa, s, "after", 2, progress);
  RunReport out = not_run(pa, sig);
  out.inject = s.inject;
  char line[512];
  std::snprintf(line, sizeof line, "# [2/2] %-6s %-12s not run (interrupted by %s)\n", "after", side_title(s).c_str(),
                signal_text(sig).c_str());
  progress << line << std::flush;
  return out;
}

// Memory and throughput the harness measured (built-in backends) or the manifest carries.
void measured_facts(const RunReport& r, AuditSideFacts& f) {
  if (r.has_memory) {
    if (r.memory.measured_model_state_bytes >= 0) f.model_state_bytes = double(r.memory.measured_model_state_bytes);
    for (const auto& p : r.memory.peaks)
      f.peak_memory_bytes = std::max(f.peak_memory_bytes.value_or(0.0), double(p.peak_bytes));
    f.peak_memory_kind = "tracked tensor peak";
  }
  if (r.has_throughput && r.throughput.target_tokens_per_s > 0)
    f.target_tokens_per_s = r.throughput.target_tokens_per_s;
}

// The facts a side's files carry, keeping what the harness measured.
void merge_facts(AuditSideFacts& into, const AuditSideFacts& from) {
  const auto peak = into.peak_memory_bytes;
  const auto state = into.model_state_bytes;
  const auto rate = into.target_tokens_per_s;
  const auto kind = into.peak_memory_kind;
  into = from;
  if (peak) into.peak_memory_bytes = peak;
  if (state) into.model_state_bytes = state;
  if (!kind.empty()) into.peak_memory_kind = kind;
  into.target_tokens_per_s = rate;
}

// The migration notes for the stacks the manifests name (external:<command> running one of the
// adapters: its manifest names it), with what the stacks themselves say about these points
// (the adapters' manifest "notes").
void manifest_notes(AuditReport& rep, const Spec& spec, const Plan& plan) {
  auto manifest_label = [](const AuditSide& s, const AuditSideFacts& f) {
    auto it = f.versions.find("adapter");
    return s.label == kExternalBackend && it != f.versions.end() ? it->second : s.label;
  };
  rep.notes = migration_notes(manifest_label(rep.before_side, rep.before_facts),
                              manifest_label(rep.after_side, rep.after_facts), spec, plan);
  for (auto& n : rep.notes) {
    const char* key = n.id == "divide-factor" ? "divide" : n.id == "grad-sync" ? "sync" : nullptr;
    if (!key) continue;
    auto clause = [&](const std::string& notes) {
      std::stringstream ss(notes);
      std::string part;
      while (std::getline(ss, part, ';'))
        if (part.find(key) != std::string::npos) return part.substr(part.find_first_not_of(' '));
      return std::string();
    };
    const std::string cb = clause(rep.before_facts.notes), ca = clause(rep.after_facts.notes);
    if (!cb.empty() || !ca.empty())
      n.why += "; the stacks' manifests: before \"" + (cb.empty() ? "-" : cb) + "\", after \"" +
               (ca.empty() ? "-" : ca) + "\"";
  }
}

}  // namespace

AuditReport run_audit(const AuditRequest& q, std::ostream& progress) {
  AuditReport rep;
  rep.before_side = resolve_side(q, q.before, q.before_inject);
  rep.after_side = resolve_side(q, q.after, q.after_inject);
  const RunPlan pb = side_plan(q, rep.before_side, "before"), pa = side_plan(q, rep.after_side, "after");
  const Spec& spec = pb.spec;
  const Plan& plan = pb.plan;
  rep.tolerance = spec.parity_tolerance();
  rep.spec_json = spec_to_json(spec);
  rep.notes = migration_notes(rep.before_side.label, rep.after_side.label, spec, plan);

  rep.before = run_side(pb, rep.before_side, "before", 1, progress);
  rep.after = run_after(pa, rep.after_side, progress);
  rep.interrupted = interrupt_signal();
  rep.environment = make_environment(spec.seed, spec.topology.world(), q.launcher,
                                     device_summary(spec, spec.topology.world(), rep.before_side.command.empty()));

  auto& diff = rep.differences;
  for (const auto* side : {&rep.before, &rep.after}) {
    const std::string who =
        side == &rep.before ? "before (" + rep.before_side.name + ")" : "after (" + rep.after_side.name + ")";
    if (!side->error.empty()) diff.push_back(who + ": run failed: " + first_line(side->error));
    for (const auto& c : side->checks)
      if (c.verdict == Verdict::Fail) diff.push_back(who + ": check " + c.id + " failed: " + c.detail);
  }
  measured_facts(rep.before, rep.before_facts);
  measured_facts(rep.after, rep.after_facts);
  rep.memory = memory_text(rep.before_facts, rep.after_facts);
  if (rep.run_failed()) return rep;

  SideData before, after;
  try {
    before = read_side(pb.request.run_dir, plan, plan.world(), spec.dtype);
    after = read_side(pa.request.run_dir, plan, plan.world(), spec.dtype);
  } catch (const ArtifactError& e) {
    diff.push_back(std::string("cannot compare the two runs: ") + e.what());
    return rep;
  }
  merge_facts(rep.before_facts, before.facts);
  merge_facts(rep.after_facts, after.facts);
  manifest_notes(rep, spec, plan);
  rep.memory = memory_text(rep.before_facts, rep.after_facts);
  rep.compared = true;

  RunComparison cmp = compare_runs(plan, before.updates, after.updates, rep.tolerance);
  rep.updates = std::move(cmp.updates);
  rep.diffs = std::move(cmp.diffs);
  diff.insert(diff.end(), cmp.differences.begin(), cmp.differences.end());
  return rep;
}

}  // namespace gradcert
