// The "memory" and "throughput" sections of the report, in each format's writer: JSON
// (json.cpp), Markdown (markdown.cpp) and the console tables (console.cpp). Torch-free.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/result.hpp"

namespace gradcert {

/// {"runs": [{backend, world, estimate{...}, measured_model_state_bytes, budget_bytes,
/// peaks[...], worst{rank, bucket, phase, peak_bytes}}], "excluded": [...]}.
nlohmann::json memory_json(const std::vector<MemoryRunReport>& runs);
/// "## Memory": a summary table (estimate, measured, budget, worst phase) and a peak table
/// (backend, rank, phase x short / typical / long).
std::string memory_markdown(const std::vector<MemoryRunReport>& runs);

/// The console table (`gradcert run`, `scripts/certify`): per run, the model-state estimate
/// and measured bytes, their difference, the peak per length bucket (worst rank and phase)
/// and where the worst peak is.
std::string memory_table(const std::vector<MemoryRunReport>& runs);

/// {"runs": [{backend, devices, input_tokens_per_s, target_tokens_per_s, step_seconds,
/// save_pause_seconds, peak_bytes, speedup, efficiency, gpu_hours_ratio, ...}]}.
nlohmann::json throughput_json(const std::vector<Throughput>& runs);
/// "## Throughput": one row per backend; scaling columns read "-" without a baseline.
std::string throughput_markdown(const std::vector<Throughput>& runs);
/// The console table: one line per run, the columns of throughput_markdown.
std::string throughput_table(const std::vector<Throughput>& runs);

}  // namespace gradcert
