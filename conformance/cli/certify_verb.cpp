// `gradcert certify`: every built-in strategy on a spec and the planted-bug matrix (the default job).
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "conformance/cli/verbs.hpp"
#include "conformance/run/certify.hpp"

namespace gradcert {

Verb add_certify_verb(CLI::App& app, CommonOptions& o) {
  auto mutants = std::make_shared<bool>(true);
  auto* cmd = app.add_subcommand("certify", "certify every built-in backend on a spec (the default job)");
  cmd->add_option("--spec", o.spec_path, "spec JSON file (default: the built-in spec)")->check(CLI::ExistingFile);
  cmd->add_option("--launcher", o.launcher, "local | mpirun")->capture_default_str();
  cmd->add_option("--out", o.out, "report folder (default: reports/out/<timestamp>)");
  add_device_option(cmd, o);
  cmd->add_flag("--mutants,!--no-mutants", *mutants, "also run the planted-bug matrix (default: on)");
  return {cmd, [&o, mutants] {
            install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop the ranks, write the report (exit 130 / 143)
            CertifyOptions opts;
            opts.spec = spec_with_overrides(o);
            opts.launcher = launcher_from(o.launcher);
            opts.mutants = *mutants;
            opts.out_dir = report_dir(o);
            opts.exe = self_exe();
            return finish(run_certify(opts, std::cout), opts.out_dir);
          }};
}

}  // namespace gradcert
