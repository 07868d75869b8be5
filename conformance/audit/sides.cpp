// Audit sides: a built-in backend, a PyTorch adapter of backends/python/adapters.json, or
// external:<command>.
#include "conformance/audit/sides.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "backends/catalog.hpp"
#include "conformance/core/files.hpp"

namespace gradcert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shell_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

std::string adapter_command(const std::string& root, const std::string& adapter, const std::string& inject) {
  const std::string script = root + "/backends/python/command.sh";
  if (!fs::exists(script))
    throw std::invalid_argument(script + " is missing (set GRADCERT_ROOT to the gradcert checkout)");
  if (!fs::exists(root + "/.venv/bin/torchrun"))
    throw std::invalid_argument(adapter + " needs " + root + "/.venv/bin/torchrun: run scripts/bootstrap for the venv");
  std::string cmd = "sh " + shell_quote(script) + " " + adapter;
  if (!inject.empty()) cmd += " --mutant " + shell_quote(inject);
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw std::invalid_argument("cannot run " + script);
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (status != 0) throw std::invalid_argument(script + " " + adapter + " failed: " + out);
  return out;
}

}  // namespace

const std::vector<AdapterInfo>& adapter_catalog(const std::string& root) {
  static std::mutex mu;
  static std::map<std::string, std::vector<AdapterInfo>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(root);
  if (it != cache.end()) return it->second;
  const std::string path = root + "/backends/python/adapters.json";
  std::vector<AdapterInfo> out;
  try {
    const json j = json::parse(read_text_file(path));
    if (j.value("schema", "") != "gradcert.adapters/1")
      throw std::invalid_argument("schema is not gradcert.adapters/1");
    for (const auto& a : j.at("adapters")) {
      AdapterInfo info;
      info.name = a.at("name").get<std::string>();
      info.aliases = a.value("aliases", std::vector<std::string>{});
      info.script = a.at("script").get<std::string>();
      info.reduction = a.at("reduction").get<std::string>();
      info.sync = a.at("sync").get<std::string>();
      info.shards = a.at("shards").get<bool>();
      info.gathers_params = a.at("gathers_params").get<bool>();
      info.mutants = a.value("mutants", std::vector<std::string>{});
      out.push_back(std::move(info));
    }
  } catch (const std::exception& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
  return cache.emplace(root, std::move(out)).first->second;
}

const AdapterInfo* find_adapter(const std::string& root, const std::string& name) {
  for (const auto& a : adapter_catalog(root))
    if (a.name == name || std::find(a.aliases.begin(), a.aliases.end(), name) != a.aliases.end()) return &a;
  return nullptr;
}

AuditSide resolve_audit_side(const std::string& name, const std::string& inject_opt, const std::string& root) {
  AuditSide s;
  s.name = name;
  std::string base = name, inject = inject_opt;
  if (name.rfind("external:", 0) != 0) {
    if (auto at = name.find("+inject="); at != std::string::npos) {
      base = name.substr(0, at);
      if (!inject.empty() && inject != name.substr(at + 8))
        throw std::invalid_argument("'" + name + "' and --*-inject '" + inject + "' disagree");
      inject = name.substr(at + 8);
    }
  }
  if (base.rfind("external:", 0) == 0) {
    s.label = kExternalBackend;
    s.backend = kExternalBackend;
    s.command = base.substr(9);
    if (s.command.empty()) throw std::invalid_argument("external:<command>: the command is empty");
    if (!inject.empty())
      throw std::invalid_argument("a planted bug applies to built-in backends and the adapters only");
    return s;
  }
  const auto names = backend_names();
  if (std::find(names.begin(), names.end(), base) == names.end()) {
    const std::string checkout = root.empty() ? locate_repo_root("") : root;
    if (const AdapterInfo* a = find_adapter(checkout, base)) {
      if (!inject.empty() && std::find(a->mutants.begin(), a->mutants.end(), inject) == a->mutants.end()) {
        std::string known;
        for (const auto& m : a->mutants) known += (known.empty() ? "" : ", ") + m;
        throw std::invalid_argument("adapter " + a->name + " does not plant '" + inject + "' (--mutant: " + known +
                                    ")");
      }
      s.label = a->name;
      s.backend = kExternalBackend;
      s.inject = inject;
      s.command = adapter_command(checkout, a->name, inject);
      return s;
    }
    std::string known, adapters;
    for (const auto& n : names) known += n + " ";
    for (const auto& a : adapter_catalog(checkout)) {
      adapters += a.name + " ";
      for (const auto& al : a.aliases) adapters += al + " ";
    }
    throw std::invalid_argument("unknown backend '" + base + "' (built-in: " + known +
                                "; PyTorch adapters: " + adapters + "; any stack: external:<command>)");
  }
  s.label = base;
  s.backend = base;
  s.inject = inject;
  return s;
}

}  // namespace gradcert
