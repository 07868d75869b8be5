// The built-in strategies: each describes itself in its own file (a StrategyInfo); this is
// the one list of them. The harness, certify, the estimator and the audit read it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backends/runtime/mutants.hpp"
#include "backends/runtime/strategy.hpp"
#include "conformance/core/memory_types.hpp"

namespace gradcert {

/// One topology certify runs a strategy at (world = dp x tp x pp).
struct CertifyTopology {
  int world = 1, tp = 1, pp = 1;
  std::string schedule{};  ///< pp only: overrides pipeline.schedule ("" keeps the spec's)
};

/// NOTE [strategy descriptor] A built-in strategy's self-description, filled field by field by
/// name in its own file (backends/<strategy>.cpp), with its traits and its factory named functions
/// just above it (nccl-tests' style). strategies() is the one list: the harness, certify, the
/// estimator, the audit, the mutant matrix (mutant_cases) and the conformance and GPU test
/// matrices (conformance/tests) are all instantiated from it, so a new strategy is its file, one
/// line in backends/catalog.cpp and a row in docs/backends.md.
struct StrategyInfo {
  std::string name;                      ///< as on the command line and in reports
  Sharding sharding = Sharding::Single;  ///< how it places model state (the estimator's rule)
  StrategyTraits traits;                 ///< which mutants it can plant (mutants.hpp)
  std::string reduction, sync;           ///< audit facts: how it reduces gradients, how it skips sync
  CertifyTopology primary;               ///< certify: every check, both optimizers, float32, every mutant
  std::vector<CertifyTopology> wider;    ///< certify: further topologies (correct runs only)
  int mutant_world = 0;                  ///< certify: world of the mutant runs (0: the primary's)
  /// What it does not report, declared (as c10d's Backend declares what it lacks): why no rank
  /// of it holds a parameter whole to digest for replicas.agree. Empty: it reports them, and
  /// Backend::replica_params must be overridden (the default throws naming the strategy).
  std::string no_replica_digests;
  std::unique_ptr<Backend> (*make)() = nullptr;
};

/// Every built-in strategy, in report order.
const std::vector<const StrategyInfo*>& strategies();
/// A strategy by name; throws std::invalid_argument listing the known names.
const StrategyInfo& strategy_info(const std::string& name);

/// The built-in backends' names.
std::vector<std::string> backend_names();
/// The mutants (planted bugs, `--inject NAME`) a backend can run with.
std::vector<std::string> mutant_names(const std::string& backend);
/// A backend by name; throws std::invalid_argument listing the known names.
std::unique_ptr<Backend> make_backend(const std::string& name);

}  // namespace gradcert
