// The built-in strategies and their planted bugs, by name (torch-free).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backends/runtime/strategy.hpp"

namespace gradcert {

/// The built-in backends' names.
std::vector<std::string> backend_names();
/// The mutants (planted bugs, `--inject NAME`) a backend can run with.
std::vector<std::string> mutant_names(const std::string& backend);

/// A backend by name; throws std::invalid_argument listing the known names.
std::unique_ptr<Backend> make_backend(const std::string& name);

}  // namespace gradcert
