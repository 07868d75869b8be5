// Torch-free tensors as gradcert's checks, reports and artifact files see them.
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

/// Writes `tensors` as a safetensors file, each in its own dtype (values rounded to it),
/// via a temporary file and rename. `metadata` goes to the "__metadata__" entry.
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// What a reader expects of one tensor: its shape and dtype.
struct TensorExpectation {
  std::vector<int64_t> shape;
  DType dtype = DType::Float64;
};

/// Reads a safetensors file strictly: header length within bounds and the file, header
/// JSON well-formed, known dtypes, offsets inside the data section, in order, not
/// overlapping and matching shape x dtype size. With `expect` non-empty, the set of names
/// must match exactly and each tensor's shape and dtype must match. Any violation throws
/// ArtifactError naming the file and the tensor. Never crashes on hostile input.
TensorMap read_safetensors(const std::string& path,
                           const std::map<std::string, TensorExpectation>& expect = {});

/// Same as read_safetensors but from bytes in memory; `label` names the source in errors.
/// (The entry point for a fuzz target.)
TensorMap parse_safetensors(const std::string& label, const std::string& bytes,
                            const std::map<std::string, TensorExpectation>& expect = {});

/// Writes `text` to `path` atomically (temporary file in the same folder, then rename).
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace gradcert
