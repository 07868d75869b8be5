// The JUnit writer of runs and audits: one testsuite model, one renderer. A testcase per
// (run, check) in both; a failed run is one "run" testcase with an <error>; a mutant run
// adds mutant.detected; an audit adds, under audit.between, a testcase per difference of
// the comparison, named by its category (differences.hpp), and a passing one per category
// without a difference.
#include <deque>
#include <set>
#include <sstream>
#include <utility>

#include "conformance/core/format.hpp"
#include "reports/differences.hpp"
#include "reports/report.hpp"
#include "reports/views.hpp"

namespace gradcert {

using namespace reports;

namespace {

struct TestCase {
  enum class Outcome { Pass, Failure, Error, Skipped };
  std::string classname, name;
  Outcome outcome = Outcome::Pass;
  std::string message, body;  ///< <failure> / <error> / <skipped> (skipped: message only)
  bool has_system_out = false;
  std::string system_out;
};

class Suite {
 public:
  explicit Suite(std::string name) : name_(std::move(name)) {}

  /// Adds a testcase; a repeated (classname, name) gets " #2", " #3", ... so names stay unique.
  TestCase& add(const std::string& classname, const std::string& name) {
    std::string unique = name;
    for (int k = 2; !names_.insert({classname, unique}).second; ++k) unique = name + " #" + std::to_string(k);
    TestCase& t = cases_.emplace_back();
    t.classname = classname;
    t.name = unique;
    return t;
  }

  std::string xml() const {
    int failures = 0, errors = 0, skipped = 0;
    std::ostringstream body;
    for (const auto& c : cases_) {
      body << "  <testcase classname=\"" << xml_escape(c.classname) << "\" name=\"" << xml_escape(c.name) << "\"";
      if (c.outcome == TestCase::Outcome::Pass && !c.has_system_out) {
        body << "/>\n";
        continue;
      }
      body << ">\n";
      switch (c.outcome) {
        case TestCase::Outcome::Pass: break;
        case TestCase::Outcome::Skipped:
          ++skipped;
          body << "    <skipped message=\"" << xml_escape(c.message) << "\"/>\n";
          break;
        case TestCase::Outcome::Failure:
        case TestCase::Outcome::Error: {
          const char* tag = c.outcome == TestCase::Outcome::Error ? "error" : "failure";
          ++(c.outcome == TestCase::Outcome::Error ? errors : failures);
          body << "    <" << tag << " message=\"" << xml_escape(c.message) << "\">" << xml_escape(c.body) << "</" << tag
               << ">\n";
          break;
        }
      }
      if (c.has_system_out) body << "    <system-out>" << xml_escape(c.system_out) << "</system-out>\n";
      body << "  </testcase>\n";
    }
    std::ostringstream o;
    o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"" << xml_escape(name_) << "\" tests=\""
      << cases_.size() << "\" failures=\"" << failures << "\" errors=\"" << errors << "\" skipped=\"" << skipped
      << "\">\n"
      << body.str() << "</testsuite>\n";
    return o.str();
  }

 private:
  std::string name_;
  std::deque<TestCase> cases_;  // add() hands out references: a deque keeps them valid
  std::set<std::pair<std::string, std::string>> names_;
};

/// A run's testcases under `classname`: "run" with an <error> when the run failed, else one
/// per check (a failed check is a <failure> unless `failing_is_expected`, as for a mutant
/// run; a skipped check is <skipped>; the detail is the system-out).
void add_run(Suite& suite, const std::string& classname, const RunReport& run, bool failing_is_expected) {
  if (!run.error.empty()) {
    TestCase& t = suite.add(classname, "run");
    t.outcome = TestCase::Outcome::Error;
    t.message = "run failed: " + first_line(run.error);
    t.body = run.error;
    return;
  }
  for (const auto& c : run.checks) {
    TestCase& t = suite.add(classname, c.id);
    if (c.verdict == Verdict::Fail && !failing_is_expected) {
      t.outcome = TestCase::Outcome::Failure;
      // What the stack computed instead, in the message GPU CI dashboards show.
      const std::string headline = diagnosis_headline(run);
      t.message = "figure " + figure_text(c.figure) + " vs tolerance " + tolerance_text(c) +
                  (headline.empty() ? "" : "; " + headline);
      t.body = c.detail;
      for (const auto& s : {diagnosis_text(run), sensitivity_text(run)})
        if (!s.empty()) t.body += "\n" + s;
    } else if (c.verdict == Verdict::Skip) {
      t.outcome = TestCase::Outcome::Skipped;
      t.message = c.detail;
    }
    t.has_system_out = true;
    t.system_out = c.detail;
  }
}

}  // namespace

std::string report_junit(const Report& r) {
  Suite suite("gradcert");
  for (const auto& run : r.runs) {
    const std::string classname = run_label(run);
    const bool mutant = !run.inject.empty();
    add_run(suite, classname, run, mutant);
    if (!mutant || !run.error.empty()) continue;
    TestCase& t = suite.add(classname, "mutant.detected");
    if (run.detected_by().empty()) {
      t.outcome = TestCase::Outcome::Failure;
      t.message = "mutant not detected";
      t.body = "no check failed on the planted bug " + run.inject;
    }
  }
  return suite.xml();
}

std::string audit_junit(const AuditReport& r) {
  Suite suite("gradcert.audit");
  // Each side's failed run or failed checks are its own testcases (the side's differences).
  add_run(suite, "audit.before." + r.before_side.name, r.before, false);
  add_run(suite, "audit.after." + r.after_side.name, r.after, false);
  // The comparison: a testcase per difference, under its category; per-update categories
  // name the update ("loss.update_1").
  const std::string between = "audit.between";
  const auto differences = classify_differences(r);
  for (DifferenceKind k :
       {DifferenceKind::Grads, DifferenceKind::Params, DifferenceKind::WindowCount, DifferenceKind::UpdateSize,
        DifferenceKind::Loss, DifferenceKind::Tensors, DifferenceKind::Compare, DifferenceKind::Other}) {
    bool any = false;
    for (const auto& d : differences) {
      if (d.kind != k) continue;
      any = true;
      std::string name = difference_kind_name(k);
      if (d.update >= 0) name += ".update_" + std::to_string(d.update);
      TestCase& t = suite.add(between, name);
      t.outcome = k == DifferenceKind::Compare ? TestCase::Outcome::Error : TestCase::Outcome::Failure;
      t.message = first_line(d.text);
      t.body = d.text;
    }
    // What was compared and agreed passes (the comparison's categories only).
    if (!any && r.compared && k != DifferenceKind::Compare && k != DifferenceKind::Other)
      suite.add(between, difference_kind_name(k));
  }
  return suite.xml();
}

}  // namespace gradcert
