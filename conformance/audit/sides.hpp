// The sides of an audit and the adapter catalog (backends/python/adapters.json).
#pragma once
#include <string>
#include <vector>

#include "conformance/audit/audit.hpp"

namespace gradcert {

/// One PyTorch adapter of backends/python/adapters.json.
struct AdapterInfo {
  std::string name;                  ///< "torch-fsdp2"
  std::vector<std::string> aliases;  ///< "fsdp2"
  std::string script;                ///< under backends/python/
  std::string reduction, sync;       ///< audit facts (the migration notes)
  bool shards = false, gathers_params = false;
  std::vector<std::string> mutants;  ///< the ids it plants with --mutant
};

/// The adapters of the checkout `root` (read once per root). Throws std::invalid_argument
/// naming the file when it is missing or malformed.
const std::vector<AdapterInfo>& adapter_catalog(const std::string& root);
/// The adapter a name or alias denotes in `root`'s catalog, or null.
const AdapterInfo* find_adapter(const std::string& root, const std::string& name);

}  // namespace gradcert
