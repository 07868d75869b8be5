// Fuzz target: the strict safetensors reader on arbitrary bytes, with and without a plan's
// expectations. Any exception but ArtifactError, and any crash, is a finding.
#include "conformance/fuzz/fuzz_target.hpp"
#include "conformance/protocol/safetensors.hpp"

#include <map>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  static const std::map<std::string, gradcert::TensorExpectation> expect = {{"a", {{2}, gradcert::DType::Float32}},
                                                                            {"b", {{2, 1}, gradcert::DType::Float32}}};
  try {
    (void)gradcert::parse_safetensors("fuzz.safetensors", bytes, expect);
  } catch (const gradcert::ArtifactError&) {}
  try {
    (void)gradcert::parse_safetensors("fuzz.safetensors", bytes);
  } catch (const gradcert::ArtifactError&) {}
  return 0;
}
