#include "conformance/core/audit_result.hpp"

namespace gradcert {

std::string AuditReport::verdict_text() const {
  if (preserved()) return "the migration preserves training semantics";
  return std::to_string(differences.size()) + " difference" + (differences.size() == 1 ? "" : "s");
}

std::string side_title(const AuditSide& s) {
  if (s.name.rfind("external:", 0) == 0) return "external";
  std::string t = s.name;
  if (s.label != s.name && s.name.find("+inject=") == std::string::npos) t += " (" + s.label + ")";
  if (!s.inject.empty() && s.name.find("+inject=") == std::string::npos) t += " +inject=" + s.inject;
  return t;
}

}  // namespace gradcert
