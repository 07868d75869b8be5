#include "conformance/protocol/safetensors.hpp"

#include "conformance/core/files.hpp"
#include "conformance/core/strict_json.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

namespace gradcert {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull * 1024 * 1024;

bool parse_safetensors_dtype(const std::string& s, DType& out) { return dtype_from_safetensors(s, out); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

uint64_t load_le(const char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

void store_le(std::string& out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

bool json_to_int64(const json& j, int64_t& out) {
  if (j.is_number_unsigned()) {
    uint64_t u = j.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (j.is_number_integer()) {
    out = j.get<int64_t>();
    return true;
  }
  return false;
}

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t numel;
  int64_t begin;
  int64_t end;
};

}  // namespace

void write_safetensors_streamed(const std::string& path, const TensorMap& tensors,
                                const std::function<void(const std::string& name, std::vector<double>& out)>& fill,
                                const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw ArtifactError(path + ": tensor name '__metadata__' is reserved");
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        throw ArtifactError(path + ": tensor '" + name + "': negative dimension in shape " + shape_text(t.shape));
      numel *= d;
    }
    const int64_t begin = offset;
    offset += numel * dtype_bytes(t.dtype);
    header[name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {begin, offset}}};
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const json::exception& e) {
    throw ArtifactError(path + ": cannot encode safetensors header: " + e.what());
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  // One write per tensor, encoded in bulk (NOTE [streamed tensors]): never the whole file in memory.
  AtomicFileWriter out(path);
  std::string head;
  store_le(head, header_text.size(), 8);
  head += header_text;
  out.append(head.data(), head.size());
  std::vector<double> values;
  std::vector<char> buf;
  for (const auto& [name, t] : tensors) {
    values.clear();
    fill(name, values);
    if (static_cast<int64_t>(values.size()) != t.numel())
      throw ArtifactError(path + ": tensor '" + name + "': " + std::to_string(values.size()) + " values but shape " +
                          shape_text(t.shape) + " holds " + std::to_string(t.numel()));
    buf.resize(values.size() * static_cast<size_t>(dtype_bytes(t.dtype)));
    encode_values(values.data(), t.dtype, values.size(), buf.data());
    out.append(buf.data(), buf.size());
  }
  out.commit();
}

void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_safetensors_streamed(
      path, tensors,
      [&](const std::string& name, std::vector<double>& out) {
        const TensorValues v = tensors.at(name).read();
        out.assign(v.begin(), v.end());
      },
      metadata);
}

namespace {

ArtifactError header_error(const std::string& label, const std::string& what) {
  return ArtifactError(label + ": " + what);
}
ArtifactError tensor_error(const std::string& label, const std::string& name, const std::string& what) {
  return ArtifactError(label + ": tensor '" + name + "': " + what);
}

// One tensor's header entry: its dtype, shape and data offsets, each checked against the data
// section of data_len bytes.
Entry parse_entry(const std::string& label, const std::string& name, const json& value, uint64_t data_len) {
  auto fail_tensor = [&](const std::string& n, const std::string& what) { return tensor_error(label, n, what); };
  if (!value.is_object()) throw fail_tensor(name, "header entry is not a JSON object");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!value.contains(field)) throw fail_tensor(name, std::string("missing \"") + field + "\"");

  Entry e;
  e.name = name;
  const json& dtype = value["dtype"];
  if (!dtype.is_string()) throw fail_tensor(name, "\"dtype\" is not a string");
  if (!parse_safetensors_dtype(dtype.get<std::string>(), e.dtype))
    throw fail_tensor(name, "unknown dtype '" + dtype.get<std::string>() + "' (expected F64, F32 or BF16)");

  const json& shape = value["shape"];
  if (!shape.is_array()) throw fail_tensor(name, "\"shape\" is not an array");
  const int64_t max_numel = std::numeric_limits<int64_t>::max() / static_cast<int64_t>(dtype_bytes(e.dtype));
  e.numel = 1;
  for (const json& d : shape) {
    int64_t dim;
    if (!json_to_int64(d, dim)) throw fail_tensor(name, "\"shape\" holds a non-integer dimension");
    if (dim < 0) throw fail_tensor(name, "\"shape\" holds negative dimension " + std::to_string(dim));
    e.shape.push_back(dim);
    if (dim != 0 && e.numel > max_numel / dim) throw fail_tensor(name, "shape size overflows");
    e.numel *= dim;
  }
  if (e.numel > max_numel) throw fail_tensor(name, "shape size overflows");

  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !json_to_int64(offsets[0], e.begin) ||
      !json_to_int64(offsets[1], e.end) || e.begin < 0)
    throw fail_tensor(name, "\"data_offsets\" is not two non-negative integers");
  if (e.begin > e.end)
    throw fail_tensor(name,
                      "data_offsets [" + std::to_string(e.begin) + "," + std::to_string(e.end) + "] begin past end");
  if (static_cast<uint64_t>(e.end) > data_len)
    throw fail_tensor(name, "data_offsets end " + std::to_string(e.end) + " lies beyond the data section of " +
                                std::to_string(data_len) + " bytes (file truncated?)");
  const int64_t want = e.numel * static_cast<int64_t>(dtype_bytes(e.dtype));
  if (e.end - e.begin != want)
    throw fail_tensor(name, "data_offsets span " + std::to_string(e.end - e.begin) + " bytes but shape " +
                                shape_text(e.shape) + " of " + safetensors_dtype(e.dtype) + " needs " +
                                std::to_string(want));
  return e;
}

