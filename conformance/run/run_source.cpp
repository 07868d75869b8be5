// The three run sources (NOTE [run sources]).
#include "conformance/run/run_source.hpp"

#include <chrono>

#include "conformance/core/dataset.hpp"
#include "conformance/core/files.hpp"
#include "conformance/launch/store.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/protocol/checkpoint.hpp"
#include "conformance/protocol/variables.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/run/python_reference.hpp"

#include <nlohmann/json.hpp>

namespace gradcert {

namespace {

std::chrono::milliseconds run_timeout(const Spec& spec) {
  return std::chrono::milliseconds(static_cast<int64_t>(spec.timeout.run_s * 1000));
}

// `gradcert worker` ranks of the checkout's built-in backends, one process group per leg.
class BuiltinRanks : public RunSource {
 public:
  explicit BuiltinRanks(const RunPlan& run) : run_(run) {}

  LaunchRequest leg(size_t i, const std::string& nonce) override {
    const RunRequest& req = run_.request;
    const RunLegPlan& leg = run_.legs.at(i);
    const int world = leg.plan.world();
    // NOTE [store] The harness serves the ranks' rendezvous store itself (NOTE [rank store]), on
    // an abstract Unix socket of its own for the life of the leg: no rank has to win a race for
    // a free port another run may take first, no name is looked up, and no rank's death takes
    // the store with it. Each leg meets at a fresh one: the first group's keys stay behind.
    store_.reset();
    if (world > 1) store_ = std::make_unique<StoreServer>();
    LaunchRequest l;
    l.kind = req.launcher;
    l.world = world;
    l.argv = {req.exe, "worker", "--run-dir", req.run_dir, "--backend", i == 0 ? req.backend : resume_backend()};
    if (store_) l.argv.insert(l.argv.end(), {"--store", store_->address()});
    if (!req.inject.empty()) l.argv.insert(l.argv.end(), {"--inject", req.inject});
    if (run_.resumed() && i == 0) l.argv.insert(l.argv.end(), {"--save-at", std::to_string(run_.spec.resume.at)});
    if (i > 0)
      l.argv.insert(l.argv.end(), {"--resume-from", req.run_dir + "/" + kCheckpointDir, "--spec-file",
                                   req.run_dir + "/leg2.spec.json", "--plan-file", req.run_dir + "/leg2.plan.json"});
    l.env = {{vars::kRunNonce, nonce}};
    l.timeout = run_timeout(run_.spec);
    l.log_dir = req.run_dir;
    return l;
  }

 private:
  std::string resume_backend() const {
    return run_.spec.resume.backend.empty() ? run_.request.backend : run_.spec.resume.backend;
  }
  const RunPlan& run_;
  std::unique_ptr<StoreServer> store_;
};

// A stack's command: one launcher process runs it, and the stack starts its own ranks (e.g.
// torchrun) from the protocol's variables (backends/PROTOCOL.md).
class StackCommand : public RunSource {
 public:
  explicit StackCommand(const RunPlan& run) : run_(run) {}

  void write_inputs(const std::string&) override {
    const RunRequest& req = run_.request;
    write_dataset(req.run_dir, external_samples(run_.spec));
    // NOTE [model factory] The user's model: the reference runner calls the factory once
    // (seeded) and writes initial.safetensors with the model's own names and shapes; the
    // stack and the reference both start from it.
    if (!run_.spec.model.factory.empty())
      run_python_tool(run_.spec, "initial",
                      "--plan '" + req.run_dir + "/plan.json' --out '" + req.run_dir + "/initial.safetensors'",
                      req.run_dir, "initial");
  }

