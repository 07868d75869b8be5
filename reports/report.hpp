// The conformance report: JSON (schema gradcert.report/1), JUnit XML, Markdown and the
// console table.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/checks.hpp"
#include "conformance/spec.hpp"
#include "reports/memory_report.hpp"

namespace gradcert {

/// Where and with what a report was made.
struct Environment {
  std::string torch;     ///< torch version the ranks linked
  std::string device = "cpu";
  int world = 1;         ///< the largest world in the report
  std::string launcher = "local";
  std::string git;       ///< commit of the gradcert checkout ("unknown" outside git)
  uint64_t seed = 0;
  std::string host;
  std::string started;   ///< UTC, ISO 8601
};

/// One backend run (or a failed attempt at one) and its checks.
struct RunReport {
  std::string backend;
  TopologySpec topology;
  std::string dtype;
  std::string optimizer;
  std::string inject;     ///< "" for the correct backend
  int updates = 0;
  int64_t update_batch = 0;
  std::vector<CheckResult> checks;
  std::string error;      ///< set when the run itself failed (names the rank)
  std::string run_dir;
  double wall_seconds = 0;
  /// Built-in backends: the estimate, measured model state and phase peaks (memory.* checks).
  bool has_memory = false;
  MemoryRunReport memory;
  /// Rates from the manifest's step times; scaling against `single` is set by certify.
  bool has_throughput = false;
  Throughput throughput;

  /// No check failed and the run did not fail.
  bool passed() const;
  /// For a mutant run: the ids of the checks that failed.
  std::vector<std::string> detected_by() const;
};

/// A whole report. Correct runs must pass; mutant runs (inject set) must be detected.
struct Report {
  Environment environment;
  std::string spec_json;
  std::vector<RunReport> runs;

  /// Every correct run passed and every mutant run was detected.
  bool passed() const;
};

/// "ddp dp2 tp2 float64 sgd [inject=NAME]": how tables and suites name a run.
std::string run_label(const RunReport& r);
/// A figure as the tables print it: integers plainly, others as %.2e; inf and nan by name.
std::string figure_text(double x);
/// A double for JSON: non-finite values become the strings "nan", "inf", "-inf".
nlohmann::json json_number(double x);
/// Text escaped for XML attributes and content (control characters become spaces).
std::string xml_escape(const std::string& s);

std::string report_json(const Report& r);
std::string report_junit(const Report& r);
std::string report_markdown(const Report& r);
/// The console table (nccl-tests style), with an OK / FAILED footer.
std::string report_table(const Report& r);

/// Writes report.json, report.md and junit.xml into `dir` (each atomically).
void write_report_files(const Report& r, const std::string& dir);

}  // namespace gradcert
