#include "reports/memory_report.hpp"

#include "conformance/core/format.hpp"
#include "conformance/memory/memory.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

namespace gradcert {

using nlohmann::json;

namespace {

json bytes_or_null(int64_t b) { return b < 0 ? json(nullptr) : json(b); }
json number_or_null(double x) { return std::isfinite(x) && x >= 0 ? json(x) : json(nullptr); }

std::string cell_bytes(int64_t b) { return b < 0 ? "-" : human_bytes(static_cast<double>(b)); }

std::string fixed(double x, const char* format) {
  char b[48];
  std::snprintf(b, sizeof b, format, x);
  return b;
}

int bucket_order(const std::string& b) { return b == "short" ? 0 : b == "typical" ? 1 : b == "long" ? 2 : 3; }

const PhasePeak* worst_of(const std::vector<PhasePeak>& peaks) {
  const PhasePeak* w = nullptr;
  for (const auto& p : peaks)
    if (!w || p.peak_bytes > w->peak_bytes) w = &p;
  return w;
}

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
         {"worst", w ? json{{"rank", w->rank}, {"bucket", w->bucket}, {"phase", w->phase},
                            {"peak_bytes", w->peak_bytes}}
                     : json(nullptr)}});
  }
  return {{"runs", out_runs}, {"excluded", excluded_from_estimate()}};
}

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
      << (w ? human_bytes(static_cast<double>(w->peak_bytes)) + " (rank " + std::to_string(w->rank) + ", " +
                  w->bucket + " bucket, " + w->phase + ")"
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
  o << "#\n# throughput (timed updates after 1 warmup; scaling: valid target tokens/s vs single with the same spec, dtype and optimizer)\n";
  std::snprintf(line, sizeof line, head, "run", "ranks", "input tok/s", "target tok/s", "step ms", "save ms", "peak",
                "speedup", "eff", "GPU-h x");
  o << line;
  for (const auto& t : runs) {
    std::snprintf(line, sizeof line, " %-30s %3d %11.1f %11.1f %9.2f %9s %10s %7s %6s %7s\n", t.backend.c_str(),
                  t.devices, t.input_tokens_per_s, t.target_tokens_per_s, t.step_seconds * 1e3,
                  t.save_pause_seconds < 0 ? "-" : fixed(t.save_pause_seconds * 1e3, "%.2f").c_str(),
                  cell_bytes(t.peak_bytes).c_str(), t.has_baseline ? fixed(t.scaling.speedup, "%.2f").c_str() : "-",
                  t.has_baseline ? fixed(t.scaling.efficiency, "%.2f").c_str() : "-",
                  t.has_baseline ? fixed(t.scaling.gpu_hours_ratio, "%.2f").c_str() : "-");
    o << line;
  }
  return o.str();
}

}  // namespace gradcert
