// The checks of a run whose ranks have ended (NOTE [checking a run folder]): the artifacts read
// strictly, the reference, the check table, the diagnosis, memory and throughput.
#pragma once
#include <string>

#include "conformance/core/result.hpp"
#include "conformance/core/tensors.hpp"
#include "conformance/run/reference_source.hpp"
#include "conformance/run/run_plan.hpp"

namespace gradcert {

/// Reads the artifacts in the run folder (they must echo `nonce`), computes the reference (the
/// C++ one, or the Python runner writing into `work_dir`), and fills `report`'s checks,
/// diagnosis, memory and throughput. Bad artifacts or a failed reference runner set report.error.
/// `early`: the free-running reference begun beside the ranks (NOTE [early reference]), or null.
void check_artifacts(RunReport& report, const RunPlan& run, const std::string& nonce, const std::string& work_dir,
                     EarlyReference* early = nullptr);

/// The model's names, shapes and dtypes, no values: the spec's tiny LM, or a model factory's
/// initial.safetensors in the run folder.
TensorMap model_shapes(const Spec& spec, const std::string& run_dir);

}  // namespace gradcert
