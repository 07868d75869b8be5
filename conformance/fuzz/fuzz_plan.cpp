// Fuzz target: plan.json as every rank reads it (conformance/protocol/inputs.hpp).
// Any exception but ArtifactError or SpecError, and any crash, is a finding.
#include "conformance/fuzz/fuzz_target.hpp"
#include "conformance/protocol/inputs.hpp"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)gradcert::parse_plan_json(text, "fuzz-plan.json");
  } catch (const gradcert::ArtifactError&) {
  } catch (const gradcert::SpecError&) {}
  return 0;
}
