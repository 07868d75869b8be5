#include "conformance/audit/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/run_folder.hpp"
#include "conformance/protocol/safetensors.hpp"

namespace gradcert {

using nlohmann::json;

namespace {

std::string loss_text(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.12g", x);
  return b;
}

std::string mib(double bytes) { return human_bytes(bytes); }

}  // namespace

std::string memory_text(const AuditSideFacts& b, const AuditSideFacts& a) {
  auto both = [](const std::optional<double>& x, const std::optional<double>& y) {
    return (x ? mib(*x) : std::string("not reported")) + " / " + (y ? mib(*y) : std::string("not reported"));
  };
  if (!b.peak_memory_bytes && !a.peak_memory_bytes && !b.model_state_bytes && !a.model_state_bytes)
    return "memory: neither stack reports it (external stacks: manifest peak_memory_bytes); step time only";
  auto kinds = [&] {
    if (b.peak_memory_kind == a.peak_memory_kind)
      return b.peak_memory_kind.empty() ? std::string() : " [" + b.peak_memory_kind + "]";
    return " [" + (b.peak_memory_kind.empty() ? std::string("?") : b.peak_memory_kind) + " / " +
           (a.peak_memory_kind.empty() ? std::string("?") : a.peak_memory_kind) + "]";
  };
  std::string t =
      "memory before / after: peak (worst rank) " + both(b.peak_memory_bytes, a.peak_memory_bytes) + kinds();
  if (b.model_state_bytes || a.model_state_bytes)
    t += "; model state (measured) " + both(b.model_state_bytes, a.model_state_bytes);
  return t;
}

SideData read_side(const std::string& dir, const Plan& plan, int world, DType dtype) {
  SideData d;
  // Names and shapes: the run already passed the harness's strict read against the
  // reference's; the audit compares the two sides' names with each other below.
  const TensorMap shapes = artifact_shapes(dir);
  d.updates = read_run(dir, plan, world, shapes, dtype, run_folder_nonce(dir));
  std::vector<double> steps;
  for (const auto& u : d.updates) steps.push_back(u.step_seconds);
  d.facts.step_seconds_median = median(steps);
  json m;  // read_run parsed it strictly already (depth, duplicate keys)
  if (parse_json_strict(read_text_file(dir + "/manifest.json"), m)) m = json();
  if (m.is_object()) {
    if (m.contains("backend") && m["backend"].is_string()) d.facts.manifest_backend = m["backend"];
    if (m.contains("versions") && m["versions"].is_object())
      for (auto it = m["versions"].begin(); it != m["versions"].end(); ++it)
        d.facts.versions[it.key()] =
            it.value().is_string() ? it.value().get<std::string>() : json_excerpt(it.value(), 200);
    if (m.contains("notes"))
      d.facts.notes = m["notes"].is_string() ? m["notes"].get<std::string>() : json_excerpt(m["notes"], 2000);
    // A number, or one per rank (the worst counts).
    auto worst = [&](const char* key) -> std::optional<double> {
      if (!m.contains(key)) return std::nullopt;
      const json& v = m[key];
      if (v.is_number()) return v.get<double>();
      if (!v.is_array() || v.empty()) return std::nullopt;
      double mx = 0;
      for (const auto& x : v)
        if (x.is_number()) mx = std::max(mx, x.get<double>());
      return mx;
    };
    d.facts.peak_memory_bytes = worst("peak_memory_bytes");
    d.facts.model_state_bytes = worst("model_state_bytes");
    if (m.contains("peak_memory_kind") && m["peak_memory_kind"].is_string())
      d.facts.peak_memory_kind = m["peak_memory_kind"].get<std::string>();
  }
  return d;
}

int64_t consumed_examples(const BackendUpdate& u) {
  std::set<int> seen;
  int64_t n = 0;
  for (const auto& r : u.ranks)
    if (seen.insert(r.dp_rank).second)
      for (const auto& mb : r.consumed) n += static_cast<int64_t>(mb.size());
  return n;
}

RunComparison compare_runs(const Plan& plan, const std::vector<BackendUpdate>& before_updates,
                           const std::vector<BackendUpdate>& after_updates, double tolerance) {
  RunComparison out;
  auto& diff = out.differences;
  // Side by side per update: examples, N, loss, step time.
  for (size_t u = 0; u < plan.windows.size(); ++u) {
    const auto &b = before_updates[u], &a = after_updates[u];
    AuditUpdate au{static_cast<int>(u),
                   consumed_examples(b),
                   consumed_examples(a),
                   b.valid_targets,
                   a.valid_targets,
                   b.loss,
                   a.loss,
                   b.step_seconds,
                   a.step_seconds};
    out.updates.push_back(au);
    const std::string at = "update " + std::to_string(u) + ": ";
    if (au.batch_before != au.batch_after)
      diff.push_back(at + "B_update differs: before " + std::to_string(au.batch_before) + " examples, after " +
                     std::to_string(au.batch_after));
    if (au.n_before != au.n_after)
      diff.push_back(at + "N differs: before " + std::to_string(au.n_before) + ", after " + std::to_string(au.n_after));
    const double lrel = std::fabs(a.loss - b.loss) / std::max(std::fabs(b.loss), 1e-300);
    if (!(lrel <= tolerance))
      diff.push_back(at + "loss differs: before " + loss_text(b.loss) + ", after " + loss_text(a.loss) + " (rel " +
                     figure_text(lrel) + " > " + figure_text(tolerance) + ")");
  }

  // Per tensor and update: after vs before.
  struct Worst {
    double rel = -1, abs = 0;
    std::string where;
  } wg, wp;
  auto track = [](Worst& w, double rel, double abs, const std::string& where) {
    if (std::isnan(rel) || rel > w.rel) w = {rel, abs, where};
  };
  for (size_t u = 0; u < plan.windows.size(); ++u) {
    const auto &b = before_updates[u], &a = after_updates[u];
    const std::string at = "update " + std::to_string(u) + ": ";
    for (const auto& [name, bt] : b.grads) {
      AuditTensorDiff d;
      d.update = static_cast<int>(u);
      d.name = name;
      auto ag = a.grads.find(name);
      auto ap = a.params_after.find(name);
      auto bp = b.params_after.find(name);
      if (ag == a.grads.end() || ap == a.params_after.end() || bp == b.params_after.end()) {
        diff.push_back(at + "tensor '" + name + "' is missing on the after side");
        continue;
      }
      try {
        const TensorError ge = compare_tensors(ag->second, bt), pe = compare_tensors(ap->second, bp->second);
        d.grad_rel = ge.relative;
        d.grad_max_abs = ge.max_abs;
        d.param_rel = pe.relative;
        d.param_max_abs = pe.max_abs;
      } catch (const ArtifactError& e) {
        diff.push_back(at + e.what());
        continue;
      }
      track(wg, d.grad_rel, d.grad_max_abs, "update " + std::to_string(u) + " " + name);
      track(wp, d.param_rel, d.param_max_abs, "update " + std::to_string(u) + " " + name);
      out.diffs.push_back(d);
    }
    for (const auto& [name, t] : a.grads)
      if (!b.grads.count(name)) diff.push_back(at + "tensor '" + name + "' is missing on the before side");
  }
  if (!(wg.rel <= tolerance) && wg.rel >= 0)
    diff.push_back("gradients differ between the two sides: worst " + wg.where + ": rel L2 " + figure_text(wg.rel) +
                   ", max abs " + figure_text(wg.abs) + " (tolerance " + figure_text(tolerance) + ")");
  if (!(wp.rel <= tolerance) && wp.rel >= 0)
    diff.push_back("parameters differ between the two sides: worst " + wp.where + ": rel L2 " + figure_text(wp.rel) +
                   ", max abs " + figure_text(wp.abs) + " (tolerance " + figure_text(tolerance) + ")");

  return out;
}

}  // namespace gradcert
