// Helpers the test files share.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

#include "conformance/checks/checks.hpp"
#include "conformance/tests/temp_dirs.hpp"
#include "reports/report.hpp"

namespace gradcert::test {

/// An empty folder under the temp directory, unique per test process: <prefix>_<name>_<pid>;
/// removed when the test passes, kept (and its path printed) when it fails (temp_dirs.hpp).
inline std::string fresh_dir(const std::string& prefix, const std::string& name) { return temp_dir(prefix, name); }

/// A run's error and every check that did not pass, one per line (for assertion messages).
/// The ids of a run's checks, in report order.
inline std::vector<std::string> ids_of(const RunReport& r) {
  std::vector<std::string> out;
  for (const auto& c : r.checks) out.push_back(c.id);
  return out;
}

inline std::string failures(const RunReport& r) {
  std::string s = r.error;
  for (const auto& c : r.checks)
    if (c.verdict != Verdict::Pass) s += "\n" + c.id + " " + verdict_name(c.verdict) + ": " + c.detail;
  return s;
}

}  // namespace gradcert::test
