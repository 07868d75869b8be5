#include "conformance/core/tensors.hpp"

#include <cmath>
#include <limits>

namespace gradcert {

int dtype_bytes(DType d) {
  switch (d) {
    case DType::Float64: return 8;
    case DType::Float32: return 4;
    case DType::BFloat16: return 2;
  }
  return 8;
}

std::string dtype_name(DType d) {
  switch (d) {
    case DType::Float64: return "float64";
    case DType::Float32: return "float32";
    case DType::BFloat16: return "bfloat16";
  }
  return "float64";
}

DType parse_dtype(const std::string& name) {
  if (name == "float64") return DType::Float64;
  if (name == "float32") return DType::Float32;
  if (name == "bfloat16") return DType::BFloat16;
  throw std::invalid_argument("unknown dtype '" + name +
                              "' (expected float64, float32 or bfloat16)");
}

std::string safetensors_dtype(DType d) {
  switch (d) {
    case DType::Float64: return "F64";
    case DType::Float32: return "F32";
    case DType::BFloat16: return "BF16";
  }
  return "F64";
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TensorError compare_tensors(const HostTensor& observed, const HostTensor& expected) {
  if (observed.shape != expected.shape || observed.values.size() != expected.values.size()) {
    auto dims = [](const std::vector<int64_t>& s) {
      std::string t = "[";
      for (size_t i = 0; i < s.size(); ++i) t += (i ? "," : "") + std::to_string(s[i]);
      return t + "]";
    };
    throw ArtifactError("tensor '" + expected.name + "': shape " + dims(observed.shape) + " but the reference has " +
                        dims(expected.shape));
  }
  long double diff2 = 0, ref2 = 0;
  double max_abs = 0;
  TensorError out;
  for (size_t i = 0; i < expected.values.size(); ++i) {
    const double o = observed.values[i], e = expected.values[i];
    const double d = o - e;
    diff2 += static_cast<long double>(d) * d;
    ref2 += static_cast<long double>(e) * e;
    if (!std::isfinite(o) || !std::isfinite(e)) {
      if (out.nonfinite++ == 0) {
        out.first_nonfinite = static_cast<int64_t>(i);
        out.first_observed = o;
        out.first_expected = e;
      }
    }
    // NaN is sticky: once the maximum is NaN no finite difference replaces it.
    if (std::isnan(d) || std::isnan(max_abs)) max_abs = std::nan("");
    else if (std::fabs(d) > max_abs) max_abs = std::fabs(d);
  }
  const double dn = std::sqrt(static_cast<double>(diff2)), rn = std::sqrt(static_cast<double>(ref2));
  out.relative = rn > 0 ? dn / rn : dn;
  out.max_abs = max_abs;
  // inf - inf is NaN, and ||ref|| = inf makes dn / rn NaN or 0: a non-finite input never reads as agreement.
  if (out.nonfinite > 0 && std::isfinite(out.relative)) out.relative = std::numeric_limits<double>::quiet_NaN();
  return out;
}

}  // namespace gradcert
