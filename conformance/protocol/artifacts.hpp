// A run directory: what ranks write and what the checks read (see backends/PROTOCOL.md).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "conformance/core/memory_types.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/core/tensors.hpp"

namespace gradcert {

/// What one rank reported for one update.
struct RankRecord {
  int rank = 0;     ///< global rank
  int dp_rank = 0;  ///< its data-parallel rank
  std::vector<std::vector<int64_t>> consumed;  ///< ids per microstep
  bool has_loss_sum = false;
  double loss_sum = 0;          ///< S_r = sum_a S_{r,a} as the rank reported it
  int64_t valid_targets = -1;   ///< n_r as the rank reported it (-1: not reported)
  /// NOTE [replica digests] canonical name -> a digest of the exact bytes of that tensor as
  /// this rank holds it after the update's optimizer step, for every tensor the rank holds
  /// whole (a DDP replica: all of them). Ranks holding the same tensor must agree exactly
  /// (replicas.agree): only rank 0's tensors become artifacts, so without this a replica
  /// that drifts (and feeds nothing back into an all-reduce) would pass.
  std::map<std::string, std::string> replicas;
};

/// What a backend produced for one update (full canonical tensors).
struct BackendUpdate {
  int update = 0;
  double loss = 0;
  int64_t valid_targets = 0;  ///< the N the backend used
  /// false where the manifest says null: the stack exposes no such figure (NOTE [stack figures]
  /// in backends/python/stacks/common.py); the loss / N checks skip that update.
  bool has_loss = true, has_valid_targets = true;
  std::vector<RankRecord> ranks;
  TensorMap grads;
  TensorMap params_after;
  double step_seconds = 0;
};

/// How far a second, mathematically equal computation of one update lands from the
/// reference's (NOTE [noise floor] in conformance/model/reference.cpp): the rounding a correct
/// stack of this size and dtype shows. Zero: not measured.
struct UpdateFloor {
  double grad = 0;    ///< the worst relative L2 over tensors of the gradient
  double scale = 0;   ///< |<g, g_ref> / <g_ref, g_ref> - 1| over every tensor
  double loss = 0;    ///< relative difference of the loss
  double params = 0;  ///< the worst relative L2 over tensors of the parameters after the step
  bool measured = false;
};

/// What the reference computed for one update.
struct ReferenceUpdate {
  int update = 0;
  double loss = 0;            ///< L = sum of token losses / N (0 when N = 0)
  int64_t valid_targets = 0;  ///< N, recounted from the concatenated batch's labels
  TensorMap grads;            ///< grad L (zero when N = 0)
  /// S_r per DP rank (the reference runner's pieces; empty when the reference computed none).
  std::vector<double> rank_loss_sums;
  TensorMap params_after;     ///< parameters after the optimizer step
  UpdateFloor floor;          ///< this update's noise floor (NOTE [noise floor])
};

/// What one rank consumed in one update, and its local sums.
struct RankUpdateRecord {
  int update = 0;
  std::vector<std::vector<int64_t>> consumed;  ///< ids per microstep
  double loss_sum = 0;                          ///< S_r = sum_a S_{r,a}
  int64_t valid_targets = 0;                    ///< sum_a n_{r,a}
  std::map<std::string, std::string> replicas;  ///< NOTE [replica digests]
};

/// Writes <dir>/rank<r>.json, carrying the run's nonce (NOTE [run nonce]).
void write_rank_record(const std::string& dir, int rank, int dp_rank, const std::vector<RankUpdateRecord>& updates,
                       const std::string& nonce);

/// What rank 0 writes per update: <dir>/u<k>.grads.safetensors, u<k>.params.safetensors.
void write_update_tensors(const std::string& dir, int update, const TensorMap& grads, const TensorMap& params);

/// One update's scalar results for the manifest.
struct ManifestUpdate {
  int update = 0;
  double loss = 0;
  int64_t valid_targets = 0;
  double step_seconds = 0;
  bool has_loss = true, has_valid_targets = true;  ///< false: null in manifest.json (not exposed)
};
/// Writes <dir>/manifest.json (rank 0, after the last update), carrying the run's nonce.
void write_manifest(const std::string& dir, const std::string& backend, int world,
                    const std::vector<ManifestUpdate>& updates, const std::string& nonce);

/// One update as manifest.json states it.
struct ManifestEntry {
  ManifestUpdate scalars;
  std::string grads, params;  ///< tensor file names inside the run folder
};
/// Parses manifest.json text strictly: schema, `world`, `nonce` equal to `nonce`, one entry
/// per plan window with integer `update` (= its index) and `valid_targets`, numeric `loss`
/// and `step_seconds`, plain file names. Throws ArtifactError naming `source` and the field.
std::vector<ManifestEntry> parse_manifest_json(const std::string& text, const std::string& source, const Plan& plan,
                                               int world, const std::string& nonce);
/// Parses rank<rank>.json text strictly: schema, integer `rank` (= rank) and `dp_rank` (= the
/// topology's), `nonce`, one entry per window with integer `update` and integer sample ids
/// per microstep. Returns one record per update. Throws ArtifactError naming the field.
std::vector<RankRecord> parse_rank_record_json(const std::string& text, const std::string& source, const Plan& plan,
                                               int rank, const std::string& nonce);

/// Reads a run directory strictly against the plan: the manifest, one record per rank,
/// and each update's tensors (names, shapes and dtype from `expected`); the manifest and
/// every record must carry `nonce` (this run's). Any problem throws ArtifactError naming
/// the file (and the rank, field or tensor).
std::vector<BackendUpdate> read_run(const std::string& dir, const Plan& plan, int world, const TensorMap& expected,
                                    DType dtype, const std::string& nonce);

/// What one rank measured of its memory: <dir>/rank<r>.memory.json (built-in backends).
struct RankMemory {
  int rank = 0;
  int64_t model_state_bytes = -1;  ///< distinct storage of the backend's state_tensors (-1: not reported)
  int64_t model_state_tensors = 0; ///< how many tensors that was
  int64_t checkpoint_bytes = 0;    ///< the checkpoint file written in "save" (last bucket)
  int64_t process_high_water_bytes = -1;  ///< VmHWM when the rank finished (-1: unknown)
  std::vector<PhasePeak> peaks;    ///< per length bucket and phase (the maximum over repeats)
};
/// Writes <dir>/rank<r>.memory.json.
void write_rank_memory(const std::string& dir, const RankMemory& m);
/// Reads <dir>/rank<rank>.memory.json strictly; throws ArtifactError naming the file and field.
RankMemory read_rank_memory(const std::string& dir, int rank);

}  // namespace gradcert
