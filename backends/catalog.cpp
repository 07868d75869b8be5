// The one list of built-in strategies (NOTE [strategy descriptor]). Adding one: its file in
// backends/ (the Backend and a StrategyInfo), one line here, a row in docs/backends.md; its CTest rows
// follow from this list.
#include "backends/catalog.hpp"

#include <algorithm>
#include <stdexcept>

namespace gradcert {

const StrategyInfo& single_strategy();
const StrategyInfo& ddp_strategy();
const StrategyInfo& zero1_strategy();
const StrategyInfo& zero2_strategy();
const StrategyInfo& zero3_strategy();
const StrategyInfo& fsdp_strategy();
const StrategyInfo& tp_strategy();
const StrategyInfo& pp_strategy();

const std::vector<const StrategyInfo*>& strategies() {
  static const std::vector<const StrategyInfo*> all = {&single_strategy(), &ddp_strategy(),   &zero1_strategy(),
                                                       &zero2_strategy(),  &zero3_strategy(), &fsdp_strategy(),
                                                       &tp_strategy(),     &pp_strategy()};
  return all;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (const auto* s : strategies()) out.push_back(s->name);
  return out;
}

const StrategyInfo& strategy_info(const std::string& name) {
  for (const auto* s : strategies())
    if (s->name == name) return *s;
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown backend '" + name + "' (built-in: " + known + ")");
}

std::vector<std::string> mutant_names(const std::string& backend) { return mutants_for(strategy_info(backend).traits); }

std::unique_ptr<Backend> make_backend(const std::string& name) { return strategy_info(name).make(); }

void Backend::validate(const Plan& plan, int world, Mutant mutant) const {
  if (plan.world() != world)
    throw std::invalid_argument("backend " + name() + ": the plan's topology needs world " +
                                std::to_string(plan.world()) + ", got " + std::to_string(world));
  if (mutant != Mutant::None) {
    auto names = mutant_names(name());
    if (std::find(names.begin(), names.end(), mutant_name(mutant)) == names.end())
      throw std::invalid_argument("backend " + name() + " does not support --inject " + mutant_name(mutant));
  }
}

// Defaults are not silent (NOTE [strategy descriptor]): an operation a strategy lacks is either
// declared in its StrategyInfo or an error naming the strategy and the operation.
NamedTensors Backend::state_tensors() {
  throw std::logic_error("backend " + name() + " does not implement state_tensors() (memory.lower_bound needs it)");
}

NamedTensors Backend::replica_params() {
  throw std::logic_error("backend " + name() +
                         " does not implement replica_params() and its StrategyInfo declares no "
                         "no_replica_digests reason (replicas.agree needs one or the other)");
}

std::vector<StatePiece> Backend::checkpoint_state(RankContext&, bool) {
  throw std::invalid_argument("backend " + name() + " cannot save or load a checkpoint (resume.at)");
}

}  // namespace gradcert
