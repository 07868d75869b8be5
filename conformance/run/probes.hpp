// The memory probes every built-in rank runs after its planned updates (NOTE [memory probes]).
#pragma once
#include <string>

#include "backends/runtime/strategy.hpp"
#include "conformance/protocol/artifacts.hpp"

namespace gradcert {

/// Per length bucket (short, typical, long), with a fresh `backend_name` backend on a plan of
/// bucket examples: load, first forward / backward / optimizer step, save (a real checkpoint
/// written into `scratch_dir`, then removed), forward, backward, optimizer step. Appends the
/// peaks to out.peaks and sets out.checkpoint_bytes. Every rank of ctx must call it (the
/// collectives stay matched); the tracking allocator must be installed for CPU peaks.
void measure_buckets(RankContext& ctx, const std::string& backend_name, const std::string& scratch_dir,
                     RankMemory& out);

/// The exact storage of every tensor of model state `backend` holds (Backend::state_tensors,
/// shared storage counted once) into out.model_state_bytes and out.model_state_tensors.
void measure_model_state(Backend& backend, RankMemory& out);

}  // namespace gradcert
