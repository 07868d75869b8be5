#include "conformance/checks/checks.hpp"

#include "conformance/core/format.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <cstring>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace gradcert {

namespace {

std::string num(double x) { return g3_text(x); }

CheckResult exact(const std::string& id, double worst, const std::string& detail) {
  return {id, worst == 0 ? Verdict::Pass : Verdict::Fail, worst, 0, detail};
}

CheckResult missing_updates(const std::string& id, const std::vector<ReferenceUpdate>& ref,
                            const std::vector<BackendUpdate>& run) {
  return {id, Verdict::Fail, std::numeric_limits<double>::infinity(), 0,
          "the backend reported " + std::to_string(run.size()) + " updates, the plan has " +
              std::to_string(ref.size())};
}

// One record per DP rank (TP/PP peers consume the same examples and count once).
std::map<int, const RankRecord*> per_replica(const BackendUpdate& u) {
  std::map<int, const RankRecord*> out;
  for (const auto& r : u.ranks) out.emplace(r.dp_rank, &r);
  return out;
}

// Per tensor and update: the relative L2 error of the gradient (grads) or the parameters,
// update u held to tolerance[u]; the worst is the largest error / tolerance.
CheckResult tensor_parity(const std::string& id, const std::vector<ReferenceUpdate>& ref,
                          const std::vector<BackendUpdate>& run, const std::vector<double>& tolerance, bool grads) {
  if (ref.size() != run.size()) return missing_updates(id, ref, run);
  double worst = 0, worst_abs = 0, worst_tol = tolerance.empty() ? 0 : tolerance.front(), worst_ratio = 0;
  bool first = true;
  std::string where = "no tensors";
  std::string nonfinite;   // the first tensor with NaN or inf values, said in the detail
  std::string first_fail;  // the first update and tensor beyond the tolerance, in model order
  for (size_t u = 0; u < ref.size(); ++u) {
    const double tol = tolerance[u];
    const TensorMap& expected = grads ? ref[u].grads : ref[u].params_after;
    const TensorMap& observed = grads ? run[u].grads : run[u].params_after;
    for (const auto& [name, e] : expected) {
      auto it = observed.find(name);
      if (it == observed.end())
        return {id, Verdict::Fail, std::numeric_limits<double>::infinity(), tol,
                "update " + std::to_string(u) + ": tensor '" + name + "' missing from the backend's artifacts"};
      TensorError err;
      try {
        err = compare_tensors(it->second, e);
      } catch (const ArtifactError& ex) {
        return {id, Verdict::Fail, std::numeric_limits<double>::infinity(), tol,
                "update " + std::to_string(u) + ": " + ex.what()};
      }
      if (err.nonfinite > 0 && nonfinite.empty())
        nonfinite = "; " + std::to_string(err.nonfinite) + " non-finite value" + (err.nonfinite == 1 ? "" : "s") +
                    " in update " + std::to_string(u) + " " + name + ", first at flat index " +
                    std::to_string(err.first_nonfinite) + " (backend " + num(err.first_observed) + ", reference " +
                    num(err.first_expected) + ")";
      if (first_fail.empty() && !(err.relative <= tol))
        first_fail = "update " + std::to_string(u) + " " + name + " (rel L2 " + num(err.relative) + ")";
      const double ratio = err.relative / tol;
      if (first || std::isnan(err.relative) || ratio > worst_ratio) {
        worst = err.relative;
        worst_ratio = ratio;
        worst_abs = err.max_abs;
        worst_tol = tol;
        where = "update " + std::to_string(u) + " " + name;
        first = false;
        if (std::isnan(worst)) break;
      }
    }
    if (std::isnan(worst)) break;
    for (const auto& [name, o] : observed)
      if (!expected.count(name))
        return {id, Verdict::Fail, std::numeric_limits<double>::infinity(), tol,
                "update " + std::to_string(u) + ": unexpected tensor '" + name + "'"};
  }
  const bool ok = worst <= worst_tol;  // NaN fails
  return {id, ok ? Verdict::Pass : Verdict::Fail, worst, worst_tol,
          "worst " + where + ": rel L2 " + num(worst) + ", max abs " + num(worst_abs) +
              (!first_fail.empty() && first_fail.rfind(where + " ", 0) != 0 ? "; first failing " + first_fail : "") +
              nonfinite};
}

CheckResult tensor_parity(const std::string& id, const std::vector<ReferenceUpdate>& ref,
                          const std::vector<BackendUpdate>& run, double tolerance, bool grads) {
  return tensor_parity(id, ref, run, std::vector<double>(ref.size(), tolerance), grads);
}

// The tolerance a check is held to, from the reference's floors (NOTE [noise floor]).
struct FloorTolerance {
  double tolerance = 0;
  double floor = -1;  ///< -1: the reference measured no floor
};
FloorTolerance floor_tolerance(const std::vector<ReferenceUpdate>& ref, double UpdateFloor::* what, double calibrated,
                               double factor) {
  FloorTolerance t{calibrated, -1};
  for (const auto& r : ref)
    if (r.floor.measured) t.floor = std::max(t.floor, std::max(0.0, r.floor.*what));
  if (t.floor >= 0) t.tolerance = std::max(calibrated, factor * t.floor);
  return t;
}

// Says what the tolerance was set from (the figures also go to report.json).
CheckResult with_floor(CheckResult c, const FloorTolerance& t, double calibrated, double factor) {
  if (t.floor < 0) return c;
  c.noise_floor = t.floor;
  c.floor_factor = factor;
  c.detail += "; tolerance " + num(t.tolerance) + " = max(calibrated " + num(calibrated) + ", " + num(factor) +
              " x noise floor " + num(t.floor) + ")";
  return c;
}

}  // namespace

