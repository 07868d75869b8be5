// `gradcert check RUN_DIR`: every check again on the artifacts a run left, launching nothing.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <memory>

#include "conformance/cli/verbs.hpp"
#include "conformance/run/harness.hpp"

namespace gradcert {

namespace {

struct CheckOptions {
  std::string run_dir, spec_path;
};

}  // namespace

Verb add_check_verb(CLI::App& app, CommonOptions& o) {
  auto c = std::make_shared<CheckOptions>();
  auto* cmd = app.add_subcommand("check", "check the artifacts already in a run folder again, launching no rank "
                                          "(the reference is recomputed)");
  cmd->add_option("RUN_DIR", c->run_dir,
                  "a run folder `gradcert run` or `gradcert observe` made (<report>/runs/<name>/)")
      ->required();
  cmd->add_option("--out", o.out, "report folder (default: reports/out/<timestamp>)");
  cmd->add_option("--spec", c->spec_path,
                  "check on this spec instead of the folder's spec.json (e.g. other tolerances); its plan must "
                  "be the run's")
      ->check(CLI::ExistingFile);
  return {cmd, [&o, c] {
            install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop the reference runner, write the report
            const std::string dir = report_dir(o);
            std::error_code ec;  // `run` makes it with the run folder; nothing else here does
            std::filesystem::create_directories(dir, ec);
            if (ec) throw std::invalid_argument("--out " + dir + ": cannot create: " + ec.message());
            CheckedRun checked = check_run({c->run_dir, c->spec_path, dir + "/check"});
            std::cout << "# gradcert check " << c->run_dir << ": the artifacts of the " << run_label(checked.report)
                      << " run, no rank launched\n";
            Report report;
            report.spec_json = spec_to_json(checked.spec);
            report.environment = make_environment(checked.spec.seed, checked.spec.topology.world(), checked.launcher);
            report.runs.push_back(std::move(checked.report));
            return finish(report, dir);
          }};
}

}  // namespace gradcert
