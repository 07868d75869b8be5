// `gradcert observe -- CMD`: the user's own training job, run as they run it, recorded by the
// gradcert integration in it (NOTE [observed records]), and certified on what it did.
#pragma once
#include <map>
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/result.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/protocol/observed.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/run/run_plan.hpp"

namespace gradcert {

/// The most updates one observe run certifies (each is a record and the job's tensors on disk).
constexpr int kMaxObservedUpdates = 10000;

/// One observed job.
struct ObserveRequest {
  std::vector<std::string> argv;  ///< the job's command, run verbatim (e.g. torchrun ... train.py --flags)
  int updates = 3;                ///< K: the first K optimizer updates are certified, then the job is ended
  int64_t expect_batch = 0;       ///< B_update the job must hold (0: the job's own settings, else what it did)
  std::string model;           ///< FILE.py:FUNC or module:FUNC the reference rebuilds the model with ("" : the job's)
  bool keep_dropout = false;   ///< refuse a model with dropout instead of turning it off
  std::string run_dir;         ///< created; receives the job's records, the run folder's files, the job's log
  std::string out_dir;         ///< the report folder (--out) the Reproduce line names ("" : run_dir)
  double timeout_s = 1800;     ///< the whole job, launch to its K-th update
  std::string device = "cpu";  ///< resolved --device: the job's parameters must be there (GRADCERT_DEVICE)
};

/// What the job's records make (NOTE [observed plan] in observed_plan.cpp): the run plan the
/// checks read, and what the report says about the job beside the checks.
struct ObservedRun {
  RunPlan run;
  std::string notes;                  ///< the job's facts: integration, batch source, dropout, optimizer, labels
  std::string unsupported_optimizer;  ///< "" : the reference steps the job's optimizer; else why not (params.* skip)
  std::map<int64_t, std::string> example_names;  ///< id -> "content KEY, tokens 5 9 2 ..." (the ledger names them)
};

/// Every rank's record of each observed update: [update][rank].
using ObservedRecords = std::vector<std::vector<ObservedUpdate>>;

/// The run folder's inputs and artifacts that a job's records make (NOTE [observed plan]).
struct ObservedFolder {
  ObservedRun observed;                              ///< the run plan the checks read, the job's facts
  std::vector<Sample> samples;                       ///< dataset.json: every example seen, by first appearance
  std::vector<std::vector<RankUpdateRecord>> ranks;  ///< rank<g>.json: what rank g consumed per update
  std::vector<ManifestUpdate> manifest;              ///< manifest.json: the job's N per update (or null)
  nlohmann::json plan_extras;  ///< plan.json's "observed": the optimizer groups per update, frozen, the job's settings
};

/// The records -> the run folder's parts: a pure function (no file is read or written). Throws
/// ArtifactError (a record that names files other than the protocol's) or std::invalid_argument
/// (a job gradcert cannot certify, naming the rank, the update and why).
ObservedFolder observed_folder(const ObserveRequest& request, const ObservedJob& job, const ObservedRecords& records);

/// Writes `folder` into its run folder through the protocol's writers (spec.json, plan.json,
/// write_dataset, write_rank_record, write_manifest; schema 2 when `sharded`).
void write_observed_folder(const ObservedFolder& folder, bool sharded, const std::string& nonce);

/// Reads K updates of every rank's records in `dir` (which the job wrote with `nonce`) and
/// writes the run folder's inputs and artifacts (spec.json, plan.json, dataset.json, rank<g>.json,
/// manifest.json) from them. Throws ArtifactError (a bad record, naming the file and field) or
/// std::invalid_argument (a job gradcert cannot certify, naming the rank, the update and why).
ObservedRun plan_observed(const ObserveRequest& request, const ObservedJob& job, const std::string& nonce);

/// Runs the job and certifies it. Bad options throw std::invalid_argument; a job that failed,
/// recorded nothing, or ran fewer updates does not throw: RunReport::error names the rank, the
/// update and the cause. `run` (optional) receives the job's plan and spec as the checks read them.
RunReport observe_job(const ObserveRequest& request, RunPlan* run = nullptr);

/// `gradcert check` of an observed run folder: the job's records in it judged again as
/// `gradcert observe` judged them (the request from its observe.json, NOTE [observe record]);
/// the Python reference writes under request.work_dir. A folder without observe.json, or whose
/// records or nonce are not the folder's, throws ArtifactError naming the file.
CheckedRun check_observed(const CheckRequest& request);

}  // namespace gradcert
