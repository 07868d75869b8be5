#include "conformance/cli/estimate.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <utility>

#include "backends/catalog.hpp"
#include "conformance/core/plan.hpp"

namespace gradcert {

namespace {

int64_t count(double x, const char* option) {
  if (!std::isfinite(x) || x < 0 || x > 9e15)
    throw std::invalid_argument(std::string(option) + ": not a parameter count");
  return static_cast<int64_t>(std::llround(x));
}

}  // namespace

MemoryEstimate make_estimate(const EstimateOptions& o) {
  for (auto [v, name] : {std::pair{o.world, "--world"}, {o.tp, "--tp"}, {o.pp, "--pp"}})
    if (v < 0) throw std::invalid_argument(std::string(name) + ": must be a positive count, got " + std::to_string(v));
  if (!o.model.empty()) {
    // The spec's own model, recipe and topology: exactly the bound memory.lower_bound holds a
    // built-in run of this spec to (estimate_for_run), for the rank that holds the most.
    Spec spec = load_spec(o.model);
    auto& t = spec.topology;
    if (o.world > 0) t.tp = 1, t.pp = 1;
    if (o.tp > 0) t.tp = o.tp;
    if (o.pp > 0) t.pp = o.pp;
    if (o.world > 0) t.dp = data_parallel_degree(o.world, t.tp, t.pp);
    const std::string strategy = o.strategy.empty() ? (t.world() == 1 ? "single" : "ddp") : o.strategy;
    MemoryEstimate e = estimate_for_heaviest_rank(spec, strategy_info(strategy).sharding);
    if (o.params > 0 || !o.recipe.empty() || o.trainable >= 0 || o.unit >= 0 || o.layer_params >= 0) {
      EstimateInput in = e.input;
      if (o.params > 0) in.params = count(o.params, "--params");
      if (!o.recipe.empty()) in.recipe = recipe_by_name(o.recipe);
      if (o.trainable >= 0) in.trainable = count(o.trainable, "--trainable");
      if (o.unit >= 0) in.largest_unit_params = count(o.unit, "--unit");
      if (o.layer_params >= 0) in.layer_params = count(o.layer_params, "--layer-params");
      e = estimate_memory(in);
    }
    return e;
  }
  EstimateInput in;
  int world = o.world > 0 ? o.world : 1, tp = o.tp > 0 ? o.tp : 1, pp = o.pp > 0 ? o.pp : 1;
  if (!(o.params > 0))
    throw std::invalid_argument("--params: must be a positive parameter count (or give --model SPEC.json)");
  in.params = count(o.params, "--params");
  if (!o.recipe.empty()) in.recipe = recipe_by_name(o.recipe);
  in.strategy =
      o.strategy.empty() ? (world == 1 ? Sharding::Single : Sharding::DDP) : strategy_info(o.strategy).sharding;
  // An unset --tp (--pp) under the tp (pp) strategy: every rank not in the other degree.
  if (in.strategy == Sharding::TP && o.tp == 0) tp = std::max(1, world / pp);
  if (in.strategy == Sharding::PP && o.pp == 0) pp = std::max(1, world / tp);
  in.world = world;
  in.tp = tp;
  in.pp = pp;
  if (o.trainable >= 0) in.trainable = count(o.trainable, "--trainable");
  if (o.unit >= 0) in.largest_unit_params = count(o.unit, "--unit");
  if (o.layer_params >= 0) in.layer_params = count(o.layer_params, "--layer-params");
  return estimate_memory(in);
}

CLI::App* add_estimate_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<EstimateOptions>();
  auto* cmd = app.add_subcommand(
      "estimate", "print the model-state lower bound per rank: bytes per parameter from a recipe, divided as the "
                  "strategy shards it (activations and buffers excluded, and listed)");
  cmd->add_option("--params", opts->params, "parameters, e.g. 0.6e9 (default: counted from --model)");
  cmd->add_option("--recipe", opts->recipe,
                  "mixed-adam | fp32-adam | fp32-grads-adam | sgd | sgd-momentum (default: mixed-adam; with "
                  "--model, the spec's dtype and optimizer)");
  cmd->add_option("--strategy", opts->strategy,
                  "single | ddp | zero1 | zero2 | zero3 | fsdp | tp | pp (default: single at world 1, else ddp)");
  auto* world = cmd->add_option("--world", opts->world, "ranks = dp x tp x pp (default: 1, or the spec's topology)");
  auto* tp = cmd->add_option("--tp", opts->tp,
                             "tensor-parallel degree (default: 1, or the spec's; without --model, --strategy tp: "
                             "world / pp)");
  auto* pp = cmd->add_option("--pp", opts->pp,
                             "pipeline-parallel degree (default: 1, or the spec's; without --model, --strategy pp: "
                             "world / tp)");
  cmd->add_option("--trainable", opts->trainable, "LoRA: trainable adapter parameters (the base is frozen)");
  cmd->add_option("--unit", opts->unit, "ZeRO-3 / FSDP: parameters of the largest gathered unit");
  cmd->add_option("--layer-params", opts->layer_params, "TP: parameters inside the layers (default: all)");
  cmd->add_option("--model", opts->model, "spec JSON file: count its model's parameters")->check(CLI::ExistingFile);
  cmd->callback([opts, &exit_code, world, tp, pp] {
    try {
      // Given counts must be >= 1 (0 would silently read as "unset").
      const struct {
        CLI::Option* opt;
        const char* name;
        int value;
      } given[] = {{world, "--world", opts->world}, {tp, "--tp", opts->tp}, {pp, "--pp", opts->pp}};
      for (const auto& g : given)
        if (g.opt->count() > 0 && g.value < 1)
          throw std::invalid_argument(std::string(g.name) + ": must be >= 1, got " + std::to_string(g.value));
      std::cout << estimate_text(make_estimate(*opts));
      exit_code = 0;
    } catch (const std::exception& e) {
      std::cerr << "gradcert estimate: " << e.what() << "\n";
      exit_code = 2;
    }
  });
  return cmd;
}

}  // namespace gradcert
