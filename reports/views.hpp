// What the writers (json.cpp, junit.cpp, markdown.cpp, console.cpp) share: views of the
// result model and the small text helpers more than one format prints with. Internal to
// reports/; the public writers are in report.hpp and memory_report.hpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/core/audit_result.hpp"
#include "conformance/core/memory_types.hpp"
#include "conformance/core/result.hpp"

namespace gradcert::reports {

// ---- text
/// The text up to the first newline.
std::string first_line(const std::string& s);
/// `s` padded with spaces to `w` characters (on the left when `right`); longer text as is.
std::string pad(const std::string& s, size_t w, bool right = false);
/// Seconds as the audit prints them: %.4f below 0.1 s, else %.3f.
std::string seconds(double s);
/// `x` through a printf format ("%.2f", "%.2f ms", "%+.2f%%").
std::string fixed(double x, const char* format);
/// Bytes as a table cell: "-" when not measured (negative), else human_bytes.
std::string cell_bytes(int64_t b);

// ---- the conformance report
/// A check's tolerance: "exact" for 0, else figure_text.
std::string tolerance_text(const CheckResult& c);
/// A check's verdict in a run's row; a mutant run's failed check reads "caught".
std::string verdict_cell(const RunReport& r, const CheckResult& c);
/// NOTE [sensitivity] What a correct run's tolerances cannot see, in words, from its own checks:
/// the smallest uniform gradient scale error grad.scale fails (its tolerance this run, set from
/// the run's measured noise floor), and grad.parity's rel L2 tolerance. "" for a run without a
/// judged grad.scale (an error, a mutant run).
std::string sensitivity_text(const RunReport& r);
/// "diagnosis (run): ..." when the diagnosis ran: what the stack computed instead, its figure and
/// the runner-up (an observed run's note begins with the job's facts); "" otherwise.
std::string diagnosis_text(const RunReport& r);
/// One line for a failing check's message: "the gradient matches unshifted-count (...) at 1.6e-07";
/// "" when no diagnosis ran.
std::string diagnosis_headline(const RunReport& r);
/// Whether the report holds a mutant run (inject set).
bool any_mutant(const Report& r);
/// The ids of the checks that caught a mutant, joined by `separator`.
std::string detected_by_text(const RunReport& r, const std::string& separator);
/// The memory and the throughput of the correct runs that measured them (mutants and failed
/// runs are left out): what the memory and throughput sections show.
std::vector<MemoryRunReport> memory_runs(const Report& r);
std::vector<Throughput> throughput_runs(const Report& r);

// ---- memory sections
/// 0 short, 1 typical, 2 long, 3 anything else.
int bucket_order(const std::string& bucket);
/// The largest phase peak (nullptr for none).
const PhasePeak* worst_of(const std::vector<PhasePeak>& peaks);

// ---- the audit
/// "error" | "pass" | "fail".
std::string run_verdict(const RunReport& r);
/// The check `id` of a run, or nullptr.
const CheckResult* find_check(const RunReport& r, const std::string& id);
/// Every check id of either side, in first-seen order (before first).
std::vector<std::string> check_ids(const AuditReport& r);
/// A check's figure, or "-" when that side has no such check.
std::string figure_or(const CheckResult* c);
/// A check's verdict on one side: "error" when the side's run failed, "-" when it lacks the check.
std::string verdict_or(const RunReport& r, const CheckResult* c);
/// The tolerance column of a check row that either side holds: "exact" for 0 or none.
std::string tolerance_or(const CheckResult* before, const CheckResult* after);
/// "fsdp2 (torch-fsdp2): external stack [adapter torch-fsdp2, ...]; notes: ...".
std::string side_facts_line(const AuditSide& s, const AuditSideFacts& f);
/// Worst figure per tensor over the updates, by tensor name.
std::vector<AuditTensorDiff> worst_per_tensor(const AuditReport& r);

}  // namespace gradcert::reports
