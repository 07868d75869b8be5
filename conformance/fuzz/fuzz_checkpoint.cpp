// Fuzz target: checkpoint.json, the record a resumed run's first leg leaves (NOTE [checkpoint
// format]; for external stacks gradcert.ref.dcp_export writes it from the stack's gradcert.json).
// Any exception but ArtifactError, and any crash, is a finding.
#include "conformance/fuzz/fuzz_target.hpp"
#include "conformance/protocol/checkpoint.hpp"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)gradcert::parse_checkpoint_record(text, "fuzz-checkpoint.json", "0123456789abcdef0123456789abcdef");
  } catch (const gradcert::ArtifactError&) {}
  return 0;
}
