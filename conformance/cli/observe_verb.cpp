// `gradcert observe [options] -- CMD ARGS...`: the user's own training job, certified on what it did.
#include <CLI/CLI.hpp>

#include <fstream>
#include <iterator>
#include <memory>

#include "conformance/cli/verbs.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/run/observe.hpp"

namespace gradcert {

Verb add_observe_verb(CLI::App& app, CommonOptions& o) {
  auto r = std::make_shared<ObserveRequest>();
  auto* cmd = app.add_subcommand(
      "observe",
      "run your own training job (`-- torchrun ... train.py ...`) with the gradcert integration in it, and certify "
      "its first K optimizer updates against one process over each window's concatenated batch");
  cmd->add_option("--updates", r->updates, "K: updates to certify; the job is ended cleanly after them")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--expect-batch", r->expect_batch,
                  "B_update the job must consume per update (default: the job's own settings, e.g. HF "
                  "per_device_train_batch_size x gradient_accumulation_steps x world)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--model", r->model,
                  "how the reference rebuilds the job's model when it is not a Hugging Face model: FILE.py:FUNC or "
                  "module:FUNC, FUNC(vocab_size, max_len) -> the model");
  cmd->add_flag("--keep-dropout", r->keep_dropout,
                "refuse a model with dropout instead of turning dropout off for the observed updates");
  cmd->add_option("--timeout", r->timeout_s, "seconds the job may run until its K-th update")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  cmd->add_option("--out", o.out, "report folder (default: reports/out/<timestamp>)");
  add_device_option(cmd, o);
  cmd->add_option("command", r->argv, "the job's command, after `--`, run verbatim")->required();
  return {cmd, [&o, r] {
            install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop the job, write the report
            ObserveRequest req = *r;
            req.device = o.device_resolved.empty() ? "cpu" : o.device_resolved;
            if (!req.model.empty()) req.model = absolute_factory(req.model);
            const std::string dir = report_dir(o);
            req.run_dir = dir + "/runs/observed";
            req.out_dir = dir;
            Report report;
            report.runs.push_back(observe_job(req));
            const RunReport& run = report.runs.back();
            std::ifstream spec(req.run_dir + "/spec.json");  // absent when the job recorded nothing usable
            report.spec_json.assign(std::istreambuf_iterator<char>(spec), std::istreambuf_iterator<char>());
            Spec device_of;
            device_of.device = req.device;
            report.environment = make_environment(0, run.topology.world(), LauncherKind::Local,
                                                  device_summary(device_of, run.topology.world(), false));
            return finish(report, dir);
          }};
}

}  // namespace gradcert
