// The safetensors format both ways, with one strict reader (backends/PROTOCOL.md).
#pragma once
#include <functional>
#include <map>
#include <string>

#include "conformance/core/tensors.hpp"

namespace gradcert {

/// Writes `tensors` as a safetensors file, each in its own dtype (values rounded to it),
/// via a temporary file and rename. `metadata` goes to the "__metadata__" entry.
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Writes a safetensors file whose tensors are produced one at a time: `heads` gives each
/// tensor's name, shape and dtype (values empty), `fill(i, out)` puts tensor i's values (as
/// double, numel of them) into `out`, called once per tensor in name order. Only one tensor's
/// values are in memory at a time (NOTE [streamed tensors]). Errors as write_safetensors'.
void write_safetensors_streamed(const std::string& path, const TensorMap& heads,
                                const std::function<void(const std::string& name, std::vector<double>& out)>& fill,
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
/// ArtifactError naming the file and the tensor. Never crashes on hostile input. Only the
/// header is read: the tensors are streamed (NOTE [streamed tensors]).
TensorMap read_safetensors(const std::string& path, const std::map<std::string, TensorExpectation>& expect = {});

/// Reads a safetensors file's header as strictly as read_safetensors, with no expectation of
/// its names (a shard file, NOTE [shard artifacts]): the file may hold at most `max_data_bytes`
/// of tensor data; its "__metadata__" goes to `metadata`. The values are streamed.
TensorMap open_safetensors(const std::string& path, uint64_t max_data_bytes,
                           std::map<std::string, std::string>& metadata);

/// Same as read_safetensors but from bytes in memory; `label` names the source in errors.
/// (The entry point for a fuzz target.)
TensorMap parse_safetensors(const std::string& label, const std::string& bytes,
                            const std::map<std::string, TensorExpectation>& expect = {});

}  // namespace gradcert
