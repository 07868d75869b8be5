// The shared parts of the HTML report: the page and its CSS, the banner, check-figure cells,
// the per-tensor charts in model order and the reproduce commands (html.hpp).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "conformance/core/format.hpp"
#include "conformance/layout/layout.hpp"
#include "reports/html.hpp"
#include "reports/svg.hpp"
#include "reports/views.hpp"

namespace gradcert::reports::html {

namespace {

// The palette of light mode; dark mode overrides it, print restores it.
const char* kLight =
    "--bg:#fff;--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--panel:#f6f8fa;--band:#eef1f4;--pass:#1a7f37;"
    "--fail:#cf222e;--caught:#0969da;--skip:#818b98;--warn:#9a6700;--passbg:#dafbe1;--failbg:#ffebe9;"
    "--warnbg:#fff8c5;--s0:#0969da;--s1:#d4760a;--s2:#8250df;--s3:#1b7c83;--s4:#bf3989;--s5:#7d6a3b;--s6:#6e7781;--s7:#"
    "6f7d00";
const char* kDark =
    "--bg:#0d1117;--fg:#e6edf3;--muted:#9198a1;--line:#3d444d;--panel:#151b23;--band:#1a2029;--pass:#3fb950;"
    "--fail:#f85149;--caught:#58a6ff;--skip:#9198a1;--warn:#d29922;--passbg:#12351f;--failbg:#3c1618;"
    "--warnbg:#3a2a0b;--s0:#58a6ff;--s1:#f0883e;--s2:#bc8cff;--s3:#39c5cf;--s4:#f778ba;--s5:#d2a679;--s6:#9198a1;--s7:#"
    "b8c14a";

const char* kCss = R"(*{box-sizing:border-box}
body{margin:0 auto;max-width:1240px;padding:16px 24px 48px;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
h1{font-size:20px;margin:0 0 6px}h2{font-size:17px;margin:30px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}h3{font-size:14px;margin:16px 0 6px}
a{color:var(--caught)}code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:var(--panel);border:1px solid var(--line);border-radius:6px;padding:8px 10px;margin:6px 0;white-space:pre-wrap;word-break:break-all}
nav{font-size:13px;margin:4px 0 0}nav a{margin-right:14px}
.banner{border:2px solid var(--c);border-left-width:10px;border-radius:8px;padding:12px 18px;background:var(--cbg);margin:10px 0 14px}
.banner.pass{--c:var(--pass);--cbg:var(--passbg)}.banner.fail{--c:var(--fail);--cbg:var(--failbg)}.banner.interrupted{--c:var(--warn);--cbg:var(--warnbg)}
.verdict{font-size:28px;font-weight:800;letter-spacing:.05em;color:var(--c);margin-right:12px}.sentence{font-size:15px;font-weight:600}
.banner pre{background:var(--bg)}
.findings{margin:6px 0;padding-left:18px;font-size:14px}.findings li{margin:2px 0}
.facts{display:flex;flex-wrap:wrap;gap:2px 18px;margin:8px 0;padding:0;list-style:none;color:var(--muted);font-size:13px}.facts b{color:var(--fg);font-weight:600}
table{border-collapse:collapse;width:100%;margin:6px 0;font-size:13px}th,td{text-align:left;padding:3px 8px;border-bottom:1px solid var(--line);vertical-align:middle}
th{font-weight:600;background:var(--panel)}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.run td{background:var(--band);font-weight:600;padding-top:6px}td.detail{color:var(--muted);font-size:12px;word-break:break-word}
.badge{display:inline-block;padding:0 8px;border-radius:10px;font-size:12px;font-weight:700;color:var(--bg);background:var(--skip);white-space:nowrap}
.badge.pass,.badge.preserved{background:var(--pass)}.badge.fail,.badge.error,.badge.missed{background:var(--fail)}.badge.caught{background:var(--caught)}.badge.interrupted{background:var(--warn)}
.muted{color:var(--muted)}.note{color:var(--muted);font-size:12.5px;margin:4px 0}.bad{color:var(--fail);font-weight:600}
svg{display:block;overflow:visible}svg.chart{max-width:100%;height:auto}.caption{font-size:12.5px;font-weight:600;margin:8px 0 0}svg text,.xl{font:10px system-ui,sans-serif;fill:var(--muted)}svg.tb{display:inline-block;vertical-align:middle;width:150px;height:14px}
.chartbox{overflow-x:auto;margin:4px 0}
.s0{--s:var(--s0)}.s1{--s:var(--s1)}.s2{--s:var(--s2)}.s3{--s:var(--s3)}.s4{--s:var(--s4)}.s5{--s:var(--s5)}.s6{--s:var(--s6)}.s7{--s:var(--s7)}
.track{fill:var(--panel);stroke:var(--line);stroke-width:.5}.tick{stroke:var(--muted);stroke-width:.6}
.bar.pass,.dot.pass{fill:var(--pass)}.bar.fail,.dot.fail{fill:var(--fail)}.bar.caught,.dot.caught{fill:var(--caught)}.bar.skip,.dot.skip{fill:var(--skip)}
.tb .tol{stroke:var(--fg);stroke-width:1.6}.profile .tol{stroke:var(--fail);stroke-width:1.2;stroke-dasharray:5 3;fill:none}
.grid{stroke:var(--line);stroke-width:.6;fill:none}.axis{stroke:var(--muted);fill:none}.band{fill:var(--band)}
.line{fill:none;stroke:var(--s);stroke-width:1.4;stroke-linejoin:round}.dots{fill:none;stroke:var(--s);stroke-width:5;stroke-linecap:round}
.over{fill:none;stroke:var(--fail);stroke-width:11;stroke-linecap:round;opacity:.45}
.hb,.vb{fill:var(--s)}.ref{stroke:var(--muted);stroke-width:1.2;stroke-dasharray:4 3;fill:none}.ref.bound{stroke:var(--caught)}.ref.budget{stroke:var(--fail)}
svg text.gl,svg text.pt,svg text.rl{fill:var(--fg)}svg text.gl,svg text.pt{font-weight:600}svg text.tl,svg text.rl.budget{fill:var(--fail)}svg text.rl.bound{fill:var(--caught)}
.legend{display:flex;flex-wrap:wrap;gap:2px 14px;font-size:12px;color:var(--muted);margin:2px 0 4px}.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px;background:var(--s)}
.sw.ring{background:none;border:3px solid var(--fail);border-radius:50%;opacity:.6}.sw.dash{height:0;border-top:2px dashed var(--fail);border-radius:0;background:none;vertical-align:3px}
.sw.bound{border-top-color:var(--caught)}.parts{font-size:12.5px;margin:2px 0 8px}
table.matrix td{font-size:11.5px;line-height:1.25;text-align:center;border:1px solid var(--line)}table.matrix td.mutant{text-align:left;font-weight:600;white-space:nowrap}
.memgrid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:4px 20px}.memrun.wide{grid-column:1/-1}
td.caught{background:var(--passbg)}td.missed{background:var(--failbg);color:var(--fail);font-weight:700}td.error{background:var(--warnbg)}td.na{background:var(--panel);color:var(--muted)}
details{margin:6px 0;border:1px solid var(--line);border-radius:6px;padding:2px 10px}details[open]{padding-bottom:8px}summary{cursor:pointer;padding:4px 0}
.pair{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:14px}.side{border:1px solid var(--line);border-radius:6px;padding:6px 12px}
td.differs{color:var(--fail);font-weight:700}ul.differences li{margin:2px 0}
@media (max-width:900px){.pair{grid-template-columns:1fr}}
)";

