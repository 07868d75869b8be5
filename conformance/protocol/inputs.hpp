// The protocol's inputs read back: plan.json as every rank (built-in or external) consumes it.
#pragma once
#include <string>

#include "conformance/core/plan.hpp"

namespace gradcert {

/// Parses plan.json text (schema gradcert.plan/1, written by plan_to_json) strictly into the
/// plan and the spec it carries. Any missing, ill-typed or inconsistent field throws
/// ArtifactError naming `source` and the field ("plan.json: windows[2].slots[1][0].ids: ...").
Plan parse_plan_json(const std::string& text, const std::string& source, Spec* spec = nullptr);
/// Reads and parses a plan.json file (ArtifactError naming the file).
Plan read_plan_file(const std::string& path, Spec* spec = nullptr);

}  // namespace gradcert
