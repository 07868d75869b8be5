// `gradcert plan`: the plan of a spec, as text or as the protocol's plan.json.
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "conformance/cli/verbs.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/run/harness.hpp"

namespace gradcert {

Verb add_plan_verb(CLI::App& app, CommonOptions& o) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("plan", "print the plan: per update, rank and microstep: ids, tokens, N");
  cmd->add_option("--spec", o.spec_path, "spec JSON file (default: the built-in spec)")->check(CLI::ExistingFile);
  o.counts.push_back({cmd->add_option("--world", o.world, "ranks (default: the spec's topology)"), &o.world});
  o.counts.push_back({cmd->add_option("--tp", o.tp, "tensor-parallel degree"), &o.tp});
  o.counts.push_back({cmd->add_option("--pp", o.pp, "pipeline-parallel degree"), &o.pp});
  cmd->add_flag("--json", *json, "print the plan as JSON (the external-backend protocol)");
  return {cmd, [&o, json] {
            RunRequest req;
            req.spec = spec_from(o.spec_path);
            req.world = o.world;
            req.tp = o.tp;
            req.pp = o.pp;
            const Spec s = effective_spec(req);
            const Plan p = make_plan(s);
            std::cout << (*json ? plan_to_json(p, s) + "\n" : plan_to_text(p));
            return kPass;
          }};
}

}  // namespace gradcert
