// Throughput of a backend run and its scaling against `single` on the same plan. Torch-free.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/accounting.hpp"

namespace gradcert {

/// One timed optimizer update (all microsteps of a window) as rank 0 saw it.
struct TimedUpdate {
  double seconds = 0;         ///< wall time of the update (step time)
  int64_t input_tokens = 0;   ///< non-pad input tokens of the window, all ranks (prompts count)
  int64_t valid_targets = 0;  ///< valid target tokens of the window, all ranks (prompts do not)
};

/// What `gradcert` reports per backend. Scaling fields are set by compare_to_single.
struct Throughput {
  std::string backend;
  int devices = 1;                 ///< ranks (devices) the run used: efficiency = speedup / devices
  int timed_updates = 0;           ///< updates after warmup that the rates use
  int warmup_updates = 0;          ///< updates left out as warmup
  double input_tokens_per_s = 0;   ///< non-pad input tokens / s
  double target_tokens_per_s = 0;  ///< valid target tokens / s
  double step_seconds = 0;         ///< median step time of the timed updates
  double save_pause_seconds = -1;  ///< the saving pause (-1: not measured)
  int64_t peak_bytes = -1;         ///< peak memory of the run's worst phase (-1: not measured)
  std::string note;                ///< e.g. "no update after warmup: every update timed"
  bool has_baseline = false;       ///< compare_to_single ran
  Scaling scaling;                 ///< vs single: speedup, efficiency (speedup / D), GPU-hours ratio
};

/// The median (mean of the two middle values for an even count); 0 for none.
double median(std::vector<double> xs);

/// Rates from the updates after the first `warmup`: tokens summed over the timed updates
/// divided by their summed seconds; step time is their median. With no update after
/// warmup, every update is timed and `note` says so.
Throughput measure_throughput(const std::string& backend, int devices, const std::vector<TimedUpdate>& updates,
                              int warmup);

/// Sets speedup, efficiency and GPU-hours ratio of `run` against `single` (same plan), on
/// valid target tokens/s (the useful work; the same plan gives the same tokens, so this is
/// also the step-time ratio). Throws std::invalid_argument when either rate is not positive.
void compare_to_single(Throughput& run, const Throughput& single);

}  // namespace gradcert
