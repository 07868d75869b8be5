// gradcert: certify that a distributed-training backend reproduces one process's gradients.
#include <CLI/CLI.hpp>

#include <ctime>
#include <filesystem>
#include <iostream>
#include <utility>
#include <vector>

#include "backends/catalog.hpp"
#include "conformance/run/worker.hpp"
#include "conformance/audit/audit.hpp"
#include "conformance/run/certify.hpp"
#include "conformance/cli/estimate.hpp"
#include "conformance/run/harness.hpp"
#include "reports/report.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

// Exit codes: 0 every check passed, 1 a check failed, 2 bad input or a failed run.
constexpr int kPass = 0, kCheckFailed = 1, kBadInput = 2;

Spec spec_from(const std::string& path) { return path.empty() ? Spec{} : load_spec(path); }

LauncherKind launcher_from(const std::string& name) {
  if (name == "local") return LauncherKind::Local;
  if (name == "mpirun") return LauncherKind::Mpirun;
  throw std::invalid_argument("--launcher: unknown launcher '" + name + "' (expected local or mpirun)");
}

int finish(const Report& report, const std::string& dir) {
  std::cout << report_table(report);
  write_report_files(report, dir);
  std::cout << "# report: " << dir << "/report.json (also report.md, junit.xml)\n";
  for (const auto& r : report.runs)
    if (!r.error.empty()) return kBadInput;
  return report.passed() ? kPass : kCheckFailed;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gradcert: does this training stack, under this parallel strategy, train the same model on the "
               "same data as one process would?"};
  app.require_subcommand(1);

  std::string spec_path, backend = "ddp", launcher = "local", inject, out, dtype, optimizer;
  int world = 0, tp = 0, pp = 0;

  auto* run = app.add_subcommand("run", "run one backend on a spec and check it against the reference");
  run->add_option("--spec", spec_path, "spec JSON file (default: the built-in spec)")->check(CLI::ExistingFile);
  run->add_option("--backend", backend, "backend name (see `gradcert backends`)")->capture_default_str();
  // Counts given on the command line must be >= 1 (checked after parsing: exit 2, the option
  // named); 0 in the variables means "not given: the spec's".
  std::vector<std::pair<CLI::Option*, const int*>> counts;
  counts.push_back({run->add_option("--world", world, "ranks to start (default: the spec's topology)"), &world});
  counts.push_back({run->add_option("--tp", tp, "tensor-parallel degree (default: the spec's)"), &tp});
  counts.push_back({run->add_option("--pp", pp, "pipeline-parallel degree (default: the spec's)"), &pp});
  run->add_option("--launcher", launcher, "local | mpirun")->capture_default_str();
  run->add_option("--inject", inject, "run with a planted bug (a mutant); the run passes if a check catches it");
  run->add_option("--dtype", dtype, "override the spec's dtype: float64 | float32 | bfloat16");
  run->add_option("--optimizer", optimizer, "override the spec's optimizer: sgd | adamw");
  run->add_option("--out", out, "report folder (default: reports/out/<timestamp>)");
  std::string model;
  run->add_option("--model", model,
                  "your own model: FILE.py:FUNC or module:FUNC, FUNC(vocab_size, max_len) -> a torch causal LM "
                  "(spec model.factory; --backend external)");
  std::string command;
  bool sampler_audit = false;
  run->add_option("--command", command,
                  "with --backend external: the command that runs the stack (see backends/PROTOCOL.md)");
  run->add_flag("--sampler-audit", sampler_audit,
                "with --backend external: the stack samples on its own; gradcert audits the ids it reports");

  auto* plan_cmd = app.add_subcommand("plan", "print the plan: per update, rank and microstep: ids, tokens, N");
  plan_cmd->add_option("--spec", spec_path, "spec JSON file (default: the built-in spec)")->check(CLI::ExistingFile);
  counts.push_back({plan_cmd->add_option("--world", world, "ranks (default: the spec's topology)"), &world});
  counts.push_back({plan_cmd->add_option("--tp", tp, "tensor-parallel degree"), &tp});
  counts.push_back({plan_cmd->add_option("--pp", pp, "pipeline-parallel degree"), &pp});
  bool plan_json = false;
  plan_cmd->add_flag("--json", plan_json, "print the plan as JSON (the external-backend protocol)");

  bool mutants = true;
  auto* certify = app.add_subcommand("certify", "certify every built-in backend on a spec (the default job)");
  certify->add_option("--spec", spec_path, "spec JSON file (default: the built-in spec)")->check(CLI::ExistingFile);
  certify->add_option("--launcher", launcher, "local | mpirun")->capture_default_str();
  certify->add_option("--out", out, "report folder (default: reports/out/<timestamp>)");
  certify->add_flag("--mutants,!--no-mutants", mutants, "also run the planted-bug matrix (default: on)");

  AuditRequest audit_req;
  auto* audit_cmd = app.add_subcommand(
      "audit", "migration audit: run two stacks on the same plan, certify both, compare them tensor by tensor");
  audit_cmd->add_option("--before", audit_req.before,
                        "the stack before the migration: a built-in backend, fsdp1 | fsdp2 | torch-ddp (the PyTorch "
                        "adapters), or external:<command>; NAME+inject=MUTANT plants a bug")->required();
  audit_cmd->add_option("--after", audit_req.after, "the stack after the migration (same forms)")->required();
  audit_cmd->add_option("--before-inject", audit_req.before_inject, "plant a bug in the before side");
  audit_cmd->add_option("--after-inject", audit_req.after_inject, "plant a bug in the after side");
  audit_cmd->add_option("--spec", spec_path, "spec JSON file (default: the built-in spec)")->check(CLI::ExistingFile);
  counts.push_back({audit_cmd->add_option("--world", world, "ranks (default: the spec's topology)"), &world});
  audit_cmd->add_option("--launcher", launcher, "local | mpirun (built-in backends)")->capture_default_str();
  audit_cmd->add_option("--dtype", dtype, "override the spec's dtype: float64 | float32 | bfloat16");
  audit_cmd->add_option("--optimizer", optimizer, "override the spec's optimizer: sgd | adamw");
  audit_cmd->add_option("--out", out, "report folder (default: reports/out/<timestamp>)");

  auto* spec_cmd = app.add_subcommand("spec", "print the built-in spec (every field with its default)");
  auto* list_cmd = app.add_subcommand("backends", "list the built-in backends and their mutants");

  WorkerArgs wargs;
  auto* worker = app.add_subcommand("worker", "one rank process (started by a launcher, not by hand)");
  worker->group("");  // hidden
  worker->add_option("--run-dir", wargs.run_dir)->required();
  worker->add_option("--backend", wargs.backend)->required();
  worker->add_option("--port", wargs.store_port)->required();
  worker->add_option("--inject", wargs.inject);

  int estimate_exit = 0;
  auto* estimate_cmd = add_estimate_command(app, estimate_exit);

  CLI11_PARSE(app, argc, argv);
  if (*estimate_cmd) return estimate_exit;

  try {
    for (const auto& [opt, value] : counts)
      if (opt->count() > 0 && *value < 1)
        throw std::invalid_argument(opt->get_name() + ": must be >= 1, got " + std::to_string(*value));
    if (*worker) return worker_main(wargs);
    if (*spec_cmd) {
      std::cout << spec_to_json(Spec{}) << "\n";
      return kPass;
    }
    if (*list_cmd) {
      for (const auto& b : backend_names()) {
        std::cout << b << "\n";
        for (const auto& m : mutant_names(b)) std::cout << "  --inject " << m << "\n";
      }
      return kPass;
    }
    if (*plan_cmd) {
      RunRequest req;
      req.spec = spec_from(spec_path);
      req.world = world;
      req.tp = tp;
      req.pp = pp;
      const Spec s = effective_spec(req);
      const Plan p = make_plan(s);
      std::cout << (plan_json ? plan_to_json(p, s) + "\n" : plan_to_text(p));
      return kPass;
    }
    if (*audit_cmd) {  // exit 0: semantics preserved; 1: a difference or failed check; 2: bad input or failed run
      audit_req.spec = spec_from(spec_path);
      if (!dtype.empty()) audit_req.spec.dtype = parse_dtype(dtype);
      if (!optimizer.empty()) audit_req.spec.optimizer.name = optimizer;
      audit_req.world = world;
      audit_req.launcher = launcher_from(launcher);
      audit_req.exe = self_exe();
      audit_req.out_dir = out.empty() ? new_report_dir("reports/out") : out;
      const AuditReport a = run_audit(audit_req, std::cout);
      std::cout << audit_table(a);
      write_audit_files(a, audit_req.out_dir);
      std::cout << "# report: " << audit_req.out_dir << "/audit.json (also audit.md, junit.xml)\n";
      return a.run_failed() ? kBadInput : a.preserved() ? kPass : kCheckFailed;
    }
    const std::string dir = out.empty() ? new_report_dir("reports/out") : out;
    if (*run) {
      RunRequest req;
      req.spec = spec_from(spec_path);
      if (!dtype.empty()) {
        try {
          req.spec.dtype = parse_dtype(dtype);
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(std::string("--dtype: ") + e.what());
        }
      }
      if (!optimizer.empty()) req.spec.optimizer.name = optimizer;
      if (!model.empty()) {
        // FILE.py:FUNC relative to where gradcert was started: the runner and the stack run elsewhere.
        const auto colon = model.rfind(':');
        std::error_code ec;
        if (colon != std::string::npos &&
            model.substr(0, colon).size() > 3 && model.substr(colon - 3, 3) == ".py" &&
            std::filesystem::exists(model.substr(0, colon), ec))
          model = std::filesystem::absolute(model.substr(0, colon), ec).string() + model.substr(colon);
        req.spec.model.factory = model;
      }
      req.backend = backend;
      req.world = world == 0 && backend == "single" ? std::max(1, tp) * std::max(1, pp) : world;
      req.tp = tp;
      req.pp = pp;
      req.launcher = launcher_from(launcher);
      req.inject = inject;
      req.command = command;
      req.sampler_audit = sampler_audit;
      req.exe = self_exe();
      req.run_dir = dir + "/runs/" + run_dir_name(req);
      Report report;
      report.spec_json = spec_to_json(effective_spec(req));
      report.runs.push_back(run_backend(req));
      report.environment = make_environment(req.spec.seed, effective_spec(req).topology.world(), req.launcher);
      return finish(report, dir);
    }
    if (*certify) {
      CertifyOptions opts;
      opts.spec = spec_from(spec_path);
      opts.launcher = launcher_from(launcher);
      opts.mutants = mutants;
      opts.out_dir = dir;
      opts.exe = self_exe();
      return finish(run_certify(opts, std::cout), dir);
    }
  } catch (const SpecError& e) {
    std::cerr << "gradcert: " << (spec_path.empty() ? "" : spec_path + ": ") << e.what() << "\n";
    return kBadInput;
  } catch (const std::exception& e) {
    std::cerr << "gradcert: " << e.what() << "\n";
    return kBadInput;
  }
  return kBadInput;
}
