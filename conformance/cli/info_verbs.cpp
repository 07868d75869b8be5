// `gradcert spec`, `gradcert backends` and `gradcert devices`: what a user can ask before running anything; and
// the hidden `gradcert worker` that every built-in rank process runs.
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "backends/catalog.hpp"
#include "conformance/cli/verbs.hpp"
#include "conformance/launch/cuda_probe.hpp"
#include "conformance/run/worker.hpp"

namespace gradcert {

std::vector<Verb> add_info_verbs(CLI::App& app) {
  auto* spec_cmd = app.add_subcommand("spec", "print the built-in spec (every field with its default)");
  auto* list_cmd = app.add_subcommand("backends", "list the built-in backends and their mutants");
  auto* dev_cmd =
      app.add_subcommand("devices", "what --device can use here: cpu, and cuda with its device count or why not");
  return {{spec_cmd,
           [] {
             std::cout << spec_to_json(Spec{}) << "\n";
             return kPass;
           }},
          {list_cmd,
           [] {
             for (const auto& b : backend_names()) {
               std::cout << b << "\n";
               for (const auto& m : mutant_names(b))
                 std::cout << "  --inject " << m << (needs_resume(parse_mutant(m)) ? "  (with --resume-at K)" : "")
                           << "\n";
             }
             return kPass;
           }},
          {dev_cmd, [] {
             const CudaProbe p = probe_cuda();  // NOTE [cuda probe]: in a child process
             std::cout << "cpu: available\n";
             if (p.count > 0)
               std::cout << "cuda: " << p.count << " device(s)\n";
             else
               std::cout << "cuda: unavailable: " << p.reason << "\n";
             return kPass;
           }}};
}

Verb add_worker_verb(CLI::App& app) {
  auto args = std::make_shared<WorkerArgs>();
  auto* worker = app.add_subcommand("worker", "one rank process (started by a launcher, not by hand)");
  worker->group("");  // hidden
  worker->add_option("--run-dir", args->run_dir)->required();
  worker->add_option("--backend", args->backend)->required();
  worker->add_option("--store", args->store);
  worker->add_option("--inject", args->inject);
  worker->add_option("--save-at", args->save_at);
  worker->add_option("--resume-from", args->resume_from);
  worker->add_option("--spec-file", args->spec_file);
  worker->add_option("--plan-file", args->plan_file);
  return {worker, [args] { return worker_main(*args); }};
}

}  // namespace gradcert