CheckResult check_update_size(const Plan& plan, const std::vector<BackendUpdate>& run) {
  const std::string id = "batch.update_size";
  double worst = 0;
  std::string detail;
  int64_t first_full = -1;
  for (size_t u = 0; u < run.size() && u < plan.windows.size(); ++u) {
    const Window& w = plan.windows[u];
    const int64_t expected = w.partial ? static_cast<int64_t>(w.ids.size()) : plan.update_batch;
    int64_t observed = 0;
    for (const auto& [dp, rec] : per_replica(run[u]))
      for (const auto& mb : rec->consumed) observed += static_cast<int64_t>(mb.size());
    if (!w.partial && first_full < 0) first_full = observed;
    const double dev = std::fabs(static_cast<double>(observed - expected));
    if (dev > worst) {
      worst = dev;
      detail = "update " + std::to_string(u) + ": " + std::to_string(observed) + " examples, expected " +
               std::to_string(expected) + (w.partial ? " (partial final window)" : "");
    }
  }
  if (run.size() != plan.windows.size()) {
    worst = std::numeric_limits<double>::infinity();
    detail = "the backend reported " + std::to_string(run.size()) + " updates, the plan has " +
             std::to_string(plan.windows.size());
  }
  if (detail.empty())
    detail = "B_update = " + std::to_string(plan.micro) + " x " + std::to_string(plan.accum) + " x " +
             std::to_string(plan.dp) + " = " + std::to_string(plan.update_batch) + " observed" +
             (plan.tp * plan.pp > 1 ? " (TP x PP = " + std::to_string(plan.tp * plan.pp) + " not counted)" : "");
  return exact(id, worst, detail);
}

CheckResult check_window_count(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run) {
  const std::string id = "targets.window_count";
  if (ref.size() != run.size()) return missing_updates(id, ref, run);
  double worst = 0;
  std::string detail, unexposed;
  for (size_t u = 0; u < ref.size(); ++u) {
    if (!run[u].has_valid_targets) {
      unexposed += (unexposed.empty() ? "" : ", ") + std::to_string(u);
      continue;
    }
    const double dev = std::fabs(static_cast<double>(run[u].valid_targets - ref[u].valid_targets));
    if (dev > worst) {
      worst = dev;
      detail = "update " + std::to_string(u) + ": the backend used N=" + std::to_string(run[u].valid_targets) +
               ", the window holds " + std::to_string(ref[u].valid_targets) + " valid targets";
    }
  }
  const size_t exposed =
      ref.size() - static_cast<size_t>(std::count_if(run.begin(), run.end(),
                                                     [](const BackendUpdate& b) { return !b.has_valid_targets; }));
  if (exposed == 0)
    return {id, Verdict::Skip, 0, 0, "the stack exposes no N (manifest valid_targets null in every update)"};
  if (detail.empty()) {
    detail = "N per window:";
    for (const auto& r : ref) detail += " " + std::to_string(r.valid_targets);
  }
  if (!unexposed.empty()) detail += " (N not exposed in updates " + unexposed + ")";
  return exact(id, worst, detail);
}

