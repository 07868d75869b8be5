// The report writers of runs (the conformance report) and audits: JSON (schemas
// gradcert.report/1 and gradcert.audit/1, json.cpp), JUnit XML (junit.cpp), Markdown
// (markdown.cpp), the console table (console.cpp) and self-contained HTML with charts
// (html.cpp, html_audit.cpp; SVG from svg.cpp); the files (report.cpp). The memory
// and throughput sections are in memory_report.hpp. Torch-free.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/core/audit_result.hpp"
#include "conformance/core/result.hpp"
#include "reports/memory_report.hpp"

namespace gradcert {

std::string report_json(const Report& r);
/// A testcase per (run, check); a failed run is one "run" testcase with an <error>; a mutant
/// run also gets mutant.detected.
std::string report_junit(const Report& r);
std::string report_markdown(const Report& r);
/// The console table (nccl-tests style), with an OK / FAILED footer.
std::string report_table(const Report& r);

/// report.html: one self-contained page (inline CSS and SVG, no request of any kind; light,
/// dark and print): the verdict banner with the environment and the reproducing command, the
/// check table with each figure against its tolerance (log scale), per update the per-tensor
/// errors in model order, the mutant detection matrix, memory and throughput charts.
std::string report_html(const Report& r);

/// Writes report.json, report.md, junit.xml and report.html into `dir` (each atomically).
void write_report_files(const Report& r, const std::string& dir);

/// The audit's writers (schema gradcert.audit/1 for JSON).
std::string audit_json(const AuditReport& r);  ///< schema gradcert.audit/1
std::string audit_markdown(const AuditReport& r);
/// The testcases of report_junit for each side (audit.before.NAME, audit.after.NAME), then
/// audit.between: a testcase per difference of the comparison, named by its category
/// (grads, params, window_count.update_U, update_size.update_U, loss.update_U,
/// tensors.update_U, compare, other), and a passing one per category without a difference.
std::string audit_junit(const AuditReport& r);
std::string audit_table(const AuditReport& r);  ///< the console report
/// report.html of an audit: the verdict, the two sides side by side (checks, per update, per
/// tensor and update against each other and against the reference), memory, migration notes.
std::string audit_html(const AuditReport& r);
/// Writes audit.json, audit.md, junit.xml and report.html into `dir` (each atomically).
void write_audit_files(const AuditReport& r, const std::string& dir);

}  // namespace gradcert
