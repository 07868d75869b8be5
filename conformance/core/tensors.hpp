// Torch-free tensors as gradcert's checks, reports and artifact files see them, and the one dtype table.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradcert {

/// Element types gradcert reads and writes (safetensors dtype names F64, F32, BF16).
enum class DType { Float64, Float32, BFloat16 };

/// The facts of a dtype, one row each in tensors.cpp (the one dtype table; the tolerances per
/// dtype are the spec's, ToleranceSpec).
struct DTypeFacts {
  DType dtype;
  const char* name;         ///< "float64": the spec's and the reports' spelling
  const char* safetensors;  ///< "F64"
  const char* short_name;   ///< "fp64": the memory recipes' labels
  int bytes;                ///< per element
};
/// The row of `d`.
const DTypeFacts& dtype_facts(DType d);

/// "float64" | "float32" | "bfloat16".
std::string dtype_name(DType d);
/// Parses "float64" | "float32" | "bfloat16"; throws std::invalid_argument naming the value.
DType parse_dtype(const std::string& name);
/// Bytes per element: 8 | 4 | 2.
int dtype_bytes(DType d);
/// safetensors spelling: "F64" | "F32" | "BF16".
std::string safetensors_dtype(DType d);
/// The dtype of a safetensors spelling; false for one gradcert does not read.
bool dtype_from_safetensors(const std::string& s, DType& out);

/// One stretch of a streamed tensor's values in a file (NOTE [streamed tensors]): `count`
/// values of `dtype` at byte `offset` of `path`, placed in the tensor at row-major index
/// `flat_begin` onwards, or (with `box` set, NOTE [shard artifacts]) as a box of extent `box`
/// at `at` (one offset per dimension). The file's identity when its header was read is kept:
/// a read of a file that has changed since is refused.
struct TensorPiece {
  std::string path;
  uint64_t offset = 0;
  DType dtype = DType::Float64;
  int64_t flat_begin = 0, count = 0;
  std::vector<int64_t> at, box;
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0;
};
/// Where a streamed tensor's values lie: one piece (a tensor of one file), or the shards that
/// tile it (checked to cover it exactly once when they were read).
struct TensorSource {
  std::vector<TensorPiece> pieces;
};

/// A tensor's values as one read sees them: a view of a held tensor's values, or a buffer
/// of its own, read from the file for a streamed one (and freed with this object).
class TensorValues {
 public:
  TensorValues() = default;
  TensorValues(const TensorValues&) = delete;
  TensorValues& operator=(const TensorValues&) = delete;
  TensorValues(TensorValues&&) = default;
  TensorValues& operator=(TensorValues&&) = default;
  const double* data() const { return p_; }
  size_t size() const { return n_; }
  double operator[](size_t i) const { return p_[i]; }
  const double* begin() const { return p_; }
  const double* end() const { return p_ + n_; }

 private:
  friend struct HostTensor;
  std::vector<double> owned_;  // a streamed tensor's values (the vector's buffer survives a move)
  const double* p_ = nullptr;
  size_t n_ = 0;
};

/// A dense row-major tensor with its canonical name. Values are double, which represents
/// float32 and bfloat16 exactly; `dtype` records what it was computed in (and, streamed, what
/// the file stores). Either `held` in memory, or streamed: `source` set, `held` empty, and
/// read() reads them from the file each time (NOTE [streamed tensors]).
struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double> held;  ///< the values, when held (empty for a streamed tensor)
  DType dtype = DType::Float64;
  std::shared_ptr<const TensorSource> source;  ///< non-null: streamed

  /// Product of the shape (1 for a scalar).
  int64_t numel() const;
  bool streamed() const { return source != nullptr; }
  /// The values: a view of `held`, or read from the file (throws ArtifactError naming the file
  /// and tensor when it cannot be read or has changed since its header was read).
  TensorValues read() const;
  /// Reads a streamed tensor into `held` and drops its source (for a caller that edits values).
  void hold();
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
/// Converts `n` little-endian values of dtype `d` at `src` to double at `dst`. `src` may lie at
/// the start of `dst`'s own buffer (an in-place widening: a file read straight into the output).
void decode_values(const char* src, DType d, size_t n, double* dst);
/// Converts `n` doubles to dtype `d` (rounded to nearest even) as little-endian bytes at `dst`
/// (n x dtype_bytes(d) bytes).
void encode_values(const double* src, DType d, size_t n, char* dst);

/// Adds <observed, expected> to `dot` and <expected, expected> to `rr` (the projection of the
/// observed tensor on the expected one, NOTE [streamed tensors]: reads each once). Returns false,
/// adding nothing, when their shapes differ.
bool accumulate_projection(const HostTensor& observed, const HostTensor& expected, long double& dot, long double& rr);

/// Compares `observed` with `expected`; throws ArtifactError naming the tensor when the shapes differ.
TensorError compare_tensors(const HostTensor& observed, const HostTensor& expected);

}  // namespace gradcert
