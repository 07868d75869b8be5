// Fuzz target: the spec parser (strict JSON, every field's type and range) on arbitrary text.
// Any exception but SpecError, and any crash, is a finding.
#include "conformance/core/spec.hpp"
#include "conformance/fuzz/fuzz_target.hpp"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const gradcert::Spec s = gradcert::parse_spec(text, "fuzz-spec.json");
    (void)gradcert::parse_spec(gradcert::spec_to_json(s), "round-trip");  // what it writes it reads
  } catch (const gradcert::SpecError&) {}
  return 0;
}
