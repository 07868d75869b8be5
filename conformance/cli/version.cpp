// `gradcert --version`. CMake defines the three facts for this file only (NOTE [one build]).
#include <string>

#include "conformance/cli/verbs.hpp"

#ifndef GRADCERT_VERSION
#error "GRADCERT_VERSION is defined by CMakeLists.txt (pyproject.toml's version)"
#endif

namespace gradcert {

std::string version_text() {
#ifdef GRADCERT_WITH_CUDA
  const char* gpu = "CUDA and NCCL compiled in";
#else
  const char* gpu = "CPU build: no CUDA, no NCCL";
#endif
  return std::string("gradcert ") + GRADCERT_VERSION + " (built against torch " + GRADCERT_TORCH_VERSION + "; " + gpu +
         "; collectives: Gloo" +
#ifdef GRADCERT_WITH_CUDA
         ", NCCL" +
#endif
         ")";
}

}  // namespace gradcert
