// What produces a run's artifacts, leg by leg (NOTE [run sources]).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "conformance/core/dataset.hpp"
#include "conformance/launch/launcher.hpp"
#include "conformance/run/run_plan.hpp"

namespace gradcert {

/// NOTE [run sources] The thing that produces a leg's artifacts, one of three kinds behind one
/// interface: the built-in ranks (`gradcert worker` processes meeting at a store the harness
/// serves), a stack's command (one `/bin/sh -c` that starts the stack's own ranks and reads the
/// protocol's variables) and an observed job (`gradcert observe`: the user's own launch command
/// with the recorder's variables). The harness loops over RunPlan.legs and asks the run's source
/// for each leg's launch (launch_run), so what differs between the kinds is said here, once.
class RunSource {
 public:
  virtual ~RunSource() = default;
  /// The inputs this source's ranks read beyond spec.json, plan.json and initial.safetensors.
  virtual void write_inputs(const std::string& nonce) { (void)nonce; }
  /// The launch of leg i of the run (a resumed run's first leg saves at resume.at, its second
  /// resumes from the checkpoint).
  virtual LaunchRequest leg(size_t i, const std::string& nonce) = 0;
  /// After the leg that saved: gradcert's checkpoint/ from what it wrote.
  virtual void export_checkpoint(const std::string& nonce) { (void)nonce; }
  /// A failed launch as the report says it (a command's output and the stack's traceback).
  virtual std::string failure(const std::string& message) const { return message; }
};

/// dataset.json: the spec's examples for an external stack (backends/PROTOCOL.md).
std::vector<Sample> external_samples(const Spec& spec);

/// The source of a planned run: the built-in ranks, or the stack's command for backend external.
std::unique_ptr<RunSource> source_of(const RunPlan& run);

/// The source of `gradcert observe`: the job's own command (argv) under the recorder's variables.
std::unique_ptr<RunSource> observed_job(const std::vector<std::string>& argv, const std::string& run_dir, int updates,
                                        bool keep_dropout, const std::string& device, double timeout_s);

}  // namespace gradcert