CheckResult check_replicas_agree(const std::vector<BackendUpdate>& run, size_t expected_updates) {
  const std::string id = "replicas.agree";
  if (run.size() != expected_updates)
    return {id, Verdict::Fail, std::numeric_limits<double>::infinity(), 0,
            std::to_string(run.size()) + " updates reported, the plan has " + std::to_string(expected_updates)};
  int64_t compared = 0, wrong = 0;
  std::string detail;
  for (size_t u = 0; u < run.size(); ++u) {
    std::map<std::string, std::vector<std::pair<int, std::string>>> held;  // tensor -> (rank, digest)
    for (const auto& r : run[u].ranks)
      for (const auto& [name, digest] : r.replicas) held[name].push_back({r.rank, digest});
    for (const auto& [name, copies] : held) {
      if (copies.size() < 2) continue;
      ++compared;
      std::map<std::string, int> votes;
      for (const auto& c : copies) ++votes[c.second];
      if (votes.size() == 1) continue;
      ++wrong;
      if (!detail.empty()) continue;
      // The majority value (ties: the lowest rank's) is the replica; the others diverged.
      std::string major = copies.front().second;
      for (const auto& [d, n] : votes)
        if (n > votes[major]) major = d;
      std::string off, on;
      for (const auto& [rank, d] : copies) {
        std::string& list = d == major ? on : off;
        list += (list.empty() ? "" : ", ") + std::to_string(rank);
      }
      detail = "update " + std::to_string(u) + " " + name + ": rank " + off + " holds other values than rank " + on;
    }
  }
  // Shard artifacts (NOTE [shard artifacts]): every other replica group's tensors against the
  // lowest group's, element by element and exactly.
  for (size_t u = 0; u < run.size(); ++u)
    for (const ReplicaCopy& c : run[u].other_replicas)
      for (auto [kind, mine, primary] :
           {std::tuple{"gradient", &c.grads, &run[u].grads}, {"parameters", &c.params_after, &run[u].params_after}})
        for (const auto& [name, t] : *mine) {
          auto it = primary->find(name);
          if (it == primary->end()) continue;
          ++compared;
          const TensorValues a = t.read(), b = it->second.read();
          size_t first = a.size();
          for (size_t i = 0; i < a.size() && i < b.size(); ++i)
            if (std::memcmp(a.data() + i, b.data() + i, sizeof(double)) != 0) {  // exact: NaN payloads and -0 too
              first = i;
              break;
            }
          if (first == a.size()) continue;
          ++wrong;
          if (!detail.empty()) continue;
          detail = "update " + std::to_string(u) + " " + name + " (" + kind + "): replica group " +
                   std::to_string(c.replica) + " (" + c.files +
                   ") holds other values than the lowest group, first at "
                   "element " +
                   std::to_string(first) + ": " + num(a[first]) + " vs " + num(b[first]);
        }
  if (compared == 0)
    return {id, Verdict::Skip, 0, 0,
            "no tensor is held by two ranks that report replica digests (rank<g>.json replicas) or by two replica "
            "groups of shard artifacts"};
  if (detail.empty())
    detail = std::to_string(compared) + " (update, tensor) pairs held by several ranks, identical on every rank";
  else
    detail += " (" + std::to_string(wrong) + " of " + std::to_string(compared) + " (update, tensor) pairs differ)";
  return exact(id, static_cast<double>(wrong), detail);
}

CheckResult check_global_mean_loss(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                                   double tolerance) {
  const std::string id = "loss.global_mean";
  if (ref.size() != run.size()) return missing_updates(id, ref, run);
  double worst = 0;
  std::string detail = "no updates";
  size_t exposed = 0;
  for (size_t u = 0; u < ref.size(); ++u) {
    if (!run[u].has_loss) continue;  // null: the stack exposes no global loss (NOTE [stack figures])
    const bool first = exposed++ == 0;
    const double denom = std::fabs(ref[u].loss);
    const double err = denom > 0 ? std::fabs(run[u].loss - ref[u].loss) / denom : std::fabs(run[u].loss);
    if (first || std::isnan(err) || err > worst) {
      worst = err;
      char buf[160];
      std::snprintf(buf, sizeof buf, "update %zu: loss %.12g vs reference %.12g", u, run[u].loss, ref[u].loss);
      detail = buf;
      if (std::isnan(err)) break;
    }
  }
  if (exposed == 0)
    return {id, Verdict::Skip, 0, tolerance, "the stack exposes no global loss (manifest loss null in every update)"};
  return {id, worst <= tolerance ? Verdict::Pass : Verdict::Fail, worst, tolerance, detail};
}

