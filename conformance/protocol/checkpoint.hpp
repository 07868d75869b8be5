// Checkpoints: what a leg of a resumed run saves and the next leg loads (NOTE [checkpoint
// format], backends/PROTOCOL.md "Checkpoints"). Torch-free: the harness reads them too.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "conformance/core/spec.hpp"
#include "conformance/protocol/safetensors.hpp"

namespace gradcert {

/// The folder a leg saves into, inside the run folder.
inline constexpr const char* kCheckpointDir = "checkpoint";
/// "rank<r>.safetensors": every rank writes one (possibly holding no tensor).
std::string checkpoint_file(int rank);

/// checkpoint.json, written by rank 0 after every rank's file.
struct CheckpointRecord {
  std::string backend;  ///< the strategy that saved it
  int world = 1;
  int updates_done = 0;        ///< K: the saved state is the one after update K - 1
  int64_t optimizer_step = 0;  ///< the optimizer's step counter (AdamW's bias correction): K
  /// The sampler's position: the next window to consume (its epoch and index in the epoch).
  int next_epoch = 0, next_index_in_epoch = 0;
  std::string nonce;  ///< the run's (NOTE [run nonce])
};
void write_checkpoint_record(const std::string& dir, const CheckpointRecord& rec);
/// Parses checkpoint.json strictly (schema, integer fields, the run's nonce); ArtifactError
/// naming `source` and the field.
CheckpointRecord parse_checkpoint_record(const std::string& text, const std::string& source, const std::string& nonce);

/// The dtype a checkpoint holds parameters and optimizer slots in: the one the optimizer
/// steps (float32 master weights for bfloat16 runs, else the run's dtype).
DType checkpoint_dtype(DType run);
/// The optimizer slots `opt` keeps per parameter: {} (sgd), {"m"} (sgd with momentum),
/// {"m", "v"} (adamw).
std::vector<std::string> optimizer_slots(const OptimizerSpec& opt);
/// Every tensor a complete checkpoint holds: "param.<p>" and "optim.<p>.<slot>" per
/// parameter (of `shapes`, names and shapes only), in checkpoint_dtype(run).
std::map<std::string, TensorExpectation> checkpoint_expectation(const TensorMap& shapes, const OptimizerSpec& opt,
                                                                DType run);

/// A checkpoint folder, read strictly: the record and replica group 0's tensors (streamed).
struct Checkpoint {
  CheckpointRecord record;
  TensorMap tensors;
};
/// Throws ArtifactError naming the rank whose file is missing, and the tensor and elements
/// no file holds (NOTE [checkpoint format]). `world`: the saving leg's (0: as the record says,
/// for a loader of another world).
Checkpoint read_checkpoint(const std::string& dir, int world, const std::map<std::string, TensorExpectation>& expect,
                           const std::string& nonce);

}  // namespace gradcert
