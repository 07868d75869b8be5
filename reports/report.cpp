// The report files: each written to a temporary name and renamed (write_file_atomic), so a
// crash never leaves a half report. The writers are one file per format: json.cpp,
// junit.cpp, markdown.cpp, console.cpp, html.cpp (runs) and html_audit.cpp (audits).
#include "reports/report.hpp"

#include <filesystem>

#include "conformance/core/files.hpp"

namespace gradcert {

void write_report_files(const Report& r, const std::string& dir) {
  write_file_atomic(dir + "/report.json", report_json(r));
  write_file_atomic(dir + "/report.md", report_markdown(r));
  write_file_atomic(dir + "/junit.xml", report_junit(r));
  write_file_atomic(dir + "/report.html", report_html(r));
}

void write_audit_files(const AuditReport& r, const std::string& dir) {
  std::filesystem::create_directories(dir);
  write_file_atomic(dir + "/audit.json", audit_json(r));
  write_file_atomic(dir + "/audit.md", audit_markdown(r));
  write_file_atomic(dir + "/junit.xml", audit_junit(r));
  write_file_atomic(dir + "/report.html", audit_html(r));
}

}  // namespace gradcert