CheckResult check_grad_parity(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                              double tolerance) {
  return tensor_parity("grad.parity", ref, run, tolerance, true);
}

std::vector<TensorFigure> tensor_errors(const std::vector<ReferenceUpdate>& ref,
                                        const std::vector<BackendUpdate>& run) {
  auto rel = [](const TensorMap& observed, const std::string& name, const HostTensor& expected) {
    auto it = observed.find(name);
    if (it == observed.end()) return std::numeric_limits<double>::infinity();
    try {
      return compare_tensors(it->second, expected).relative;
    } catch (const ArtifactError&) {
      return std::numeric_limits<double>::infinity();
    }
  };
  std::vector<TensorFigure> out;
  for (size_t u = 0; u < ref.size() && u < run.size(); ++u)
    for (const auto& [name, g] : ref[u].grads) {
      TensorFigure f;
      f.update = static_cast<int>(u);
      f.tensor = name;
      f.grad_rel = rel(run[u].grads, name, g);
      if (auto it = run[u].grads.find(name); it != run[u].grads.end()) {
        long double dot = 0, rr = 0;
        if (accumulate_projection(it->second, g, dot, rr) && rr > 0) f.grad_scale = static_cast<double>(dot / rr);
      }
      auto p = ref[u].params_after.find(name);
      f.param_rel = p == ref[u].params_after.end() ? std::numeric_limits<double>::quiet_NaN()
                                                   : rel(run[u].params_after, name, p->second);
      out.push_back(std::move(f));
    }
  return out;
}

CheckResult check_params_parity(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                                double tolerance) {
  return tensor_parity("params.parity", ref, run, tolerance, false);
}

CheckResult check_params_trajectory(const std::vector<ReferenceUpdate>& free_running,
                                    const std::vector<BackendUpdate>& run, double tolerance, double factor) {
  std::vector<double> tol(free_running.size(), tolerance);
  double worst_floor = -1;
  for (size_t u = 0; u < free_running.size(); ++u)
    if (free_running[u].floor.measured) {
      tol[u] = std::max(tolerance, factor * free_running[u].floor.params);
      worst_floor = std::max(worst_floor, free_running[u].floor.params);
    }
  CheckResult c = tensor_parity("params.trajectory", free_running, run, tol, false);
  if (worst_floor < 0 || free_running.size() != run.size()) return c;
  c.noise_floor = worst_floor;  // the floor of the update whose tolerance is reported
  for (size_t u = 0; u < tol.size(); ++u)
    if (tol[u] == c.tolerance && free_running[u].floor.measured) {
      c.noise_floor = free_running[u].floor.params;
      break;
    }
  c.floor_factor = factor;
  std::string floors;
  for (size_t u = 0; u < free_running.size(); ++u) floors += (u ? " " : "") + num(free_running[u].floor.params);
  c.detail += "; free-running (NOTE [teacher forcing]): update u held to max(calibrated " + num(tolerance) + ", " +
              num(factor) + " x trajectory floor_u), floors " + floors;
  return c;
}

CheckResult check_grad_scale(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                             double tolerance) {
  CheckResult c;
  c.id = "grad.scale";
  c.tolerance = tolerance;
  if (ref.size() != run.size()) return missing_updates(c.id, ref, run);
  if (!(tolerance > 0)) {
    c.detail = "no scale tolerance set";
    return c;
  }
  double worst = 0, worst_s = 1;
  int worst_u = -1, first_bad = -1;
  for (size_t u = 0; u < run.size() && u < ref.size(); ++u) {
    long double dot = 0, rr = 0;
    for (const auto& [name, r] : ref[u].grads) {
      auto it = run[u].grads.find(name);
      if (it != run[u].grads.end()) accumulate_projection(it->second, r, dot, rr);
    }
    if (!(rr > 0)) continue;
    const double s = static_cast<double>(dot / rr);
    const double dev = std::fabs(s - 1);
    if (!(dev <= tolerance) && first_bad < 0) first_bad = static_cast<int>(u);
    if (worst_u < 0 || !(dev <= worst)) worst = dev, worst_s = s, worst_u = static_cast<int>(u);
  }
  if (worst_u < 0) {
    c.detail = "no update with a non-zero reference gradient";
    return c;
  }
  c.figure = worst;
  c.verdict = worst <= tolerance ? Verdict::Pass : Verdict::Fail;
  char b[160];
  std::snprintf(b, sizeof b, "worst update %d: the gradient is %.6g x the reference's along it", worst_u, worst_s);
  c.detail = b;
  if (first_bad >= 0 && first_bad != worst_u) c.detail += "; first failing update " + std::to_string(first_bad);
  return c;
}

