#include "conformance/core/tensors.hpp"

#include "conformance/core/format.hpp"

#include "conformance/core/files.hpp"

#include <cmath>
#include <cstring>
#include <limits>

// The artifact formats are little-endian; values are copied as the host stores them.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "gradcert reads and writes little-endian tensors");

namespace gradcert {

namespace {

constexpr DTypeFacts kDTypes[] = {
    {DType::Float64, "float64", "F64", "fp64", 8},
    {DType::Float32, "float32", "F32", "fp32", 4},
    {DType::BFloat16, "bfloat16", "BF16", "bf16", 2},
};

}  // namespace

const DTypeFacts& dtype_facts(DType d) {
  for (const auto& f : kDTypes)
    if (f.dtype == d) return f;
  return kDTypes[0];
}

int dtype_bytes(DType d) { return dtype_facts(d).bytes; }

std::string dtype_name(DType d) { return dtype_facts(d).name; }

DType parse_dtype(const std::string& name) {
  for (const auto& f : kDTypes)
    if (name == f.name) return f.dtype;
  throw std::invalid_argument("unknown dtype " + quoted_excerpt(name) + " (expected float64, float32 or bfloat16)");
}

std::string safetensors_dtype(DType d) { return dtype_facts(d).safetensors; }

bool dtype_from_safetensors(const std::string& s, DType& out) {
  for (const auto& f : kDTypes)
    if (s == f.safetensors) {
      out = f.dtype;
      return true;
    }
  return false;
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace

void decode_values(const char* src, DType d, size_t n, double* dst) {
  switch (d) {
    case DType::Float64:
      if (static_cast<const void*>(src) != static_cast<const void*>(dst)) std::memmove(dst, src, n * sizeof(double));
      return;
    case DType::Float32:
      // Back to front: element i (4 bytes at 4i) is read before dst[i] (8 bytes at 8i) overwrites
      // the source elements 2i and 2i + 1, both >= i and so already converted.
      for (size_t i = n; i-- > 0;) {
        float f;
        std::memcpy(&f, src + 4 * i, sizeof f);
        dst[i] = f;
      }
      return;
    case DType::BFloat16:
      for (size_t i = n; i-- > 0;) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, sizeof h);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof f);
        dst[i] = f;
      }
      return;
  }
}

void encode_values(const double* src, DType d, size_t n, char* dst) {
  switch (d) {
    case DType::Float64: std::memcpy(dst, src, n * sizeof(double)); return;
    case DType::Float32:
      for (size_t i = 0; i < n; ++i) {
        const float f = static_cast<float>(src[i]);
        std::memcpy(dst + 4 * i, &f, sizeof f);
      }
      return;
    case DType::BFloat16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = float_to_bf16(static_cast<float>(src[i]));
        std::memcpy(dst + 2 * i, &h, sizeof h);
      }
      return;
  }
}

// NOTE [streamed tensors] The checker holds at most a few tensors' values at a time: a
// tensor read from an artifact file keeps only where its bytes lie (TensorSource), and every
// reader takes its values through read(), which reads them from the file into a buffer that
// lives as long as that one comparison. The stack's artifacts, the reference's (written to
// the work folder as they are computed) and the diagnosis pieces are all streamed, so the
// harness's memory is the reference model's own state plus O(the largest tensor), not
// O(updates x parameters). Each read reopens the file under NOTE [artifact files] and refuses
// one whose identity (device, inode, size, mtime) is not the one whose header was checked.
namespace {

// Reads `p`'s values into `dst` (p.count doubles).
void read_piece(const TensorPiece& p, const std::string& name, double* dst) {
  const ArtifactFile f(p.path, std::numeric_limits<uint64_t>::max());
  const FileIdentity was{p.device, p.inode, p.size, p.mtime_ns};
  if (!(f.identity() == was))
    throw ArtifactError(p.path + ": tensor '" + name +
                        "': the file changed after gradcert read its header (another inode, size or mtime)");
  const size_t n = static_cast<size_t>(p.count);
  f.read_at(p.offset, n * static_cast<size_t>(dtype_bytes(p.dtype)), reinterpret_cast<char*>(dst));
  decode_values(reinterpret_cast<const char*>(dst), p.dtype, n, dst);
}

}  // namespace

