// Torch-free tensors as gradcert's checks, reports and artifact files see them, and the one dtype table.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradcert {

/// Element types gradcert reads and writes (safetensors dtype names F64, F32, BF16).
enum class DType { Float64, Float32, BFloat16 };

/// "float64" | "float32" | "bfloat16".
std::string dtype_name(DType d);
/// Parses "float64" | "float32" | "bfloat16"; throws std::invalid_argument naming the value.
DType parse_dtype(const std::string& name);
/// Bytes per element: 8 | 4 | 2.
int dtype_bytes(DType d);
/// safetensors spelling: "F64" | "F32" | "BF16".
std::string safetensors_dtype(DType d);

/// A dense row-major tensor with its canonical name. Values are held as double, which
/// represents float32 and bfloat16 exactly; `dtype` records what it was computed in.
struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double> values;
  DType dtype = DType::Float64;

  /// Product of the shape (1 for a scalar).
  int64_t numel() const;
};

/// Tensors by canonical name (ordered, so reports and files are deterministic).
using TensorMap = std::map<std::string, HostTensor>;

/// Any malformed or unexpected artifact file. The message names the file and, where
/// one is involved, the tensor.
struct ArtifactError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Relative L2 error ||a - b|| / ||b|| (||a - b|| when b is zero) and max |a - b|. A
/// non-finite value on either side makes both figures non-finite (NaN stays NaN; it is
/// never overwritten by a later finite difference) and is counted.
struct TensorError {
  double relative = 0;
  double max_abs = 0;
  int64_t nonfinite = 0;         ///< positions where the observed or the expected value is NaN or +-inf
  int64_t first_nonfinite = -1;  ///< the first such flat (row-major) index, -1 if none
  double first_observed = 0, first_expected = 0;  ///< the two values there
};
/// Compares `observed` with `expected`; throws ArtifactError naming the tensor when the shapes differ.
TensorError compare_tensors(const HostTensor& observed, const HostTensor& expected);

}  // namespace gradcert
