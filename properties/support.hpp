// Shared pieces of the property tests: seed reporting, the planted-bug harness, tiny specs.
#pragma once
#include <rapidcheck.h>
#include <rapidcheck/detail/TestListenerAdapter.h>

#include <iostream>
#include <sstream>
#include <string>

#include "properties/generators.hpp"

namespace gradcert::props {

/// A double with 3 significant digits ("1.2e-07"), for messages.
inline std::string show_number(double x) {
  std::ostringstream os;
  os.precision(3);
  os << x;
  return os.str();
}

/// The run's rapidcheck seed (from RC_PARAMS or drawn by rapidcheck).
uint64_t rapidcheck_seed();

/// `RC_PARAMS="reproduce=..."` for one failed property (id = gtest "Suite/Name").
std::string reproduce_line(const std::string& id, const rc::detail::Reproduce& reproduce);

/// What a search for a counterexample found.
struct Falsification {
  bool falsified = false;
  std::string message;  ///< rapidcheck's report: counterexample, shrink result, RC_PARAMS reproduce line
};

/// Runs `property` as rapidcheck would under the id `id` (the gtest "Suite/Name", so
/// `RC_PARAMS="reproduce=..."` replays it), expecting it to FAIL: a planted bug must be
/// caught. The report (shrunk counterexample and the reproduce line) is printed and
/// returned. Expected failures stay out of rapidcheck's end-of-run failure summary.
template <typename Testable>
Falsification falsify(const std::string& id, Testable&& property) {
  rc::detail::TestMetadata metadata;
  metadata.id = id;
  metadata.description = id;
  const auto& config = rc::detail::configuration();
  rc::detail::TestListenerAdapter quiet;
  const auto result =
      rc::detail::checkTestable(std::forward<Testable>(property), metadata, config.testParams, quiet, config.reproduce);
  Falsification f;
  f.falsified = result.template is<rc::detail::FailureResult>();
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  if (f.falsified) os << "\n" << reproduce_line(id, result.template get<rc::detail::FailureResult>().reproduce);
  f.message = os.str();
  std::cout << "- " << id << (f.falsified ? ": planted bug caught" : ": planted bug NOT caught") << "\n"
            << f.message << std::endl;
  return f;
}

}  // namespace gradcert::props
