// `gradcert estimate`: the model-state lower bound per rank, printed with its recipe.
#pragma once
#include <string>

#include "conformance/memory/memory.hpp"

namespace CLI {
class App;
}

namespace gradcert {

/// The command line of `gradcert estimate` (strings and counts as typed; see make_estimate).
struct EstimateOptions {
  double params = 0;              ///< --params (e.g. 0.6e9); from --model when 0
  std::string recipe;             ///< --recipe; "" = mixed-adam, or the spec's own recipe with --model
  std::string strategy;           ///< --strategy; "" = single at world 1, else ddp
  int world = 0, tp = 0, pp = 0;  ///< 0 = the spec's topology with --model (tp, pp: 1 once --world is given), else 1
  double trainable = -1;          ///< --trainable: LoRA adapter parameters (-1: full fine-tuning)
  double unit = -1;               ///< --unit: largest gathered unit (-1: the tiny LM's with --model, else 0)
  double layer_params = -1;       ///< --layer-params: what TP splits (-1: the tiny LM's blocks, else all)
  std::string model;              ///< --model SPEC.json: count the spec's tiny LM
};

/// The estimate the options ask for. Throws std::invalid_argument (or SpecError for a bad
/// --model file) naming the option.
MemoryEstimate make_estimate(const EstimateOptions& o);

/// Adds the `estimate` subcommand to `app`. When it is selected, parsing runs it: it prints
/// estimate_text() to stdout and sets exit_code to 0, or prints "gradcert estimate: ..." to
/// stderr and sets exit_code to 2. Returns the subcommand (test `*cmd` after parsing).
CLI::App* add_estimate_command(CLI::App& app, int& exit_code);

}  // namespace gradcert
