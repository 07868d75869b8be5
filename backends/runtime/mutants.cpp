#include "backends/runtime/mutants.hpp"

#include <stdexcept>

namespace gradcert {

const std::vector<MutantInfo>& mutant_table() {
  // local-mean is the correct rule at D = 1, so it needs data parallelism to be a bug.
  static const std::vector<MutantInfo> table = {
      {Mutant::LocalMean, "local-mean", "each rank normalises by its own targets, then ranks are averaged",
       [](const StrategyTraits& t) { return t.data_parallel; }},
      {Mutant::MicroMean, "micro-mean",
       "per-microstep mean, then divide by A (the 2024 gradient-accumulation bug class)",
       [](const StrategyTraits&) { return true; }},
      {Mutant::StaleWindowCount, "stale-window-count", "the full window's N reused in the partial final window",
       [](const StrategyTraits&) { return true; }},
      {Mutant::DoubleAccumDivision, "double-accum-division", "an extra division by A on top of token normalisation",
       [](const StrategyTraits&) { return true; }},
      {Mutant::PadAsTarget, "pad-as-target", "padding positions counted as valid targets in N",
       [](const StrategyTraits&) { return true; }},
      {Mutant::SamplerPadDuplicate, "sampler-pad-duplicate",
       "the partial window padded by repeating examples, as a distributed sampler with drop_last=False does",
       [](const StrategyTraits& t) { return t.data_parallel; }},
      {Mutant::MissingFinalSync, "missing-final-sync", "no gradient all-reduce at the end of the window",
       [](const StrategyTraits& t) { return t.final_allreduce; }},
      {Mutant::ShardDivideFactor, "divided-by-d-twice",
       "the reduce-scatter divided by D twice (loss scaling and a reduce-op average both applied)",
       [](const StrategyTraits& t) { return t.reduce_scatter; }},
      {Mutant::StaleGatheredParams, "stale-gathered-params",
       "the shard is updated but the next update computes with the previously gathered weights",
       [](const StrategyTraits& t) { return t.gathers_params; }},
      {Mutant::TpCountedAsDp, "tp-counted-as-dp",
       "D taken as the world size under TP, so the TP ranks count as replicas",
       [](const StrategyTraits& t) { return t.tensor_parallel; }},
      {Mutant::ReplicaDrift, "replica-drift",
       "one replica steps its last update with lr x 1.01 (a per-rank schedule): only rank 0's tensors become artifacts",
       [](const StrategyTraits& t) { return t.data_parallel && t.replica_digests; }},
      {Mutant::ResumeOptimizerUnsaved, "resume-optimizer-unsaved",
       "the checkpoint holds the weights but no optimizer state; the resumed optimizer starts fresh",
       [](const StrategyTraits&) { return true; }, true},
      {Mutant::ResumeStepReset, "resume-step-reset",
       "the optimizer's step counter is not restored: AdamW's bias correction restarts at the resume",
       [](const StrategyTraits&) { return true; }, true},
      {Mutant::ResumeSamplerRestart, "resume-sampler-restart",
       "the resumed sampler starts its epoch over (the data loader is not fast-forwarded)",
       [](const StrategyTraits&) { return true; }, true},
      {Mutant::ResumeSamplerSkip, "resume-sampler-skip",
       "the resumed sampler starts the next epoch, skipping the rest of the current one",
       [](const StrategyTraits&) { return true; }, true},
      {Mutant::ResumeShardUnwritten, "resume-shard-unwritten",
       "the last rank writes no checkpoint file (only some ranks save their shards)",
       [](const StrategyTraits& t) { return t.sharded_state; }, true},
  };
  return table;
}

std::string mutant_name(Mutant m) {
  for (const auto& row : mutant_table())
    if (row.id == m) return row.name;
  return "";
}

Mutant parse_mutant(const std::string& name) {
  if (name.empty()) return Mutant::None;
  if (name == "shard-divide-factor")
    return Mutant::ShardDivideFactor;  // its name before the bug catalog (one name per bug)
  std::string known;
  for (const auto& row : mutant_table()) {
    if (row.name == name) return row.id;
    known += (known.empty() ? "" : ", ") + row.name;
  }
  throw std::invalid_argument("unknown mutant '" + name + "' (known: " + known + ")");
}

bool needs_resume(Mutant m) {
  for (const auto& row : mutant_table())
    if (row.id == m) return row.needs_resume;
  return false;
}

std::vector<std::string> mutants_for(const StrategyTraits& traits) {
  std::vector<std::string> out;
  for (const auto& row : mutant_table())
    if (row.applies(traits)) out.push_back(row.name);
  return out;
}

}  // namespace gradcert
