// What a user's own job records under `gradcert observe` (backends/python/gradcert/observe.py
// writes it; NOTE [observed records]).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradcert {

// NOTE [observed records] The integration in the job (gradcert.watch or a framework callback)
// writes into GRADCERT_OBSERVE_DIR, every file carrying the run's nonce:
//   observed.json                 rank 0: the model (class, HF config or factory, dtype, frozen
//                                 parameters), the label convention, the dropout it turned off,
//                                 the optimizer, the job's own batch settings, its status;
//   initial.safetensors           rank 0, before the first step: the weights the job starts from;
//   observed.rank<g>.u<k>.json    every rank, after update k's optimizer step: the examples of
//                                 each forward (tokens and shifted targets, a content key), the
//                                 job's num_items_in_batch, gradcert's loss sum on the job's own
//                                 logits, the clip, the tensor files, replica digests, and (rank
//                                 0) the param groups as the step used them;
//   u<k>.grads / u<k>.params      the gradient before clipping and the parameters after the step
//                                 (rank 0 whole, or every rank's DTensor pieces, placed);
//   observed.rank<g>.error.json   a rank that cannot record: the update and the cause.
// gradcert reads them strictly (a missing or mistyped field names the file and the field) and
// turns them into a run folder the checks read (NOTE [observed plan] in conformance/run/observe.cpp).

struct ObservedExample {
  std::string key;                      ///< the content key (identity: equal content, one example)
  std::vector<int64_t> tokens, labels;  ///< labels shifted: labels[t] is position t's target
};

struct ObservedMicrostep {
  std::vector<ObservedExample> examples;
  int64_t num_items_in_batch = -1;  ///< as the job passed it to the forward; -1: not passed
};

/// One rank's record of one update.
struct ObservedUpdate {
  int rank = 0, world = 0, update = 0;
  std::vector<ObservedMicrostep> microsteps;
  double loss_sum = 0;                     ///< gradcert's S_r on the job's logits
  double step_seconds = 0;                 ///< the job's own step time, the recording excluded
  double record_seconds = -1;              ///< what recording the update cost the rank (-1: not recorded)
  double clip_max_norm = 0;                ///< 0: the job did not call clip_grad_norm_ this update
  std::vector<std::string> grads, params;  ///< one file (whole tensors) or one per rank (pieces)
  bool sharded = false;
  std::map<std::string, std::string> replicas;  ///< NOTE [replica digests]
  nlohmann::json groups;  ///< rank 0: the param groups ({params: [names], lr, ...}); null elsewhere
};

/// observed.json.
struct ObservedJob {
  int world = 0;
  std::string integration, status;
  int updates_asked = 0, updates_done = 0;
  std::string model_class, factory, dtype;
  bool hf = false;
  std::string hf_loss_type;  ///< the HF model's loss_type ("" when none)
  /// How observed_model.py rebuilds the model (its HF config, the job's pickled module); "" when
  /// it does not, then rebuild_error says why (NOTE [the job's own module]).
  std::string rebuild, rebuild_error;
  int vocab = 0, max_len = 0;
  std::vector<std::string> frozen;
  std::string labels;                           ///< "hf" | "shifted" | "loss-call" | "" (no forward seen)
  std::vector<std::string> dropout;             ///< "module[.attribute] p=..." turned off
  std::string optimizer_class, optimizer_kind;  ///< kind "" : not one the reference steps
  bool sharded = false;
  std::vector<std::string> autocast;
  nlohmann::json job;  ///< the job's own settings (expect_batch, micro, accum, dataset_size, ...)
  nlohmann::json versions;
  std::string python;  ///< the job's interpreter (versions.executable): the reference runs in it
};

/// A rank's observed.rank<g>.error.json.
struct ObservedError {
  int rank = 0, update = 0;
  std::string error, file;
  std::string where;  ///< died: the innermost frame ("File ..., line N, in f")
};

/// Reads <dir>/observed.json; throws ArtifactError naming the file and field.
ObservedJob read_observed_job(const std::string& dir, const std::string& nonce);
/// Reads <dir>/observed.rank<rank>.u<update>.json; throws ArtifactError naming the file and field.
ObservedUpdate read_observed_update(const std::string& dir, int rank, int update, const std::string& nonce);
/// Every observed.rank<g>.<kind>.json in `dir`, lowest rank first (unreadable ones say so): kind
/// "error" (the integration stopped the job), "died" (the job's own uncaught exception on that rank).
std::vector<ObservedError> read_observed_errors(const std::string& dir, const std::string& kind = "error");
/// "observed.rank<rank>.u<update>.json".
std::string observed_update_file(int rank, int update);

}  // namespace gradcert