CheckResult check_rank_sums(const std::vector<ReferenceUpdate>& ref, const std::vector<BackendUpdate>& run,
                            const std::vector<int64_t>& targets_of_id, double tolerance) {
  CheckResult c;
  c.id = "ranks.local_sums";
  c.tolerance = tolerance;
  bool any = false, sums = false;
  std::string first_bad;
  for (size_t u = 0; u < run.size(); ++u)
    for (const auto& r : run[u].ranks) {
      const std::string where = "update " + std::to_string(u) + ", rank " + std::to_string(r.rank);
      if (r.valid_targets >= 0) {
        int64_t n = 0;
        for (const auto& mb : r.consumed)
          for (auto id : mb)
            if (id >= 0 && static_cast<size_t>(id) < targets_of_id.size()) n += targets_of_id[id];
        any = true;
        const double dev = std::fabs(static_cast<double>(r.valid_targets - n));
        if (dev > 0 && first_bad.empty())
          first_bad = where + ": valid_targets " + std::to_string(r.valid_targets) + ", the recount of its ids is " +
                      std::to_string(n);
        if (dev > c.figure)
          c.figure = dev,
          c.detail = where + ": valid_targets " + std::to_string(r.valid_targets) + " vs recount " + std::to_string(n);
      }
      if (r.has_loss_sum && u < ref.size() && static_cast<size_t>(r.dp_rank) < ref[u].rank_loss_sums.size()) {
        const double S = ref[u].rank_loss_sums[r.dp_rank];
        const double rel = std::fabs(r.loss_sum - S) / std::max(std::fabs(S), 1.0);
        any = sums = true;
        if (!(rel <= tolerance) && first_bad.empty())
          first_bad = where + ": loss_sum " + num(r.loss_sum) + ", the reference's S_r is " + num(S);
        if (!(rel <= c.figure))
          c.figure = rel, c.detail = where + ": loss_sum " + num(r.loss_sum) + " vs reference " + num(S);
      }
    }
  if (!any) {
    c.detail = "no rank reported its valid_targets or loss_sum";
    return c;
  }
  c.verdict = first_bad.empty() ? Verdict::Pass : Verdict::Fail;
  if (!first_bad.empty())
    c.detail = "first: " + first_bad + "; worst: " + c.detail;
  else
    c.detail = std::string("every rank's valid_targets") + (sums ? " and loss_sum" : "") + " match" +
               (sums ? "" : " (loss sums not checked: the reference has no per-rank sums)");
  return c;
}

std::vector<CheckResult> run_checks(const Plan& plan, int64_t dataset_size, const std::vector<ReferenceUpdate>& ref,
                                    const std::vector<BackendUpdate>& run, double tolerance) {
  CheckInput in;
  in.plan = &plan;
  in.dataset_size = dataset_size;
  in.reference = &ref;
  in.run = &run;
  in.tolerance = tolerance;
  in.scale_tolerance = tolerance;  // no dtype-specific scale tolerance given: the parity one
  return run_checks(in);
}

namespace {

int severity(Verdict v) { return v == Verdict::Fail ? 2 : v == Verdict::Pass ? 1 : 0; }

// Each rank is held to the estimate for that rank (PP stages differ); the worst is reported.
CheckResult memory_lower_bound(const CheckInput& in) {
  CheckResult worst;
  bool first = true;
  for (const auto& r : in.memory->ranks) {
    CheckResult c = check_memory_lower_bound(r.measured_model_state_bytes, r.estimate_model_state_bytes);
    c.detail = "rank " + std::to_string(r.rank) + ": " + c.detail;
    if (first || severity(c.verdict) > severity(worst.verdict) ||
        (c.verdict == worst.verdict && std::fabs(c.figure) > std::fabs(worst.figure)))
      worst = c;
    first = false;
  }
  if (first) worst = check_memory_lower_bound(-1, -1);
  return worst;
}

bool always(const CheckInput&) { return true; }

// The reference the loss, gradient and single-step checks judge (NOTE [teacher forcing]).
const std::vector<ReferenceUpdate>& judged(const CheckInput& in) { return in.forced ? *in.forced : *in.reference; }

// A check against judged(in), its tolerance set from that reference's noise floor.
CheckResult floored(const CheckInput& in, double UpdateFloor::* what, double calibrated,
                    CheckResult (*check)(const std::vector<ReferenceUpdate>&, const std::vector<BackendUpdate>&,
                                         double)) {
  const auto& ref = judged(in);
  const FloorTolerance t = floor_tolerance(ref, what, calibrated, in.floor_factor);
  return with_floor(check(ref, *in.run, t.tolerance), t, calibrated, in.floor_factor);
}
bool with_memory(const CheckInput& in) { return in.memory != nullptr; }

}  // namespace

