// The conformance report: JSON (schema gradcert.report/1), JUnit XML, Markdown and the
// console table.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/core/audit_result.hpp"
#include "conformance/core/result.hpp"
#include "reports/memory_report.hpp"

namespace gradcert {

std::string report_json(const Report& r);
std::string report_junit(const Report& r);
std::string report_markdown(const Report& r);
/// The console table (nccl-tests style), with an OK / FAILED footer.
std::string report_table(const Report& r);

/// Writes report.json, report.md and junit.xml into `dir` (each atomically).
void write_report_files(const Report& r, const std::string& dir);

/// The audit's writers (schema gradcert.audit/1 for JSON).
std::string audit_json(const AuditReport& r);  ///< schema gradcert.audit/1
std::string audit_markdown(const AuditReport& r);
std::string audit_junit(const AuditReport& r);
std::string audit_table(const AuditReport& r);  ///< the console report
/// Writes audit.json, audit.md and junit.xml into `dir` (each atomically).
void write_audit_files(const AuditReport& r, const std::string& dir);

}  // namespace gradcert
