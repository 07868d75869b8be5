// Helpers the test files share.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

#include "conformance/checks/checks.hpp"
#include "reports/report.hpp"

namespace gradcert::test {

/// An empty folder under the temp directory, unique per test process: <prefix>_<name>_<pid>.
inline std::string fresh_dir(const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  const auto d = fs::temp_directory_path() / (prefix + "_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

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
