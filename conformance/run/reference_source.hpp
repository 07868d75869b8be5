// Where the C++ reference comes from: computed now, shared across certify's runs (NOTE
// [reference cache]), or begun on a harness thread while the ranks train (NOTE [early reference]).
#pragma once
#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "conformance/model/reference.hpp"
#include "conformance/run/run_plan.hpp"

namespace gradcert {

// NOTE [reference cache] The free-running reference and its floor are a function of the spec and
// the plan alone, so one gradcert process computes them once per (spec, plan): certify's runs of
// one spec and data-parallel degree (the mutants beside their correct run, most strategies)
// share them, and each run still gets its own teacher-forced reference, from its own artifacts
// (the checks that judge a run's gradients and steps read that one). Only small models are kept,
// held in memory (kCachedModelBytes a run, kCacheBytes in all); a bigger one is recomputed per run
// and streamed through the run's folder (NOTE [streamed tensors]). Runs are checked one at a time.
class ReferenceCache {
 public:
  static constexpr double kCachedModelBytes = 32.0 * (1 << 20), kCacheBytes = 256.0 * (1 << 20);

  /// float64 gradients and parameters of every update (the C++ reference is the tiny LM's).
  static double bytes(const Spec& spec, const Plan& plan) {
    return 16 * tiny_lm_parameters(spec.model) * static_cast<double>(plan.windows.size());
  }
  static bool keeps(const Spec& spec, const Plan& plan) { return bytes(spec, plan) <= kCachedModelBytes; }
  /// Whether two plans train the same windows (one free-running reference serves both).
  static bool same(const Spec& spec, const Plan& a, const Plan& b) { return key(spec, a) == key(spec, b); }

  const std::vector<ReferenceUpdate>* find(const Spec& spec, const Plan& plan) const {
    const auto it = entries_.find(key(spec, plan));
    return it == entries_.end() ? nullptr : &it->second;
  }
  const std::vector<ReferenceUpdate>* keep(const Spec& spec, const Plan& plan, std::vector<ReferenceUpdate> free) {
    if (held_ + bytes(spec, plan) > kCacheBytes) entries_.clear(), held_ = 0;
    held_ += bytes(spec, plan);
    return &(entries_[key(spec, plan)] = std::move(free));
  }

 private:
  // The spec and every window's microbatches (a resumed run's plan mixes two worlds' splits).
  static std::string key(const Spec& spec, const Plan& plan) {
    std::string key = spec_to_json(spec);
    for (const Window& w : plan.windows) {
      key += "\nu" + std::to_string(w.update) + ":";
      for (int64_t id : w.ids) key += std::to_string(id) + ",";
      for (const auto& row : w.slots) {
        key += " |";
        for (const Microbatch& mb : row) {
          key += " [";
          for (int64_t id : mb.ids) key += std::to_string(id) + ",";
        }
      }
    }
    return key;
  }
  std::map<std::string, std::vector<ReferenceUpdate>> entries_;
  double held_ = 0;
};

/// The process's one cache (runs are checked one at a time).
ReferenceCache& reference_cache();

// NOTE [early reference] The free-running half of the C++ reference needs nothing from the ranks
// (NOTE [reference cache]), so where the machine has a core beyond the built-in ranks' (one
// intra-op thread each), it runs on a thread of the harness while they train: into the run
// folder's reference/ (streamed, NOTE [streamed tensors]), or held and then cached when the model
// is small. The teacher-forced half waits for the ranks' artifacts. Where the ranks have every
// core (here: 2 cores, 2 ranks), it runs after them as before, so that it does not slow the steps
// the throughput table reports; an external stack's ranks may use every core, so they never
// share. A run that fails stops it at its next update; its files are removed with the run's
// reference/ folder.
struct EarlyReference {
  std::atomic<bool> stop{false};
  std::future<std::vector<ReferenceUpdate>> free;
  std::string spill_dir;  ///< "" when the result is held (a small model)
  Plan plan;
  EarlyReference() = default;
  EarlyReference(const EarlyReference&) = delete;
  EarlyReference& operator=(const EarlyReference&) = delete;
  ~EarlyReference() {
    stop = true;
    if (free.valid()) free.wait();
    std::error_code ec;
    if (!spill_dir.empty()) std::filesystem::remove_all(spill_dir, ec);
  }
};

/// Starts the free-running reference of `run` on a thread where the machine has a core beyond the
/// `ranks` the launch starts (and the reference is the C++ one and not cached yet).
void start_early_reference(EarlyReference& early, const RunPlan& run, int ranks);

}  // namespace gradcert