// The tensors tile the data section exactly, as Python safetensors 0.8 requires: sorted
// by offsets, each begins where the previous ended (no overlap, no gap), and the last
// ends at the end of the file (no trailing bytes).
void check_tiling(const std::string& label, const std::vector<Entry>& entries, uint64_t data_len) {
  auto fail = [&](const std::string& what) { return header_error(label, what); };
  auto fail_tensor = [&](const std::string& n, const std::string& what) { return tensor_error(label, n, what); };
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  int64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_offset) {
    if (e->begin < covered) throw fail_tensor(e->name, "data_offsets overlap those of tensor '" + prev->name + "'");
    if (e->begin > covered)
      throw fail_tensor(e->name, "data_offsets begin at " + std::to_string(e->begin) + ", leaving a gap of " +
                                     std::to_string(e->begin - covered) + " bytes after " +
                                     (prev ? "tensor '" + prev->name + "'" : std::string("the header")));
    covered = e->end;
    prev = e;
  }
  if (static_cast<uint64_t>(covered) != data_len)
    throw fail(std::to_string(data_len - static_cast<uint64_t>(covered)) + " trailing bytes after the last tensor" +
               (prev ? " ('" + prev->name + "')" : std::string()) + ": the data section is " +
               std::to_string(data_len) + " bytes, the tensors cover " + std::to_string(covered));
}

// The tensors the plan expects, each of its shape and dtype, and no other.
void check_expected(const std::string& label, const std::vector<Entry>& entries,
                    const std::map<std::string, TensorExpectation>& expect) {
  auto fail = [&](const std::string& what) { return header_error(label, what); };
  auto fail_tensor = [&](const std::string& n, const std::string& what) { return tensor_error(label, n, what); };
  for (const auto& kv : expect) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang rejects it).
    const std::string& name = kv.first;
    const TensorExpectation& want = kv.second;
    auto it = std::find_if(entries.begin(), entries.end(), [&name](const Entry& e) { return e.name == name; });
    if (it == entries.end()) throw fail("tensor '" + name + "' is missing");
    if (it->shape != want.shape)
      throw fail_tensor(name, "shape " + shape_text(it->shape) + " but the plan expects " + shape_text(want.shape));
    if (it->dtype != want.dtype)
      throw fail_tensor(name, "dtype " + dtype_name(it->dtype) + " but the plan expects " + dtype_name(want.dtype));
  }
  for (const Entry& e : entries)
    if (!expect.count(e.name)) throw fail("tensor '" + e.name + "' is not expected");
}

// A validated header: its tensors, by name order as nlohmann iterates the object.
std::vector<Entry> parse_header(const std::string& label, const std::string& header_text, uint64_t data_len,
                                const std::map<std::string, TensorExpectation>& expect,
                                std::map<std::string, std::string>* metadata = nullptr) {
  auto fail = [&](const std::string& what) { return header_error(label, what); };
  auto fail_tensor = [&](const std::string& n, const std::string& what) { return tensor_error(label, n, what); };
  // As Python safetensors 0.8 reads it: the header starts with '{' and is JSON up to its
  // padding (spaces); a NUL would end nlohmann's input early and hide what follows it.
  if (header_text[0] != '{') throw fail("safetensors header does not start with '{'");
  if (header_text.find('\0') != std::string::npos) throw fail("safetensors header holds a NUL byte");
  json header;
  if (auto p = parse_json_strict(header_text, header)) {
    if (p->kind == JsonProblem::Kind::DuplicateKey && p->path == p->key)
      throw fail_tensor(p->key, "named twice in the header (the last would silently win)");
    throw fail("safetensors header: " + p->message());
  }
  if (!header.is_object()) throw fail("safetensors header is not a JSON object");

  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw fail("\"__metadata__\" is not a JSON object");
      for (const auto& [key, v] : value.items())
        if (!v.is_string())
          throw fail("\"__metadata__\" entry '" + key + "' is not a string");
        else if (metadata)
          (*metadata)[key] = v.get<std::string>();
      continue;
    }
    entries.push_back(parse_entry(label, name, value, data_len));
  }
  check_tiling(label, entries, data_len);
  if (!expect.empty()) check_expected(label, entries, expect);
  return entries;
}

