// The migration audit of the user's own two jobs (`gradcert audit-jobs`): each launch command runs
// under `gradcert observe` and is certified against its own one-process reference; then the two are
// compared: the examples each update consumed (by content), N, and every tensor's gradient and
// parameters after the step. Where they part first is named, and explained by the reference where
// one side is right and the other wrong.
#pragma once
#include <ostream>
#include <string>

#include "conformance/core/audit_result.hpp"
#include "conformance/run/observe.hpp"

namespace gradcert {

struct JobAuditRequest {
  ObserveRequest before, after;  ///< argv, updates, device ...; run_dir and out_dir are set here
  std::string out_dir;           ///< the report folder; the jobs' run folders go under <out_dir>/runs/
};

/// Observes both jobs (one after the other) and compares them. A job that fails is reported
/// (run_failed()); bad input throws std::invalid_argument.
AuditReport run_job_audit(JobAuditRequest request, std::ostream& progress);

/// The first (update, rank, microstep) where the two run folders' observed jobs consumed other
/// examples, as a sentence naming both sides' examples by content and first tokens; "" when every
/// update consumed the same examples in the same order. Throws ArtifactError naming the file.
std::string first_sample_difference(const std::string& before_dir, const std::string& after_dir, int updates);

}  // namespace gradcert
