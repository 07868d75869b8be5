#include "conformance/core/tensors.hpp"

#include <cmath>

namespace gradcert {

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
  for (size_t i = 0; i < expected.values.size(); ++i) {
    const double d = observed.values[i] - expected.values[i];
    diff2 += static_cast<long double>(d) * d;
    ref2 += static_cast<long double>(expected.values[i]) * expected.values[i];
    if (!(std::fabs(d) <= max_abs)) max_abs = std::fabs(d);
  }
  const double dn = std::sqrt(static_cast<double>(diff2)), rn = std::sqrt(static_cast<double>(ref2));
  return {rn > 0 ? dn / rn : dn, max_abs};
}

}  // namespace gradcert
