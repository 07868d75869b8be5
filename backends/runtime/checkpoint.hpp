// Saving and loading a built-in backend's state (NOTE [checkpoints]) in the layout-independent
// checkpoint format (NOTE [checkpoint format], conformance/protocol/checkpoint.hpp).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "backends/runtime/flat.hpp"
#include "backends/runtime/strategy.hpp"
#include "conformance/protocol/checkpoint.hpp"

namespace gradcert {

/// This rank saves its pieces of the backend's state to dir/checkpoint_file(rank); rank 0
/// writes `record` (after a barrier, so checkpoint.json means every file is there). The
/// mutants resume-optimizer-unsaved and resume-shard-unwritten plant their bugs here.
/// Returns the bytes of the host copies it held at once (the pieces it wrote), for the save's peak.
int64_t save_checkpoint(RankContext& ctx, Backend& backend, const std::string& dir, const CheckpointRecord& record);

/// Loads dir into the backend (set up from the initial weights): every canonical tensor is
/// assembled from any rank's pieces and each of this rank's pieces copied out of it; then
/// backend.after_load. Returns the record. Throws ArtifactError naming the rank, file or
/// tensor. Under resume-optimizer-unsaved the optimizer slots are left to start fresh.
CheckpointRecord load_checkpoint(RankContext& ctx, Backend& backend, const std::string& dir, const std::string& nonce);

/// The slots of `slot` that `opt` keeps, created as zeros shaped like `like` where undefined.
void allocate_slots(const OptimizerSpec& opt, OptimizerSlot& slot, const torch::Tensor& like);

/// A flat-layout range [begin, begin + n) of stepped values (`master`, and `slot` of the same
/// length from offset 0), as one StatePiece per canonical tensor it spans (ZeRO, FSDP).
std::vector<StatePiece> flat_state(const FlatLayout& layout, int64_t begin, int64_t n, const torch::Tensor& master,
                                   const OptimizerSlot& slot);

}  // namespace gradcert
