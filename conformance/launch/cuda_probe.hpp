// Whether CUDA can serve this gradcert binary, asked without touching CUDA in this process.
#pragma once
#include <string>

namespace gradcert {

/// The CUDA this binary can use: count > 0, or `reason` one line naming why not (a CPU build of
/// torch, no NVIDIA driver, no device). NOTE [cuda probe].
struct CudaProbe {
  int count = 0;
  std::string reason;
};

CudaProbe probe_cuda();

/// "cpu" | "cuda" | "auto" resolved for this machine (NOTE [device]): "cuda" where the probe
/// finds a device, else std::runtime_error with the probe's reason; "auto" falls back to "cpu".
/// `what` names where the request came from (--device, the spec file) in the error.
std::string resolve_device(const std::string& requested, const std::string& what);

}  // namespace gradcert
