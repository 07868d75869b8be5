// The gradcert command's verbs: one file each (run, check, plan, certify, audit, info, worker,
// estimate); main.cpp only dispatches. Shared option parsing and exit codes live here.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "conformance/core/audit_result.hpp"
#include "conformance/core/result.hpp"
#include "conformance/launch/launcher.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace gradcert {

/// Exit codes: 0 every check passed, 1 a check failed, 2 bad input or a failed run.
constexpr int kPass = 0, kCheckFailed = 1, kBadInput = 2;

/// Options several verbs share (each verb registers the ones it takes).
struct CommonOptions {
  std::string spec_path, launcher = "local", out, dtype, optimizer;
  int world = 0, tp = 0, pp = 0;  ///< 0: not given (the spec's)
  /// --device as given ("": the spec's) and as resolved before anything ran (NOTE [device]).
  std::string device, device_resolved;
  /// Counts given on the command line must be >= 1 (checked after parsing: exit 2, the option named).
  std::vector<std::pair<CLI::Option*, const int*>> counts;
};

/// A verb: its subcommand and what runs when it was selected (returns the exit code).
struct Verb {
  CLI::App* cmd = nullptr;
  std::function<int()> run;
};

/// The spec file, or the built-in spec when `path` is empty.
Spec spec_from(const std::string& path);
/// The spec with --dtype / --optimizer applied (errors name the option).
Spec spec_with_overrides(const CommonOptions& o);
/// Resolves (NOTE [device]) --device (else the --spec file's `device`) of a run / certify / audit /
/// observe command line into o.device_resolved; "" when it is not one of those verbs. Throws
/// naming --device (or the spec file) when CUDA was asked for and cannot serve.
void resolve_device_option(int argc, char** argv, CommonOptions& o);
/// Registers --device on a verb.
void add_device_option(CLI::App* cmd, CommonOptions& o);
/// "local" | "mpirun"; throws std::invalid_argument naming --launcher.
LauncherKind launcher_from(const std::string& name);
/// Removes an earlier report from --out (NOTE [stale report]).
void clear_previous_report(const std::string& dir);
/// FILE.py:FUNC made absolute (relative to where gradcert was started: the runner and the stack
/// run elsewhere); module:FUNC as given.
std::string absolute_factory(const std::string& model);
/// --out, or a new reports/out/<timestamp> folder.
std::string report_dir(const CommonOptions& o);
/// Prints the console table, writes the report files into `dir`, and returns the exit code.
int finish(const Report& report, const std::string& dir);
/// The same for an audit (`audit`, `audit-jobs`): 0 preserved, 1 a difference, 2 a failed run.
int finish_audit(AuditReport& audit, const std::string& dir);
/// The console line of an interrupted command (NOTE [interrupt]): "# INTERRUPTED by SIGTERM: ...".
std::string interrupted_line(int sig);

Verb add_run_verb(CLI::App& app, CommonOptions& o);
/// `gradcert observe -- CMD`: the user's own training job, certified on what it did.
Verb add_observe_verb(CLI::App& app, CommonOptions& o);
/// `gradcert check RUN_DIR`: a run folder's artifacts checked again, no rank launched.
Verb add_check_verb(CLI::App& app, CommonOptions& o);
Verb add_plan_verb(CLI::App& app, CommonOptions& o);
Verb add_certify_verb(CLI::App& app, CommonOptions& o);
Verb add_audit_verb(CLI::App& app, CommonOptions& o);
/// `gradcert audit-jobs`: two of the user's own jobs observed, certified and compared.
Verb add_audit_jobs_verb(CLI::App& app, CommonOptions& o);
/// `gradcert spec` and `gradcert backends`.
std::vector<Verb> add_info_verbs(CLI::App& app);
/// `gradcert findings DIR`: scripts/certify-stacks' findings report and golden comparison.
Verb add_findings_verb(CLI::App& app);
/// `gradcert --version`: this version (pyproject.toml's), the torch it was built against, and
/// whether CUDA and NCCL are compiled in (conformance/cli/version.cpp).
std::string version_text();
/// The hidden `gradcert worker` (one rank process).
Verb add_worker_verb(CLI::App& app);

}  // namespace gradcert
