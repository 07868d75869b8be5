// A run directory: what ranks write and what the checks read (see backends/PROTOCOL.md).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "conformance/core/dataset.hpp"
#include "conformance/core/memory_types.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/core/tensors.hpp"
#include "conformance/protocol/safetensors.hpp"

namespace gradcert {

/// What one rank reported for one update.
struct RankRecord {
  int rank = 0;                                ///< global rank
  int dp_rank = 0;                             ///< its data-parallel rank
  std::vector<std::vector<int64_t>> consumed;  ///< ids per microstep
  bool has_loss_sum = false;
  double loss_sum = 0;         ///< S_r = sum_a S_{r,a} as the rank reported it
  int64_t valid_targets = -1;  ///< n_r as the rank reported it (-1: not reported)
  /// NOTE [replica digests] canonical name -> a digest of the exact bytes of that tensor as
  /// this rank holds it after the update's optimizer step, for every tensor the rank holds
  /// whole (a DDP replica: all of them). Ranks holding the same tensor must agree exactly
  /// (replicas.agree): only rank 0's tensors become artifacts, so without this a replica
  /// that drifts (and feeds nothing back into an all-reduce) would pass.
  std::map<std::string, std::string> replicas;
};

/// Another replica group's copy of one update's tensors (shard artifacts, NOTE [shard
/// artifacts]): replicas.agree holds it to the primary group's values exactly.
struct ReplicaCopy {
  int replica = 0;
  std::string files;  ///< the files its pieces came from (for messages)
  TensorMap grads, params_after;
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
  TensorMap grads;  ///< per-rank shards: the lowest replica group's, assembled on read
  TensorMap params_after;
  double step_seconds = 0;
  std::vector<ReplicaCopy> other_replicas;  ///< per-rank shards: every other replica group's
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
  TensorMap params_after;  ///< parameters after the optimizer step
  UpdateFloor floor;       ///< this update's noise floor (NOTE [noise floor])
};

/// What one rank consumed in one update, and its local sums.
struct RankUpdateRecord {
  int update = 0;
  std::vector<std::vector<int64_t>> consumed;   ///< ids per microstep
  double loss_sum = 0;                          ///< S_r = sum_a S_{r,a}
  int64_t valid_targets = 0;                    ///< sum_a n_{r,a}; -1: the rank did not count it (left out)
  std::map<std::string, std::string> replicas;  ///< NOTE [replica digests]
};

/// Writes <dir>/rank<r>.json, carrying the run's nonce (NOTE [run nonce]).
void write_rank_record(const std::string& dir, int rank, int dp_rank, const std::vector<RankUpdateRecord>& updates,
                       const std::string& nonce);

/// dataset.json (backends/PROTOCOL.md): schema, ignore_index, pad_token and every sample's id,
/// tokens and labels, in the order given.
std::string dataset_json(const std::vector<Sample>& samples);
/// Writes <dir>/dataset.json.
void write_dataset(const std::string& dir, const std::vector<Sample>& samples);

/// "u<update>.<kind>.safetensors", kind "grads" | "params": rank 0's whole tensors of an update.
std::string tensor_file(int update, const char* kind);
/// What rank 0 writes per update: <dir>/u<k>.grads.safetensors, u<k>.params.safetensors.
void write_update_tensors(const std::string& dir, int update, const TensorMap& grads, const TensorMap& params);

/// NOTE [shard artifacts] Per-rank shards (artifacts schema 2, backends/PROTOCOL.md): each
/// rank writes the pieces of each tensor it holds, so no rank gathers a model it may not be able
/// to hold. A piece says which canonical tensor it is part of, that tensor's shape, which
/// replica group it belongs to, and where it lies: a row-major range (`flat`, as ZeRO and
/// FSDP split a flat parameter) or a box at per-dimension offsets (`offset`, a TP slice or a
/// DTensor Shard(dim)). gradcert checks that each replica group's pieces tile every tensor
/// exactly once (a gap or an overlap names the tensor, the elements and the files), reads the
/// lowest group's tensors as the stack's (each tensor assembled only when a check reads it, as
/// in NOTE [streamed tensors]) and holds every other group's to it exactly (replicas.agree).
struct ShardPiece {
  std::string tensor;           ///< the canonical name
  std::vector<int64_t> shape;   ///< the tensor's (global) shape
  int replica = 0;              ///< its replica group
  int64_t flat_begin = -1;      ///< >= 0: the row-major range [flat_begin, flat_begin + data.numel())
  std::vector<int64_t> offset;  ///< otherwise: the box data.shape at these offsets
  HostTensor data;              ///< the values (held), in the run's dtype
};
/// "u<update>.rank<rank>.<kind>.safetensors", kind "grads" | "params".
std::string shard_file(int update, int rank, const char* kind);
/// Writes this rank's pieces of one update: shard_file(update, rank, "grads" / "params"), each
/// with its placement in the "gradcert.placement" metadata entry (possibly no pieces).
void write_rank_shards(const std::string& dir, int update, int rank, const std::vector<ShardPiece>& grads,
                       const std::vector<ShardPiece>& params);

/// Writes `pieces` to one safetensors file at `path` with their placement in the
/// "gradcert.placement" metadata entry (beside `metadata`): the shard file format.
void write_placed_file(const std::string& path, const std::vector<ShardPiece>& pieces,
                       std::map<std::string, std::string> metadata);
/// Reads placed files (dir/<file> each) as the shard artifacts are read: every replica group
/// must tile every tensor of `expect` exactly once (errors name `what`, the tensor, the
/// elements and the files). Returns each group's tensors, streamed (NOTE [streamed tensors]).
std::map<int, TensorMap> read_placed(const std::string& dir, const std::vector<std::string>& files,
                                     const std::map<std::string, TensorExpectation>& expect, const std::string& what);

/// One update's scalar results for the manifest.
struct ManifestUpdate {
  int update = 0;
  double loss = 0;
  int64_t valid_targets = 0;
  double step_seconds = 0;
  bool has_loss = true, has_valid_targets = true;  ///< false: null in manifest.json (not exposed)
};
/// Writes <dir>/manifest.json (rank 0, after the last update), carrying the run's nonce (a loss
/// or N the stack does not expose, has_loss / has_valid_targets false, is written null); with
/// `shards`, schema 2 naming every rank's shard_file per update (NOTE [shard artifacts]).
void write_manifest(const std::string& dir, const std::string& backend, int world,
                    const std::vector<ManifestUpdate>& updates, const std::string& nonce, bool shards = false);

/// One update as manifest.json states it.
struct ManifestEntry {
  ManifestUpdate scalars;
  std::string grads, params;                           ///< schema 1: the full tensors' file names inside the run folder
  std::vector<std::string> grad_shards, param_shards;  ///< schema 2: the shard files (NOTE [shard artifacts])
  bool sharded = false;
};
/// Parses manifest.json text strictly: schema (1, or 2 with shard file lists), `world`,
/// `nonce` equal to `nonce`, one entry per plan window (or `count` of them, updates from
/// `first`: a resumed run's leg) with integer `update` (= its index)
/// and `valid_targets`, numeric `loss` and `step_seconds`, plain file names. Throws
/// ArtifactError naming `source` and the field.
std::vector<ManifestEntry> parse_manifest_json(const std::string& text, const std::string& source, const Plan& plan,
                                               int world, const std::string& nonce, int first = 0, int count = -1);
/// Parses rank<rank>.json text strictly: schema, integer `rank` (= rank) and `dp_rank` (= the
/// topology's), `nonce`, one entry per window with integer `update` and integer sample ids
/// per microstep. Returns one record per update. Throws ArtifactError naming the field.
std::vector<RankRecord> parse_rank_record_json(const std::string& text, const std::string& source, const Plan& plan,
                                               int rank, const std::string& nonce, int first = 0, int count = -1);

/// Reads a run directory strictly against the plan: the manifest, one record per rank,
/// and each update's tensors (names, shapes and dtype from `expected`); the manifest and
/// every record must carry `nonce` (this run's). Any problem throws ArtifactError naming
/// the file (and the rank, field or tensor).
/// One leg of a resumed run (NOTE [resume] in conformance/run/harness.cpp): its files are
/// <prefix>manifest.json and <prefix>rank<r>.json, holding updates [first, first + count)
/// (count -1: every window of the plan, from first = 0: a run that did not resume).
struct RunLeg {
  std::string prefix;
  int first = 0, count = -1;
};
std::vector<BackendUpdate> read_run(const std::string& dir, const Plan& plan, int world, const TensorMap& expected,
                                    DType dtype, const std::string& nonce, const RunLeg& leg = {});

/// The names, shapes and dtypes of a run folder's tensors, as its update 0 parameters say
/// (a schema 1 file, or the placements of the schema 2 shard files), no values: for a reader
/// without a plan's model (the audit). Throws ArtifactError naming the file.
TensorMap artifact_shapes(const std::string& dir);

/// What one rank measured of its memory: <dir>/rank<r>.memory.json (built-in backends).
struct RankMemory {
  int rank = 0;
  int64_t model_state_bytes = -1;         ///< distinct storage of the backend's state_tensors (-1: not reported)
  int64_t model_state_tensors = 0;        ///< how many tensors that was
  int64_t checkpoint_bytes = 0;           ///< the checkpoint file written in "save" (last bucket)
  int64_t process_high_water_bytes = -1;  ///< VmHWM when the rank finished (-1: unknown)
  std::vector<PhasePeak> peaks;           ///< per length bucket and phase (the maximum over repeats)
};
/// Writes <dir>/rank<r>.memory.json.
void write_rank_memory(const std::string& dir, const RankMemory& m);
/// Reads <dir>/rank<rank>.memory.json strictly; throws ArtifactError naming the file and field.
RankMemory read_rank_memory(const std::string& dir, int rank);

}  // namespace gradcert
