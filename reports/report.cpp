#include "reports/report.hpp"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"
#include "conformance/core/memory_types.hpp"
#include "reports/memory_report.hpp"

namespace gradcert {

using nlohmann::json;

namespace {

// The memory and throughput of the correct runs that measured them (mutants are left out).
std::vector<MemoryRunReport> memory_runs(const Report& r) {
  std::vector<MemoryRunReport> out;
  for (const auto& run : r.runs)
    if (run.inject.empty() && run.error.empty() && run.has_memory) out.push_back(run.memory);
  return out;
}
std::vector<Throughput> throughput_runs(const Report& r) {
  std::vector<Throughput> out;
  for (const auto& run : r.runs)
    if (run.inject.empty() && run.error.empty() && run.has_throughput) out.push_back(run.throughput);
  return out;
}

std::string tolerance_text(const CheckResult& c) { return c.tolerance == 0 ? "exact" : figure_text(c.tolerance); }

// A mutant run's rows read "caught" when the check failed: that is the expected outcome.
std::string verdict_cell(const RunReport& r, const CheckResult& c) {
  if (r.inject.empty()) return verdict_name(c.verdict);
  return c.verdict == Verdict::Fail ? "caught" : verdict_name(c.verdict);
}

}  // namespace

std::string report_json(const Report& r) {
  json runs = json::array();
  for (const auto& run : r.runs) {
    json checks = json::array();
    for (const auto& c : run.checks)
      checks.push_back({{"id", c.id}, {"verdict", verdict_name(c.verdict)}, {"figure", json_number(c.figure)},
                        {"tolerance", json_number(c.tolerance)}, {"detail", c.detail}});
    json j = {{"backend", run.backend},
              {"topology", {{"dp", run.topology.dp}, {"tp", run.topology.tp}, {"pp", run.topology.pp}}},
              {"dtype", run.dtype},
              {"optimizer", run.optimizer},
              {"inject", run.inject.empty() ? json(nullptr) : json(run.inject)},
              {"updates", run.updates},
              {"update_batch", run.update_batch},
              {"checks", checks},
              {"verdict", run.passed() ? "pass" : "fail"},
              {"run_dir", run.run_dir},
              {"wall_seconds", run.wall_seconds}};
    if (!run.error.empty()) j["error"] = run.error;
    runs.push_back(j);
  }
  json mutants = json::array();
  for (const auto& run : r.runs)
    if (!run.inject.empty())
      mutants.push_back({{"name", run.inject}, {"backend", run.backend},
                         {"detected", run.error.empty() && !run.detected_by().empty()},
                         {"detected_by", run.detected_by()}});
  const auto& e = r.environment;
  json out = {{"schema", "gradcert.report/1"},
              {"environment", {{"torch", e.torch}, {"device", e.device}, {"world", e.world}, {"launcher", e.launcher},
                               {"git", e.git}, {"seed", e.seed}, {"host", e.host}, {"started", e.started}}},
              {"spec", r.spec_json.empty() ? json(nullptr) : json::parse(r.spec_json)},
              {"runs", runs},
              {"mutants", mutants},
              {"memory", memory_json(memory_runs(r))},
              {"throughput", throughput_json(throughput_runs(r))},
              {"verdict", r.passed() ? "pass" : "fail"}};
  return out.dump(2) + "\n";
}

std::string report_junit(const Report& r) {
  int tests = 0, failures = 0, skipped = 0;
  std::ostringstream cases;
  for (const auto& run : r.runs) {
    const std::string suite = xml_escape(run_label(run));
    if (!run.error.empty()) {
      ++tests;
      ++failures;
      cases << "  <testcase classname=\"" << suite << "\" name=\"run\">\n    <failure message=\"run failed\">"
            << xml_escape(run.error) << "</failure>\n  </testcase>\n";
      continue;
    }
    for (const auto& c : run.checks) {
      ++tests;
      cases << "  <testcase classname=\"" << suite << "\" name=\"" << xml_escape(c.id) << "\">\n";
      const bool bad = run.inject.empty() ? c.verdict == Verdict::Fail : false;
      if (bad) {
        ++failures;
        cases << "    <failure message=\"figure " << figure_text(c.figure) << " vs tolerance " << tolerance_text(c) << "\">"
              << xml_escape(c.detail) << "</failure>\n";
      } else if (c.verdict == Verdict::Skip) {
        ++skipped;
        cases << "    <skipped message=\"" << xml_escape(c.detail) << "\"/>\n";
      }
      cases << "    <system-out>" << xml_escape(c.detail) << "</system-out>\n  </testcase>\n";
    }
    if (!run.inject.empty()) {
      ++tests;
      cases << "  <testcase classname=\"" << suite << "\" name=\"mutant.detected\">\n";
      if (run.detected_by().empty()) {
        ++failures;
        cases << "    <failure message=\"mutant not detected\">no check failed on the planted bug " << xml_escape(run.inject)
              << "</failure>\n";
      }
      cases << "  </testcase>\n";
    }
  }
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"gradcert\" tests=\"" << tests << "\" failures=\""
    << failures << "\" skipped=\"" << skipped << "\">\n"
    << cases.str() << "</testsuite>\n";
  return o.str();
}

std::string report_markdown(const Report& r) {
  std::ostringstream o;
  const auto& e = r.environment;
  o << "# gradcert conformance report\n\n"
    << "Verdict: **" << (r.passed() ? "pass" : "FAIL") << "**  \n"
    << "torch " << e.torch << " · " << e.device << " · launcher " << e.launcher << " · seed " << e.seed << " · git "
    << e.git << " · " << e.started << "\n\n"
    << "| run | check | figure | tolerance | verdict | detail |\n|---|---|---|---|---|---|\n";
  for (const auto& run : r.runs) {
    if (!run.error.empty()) {
      o << "| " << run_label(run) << " | run | - | - | **error** | " << run.error.substr(0, run.error.find('\n'))
        << " |\n";
      continue;
    }
    for (const auto& c : run.checks)
      o << "| " << run_label(run) << " | " << c.id << " | " << figure_text(c.figure) << " | " << tolerance_text(c) << " | "
        << verdict_cell(run, c) << " | " << c.detail << " |\n";
  }
  bool any_mutant = false;
  for (const auto& run : r.runs) any_mutant |= !run.inject.empty();
  if (any_mutant) {
    o << "\n## Mutant detection\n\n| mutant | backend | detected | by |\n|---|---|---|---|\n";
    for (const auto& run : r.runs) {
      if (run.inject.empty()) continue;
      std::string by;
      for (const auto& id : run.detected_by()) by += (by.empty() ? "" : ", ") + id;
      o << "| " << run.inject << " | " << run.backend << " | " << (by.empty() ? "**no**" : "yes") << " | " << by
        << " |\n";
    }
  }
  if (const auto m = memory_runs(r); !m.empty()) o << "\n" << memory_markdown(m);
  if (const auto t = throughput_runs(r); !t.empty()) o << "\n" << throughput_markdown(t);
  return o.str();
}

std::string report_table(const Report& r) {
  std::ostringstream o;
  char line[512];
  const char* row = " %-9s %3d %3d %3d %-9s %-6s %-21s %10s %10s %7s\n";
  std::snprintf(line, sizeof line, "#%-9s %3s %3s %3s %-9s %-6s %-21s %10s %10s %7s\n", "backend", "dp", "tp", "pp",
                "dtype", "optim", "check", "figure", "tolerance", "verdict");
  o << line;
  std::snprintf(line, sizeof line, "#%-9s %3s %3s %3s %-9s %-6s %-21s %10s %10s %7s\n", "", "", "", "", "", "", "",
                "(rel / #)", "", "");
  o << line;
  int wrong = 0;
  for (const auto& run : r.runs) {
    if (!run.inject.empty()) continue;
    if (!run.error.empty()) {
      ++wrong;
      std::snprintf(line, sizeof line, row, run.backend.c_str(), run.topology.dp, run.topology.tp, run.topology.pp,
                    run.dtype.c_str(), run.optimizer.c_str(), "run", "-", "-", "ERROR");
      o << line << "   " << run.error << "\n";
      continue;
    }
    for (const auto& c : run.checks) {
      std::snprintf(line, sizeof line, row, run.backend.c_str(), run.topology.dp, run.topology.tp, run.topology.pp,
                    run.dtype.c_str(), run.optimizer.c_str(), c.id.c_str(), figure_text(c.figure).c_str(),
                    tolerance_text(c).c_str(), verdict_name(c.verdict).c_str());
      o << line;
      if (c.verdict == Verdict::Fail) {
        ++wrong;
        o << "   " << c.detail << "\n";
      }
    }
  }
  bool any_mutant = false;
  for (const auto& run : r.runs) any_mutant |= !run.inject.empty();
  if (any_mutant) {
    o << "#\n# planted bugs (--inject): each must fail at least one check\n";
    std::snprintf(line, sizeof line, "#%-22s %-9s %3s %-9s %s\n", "mutant", "backend", "dp", "detected", "by");
    o << line;
    for (const auto& run : r.runs) {
      if (run.inject.empty()) continue;
      std::string by;
      for (const auto& id : run.detected_by()) by += (by.empty() ? "" : " ") + id;
      const bool caught = run.error.empty() && !by.empty();
      if (!caught) ++wrong;
      std::snprintf(line, sizeof line, " %-22s %-9s %3d %-9s %s\n", run.inject.c_str(), run.backend.c_str(),
                    run.topology.dp, caught ? "yes" : "NO", run.error.empty() ? by.c_str() : "(run failed)");
      o << line;
      if (!run.error.empty()) o << "   " << run.error << "\n";
    }
  }
  if (const auto m = memory_runs(r); !m.empty()) o << memory_table(m);
  if (const auto t = throughput_runs(r); !t.empty()) o << throughput_table(t);
  o << "# #wrong: " << wrong << "\n# " << (r.passed() ? "OK" : "FAILED") << "\n";
  return o.str();
}

void write_report_files(const Report& r, const std::string& dir) {
  write_file_atomic(dir + "/report.json", report_json(r));
  write_file_atomic(dir + "/report.md", report_markdown(r));
  write_file_atomic(dir + "/junit.xml", report_junit(r));
}

}  // namespace gradcert