const std::vector<CheckEntry>& check_table() {
  static const std::vector<CheckEntry> table = {
      {"batch.update_size", "examples consumed per update = B_micro x A x D, or the partial window's own size", always,
       [](const CheckInput& in) { return check_update_size(*in.plan, *in.run); }},
      {"batch.sample_ledger", "each example exactly once per epoch; TP/PP peers of a replica saw the same ids", always,
       [](const CheckInput& in) { return check_sample_ledger(*in.plan, in.dataset_size, *in.run); }},
      {"targets.window_count", "the N the backend used = the reference's recount of valid targets in the window",
       always, [](const CheckInput& in) { return check_window_count(*in.reference, *in.run); }},
      {"ranks.local_sums", "each rank's valid_targets = the recount of its ids; its loss_sum = the reference's S_r",
       [](const CheckInput& in) { return in.targets_of_id != nullptr; },
       [](const CheckInput& in) { return check_rank_sums(judged(in), *in.run, *in.targets_of_id, in.tolerance); }},
      {"loss.global_mean", "the backend's loss = the global token mean at its own parameters (relative error)", always,
       [](const CheckInput& in) { return floored(in, &UpdateFloor::loss, in.tolerance, check_global_mean_loss); }},
      {"grad.parity",
       "per tensor and update, relative L2 error of the gradient vs the reference at the stack's parameters", always,
       [](const CheckInput& in) { return floored(in, &UpdateFloor::grad, in.tolerance, check_grad_parity); }},
      {"grad.scale", "per update, <g, g_ref> / <g_ref, g_ref> = 1: catches scale errors below the L2 noise", always,
       [](const CheckInput& in) {
         if (!(in.scale_tolerance > 0)) return check_grad_scale(judged(in), *in.run, in.scale_tolerance);
         return floored(in, &UpdateFloor::scale, in.scale_tolerance, check_grad_scale);
       }},
      {"params.parity",
       "per tensor and update, relative L2 error of the parameters after one step from the stack's own", always,
       [](const CheckInput& in) { return floored(in, &UpdateFloor::params, in.tolerance, check_params_parity); }},
      {"params.trajectory", "per tensor, after every update, the parameters vs the free-running reference's trajectory",
       always,
       [](const CheckInput& in) {
         return check_params_trajectory(*in.reference, *in.run, in.tolerance, in.floor_factor);
       }},
      {"replicas.agree", "every tensor several ranks hold is identical on all of them after every update", always,
       [](const CheckInput& in) { return check_replicas_agree(*in.run, in.plan->windows.size()); }},
      {"memory.lower_bound", "each rank's model state >= the estimate for that rank, and at most 2% above it",
       with_memory, memory_lower_bound},
      {"memory.budget", "every peak (rank x phase x length bucket) <= memory.budget_bytes", with_memory,
       [](const CheckInput& in) { return check_memory_budget(in.memory->peaks, in.memory->budget_bytes); }},
  };
  return table;
}

std::vector<CheckResult> run_checks(const CheckInput& input) {
  std::vector<CheckResult> out;
  for (const auto& e : check_table())
    if (e.applies(input)) out.push_back(e.run(input));
  if (auto finite = check_finite(input, out)) out.insert(out.begin(), *finite);  // NOTE [non-finite values]
  return out;
}

std::vector<std::string> check_ids(bool memory, bool target_counts) {
  RunMemoryEvidence none;
  const std::vector<int64_t> no_targets;
  CheckInput probe;
  if (memory) probe.memory = &none;
  if (target_counts) probe.targets_of_id = &no_targets;
  std::vector<std::string> out;
  for (const auto& e : check_table())
    if (e.applies(probe)) out.push_back(e.id);
  return out;
}

}  // namespace gradcert