bool digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

// The tiny LM's canonical order (conformance/layout): names outside the blocks, and the
// names inside block 0 without their prefix.
const std::vector<std::string>& canonical(bool in_block) {
  static const auto lists = [] {
    std::pair<std::vector<std::string>, std::vector<std::string>> l;
    for (const auto& p : tiny_lm_layout(ModelSpec{})) {
      if (p.block < 0)
        l.first.push_back(p.name);
      else if (p.block == 0)
        l.second.push_back(p.name.substr(std::string("blocks.0.").size()));
    }
    return l;
  }();
  return in_block ? lists.second : lists.first;
}

struct Place {
  int part = 0;  ///< 0 embeddings, 1 numbered blocks, 2 other, 3 head (final norm, output layer)
  int block = 0;
  size_t within = 0;
  std::string suffix;  ///< inside a block: the name after its index
};

Place place_of(const std::string& name) {
  Place p;
  const auto seg = split(name, '.');
  for (size_t i = 1; i < seg.size(); ++i)
    if (digits(seg[i]) && seg[i].size() < 7) {
      p.part = 1;
      p.block = std::stoi(seg[i]);
      for (size_t k = i + 1; k < seg.size(); ++k) p.suffix += (p.suffix.empty() ? "" : ".") + seg[k];
      const auto& c = canonical(true);
      p.within = static_cast<size_t>(std::find(c.begin(), c.end(), p.suffix) - c.begin());
      return p;
    }
  // Not in a numbered block: the embeddings (wte, wpe, *emb*), the head (*head*, ln_f, a final
  // norm, an output layer), else another part (a GRU, ...), placed between the two.
  bool embed = false, head = false;
  for (std::string s : seg) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    embed = embed || s.rfind("wte", 0) == 0 || s.rfind("wpe", 0) == 0 || s.find("emb") != std::string::npos;
    head = head || s.find("head") != std::string::npos || s == "ln_f" || s == "norm" || s == "final_norm" ||
           s == "out" || s == "output";
  }
  p.part = embed ? 0 : head ? 3 : 2;
  // The tiny LM's place of the same name, also under a prefix ("transformer.ln_f.weight").
  const auto& c = canonical(false);
  p.within = static_cast<size_t>(
      std::find_if(c.begin(), c.end(),
                   [&](const std::string& k) {
                     return name == k || (name.size() > k.size() &&
                                          name.compare(name.size() - k.size() - 1, std::string::npos, "." + k) == 0);
                   }) -
      c.begin());
  return p;
}

