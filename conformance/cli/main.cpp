// gradcert: certify that a distributed-training backend reproduces one process's gradients.
// Only dispatches: each verb is its own file (conformance/cli/verbs.hpp).
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "conformance/cli/estimate.hpp"
#include "conformance/cli/verbs.hpp"
#include "conformance/launch/zygote.hpp"

using namespace gradcert;

namespace {

int dispatch(int argc, char** argv) {
  CLI::App app{"gradcert: does this training stack, under this parallel strategy, train the same model on the "
               "same data as one process would?"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text());
  CommonOptions o;
  std::vector<Verb> verbs = {add_run_verb(app, o),       add_observe_verb(app, o), add_check_verb(app, o),
                             add_plan_verb(app, o),      add_certify_verb(app, o), add_audit_verb(app, o),
                             add_audit_jobs_verb(app, o)};
  for (auto& v : add_info_verbs(app)) verbs.push_back(std::move(v));
  verbs.push_back(add_findings_verb(app));
  verbs.push_back(add_worker_verb(app));
  int estimate_exit = 0;
  auto* estimate_cmd = add_estimate_command(app, estimate_exit);

  // A device that cannot serve is refused first: exit 2, nothing touched (NOTE [device]).
  try {
    resolve_device_option(argc, argv, o);
  } catch (const std::exception& e) {
    std::cerr << "gradcert: " << e.what() << "\n";
    return kBadInput;
  }
  // Before anything can fail, a bad option included (NOTE [stale report]).
  const std::string verb = argc > 1 ? argv[1] : "";
  if (verb == "run" || verb == "certify" || verb == "check" || verb == "audit" || verb == "observe")
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--") break;  // `observe -- CMD`: the job's own options are not gradcert's
      std::string dir = a == "--out" && i + 1 < argc ? argv[i + 1] : a.rfind("--out=", 0) == 0 ? a.substr(6) : "";
      if (dir.empty()) continue;
      try {
        clear_previous_report(dir);
      } catch (const std::exception& e) {
        std::cerr << "gradcert: " << e.what() << "\n";
        return kBadInput;
      }
    }
  CLI11_PARSE(app, argc, argv);
  if (*estimate_cmd) return estimate_exit;

  try {
    for (const auto& [opt, value] : o.counts)
      if (opt->count() > 0 && (*value < 1 || *value > kMaxWorld))
        throw std::invalid_argument(opt->get_name() + ": must be in [1, " + std::to_string(kMaxWorld) + "], got " +
                                    std::to_string(*value) +
                                    (*value > kMaxWorld ? " (gradcert starts every rank as a process)" : ""));
    for (const auto& v : verbs)
      if (*v.cmd) return v.run();
  } catch (const SpecError& e) {
    std::cerr << "gradcert: " << (o.spec_path.empty() ? "" : o.spec_path + ": ") << e.what() << "\n";
    return kBadInput;
  } catch (const std::exception& e) {
    std::cerr << "gradcert: " << e.what() << "\n";
    return kBadInput;
  }
  return kBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  // The verbs that launch built-in ranks fork their zygote first, while this process has one
  // thread (NOTE [zygote]); every verb ends without static destructors.
  const std::string verb = argc > 1 ? argv[1] : "";
  if (verb == "run" || verb == "certify" || verb == "audit") start_zygote(dispatch);
  exit_now(dispatch(argc, argv));
}
