// The user's own model: gradcert's Python reference runner (backends/python/gradcert/ref) makes
// the initial weights from the model factory and computes the float64 reference, in the
// protocol's artifact format, which the harness reads like a stack's.
#pragma once
#include <string>

#include "conformance/core/spec.hpp"

namespace gradcert {

/// The gradcert checkout (it holds backends/python/): $GRADCERT_ROOT, else the folders above
/// `exe` (build/gradcert -> the checkout; "" = this executable), else the working directory.
/// Throws std::invalid_argument saying to set GRADCERT_ROOT.
std::string locate_repo_root(const std::string& exe);

/// A run needs the Python reference runner: a model factory, or clipping (the C++ reference
/// trains the tiny LM without clipping).
bool needs_python_reference(const Spec& spec);

/// Runs `python -m gradcert.ref.<module> <args>` with `python` ("": the checkout's venv), its log
/// in `log_dir/<log_name>.log`, within the spec's run timeout. Throws std::runtime_error with
/// the log's tail when it fails.
void run_python_tool(const Spec& spec, const std::string& module, const std::string& args, const std::string& log_dir,
                     const std::string& log_name, const std::string& python = "");

}  // namespace gradcert