std::string short_label(const std::string& name) {
  const Place p = place_of(name);
  std::string s = p.part == 1 ? p.suffix : name;
  for (auto [from, to] : {std::pair<const char*, const char*>{".weight", ".w"}, {".bias", ".b"}}) {
    const size_t k = std::string(from).size();
    if (s.size() > k && s.compare(s.size() - k, std::string::npos, from) == 0) s = s.substr(0, s.size() - k) + to;
  }
  return s.empty() ? name : s;
}

std::string num(double x) { return figure_text(x); }

}  // namespace

std::string esc(const std::string& s) { return xml_escape(s); }

std::string page(const std::string& title, const std::string& body) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<meta name=\"color-scheme\" content=\"light dark\">\n"
    << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
       "script-src 'unsafe-inline'; img-src data:\">\n"
    << "<link rel=\"icon\" href=\"data:,\">\n<title>" << esc(title) << "</title>\n<style>\n"
    << ":root{color-scheme:light dark;" << kLight << "}\n"
    << "@media (prefers-color-scheme:dark){:root{" << kDark << "}}\n"
    << kCss << "@media print{:root{color-scheme:light;" << kLight << "}\n"
    << "body{max-width:none;padding:0;font-size:11px}nav{display:none}details{border:none;padding:0}"
       "summary{font-weight:600}.chartbox{overflow:visible}svg,tr,.banner,.side{break-inside:avoid}"
       "h2,h3{break-after:avoid}a{color:inherit;text-decoration:none}.pair{grid-template-columns:1fr 1fr}}\n"
    << "</style>\n</head>\n<body>\n"
    << body
    << "<script>addEventListener(\"beforeprint\",function(){document.querySelectorAll(\"details\").forEach("
       "function(d){d.open=true})});</script>\n</body>\n</html>\n";
  return o.str();
}

std::string section(const std::string& id, const std::string& title, const std::string& body) {
  return "<section id=\"" + id + "\">\n<h2>" + esc(title) + "</h2>\n" + body + "</section>\n";
}

std::string badge(const std::string& cls, const std::string& text) {
  return "<span class=\"badge " + cls + "\">" + esc(text) + "</span>";
}

