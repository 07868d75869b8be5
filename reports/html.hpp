// What the HTML writers (html.cpp: report.html of run / certify, html_audit.cpp: report.html of
// an audit) share: the page (inline CSS, no network), the banner, the check-figure cells, the
// per-tensor charts in model order and the reproduce commands. Internal to reports/; the
// public writers are report_html and audit_html in report.hpp.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "conformance/core/audit_result.hpp"
#include "conformance/core/result.hpp"

namespace gradcert::reports::html {

/// Text escaped for HTML content and attributes.
std::string esc(const std::string& s);

/// The whole page: one file, inline CSS (light and dark: prefers-color-scheme; print), a
/// Content-Security-Policy that allows no request at all, and one inline script that opens
/// every <details> before printing.
std::string page(const std::string& title, const std::string& body);
/// <section id="ID"><h2>TITLE</h2>BODY</section>
std::string section(const std::string& id, const std::string& title, const std::string& body);
/// <span class="badge CLS">TEXT</span>
std::string badge(const std::string& cls, const std::string& text);

/// The verdict banner: `cls` is "pass" | "fail" | "interrupted"; `findings` (the diagnosis, the
/// sensitivity) under the verdict; `facts` are list items; the commands reproduce the run.
std::string banner(const std::string& cls, const std::string& title, const std::string& sentence,
                   const std::vector<std::string>& facts, const std::vector<std::string>& commands,
                   const std::string& command_note, const std::vector<std::string>& findings = {});
/// The environment as banner facts (torch, device, world, launcher, git, seed, host, started).
std::vector<std::string> environment_facts(const Environment& e, bool with_world = true);
/// The spec (pretty JSON) in a closed <details>, or nothing for an empty spec.
std::string spec_block(const std::string& spec_json);

/// `gradcert run` reproducing one run of a report (its run folder keeps the effective spec).
std::string run_command(const RunReport& r, const std::string& launcher);

/// A table cell pair for one check: the figure and its chart against the tolerance ("caught"
/// colours a mutant run's failure). A skipped check draws no chart.
std::string figure_cells(const CheckResult* c, const std::string& cls);
/// The colour class of a check in a run: pass | fail | caught | skip.
std::string check_class(const RunReport& r, const CheckResult& c);

/// The per-tensor errors, per update, in model order: a chart of the gradients (and of the
/// parameters after the step), the worst figure per part of the model (embeddings, each
/// block, head) and a legend. `kind` prefixes the charts' data-chart names ("tensor" ->
/// tensor-grad, tensor-params); `against` says what the figures compare with. `shared`: the
/// page's tensor-name blocks (svg::Profile::shared), so each is written once per page.
std::string tensor_charts(const std::vector<TensorFigure>& figs, double tolerance, const std::string& kind,
                          const std::string& against, std::map<std::string, std::string>* shared);
/// The audit's after-vs-before differences in the same form.
std::vector<TensorFigure> as_figures(const std::vector<AuditTensorDiff>& diffs);

/// "embeddings" | "block N" | "other" | "head": the part of the model a tensor belongs to (a
/// numbered segment names a block: blocks.3, transformer.h.3, model.layers.3).
std::string model_part(const std::string& tensor);
/// Tensor names sorted as the model runs them: embeddings, blocks by index (canonical order
/// inside a block), other parts, then the final norm and head; names the tiny LM does not
/// have by name within their part.
std::vector<std::string> model_order(std::vector<std::string> names);

}  // namespace gradcert::reports::html
