// The reference: one process, every example of an update in one concatenated batch, float64.
#pragma once
#include <atomic>
#include <string>
#include <vector>

#include "conformance/core/plan.hpp"
#include "conformance/protocol/artifacts.hpp"

namespace gradcert {

/// Runs the reference over plan.windows in order (float64, CPU), starting from
/// initial_params(spec). The topology of the plan does not matter, only each window's ids.
/// No noise floor is measured (every `floor` is zero).
std::vector<ReferenceUpdate> run_reference(const Spec& spec, const Plan& plan);

/// The two references a run is judged against (NOTE [teacher forcing]).
struct References {
  /// The reference's own trajectory from the initial weights. Each update's floor is the
  /// trajectory floor: how far a second route's own trajectory has drifted from it by then.
  std::vector<ReferenceUpdate> free_running;
  /// Update u recomputed at the stack's parameters after update u-1 (update 0: the initial
  /// weights): the gradient there, and one optimizer step from there. Each update's floor is
  /// the one-step floor. Empty when the run has another number of updates than the plan.
  std::vector<ReferenceUpdate> forced;
};

/// How the two routes of a trajectory (NOTE [noise floor]) share the machine: Auto, side by
/// side on two threads where the machine has two cores and the model is small enough (NOTE
/// [routes side by side]; for a caller whose ranks have exited); One, one after the other on the
/// calling thread (ranks are training beside it); Two, side by side whatever the size. The
/// figures are the same.
enum class RouteThreads { Auto, One, Two };

/// Both references for `run` (the stack's artifacts, read strictly), with their noise floors
/// (NOTE [noise floor]). The free-running reference keeps no gradients when `forced` is
/// computed (no check reads them then). With `spill_dir` set (created), every tensor is written
/// there as it is computed and returned streamed (NOTE [streamed tensors]): the caller holds
/// one model's state (two, side by side), not every update's; the files must outlive the
/// returned tensors. Throws ArtifactError naming the update and tensor when the
/// stack's parameters cannot be loaded, or the file when the folder cannot be written.
/// `free_running`, when given, is that half already computed for this spec and plan
/// (free_running_reference's; NOTE [reference cache] in conformance/run/reference_source.hpp): copied, not recomputed.
References run_references(const Spec& spec, const Plan& plan, const std::vector<BackendUpdate>& run,
                          const std::string& spill_dir = "", const std::vector<ReferenceUpdate>* free_running = nullptr,
                          RouteThreads threads = RouteThreads::Auto);

/// The free-running half of run_references (its gradients kept): a function of the spec and the
/// plan alone. Held in memory, or streamed from `spill_dir` when it is set (as run_references).
/// Once `*stop` is true it returns at the next update, unfinished (for a run that failed).
std::vector<ReferenceUpdate> free_running_reference(const Spec& spec, const Plan& plan,
                                                    const std::string& spill_dir = "",
                                                    const std::atomic<bool>* stop = nullptr,
                                                    RouteThreads threads = RouteThreads::Auto);

}  // namespace gradcert
