// The built-in strategies and their planted bugs, by name (torch-free).
#pragma once
#include <string>
#include <vector>

namespace gradcert {

/// The built-in backends' names.
std::vector<std::string> backend_names();
/// The mutants (planted bugs, `--inject NAME`) a backend can run with.
std::vector<std::string> mutant_names(const std::string& backend);

}  // namespace gradcert