// The length field and the header's bounds; returns the header length.
uint64_t header_length(const std::string& label, const char* first8, uint64_t file_size) {
  if (file_size < 8)
    throw ArtifactError(label + ": file is " + std::to_string(file_size) +
                        " bytes, shorter than the 8-byte safetensors header length");
  const uint64_t header_len = load_le(first8, 8);
  if (header_len == 0) throw ArtifactError(label + ": safetensors header length is 0");
  if (header_len > kMaxHeaderBytes)
    throw ArtifactError(label + ": safetensors header length " + std::to_string(header_len) +
                        " exceeds the 100 MiB limit");
  if (header_len > file_size - 8)
    throw ArtifactError(label + ": safetensors header length " + std::to_string(header_len) + " exceeds the " +
                        std::to_string(file_size - 8) + " bytes after the length field");
  return header_len;
}

}  // namespace

TensorMap parse_safetensors(const std::string& label, const std::string& bytes,
                            const std::map<std::string, TensorExpectation>& expect) {
  const uint64_t header_len = header_length(label, bytes.data(), bytes.size());
  const std::vector<Entry> entries =
      parse_header(label, bytes.substr(8, header_len), bytes.size() - 8 - header_len, expect);
  const char* data = bytes.data() + 8 + header_len;
  TensorMap out;
  for (const Entry& e : entries) {
    HostTensor t;
    t.name = e.name;
    t.shape = e.shape;
    t.dtype = e.dtype;
    t.held.resize(static_cast<size_t>(e.numel));
    decode_values(data + e.begin, e.dtype, t.held.size(), t.held.data());
    out.emplace(e.name, std::move(t));
  }
  return out;
}

namespace {

// The header of `path` (capped at `cap` bytes), its tensors streamed from the file.
TensorMap open_header(const std::string& path, uint64_t cap, const std::map<std::string, TensorExpectation>& expect,
                      std::map<std::string, std::string>* metadata) {
  // Only the header is read now; the values are read where a check needs them (NOTE [streamed tensors]).
  const ArtifactFile f(path, cap);
  char first8[8] = {};
  if (f.size() >= 8) f.read_at(0, 8, first8);
  const uint64_t header_len = header_length(path, first8, f.size());
  std::string header_text(static_cast<size_t>(header_len), '\0');
  f.read_at(8, header_text.size(), header_text.data());
  const std::vector<Entry> entries = parse_header(path, header_text, f.size() - 8 - header_len, expect, metadata);
  TensorMap out;
  for (const Entry& e : entries) {
    TensorPiece piece;
    piece.path = path;
    piece.offset = 8 + header_len + static_cast<uint64_t>(e.begin);
    piece.dtype = e.dtype;
    piece.count = e.numel;
    piece.device = f.identity().device;
    piece.inode = f.identity().inode;
    piece.size = f.identity().size;
    piece.mtime_ns = f.identity().mtime_ns;
    auto src = std::make_shared<TensorSource>();
    src->pieces.push_back(std::move(piece));
    HostTensor t;
    t.name = e.name;
    t.shape = e.shape;
    t.dtype = e.dtype;
    t.source = std::move(src);
    out.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace

TensorMap read_safetensors(const std::string& path, const std::map<std::string, TensorExpectation>& expect) {
  // The cap (NOTE [artifact files]): the expected tensors' bytes, the length field and a
  // header within the parser's limit; a file read without expectations is not capped.
  uint64_t cap = std::numeric_limits<uint64_t>::max();
  if (!expect.empty()) {
    cap = 8 + kMaxHeaderBytes;
    for (const auto& kv : expect) {
      uint64_t bytes = dtype_bytes(kv.second.dtype);
      for (int64_t d : kv.second.shape) bytes *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
      cap += bytes;
    }
  }
  return open_header(path, cap, expect, nullptr);
}

TensorMap open_safetensors(const std::string& path, uint64_t max_data_bytes,
                           std::map<std::string, std::string>& metadata) {
  metadata.clear();
  return open_header(path, 8 + kMaxHeaderBytes + max_data_bytes, {}, &metadata);
}

}  // namespace gradcert
