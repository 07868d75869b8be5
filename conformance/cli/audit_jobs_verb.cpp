// `gradcert audit-jobs`: the user's own two jobs (an FSDP1 script and its FSDP2 port), each observed
// and certified, then compared (conformance/audit/job_audit.hpp).
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "conformance/audit/job_audit.hpp"
#include "conformance/cli/verbs.hpp"
#include "conformance/run/certify.hpp"
#include "reports/report.hpp"

namespace gradcert {

Verb add_audit_jobs_verb(CLI::App& app, CommonOptions& o) {
  struct Args {
    std::string before, after;
    int updates = 3;
    double timeout_s = 1800;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "audit-jobs", "migration audit of your own two jobs: observe both launch commands (each with its one "
                    "gradcert line), certify each, compare them update by update and tensor by tensor");
  cmd->add_option("--before", a->before, "the job before the migration: its launch command, as one shell word")
      ->required();
  cmd->add_option("--after", a->after, "the job after the migration (e.g. its FSDP2 port)")->required();
  cmd->add_option("--updates", a->updates, "K: the first K optimizer updates of each job")->capture_default_str();
  cmd->add_option("--timeout", a->timeout_s, "seconds each job may run until its K-th update")->capture_default_str();
  cmd->add_option("--out", o.out, "report folder (default: reports/out/<timestamp>)");
  add_device_option(cmd, o);
  // exit 0: the two jobs train the same model, each as the reference does; 1: a difference; 2: bad
  // input or a job that failed; 130 / 143: interrupted
  return {cmd, [&o, a] {
            install_interrupt_handlers();
            JobAuditRequest req;
            for (auto [side, command] :
                 {std::pair<ObserveRequest*, std::string*>{&req.before, &a->before}, {&req.after, &a->after}}) {
              side->argv = {"/bin/sh", "-c", *command};
              side->updates = a->updates;
              side->timeout_s = a->timeout_s;
              side->device = o.device_resolved.empty() ? "cpu" : o.device_resolved;
            }
            req.out_dir = report_dir(o);
            AuditReport rep = run_job_audit(req, std::cout);
            return finish_audit(rep, req.out_dir);
          }};
}

}  // namespace gradcert
