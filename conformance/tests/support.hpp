// Helpers the test files share.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>

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

/// What `gradcert ARGS` did: its exit code (-1 when it did not exit), whether a signal
/// ended it, and its stdout and stderr together.
struct CliResult {
  int code = -1;
  bool signaled = false;
  std::string out;
};

/// Runs a shell command line and waits for it.
inline CliResult shell(const std::string& command) {
  CliResult c;
  const std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return c;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) c.out.append(buf.data(), n);
  const int status = pclose(p);
  c.signaled = WIFSIGNALED(status);
  c.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return c;
}

/// Runs the gradcert executable (GRADCERT_EXE) with `args` (shell words) and waits for it.
inline CliResult run_cli(const std::string& args) { return shell(std::string(GRADCERT_EXE) + " " + args); }

}  // namespace gradcert::test
