// `gradcert findings DIR`: the findings report of scripts/certify-stacks (one entry per stack,
// version and configuration), and the comparison with the approved goldens.
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "conformance/cli/verbs.hpp"
#include "conformance/core/files.hpp"
#include "reports/findings.hpp"

namespace gradcert {

namespace {

struct FindingsOptions {
  std::string dir, golden;
  bool approve = false;
};

// "id | ..." lines keyed by id.
std::map<std::string, std::string> golden_lines(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out[line.substr(0, line.find(" | "))] = line;
  return out;
}

}  // namespace

Verb add_findings_verb(CLI::App& app) {
  auto o = std::make_shared<FindingsOptions>();
  auto* cmd =
      app.add_subcommand("findings", "write findings.json / findings.md of a scripts/certify-stacks folder and compare "
                                     "them with the approved goldens");
  cmd->add_option("dir", o->dir, "the certify-stacks output folder (with entries/*.json)")->required();
  cmd->add_option("--golden", o->golden, "approved findings (golden/stacks/findings.txt): exit 1 on any difference");
  cmd->add_flag("--approve", o->approve, "with --golden: write this run's lines into it (merged by id)");
  return {cmd, [o] {
            const auto findings = read_findings(o->dir);
            write_file_atomic(o->dir + "/findings.json", findings_json(findings));
            write_file_atomic(o->dir + "/findings.md", findings_markdown(findings));
            std::cout << findings_console(findings);
            std::cout << "# wrote " << o->dir << "/findings.json, findings.md (" << findings.size() << " entries)\n";
            if (o->golden.empty()) return kPass;
            std::string old_text;
            {
              std::ifstream in(o->golden);
              if (in) old_text.assign(std::istreambuf_iterator<char>(in), {});
            }
            auto approved = golden_lines(old_text);
            const auto now = golden_lines(findings_golden(findings));
            if (o->approve) {
              for (const auto& [id, line] : now) approved[id] = line;
              std::string text =
                  "# approved findings of scripts/certify-stacks (gradcert findings --golden FILE --approve)\n"
                  "# id | version | verdict | diagnosis | partial window | N count | check verdicts\n";
              for (const auto& [id, line] : approved) text += line + "\n";
              write_file_atomic(o->golden, text);
              std::cout << "# approved " << now.size() << " lines into " << o->golden << "\n";
              return kPass;
            }
            int differ = 0;
            for (const auto& [id, line] : now) {
              auto it = approved.find(id);
              if (it == approved.end()) {
                std::cout << "# NOT APPROVED " << id << ":\n+ " << line << "\n";
                ++differ;
              } else if (it->second != line) {
                std::cout << "# CHANGED " << id << ":\n- " << it->second << "\n+ " << line << "\n";
                ++differ;
              }
            }
            std::cout << (differ ? "# findings differ from " : "# findings equal ") << o->golden << " (" << now.size()
                      << " compared, " << differ << " differ)\n";
            return differ ? kCheckFailed : kPass;
          }};
}

}  // namespace gradcert
