// `gradcert audit`: two stacks on one plan, each certified, then compared tensor by tensor.
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "conformance/audit/audit.hpp"
#include "conformance/cli/verbs.hpp"
#include "conformance/run/certify.hpp"
#include "reports/report.hpp"

namespace gradcert {

Verb add_audit_verb(CLI::App& app, CommonOptions& o) {
  auto q = std::make_shared<AuditRequest>();
  auto* cmd = app.add_subcommand(
      "audit", "migration audit: run two stacks on the same plan, certify both, compare them tensor by tensor");
  cmd->add_option("--before", q->before,
                  "the stack before the migration: a built-in backend, fsdp1 | fsdp2 | torch-ddp (the PyTorch "
                  "adapters), or external:<command>; NAME+inject=MUTANT plants a bug")
      ->required();
  cmd->add_option("--after", q->after, "the stack after the migration (same forms)")->required();
  cmd->add_option("--before-inject", q->before_inject, "plant a bug in the before side");
  cmd->add_option("--after-inject", q->after_inject, "plant a bug in the after side");
  cmd->add_option("--spec", o.spec_path, "spec JSON file (default: the built-in spec)")->check(CLI::ExistingFile);
  o.counts.push_back({cmd->add_option("--world", o.world, "ranks (default: the spec's topology)"), &o.world});
  cmd->add_option("--launcher", o.launcher, "local | mpirun (built-in backends)")->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "override the spec's dtype: float64 | float32 | bfloat16");
  cmd->add_option("--optimizer", o.optimizer, "override the spec's optimizer: sgd | adamw");
  cmd->add_option("--out", o.out, "report folder (default: reports/out/<timestamp>)");
  add_device_option(cmd, o);
  // exit 0: semantics preserved; 1: a difference or failed check; 2: bad input or failed run;
  // 130 / 143: interrupted (NOTE [interrupt])
  return {cmd, [&o, q] {
            install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop both sides' processes, write the report
            AuditRequest req = *q;
            req.spec = spec_with_overrides(o);
            req.world = o.world;
            req.launcher = launcher_from(o.launcher);
            req.exe = self_exe();
            req.out_dir = report_dir(o);
            AuditReport a = run_audit(req, std::cout);
            return finish_audit(a, req.out_dir);
          }};
}

}  // namespace gradcert