std::string banner(const std::string& cls, const std::string& title, const std::string& sentence,
                   const std::vector<std::string>& facts, const std::vector<std::string>& commands,
                   const std::string& command_note, const std::vector<std::string>& findings) {
  static const std::map<std::string, std::string> word = {
      {"pass", "PASS"}, {"fail", "FAIL"}, {"interrupted", "INTERRUPTED"}};
  std::ostringstream o;
  o << "<header id=\"verdict\" class=\"banner " << cls << "\" data-verdict=\"" << cls << "\">\n<h1>" << esc(title)
    << "</h1>\n<div><span class=\"verdict\">" << word.at(cls) << "</span><span class=\"sentence\">" << esc(sentence)
    << "</span></div>\n";
  if (!findings.empty()) {
    o << "<ul class=\"findings\" id=\"findings\">";
    for (const auto& f : findings) o << "<li>" << esc(f) << "</li>";
    o << "</ul>\n";
  }
  o << "<ul class=\"facts\" id=\"environment\">";
  for (const auto& f : facts) o << "<li>" << f << "</li>";
  o << "</ul>\n<div class=\"reproduce\"><b>Reproduce</b> <span class=\"note\">" << esc(command_note) << "</span>\n";
  for (const auto& c : commands) o << "<pre><code>" << esc(c) << "</code></pre>\n";
  o << "</div>\n</header>\n";
  return o.str();
}

std::vector<std::string> environment_facts(const Environment& e, bool with_world) {
  auto fact = [](const char* k, const std::string& v) { return std::string(k) + " <b>" + esc(v) + "</b>"; };
  std::vector<std::string> out = {fact("torch", e.torch), fact("device", e.device)};
  if (with_world) out.push_back(fact("world", std::to_string(e.world)));
  for (auto f : {fact("launcher", e.launcher), fact("git", e.git), fact("seed", std::to_string(e.seed)),
                 fact("host", e.host), fact("started", e.started)})
    out.push_back(f);
  return out;
}

std::string spec_block(const std::string& spec_json) {
  if (spec_json.empty()) return "<p class=\"note\">no spec recorded</p>\n";
  const auto j = nlohmann::json::parse(spec_json, nullptr, false);
  return "<details id=\"spec\"><summary>the spec (save as <code>spec.json</code> for the command above)</summary>"
         "<pre>" +
         esc(j.is_discarded() ? spec_json : j.dump(2)) + "</pre></details>\n";
}

std::string run_command(const RunReport& r, const std::string& launcher) {
  if (!r.reproduce.empty()) return r.reproduce;
  std::string c = "gradcert run";
  if (!r.run_dir.empty()) c += " --spec " + shell_word(r.run_dir + "/spec.json");
  c += " --backend " + shell_word(r.backend) + " --world " + std::to_string(r.topology.world());
  if (r.topology.tp > 1) c += " --tp " + std::to_string(r.topology.tp);
  if (r.topology.pp > 1) c += " --pp " + std::to_string(r.topology.pp);
  c += " --dtype " + shell_word(r.dtype) + " --optimizer " + shell_word(r.optimizer);
  if (!r.inject.empty()) c += " --inject " + shell_word(r.inject);
  if (launcher != "local" && !launcher.empty()) c += " --launcher " + shell_word(launcher);
  if (r.backend == kExternalBackend) c += " --command '<the stack's launch command>'";
  return c;
}

std::string check_class(const RunReport& r, const CheckResult& c) {
  if (c.verdict == Verdict::Skip) return "skip";
  if (c.verdict == Verdict::Fail) return r.inject.empty() ? "fail" : "caught";
  return "pass";
}

std::string figure_cells(const CheckResult* c, const std::string& cls) {
  if (!c) return "<td class=\"num\">-</td><td></td>";
  std::string chart = c->verdict == Verdict::Skip ? "<span class=\"note\">skipped</span>"
                                                  : svg::tolerance_bar(c->figure, c->tolerance, cls);
  return "<td class=\"num\">" + esc(figure_text(c->figure)) + "</td><td>" + chart + "</td>";
}

std::string model_part(const std::string& tensor) {
  const Place p = place_of(tensor);
  switch (p.part) {
    case 0: return "embeddings";
    case 1: return "block " + std::to_string(p.block);
    case 2: return "other";
  }
  return "head";
}

std::vector<std::string> model_order(std::vector<std::string> names) {
  std::map<std::string, std::tuple<int, int, size_t>> key;
  for (const auto& n : names) {
    const Place p = place_of(n);
    key[n] = {p.part, p.block, p.within};
  }
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    return std::tie(key[a], a) < std::tie(key[b], b);
  });
  return names;
}

