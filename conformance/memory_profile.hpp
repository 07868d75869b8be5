// Measured peaks per phase of one process training the spec's model on one length bucket.
// Torch-free header; memory_profile.cpp links against LibTorch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/memory.hpp"

namespace at {
class Tensor;
}

namespace gradcert {

/// What measure_phases saw.
struct PhaseProfile {
  std::string bucket;              ///< "short" | "typical" | "long"
  std::vector<int64_t> ids;        ///< the batch (bucket_ids, spec.batch.micro of them)
  int64_t padded_length = 0;       ///< T of the batch
  int64_t input_tokens = 0, valid_targets = 0;
  int64_t params = 0;              ///< parameters of the model
  Recipe recipe;                   ///< recipe_for_run(spec.dtype, spec.optimizer)
  int64_t model_state_bytes = 0;   ///< exact storage of params + grads + master + optimizer slots
  int64_t checkpoint_bytes = 0;    ///< size of the checkpoint file written in "save"
  double save_seconds = 0;         ///< the saving pause
  std::vector<PhasePeak> phases;   ///< load, first forward, first backward, first optimizer step,
                                   ///< save, then forward, backward, optimizer step after warmup
};

/// Trains the spec's model on ONE process, on CPU, with the tracking allocator installed:
/// load (initial_params -> make_model, plus an fp32 master for bfloat16), the first step
/// (forward, backward, optimizer step: the step allocates the optimizer state), save (a
/// real checkpoint of params, master and optimizer state, written with torch::save to a
/// temporary folder, then removed), `warmup` unmeasured steps, and one measured step.
/// Every step uses the same batch: bucket_ids(spec, bucket, spec.batch.micro).
PhaseProfile measure_phases(const Spec& spec, LengthBucket bucket, int warmup = 2, int rank = 0);

/// Bytes of the distinct storages behind `tensors` (undefined tensors skipped, shared
/// storage counted once): the exact model-state figure for memory.lower_bound.
int64_t distinct_storage_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace gradcert
