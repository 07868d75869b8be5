#include "conformance/cli/estimate.hpp"

#include <CLI/CLI.hpp>

#include <cmath>
#include <iostream>
#include <memory>
#include <stdexcept>

namespace gradcert {

namespace {

int64_t count(double x, const char* option) {
  if (!std::isfinite(x) || x < 0 || x > 9e15)
    throw std::invalid_argument(std::string(option) + ": not a parameter count");
  return static_cast<int64_t>(std::llround(x));
}

}  // namespace

MemoryEstimate make_estimate(const EstimateOptions& o) {
  EstimateInput in;
  int world = 1, tp = 1, pp = 1;
  if (!o.model.empty()) {
    const Spec spec = load_spec(o.model);
    const TinyLMCounts c = tiny_lm_counts(spec.model);
    in.params = c.total;
    in.layer_params = c.blocks;
    in.largest_unit_params = c.largest_unit();
    in.recipe = recipe_for_run(spec.dtype, spec.optimizer);
    world = spec.topology.world();
    tp = spec.topology.tp;
    pp = spec.topology.pp;
  }
  if (o.params > 0) in.params = count(o.params, "--params");
  if (in.params <= 0) throw std::invalid_argument("--params or --model is required");
  if (!o.recipe.empty()) in.recipe = recipe_by_name(o.recipe);
  if (o.world > 0) world = o.world, tp = 1, pp = 1;
  if (o.tp > 0) tp = o.tp;
  if (o.pp > 0) pp = o.pp;
  in.world = world;
  in.tp = tp;
  in.pp = pp;
  in.strategy = o.strategy.empty() ? (world == 1 ? Sharding::Single : Sharding::DDP) : parse_sharding(o.strategy);
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
  cmd->add_option("--world", opts->world, "ranks = dp x tp x pp (default: 1, or the spec's topology)");
  cmd->add_option("--tp", opts->tp, "tensor-parallel degree (default: 1, or the spec's)");
  cmd->add_option("--pp", opts->pp, "pipeline-parallel degree (default: 1, or the spec's)");
  cmd->add_option("--trainable", opts->trainable, "LoRA: trainable adapter parameters (the base is frozen)");
  cmd->add_option("--unit", opts->unit, "ZeRO-3 / FSDP: parameters of the largest gathered unit");
  cmd->add_option("--layer-params", opts->layer_params, "TP: parameters inside the layers (default: all)");
  cmd->add_option("--model", opts->model, "spec JSON file: count its model's parameters")->check(CLI::ExistingFile);
  cmd->callback([opts, &exit_code] {
    try {
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