std::vector<TensorFigure> as_figures(const std::vector<AuditTensorDiff>& diffs) {
  std::vector<TensorFigure> out;
  for (const auto& d : diffs) {
    TensorFigure f;
    f.update = d.update, f.tensor = d.name, f.grad_rel = d.grad_rel, f.param_rel = d.param_rel;
    out.push_back(f);
  }
  return out;
}

std::string tensor_charts(const std::vector<TensorFigure>& figs, double tolerance, const std::string& kind,
                          const std::string& against, std::map<std::string, std::string>* shared) {
  if (figs.empty()) return "<p class=\"note\">no per-tensor figures (the run produced no tensors to compare)</p>\n";
  std::set<std::string> unique;
  std::set<int> updates;
  for (const auto& f : figs) unique.insert(f.tensor), updates.insert(f.update);
  const auto names = model_order({unique.begin(), unique.end()});
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index[names[i]] = i;
  std::map<int, size_t> series_of;
  for (int u : updates) series_of.emplace(u, series_of.size());
  svg::Profile g, p;
  g.kind = kind + "-grad", p.kind = kind + "-params";
  g.title = "gradient relative L2 error per tensor (" + against + "), per update, in model order";
  p.title = "parameter relative L2 error per tensor after the step (" + against + "), per update, in model order";
  for (auto* chart : {&g, &p}) {
    chart->tolerance = tolerance;
    chart->shared = shared;
    for (const auto& n : names) chart->labels.push_back(short_label(n)), chart->groups.push_back(model_part(n));
    for (int u : updates)
      chart->series.push_back({"update " + std::to_string(u), std::vector<double>(names.size(), NAN)});
  }
  // Worst gradient figure per part, and the tensor-updates above the tolerance.
  std::vector<std::string> parts;
  std::map<std::string, const TensorFigure*> worst;
  std::vector<const TensorFigure*> over;
  for (const auto& f : figs) {
    const size_t s = series_of[f.update], i = index[f.tensor];
    g.series[s].values[i] = f.grad_rel;
    p.series[s].values[i] = f.param_rel;
    const std::string part = model_part(f.tensor);
    auto& w = worst[part];
    if (!w || !(f.grad_rel <= w->grad_rel)) w = &f;
    if (tolerance > 0 && !(f.grad_rel <= tolerance)) over.push_back(&f);
  }
  for (const auto& n : names)
    if (std::find(parts.begin(), parts.end(), model_part(n)) == parts.end()) parts.push_back(model_part(n));
  std::ostringstream o;
  o << "<div class=\"legend\">";
  for (int u : updates) o << "<span><i class=\"sw s" << series_of[u] % 8 << "\"></i>update " << u << "</span>";
  o << "<span><i class=\"sw dash\"></i>tolerance " << esc(num(tolerance)) << "</span>"
    << "<span><i class=\"sw ring\"></i>above the tolerance</span><span>bottom row: 0 or below the axis</span></div>\n";
  o << "<p class=\"caption\">gradient: relative L2 error per tensor, " << esc(against)
    << "</p>\n<div class=\"chartbox\">" << svg::profile_chart(g) << "</div>\n";
  o << "<p class=\"parts\"><span class=\"muted\">worst gradient error per part:</span> ";
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorFigure* w = worst[parts[i]];
    const bool bad = tolerance > 0 && !(w->grad_rel <= tolerance);
    o << (i ? " · " : "") << "<span" << (bad ? " class=\"bad\"" : "") << ">" << esc(parts[i]) << " "
      << esc(num(w->grad_rel)) << (bad ? " (" + esc(w->tensor) + ", update " + std::to_string(w->update) + ")" : "")
      << "</span>";
  }
  o << "</p>\n";
  if (!over.empty())
    o << "<p class=\"note\"><span class=\"bad\">" << over.size() << " of " << figs.size()
      << "</span> tensor-updates above the tolerance, in " <<
        [&] {
          std::set<std::string> in;
          for (const auto* f : over) in.insert(model_part(f->tensor));
          std::string s;
          for (const auto& part : parts)
            if (in.count(part)) s += (s.empty() ? "" : ", ") + part;
          return esc(s);
        }()
      << "</p>\n";
  o << "<p class=\"caption\">parameters after the step: relative L2 error per tensor, " << esc(against)
    << "</p>\n<div class=\"chartbox\">" << svg::profile_chart(p) << "</div>\n";
  return o.str();
}

}  // namespace gradcert::reports::html
