// `gradcert run`: one backend (built-in or an external stack) on a spec, checked against the reference.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "conformance/cli/verbs.hpp"
#include "conformance/run/certify.hpp"
#include "conformance/run/harness.hpp"

namespace gradcert {

namespace {

struct RunOptions {
  std::string backend = "ddp", inject, model, command;
  bool sampler_audit = false;
  int resume_at = 0;  ///< 0: the spec's resume.at
  int resume_world = 0;
  std::string resume_backend, resume_command;
};

}  // namespace

Verb add_run_verb(CLI::App& app, CommonOptions& o) {
  auto r = std::make_shared<RunOptions>();
  auto* run = app.add_subcommand("run", "run one backend on a spec and check it against the reference");
  run->add_option("--spec", o.spec_path, "spec JSON file (default: the built-in spec)")->check(CLI::ExistingFile);
  run->add_option("--backend", r->backend, "backend name (see `gradcert backends`)")->capture_default_str();
  o.counts.push_back({run->add_option("--world", o.world, "ranks to start (default: the spec's topology)"), &o.world});
  o.counts.push_back({run->add_option("--tp", o.tp, "tensor-parallel degree (default: the spec's)"), &o.tp});
  o.counts.push_back({run->add_option("--pp", o.pp, "pipeline-parallel degree (default: the spec's)"), &o.pp});
  run->add_option("--launcher", o.launcher, "local | mpirun")->capture_default_str();
  run->add_option("--inject", r->inject, "run with a planted bug (a mutant); the run passes if a check catches it");
  run->add_option("--dtype", o.dtype, "override the spec's dtype: float64 | float32 | bfloat16");
  run->add_option("--optimizer", o.optimizer, "override the spec's optimizer: sgd | adamw");
  run->add_option("--out", o.out, "report folder (default: reports/out/<timestamp>)");
  add_device_option(run, o);
  run->add_option("--model", r->model,
                  "your own model: FILE.py:FUNC or module:FUNC, FUNC(vocab_size, max_len) -> a torch causal LM "
                  "(spec model.factory; --backend external)");
  run->add_option("--command", r->command,
                  "with --backend external: the command that runs the stack (see backends/PROTOCOL.md)");
  run->add_option("--resume-at", r->resume_at,
                  "stop after K updates, save a checkpoint, end every rank, and resume in a new process group "
                  "(spec resume.at)")
      ->check(CLI::Range(1, 1 << 30));
  run->add_option("--resume-backend", r->resume_backend,
                  "with --resume-at: the strategy that loads the checkpoint and trains on (spec resume.backend)");
  run->add_option("--resume-command", r->resume_command,
                  "with --backend external and --resume-at: the command whose ranks load the checkpoint and train on "
                  "(default: --command; spec resume.command)");
  run->add_option("--resume-world", r->resume_world,
                  "with --resume-at: the second leg's world (TP and PP kept; B_update kept: spec resume.micro / "
                  "resume.accum, or derived)")
      ->check(CLI::Range(1, 1 << 20));
  run->add_flag("--sampler-audit", r->sampler_audit,
                "with --backend external: the stack samples on its own; gradcert audits the ids it reports");
  return {run, [&o, r] {
            install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop the ranks, write the report (exit 130 / 143)
            RunRequest req;
            req.spec = spec_with_overrides(o);
            if (!r->model.empty()) req.spec.model.factory = absolute_factory(r->model);
            if (r->resume_at > 0) req.spec.resume.at = r->resume_at;
            if (!r->resume_backend.empty()) req.spec.resume.backend = r->resume_backend;
            if (r->resume_world > 0) req.spec.resume.world = r->resume_world;
            if (!r->resume_command.empty()) req.spec.resume.command = r->resume_command;
            validate_spec(req.spec);  // resume.backend without resume.at
            req.backend = r->backend;
            req.world = o.world == 0 && r->backend == "single" ? std::max(1, o.tp) * std::max(1, o.pp) : o.world;
            req.tp = o.tp;
            req.pp = o.pp;
            req.launcher = launcher_from(o.launcher);
            req.inject = r->inject;
            req.command = r->command;
            req.sampler_audit = r->sampler_audit;
            req.exe = self_exe();
            RunPlan planned = make_run_plan(req);  // NOTE [run plan]: the one derivation of this run
            const std::string dir = report_dir(o);
            planned.request.run_dir = dir + "/runs/" + run_dir_name(planned);
            Report report;
            report.spec_json = spec_to_json(planned.spec);
            report.runs.push_back(run_backend(planned));
            report.environment = make_environment(
                req.spec.seed, planned.spec.topology.world(), req.launcher,
                device_summary(planned.spec, planned.spec.topology.world(), req.backend != kExternalBackend));
            return finish(report, dir);
          }};
}

}  // namespace gradcert
