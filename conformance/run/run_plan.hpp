// A run's request and its plan, computed once (NOTE [run plan]).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/plan.hpp"
#include "conformance/core/spec.hpp"
#include "conformance/launch/launcher.hpp"

namespace gradcert {

/// One backend run to certify.
struct RunRequest {
  Spec spec;
  std::string backend;
  int world = 0;       ///< 0: spec.topology's world; otherwise dp = world / (tp x pp)
  int tp = 0, pp = 0;  ///< 0: spec.topology's
  LauncherKind launcher = LauncherKind::Local;
  std::string inject;   ///< a planted bug, "" for none
  std::string run_dir;  ///< created; receives spec.json, plan.json, artifacts, rank logs
  std::string exe;      ///< the gradcert executable the ranks run (`gradcert worker`)
  /// backend "external": the shell command that runs the foreign stack (backends/PROTOCOL.md).
  std::string command;
  /// backend "external": the stack samples on its own and reports the ids it consumed;
  /// the reference is recomputed from those ids (duplicates and gaps are findings).
  bool sampler_audit = false;
};

/// One leg of a run: a resumed run (NOTE [resume] in harness.cpp) has two, each its own world's
/// split of the same windows.
struct RunLegPlan {
  Spec spec;
  Plan plan;
  int first_update = 0;  ///< the leg trains updates [first_update, first_update + its count)
};

/// NOTE [run plan] Everything a run is a function of, computed once from its request by
/// make_run_plan (or, for `gradcert observe`, from what the job did): the effective spec (the
/// request's topology applied, validated), the plan, the legs, the windows the reference runs
/// and the checks read, and each example's valid targets. Launching, checking, `check` and
/// `certify` read it and never derive a spec or a plan again, so no two of them can disagree.
struct RunPlan {
  RunRequest request;
  Spec spec;  ///< the effective spec
  Plan plan;  ///< the run's plan (a resumed run: the first leg's split of every window)
  /// The windows the reference runs and the checks read: `plan`, or for a resumed run the first
  /// leg's windows up to resume.at and the second leg's after it (resumed_plan).
  Plan checked;
  std::vector<RunLegPlan> legs;  ///< one, or two for a resumed run
  /// Valid targets of each example by id (the spec's synthetic dataset, or an observed job's).
  std::vector<int64_t> targets_of_id;
  /// A `gradcert observe` run: the dataset, plan and spec are what the job did (NOTE [observed
  /// plan] in observe.cpp); the run folder's inputs are not the spec's synthetic ones.
  bool observed = false;
  /// The Python the reference runner runs in: an observed job's own (it rebuilds the job's
  /// model, e.g. with transformers); "": the checkout's .venv.
  std::string python;

  bool external() const;
  bool resumed() const { return legs.size() > 1; }
  /// The leg that trains the last updates (a resumed run's second): its world measures memory.
  const RunLegPlan& final_leg() const { return legs.back(); }
  /// The most ranks any leg runs.
  int widest_leg() const;
  int64_t dataset_size() const { return static_cast<int64_t>(targets_of_id.size()); }
  int world() const { return plan.world(); }
};

/// The spec with the request's topology applied (throws SpecError naming topology.*).
Spec effective_spec(const RunRequest& request);

/// The request's plan, validated before anything runs: bad input (unknown backend, a topology it
/// cannot run, an unknown mutant, a bad spec, an oversized model) throws std::invalid_argument or
/// SpecError naming the option or field.
RunPlan make_run_plan(const RunRequest& request);

/// The tiny LM's parameter count, in double (a d_model of 2^31 would overflow int64).
double tiny_lm_parameters(const ModelSpec& model);

}  // namespace gradcert
