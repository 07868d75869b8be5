// `gradcert audit-jobs`: two observed jobs, each certified, then compared (job_audit.hpp).
#include "conformance/audit/job_audit.hpp"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "conformance/audit/compare.hpp"
#include "conformance/core/format.hpp"
#include "conformance/protocol/observed.hpp"
#include "conformance/run/harness.hpp"

namespace gradcert {

namespace {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// The job's command as the user gave it (audit-jobs runs it as `/bin/sh -c CMD`).
std::string command_of(const ObserveRequest& r) {
  if (r.argv.size() == 3 && r.argv[0] == "/bin/sh" && r.argv[1] == "-c") return r.argv[2];
  std::string c;
  for (const auto& a : r.argv) c += (c.empty() ? "" : " ") + a;
  return c;
}

// The run folder's nonce (observed.json): the strict readers hold every record to it.
std::string nonce_of(const std::string& dir) {
  std::ifstream in(dir + "/observed.json");
  std::stringstream s;
  s << in.rdbuf();
  const auto j = nlohmann::json::parse(s.str(), nullptr, false);
  if (j.is_discarded() || !j.contains("nonce") || !j["nonce"].is_string())
    throw ArtifactError(dir + "/observed.json: unreadable, or without its 'nonce'");
  return j["nonce"].get<std::string>();
}

std::string example_text(const ObservedExample& e) {
  std::string t;
  for (size_t i = 0; i < e.tokens.size() && i < 6; ++i) t += (i ? " " : "") + std::to_string(e.tokens[i]);
  return "content " + e.key + ", tokens " + t + (e.tokens.size() > 6 ? " ..." : "");
}

// "before passes (global-mean); after fails: the gradient matches local-mean ... at 3e-16".
std::string side_verdict(const char* who, const RunReport& r) {
  const Diagnosis& d = r.diagnosis;
  std::string s = std::string(who) + (r.passed() ? " passes" : " fails") + " against its own one-process reference";
  if (d.ran && !d.best.id.empty())
    s += std::string(d.matched     ? ": its gradient matches "
                     : d.separated ? ": its gradient matches, beyond its own rounding, "
                                   : ": its gradient is closest to ") +
         d.best.id + " at " + figure_text(d.best.figure);
  return s;
}

// Where the two jobs' tensors part first: the gradient (the objective, the batch, the reduction) or,
// with equal gradients, the parameters after the step (the optimizer, its state, clipping).
std::string first_departure(const std::vector<AuditTensorDiff>& diffs, double tolerance) {
  for (const auto& d : diffs) {  // in update order, then the model's tensor order
    if (!(d.grad_rel <= tolerance))
      return "the jobs part first at update " + std::to_string(d.update) + ": the gradient differs (" + d.name +
             ": rel L2 " + figure_text(d.grad_rel) + " > " + figure_text(tolerance) +
             "): the objective, the batch or the reduction";
    if (!(d.param_rel <= tolerance))
      return "the jobs part first at update " + std::to_string(d.update) +
             ": equal gradients, other parameters after the step (" + d.name + ": rel L2 " + figure_text(d.param_rel) +
             "): the optimizer, its state or clipping";
  }
  return "";
}

}  // namespace

std::string first_sample_difference(const std::string& before_dir, const std::string& after_dir, int updates) {
  const std::string nb = nonce_of(before_dir), na = nonce_of(after_dir);
  const ObservedJob jb = read_observed_job(before_dir, nb), ja = read_observed_job(after_dir, na);
  if (jb.world != ja.world)
    return "the two jobs ran on other worlds (before " + std::to_string(jb.world) + " ranks, after " +
           std::to_string(ja.world) + "): their samples are not compared rank by rank";
  for (int u = 0; u < updates; ++u)
    for (int g = 0; g < jb.world; ++g) {
      const ObservedUpdate b = read_observed_update(before_dir, g, u, nb),
                           a = read_observed_update(after_dir, g, u, na);
      const std::string at = "update " + std::to_string(u) + " rank " + std::to_string(g);
      if (b.microsteps.size() != a.microsteps.size())
        return at + ": the jobs ran " + std::to_string(b.microsteps.size()) + " and " +
               std::to_string(a.microsteps.size()) + " micro-batches (their accumulation differs)";
      for (size_t m = 0; m < b.microsteps.size(); ++m) {
        const auto &eb = b.microsteps[m].examples, &ea = a.microsteps[m].examples;
        for (size_t i = 0; i < std::max(eb.size(), ea.size()); ++i) {
          if (i < eb.size() && i < ea.size() && eb[i].key == ea[i].key) continue;
          return at + " microstep " + std::to_string(m) + " row " + std::to_string(i) + ": before consumed " +
                 (i < eb.size() ? example_text(eb[i]) : "nothing") + ", after " +
                 (i < ea.size() ? example_text(ea[i]) : "nothing") +
                 " (the jobs' data order differs: a sampler seed, shuffle or drop_last, or the data itself)";
        }
      }
    }
  return "";
}

AuditReport run_job_audit(JobAuditRequest q, std::ostream& progress) {
  AuditReport rep;
  if (q.before.argv.empty() || q.after.argv.empty())
    throw std::invalid_argument("gradcert audit-jobs: --before and --after each need the job's launch command");
  q.before.run_dir = q.out_dir + "/runs/before";
  q.after.run_dir = q.out_dir + "/runs/after";
  q.before.out_dir = q.after.out_dir = "";
  rep.before_side = {"job", "job", "observed", command_of(q.before), ""};
  rep.after_side = {"job", "job", "observed", command_of(q.after), ""};
  int k = 0;
  RunPlan run_before, run_after;  // each job's own plan and spec, as its observe made them
  for (auto [req, out, run, role] :
       {std::tuple<ObserveRequest*, RunReport*, RunPlan*, const char*>{&q.before, &rep.before, &run_before, "before"},
        {&q.after, &rep.after, &run_after, "after"}}) {
    *out = observe_job(*req, run);
    char line[256];
    std::snprintf(line, sizeof line, "# [%d/2] %-6s job %s (%.1f s): ", ++k, role,
                  !out->error.empty() ? "RUN FAILED"
                  : out->passed()     ? "pass"
                                      : "FAIL",
                  out->wall_seconds);
    progress << line << command_of(*req) << "\n" << std::flush;
  }
  auto& diff = rep.differences;
  for (const auto& [who, r] : {std::pair<const char*, const RunReport*>{"before", &rep.before}, {"after", &rep.after}})
    if (!r->error.empty()) diff.push_back(std::string(who) + " job: run failed: " + first_line(r->error));
  if (rep.run_failed()) return rep;

  const Spec &spec = run_before.spec, &spec_after = run_after.spec;
  const Plan &plan = run_before.plan, &plan_after = run_after.plan;
  rep.spec_json = spec_to_json(spec);
  rep.tolerance = spec.parity_tolerance();
  rep.environment = make_environment(0, plan.world(), LauncherKind::Local, q.before.device);
  // Each side against the reference first: a difference the reference explains is named so.
  if (!rep.before.passed() || !rep.after.passed()) {
    diff.push_back(
        side_verdict("before", rep.before) + "; " + side_verdict("after", rep.after) +
        (rep.before.passed() != rep.after.passed()
             ? std::string(rep.before.passed() ? ": the after job departs from the reference, the before job does not"
                                               : ": the before job departs from the reference, the after job does not")
             : std::string(": both depart from the reference")));
    for (const auto& [who, r] :
         {std::pair<const char*, const RunReport*>{"before", &rep.before}, {"after", &rep.after}})
      for (const auto& c : r->checks)
        if (c.verdict == Verdict::Fail)
          diff.push_back(std::string(who) + " job: check " + c.id + " failed: " + c.detail);
  }
  if (spec.dtype != spec_after.dtype)
    diff.push_back("the jobs train other dtypes (before " + dtype_name(spec.dtype) + ", after " +
                   dtype_name(spec_after.dtype) + ")");
  SideData before, after;
  try {
    if (const std::string s = first_sample_difference(q.before.run_dir, q.after.run_dir, q.before.updates); !s.empty())
      diff.push_back("the jobs part first in their data: " + s);
    before = read_side(q.before.run_dir, plan, plan.world(), spec.dtype);
    after = read_side(q.after.run_dir, plan_after, plan_after.world(), spec_after.dtype);
  } catch (const ArtifactError& e) {
    diff.push_back(std::string("cannot compare the two jobs: ") + e.what());
    return rep;
  }
  rep.before_facts = before.facts;
  rep.after_facts = after.facts;
  rep.memory = memory_text(rep.before_facts, rep.after_facts);
  if (before.updates.size() != after.updates.size() || before.updates.size() != plan.windows.size()) {
    diff.push_back("the jobs recorded " + std::to_string(before.updates.size()) + " and " +
                   std::to_string(after.updates.size()) + " updates: not compared");
    return rep;
  }
  rep.compared = true;
  RunComparison cmp = compare_runs(plan, before.updates, after.updates, rep.tolerance);
  rep.updates = std::move(cmp.updates);
  rep.diffs = std::move(cmp.diffs);
  if (const std::string first = first_departure(rep.diffs, rep.tolerance); !first.empty()) diff.push_back(first);
  diff.insert(diff.end(), cmp.differences.begin(), cmp.differences.end());
  return rep;
}

}  // namespace gradcert
