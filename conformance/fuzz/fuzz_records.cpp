// Fuzz target: manifest.json and rank<g>.json as the harness reads them, against the default
// spec's plan (world 2) and a fixed nonce. Any exception but ArtifactError, and any crash,
// is a finding.
#include "conformance/fuzz/fuzz_target.hpp"
#include "conformance/protocol/artifacts.hpp"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const gradcert::Plan plan = gradcert::make_plan(gradcert::Spec{});
  static const std::string nonce = "0123456789abcdef0123456789abcdef";
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)gradcert::parse_manifest_json(text, "manifest.json", plan, plan.world(), nonce);
  } catch (const gradcert::ArtifactError&) {}
  for (int rank = 0; rank < plan.world(); ++rank) {
    try {
      (void)gradcert::parse_rank_record_json(text, "rank.json", plan, rank, nonce);
    } catch (const gradcert::ArtifactError&) {}
  }
  return 0;
}