  LaunchRequest leg(size_t i, const std::string& nonce) override {
    const RunRequest& req = run_.request;
    const Spec& spec = run_.spec;
    LaunchRequest l;
    l.kind = LauncherKind::Local;
    l.rank_env = false;  // the stack's ranks are its own: no GRADCERT_RANK / GRADCERT_WORLD
    l.world = 1;
    l.argv = {"/bin/sh", "-c", i > 0 && !spec.resume.command.empty() ? spec.resume.command : req.command};
    l.env = {{vars::kRunDir, req.run_dir},
             {vars::kPlan, req.run_dir + (i == 0 ? "/plan.json" : "/leg2.plan.json")},
             {vars::kDataset, req.run_dir + "/dataset.json"},
             {vars::kInit, req.run_dir + "/initial.safetensors"},
             {vars::kOut, req.run_dir},
             {vars::kNproc, std::to_string(run_.legs.at(i).plan.world())},
             {vars::kMasterPort, std::to_string(free_local_port())},
             {vars::kSampler, req.sampler_audit ? "own" : "plan"},
             {vars::kDevice, spec.device},
             {vars::kRunNonce, nonce}};
    // The first leg saves in the stack's own format, the second resumes (NOTE [stack checkpoints]).
    if (run_.resumed() && i == 0) {
      l.env[vars::kSaveAt] = std::to_string(spec.resume.at);
      l.env[vars::kSaveDir] = stack_dir();
    }
    if (i > 0) l.env[vars::kResumeFrom] = stack_dir();
    l.timeout = run_timeout(spec);
    l.log_dir = req.run_dir;
    return l;
  }

  void export_checkpoint(const std::string& nonce) override {
    const RunRequest& req = run_.request;
    run_python_tool(run_.spec, "dcp_export",
                    "--from '" + stack_dir() + "' --out '" + req.run_dir + "/" + kCheckpointDir + "' --world " +
                        std::to_string(run_.world()) + " --nonce " + nonce,
                    req.run_dir, "checkpoint-export");
  }

  std::string failure(const std::string& message) const override {
    return command_failure(message, "the external command", "external command output", run_.request.run_dir);
  }

 private:
  std::string stack_dir() const { return run_.request.run_dir + "/checkpoint.stack"; }
  const RunPlan& run_;
};

// The user's own job under `gradcert observe`: it starts its own ranks (torchrun, accelerate
// launch, ...), and the recorder in it reads the observe variables.
class ObservedJobSource : public RunSource {
 public:
  ObservedJobSource(std::vector<std::string> argv, std::string dir, int updates, bool keep_dropout, std::string device,
                    double timeout_s)
      : argv_(std::move(argv)),
        dir_(std::move(dir)),
        updates_(updates),
        keep_dropout_(keep_dropout),
        device_(std::move(device)),
        timeout_s_(timeout_s) {}

  LaunchRequest leg(size_t, const std::string& nonce) override {
    LaunchRequest l;
    l.kind = LauncherKind::Local;
    l.world = 1;
    l.rank_env = false;
    l.argv = argv_;
    l.env = {{vars::kObserveDir, dir_},
             {vars::kObserveUpdates, std::to_string(updates_)},
             {vars::kObserveKeepDropout, keep_dropout_ ? "1" : "0"},
             {vars::kDevice, device_},
             {vars::kRunNonce, nonce}};
    l.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000));
    l.log_dir = dir_;
    return l;
  }

  std::string failure(const std::string& message) const override {
    return command_failure(message, "the job", "the job's output", dir_);
  }

 private:
  std::vector<std::string> argv_;
  std::string dir_;
  int updates_;
  bool keep_dropout_;
  std::string device_;
  double timeout_s_;
};

}  // namespace

std::vector<Sample> external_samples(const Spec& spec) {
  std::vector<Sample> samples;
  for (int64_t id = 0; id < spec.dataset.size; ++id) samples.push_back(make_sample(spec, id));
  return samples;
}

std::unique_ptr<RunSource> source_of(const RunPlan& run) {
  if (run.external()) return std::make_unique<StackCommand>(run);
  return std::make_unique<BuiltinRanks>(run);
}

std::unique_ptr<RunSource> observed_job(const std::vector<std::string>& argv, const std::string& run_dir, int updates,
                                        bool keep_dropout, const std::string& device, double timeout_s) {
  return std::make_unique<ObservedJobSource>(argv, run_dir, updates, keep_dropout, device, timeout_s);
}

}  // namespace gradcert