TensorValues HostTensor::read() const {
  TensorValues v;
  if (!source) {
    v.p_ = held.data();
    v.n_ = held.size();
    return v;
  }
  const size_t n = static_cast<size_t>(numel());
  v.owned_.resize(n);
  const auto& pieces = source->pieces;
  if (pieces.size() == 1 && pieces[0].box.empty() && pieces[0].flat_begin == 0 &&
      pieces[0].count == static_cast<int64_t>(n)) {
    read_piece(pieces[0], name, v.owned_.data());  // a whole tensor: straight into the output
  } else {
    std::vector<double> buf;
    for (const TensorPiece& p : pieces) {
      if (p.box.empty()) {  // a row-major range
        read_piece(p, name, v.owned_.data() + p.flat_begin);
        continue;
      }
      // A box: its rows (the last dimension) land at strided places of the tensor.
      buf.resize(static_cast<size_t>(p.count));
      read_piece(p, name, buf.data());
      const size_t dims = shape.size();
      if (dims == 0 || p.count == 0) {
        if (p.count) v.owned_[0] = buf[0];
        continue;
      }
      const int64_t row = p.box[dims - 1];
      std::vector<int64_t> idx(dims, 0);  // position inside the box, last dimension 0
      for (int64_t src = 0; src < p.count; src += row) {
        int64_t flat = 0;
        for (size_t d = 0; d < dims; ++d) flat = flat * shape[d] + p.at[d] + idx[d];
        std::copy(buf.begin() + src, buf.begin() + src + row, v.owned_.begin() + flat);
        for (size_t d = dims - 1; d-- > 0;) {  // next row: carry through the outer dimensions
          if (++idx[d] < p.box[d]) break;
          idx[d] = 0;
        }
      }
    }
  }
  v.p_ = v.owned_.data();
  v.n_ = n;
  return v;
}

void HostTensor::hold() {
  if (!source) return;
  TensorValues v = read();
  held.assign(v.begin(), v.end());
  source.reset();
}

bool accumulate_projection(const HostTensor& observed, const HostTensor& expected, long double& dot, long double& rr) {
  if (observed.shape != expected.shape) return false;
  const TensorValues o = observed.read(), e = expected.read();
  if (o.size() != e.size()) return false;
  for (size_t i = 0; i < e.size(); ++i) {
    dot += static_cast<long double>(o[i]) * e[i];
    rr += static_cast<long double>(e[i]) * e[i];
  }
  return true;
}

TensorError compare_tensors(const HostTensor& observed, const HostTensor& expected) {
  if (observed.shape != expected.shape || observed.numel() != expected.numel()) {
    auto dims = [](const std::vector<int64_t>& s) {
      std::string t = "[";
      for (size_t i = 0; i < s.size(); ++i) t += (i ? "," : "") + std::to_string(s[i]);
      return t + "]";
    };
    throw ArtifactError("tensor '" + expected.name + "': shape " + dims(observed.shape) + " but the reference has " +
                        dims(expected.shape));
  }
  const TensorValues ov = observed.read(), ev = expected.read();
  if (ov.size() != ev.size() || ev.size() != static_cast<size_t>(expected.numel()))
    throw ArtifactError("tensor '" + expected.name + "': " + std::to_string(ov.size()) + " values against " +
                        std::to_string(ev.size()) + " (shape holds " + std::to_string(expected.numel()) + ")");
  long double diff2 = 0, ref2 = 0;
  double max_abs = 0;
  TensorError out;
  for (size_t i = 0; i < ev.size(); ++i) {
    const double o = ov[i], e = ev[i];
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
    if (std::isnan(d) || std::isnan(max_abs))
      max_abs = std::nan("");
    else if (std::fabs(d) > max_abs)
      max_abs = std::fabs(d);
  }
  const double dn = std::sqrt(static_cast<double>(diff2)), rn = std::sqrt(static_cast<double>(ref2));
  out.relative = rn > 0 ? dn / rn : dn;
  out.max_abs = max_abs;
  // inf - inf is NaN, and ||ref|| = inf makes dn / rn NaN or 0: a non-finite input never reads as agreement.
  if (out.nonfinite > 0 && std::isfinite(out.relative)) out.relative = std::numeric_limits<double>::quiet_NaN();
  return out;
}

}  // namespace gradcert
