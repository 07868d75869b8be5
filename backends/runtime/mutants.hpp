// Mutants: planted bugs, each a real-world bug class, by typed id. The one table of their
// names and descriptions; which strategies can plant one follows from the strategy's traits.
#pragma once
#include <string>
#include <vector>

namespace gradcert {

/// A planted bug (`--inject NAME`); None for the correct backend.
enum class Mutant {
  None,
  LocalMean,
  MicroMean,
  StaleWindowCount,
  DoubleAccumDivision,
  PadAsTarget,
  SamplerPadDuplicate,
  MissingFinalSync,
  ShardDivideFactor,
  StaleGatheredParams,
  TpCountedAsDp,
  ReplicaDrift,
  // Resumed runs only (spec resume.at; NOTE [checkpoints]):
  ResumeOptimizerUnsaved,
  ResumeStepReset,
  ResumeSamplerRestart,
  ResumeSamplerSkip,
  ResumeShardUnwritten,
};

/// What a strategy does, as far as the mutants care (backends/<strategy>.cpp says it).
struct StrategyTraits {
  bool data_parallel = true;     ///< can run with D > 1 (every strategy but single)
  bool final_allreduce = false;  ///< one gradient all-reduce at the end of the window
  bool reduce_scatter = false;   ///< gradients reduce-scattered into shards
  bool gathers_params = false;   ///< parameters sharded and all-gathered for compute
  bool tensor_parallel = false;  ///< TP ranks inside a replica
  /// Digests what it holds whole and plants replica-drift: ddp through ReplicaState, tp on
  /// its TP-replicated tensors (ZeRO-1/2 also digest their gathered replicas for
  /// replicas.agree but step shards, and pp digests its stages, without the mutant).
  bool replica_digests = false;
  /// Its model state is split over ranks (ZeRO, FSDP, TP, PP): ranks but 0 save pieces too.
  bool sharded_state = false;
};

/// One row of the mutant table.
struct MutantInfo {
  Mutant id;
  std::string name;       ///< "local-mean"
  std::string bug_class;  ///< the real-world bug it stands for
  bool (*applies)(const StrategyTraits&);
  /// The bug is in saving or loading a checkpoint: it runs with resume.at (a resumed run).
  bool needs_resume = false;
};

/// Every mutant, in report order.
const std::vector<MutantInfo>& mutant_table();
/// "local-mean", ... ("" for None).
std::string mutant_name(Mutant m);
/// Parses a mutant name ("" is None); throws std::invalid_argument listing the names.
Mutant parse_mutant(const std::string& name);
/// Whether `m` is planted in a checkpoint's save or load (MutantInfo::needs_resume).
bool needs_resume(Mutant m);
/// The mutants a strategy with these traits can plant, in report order.
std::vector<std::string> mutants_for(const StrategyTraits& traits);

}  // namespace gradcert
