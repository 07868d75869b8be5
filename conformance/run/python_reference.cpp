#include "conformance/run/python_reference.hpp"

#include "conformance/protocol/variables.hpp"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "conformance/launch/launcher.hpp"

namespace gradcert {

namespace fs = std::filesystem;

std::string locate_repo_root(const std::string& exe) {
  if (const char* e = std::getenv(vars::kRoot); e && *e) return e;
  auto ok = [](const fs::path& p) { return fs::exists(p / "backends/python/command.sh"); };
  std::error_code ec;
  fs::path p = exe.empty() ? fs::read_symlink("/proc/self/exe", ec) : fs::weakly_canonical(exe, ec);
  if (!ec) {
    p = p.parent_path();  // build/
    for (int i = 0; i < 4 && !p.empty(); ++i, p = p.parent_path()) {
      if (ok(p)) return p.string();
      if (p == p.root_path()) break;
    }
  }
  if (ok(fs::current_path(ec))) return fs::current_path(ec).string();
  throw std::invalid_argument("cannot find the gradcert checkout (backends/python/command.sh) above " +
                              (exe.empty() ? std::string("the executable") : exe) + ": set GRADCERT_ROOT");
}

bool needs_python_reference(const Spec& spec) {
  return !spec.model.factory.empty() || spec.optimizer.max_grad_norm > 0;
}

void run_python_tool(const Spec& spec, const std::string& module, const std::string& args, const std::string& log_dir,
                     const std::string& log_name, const std::string& python) {
  const std::string py = python.empty() ? locate_repo_root("") + "/.venv/bin/python" : python;
  if (!fs::exists(py))
    throw std::invalid_argument(py + " is missing" + (python.empty() ? ": run scripts/bootstrap for the venv" : ""));
  LaunchRequest req;
  req.world = 1;
  req.rank_env = false;
  // The gradcert package is installed into the venv (scripts/bootstrap: editable): no PYTHONPATH.
  req.argv = {"/bin/sh", "-c", "exec '" + py + "' -m gradcert.ref." + module + " " + args};
  req.env = {{"OMP_NUM_THREADS", "1"}};
  req.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec.timeout.run_s * 1000));
  const std::string dir = log_dir + "/" + log_name;
  req.log_dir = dir;
  const LaunchResult r = launch(req);
  if (!r.ok) {
    std::string msg = r.message;
    const std::string who = module == "reference" ? "the reference runner " : "gradcert.ref." + module + " ";
    if (auto at = msg.find("rank 0 "); at != std::string::npos) msg.replace(at, 7, who);
    if (auto at = msg.find("--- rank 0 log tail ---"); at != std::string::npos)
      msg.replace(at, 23, "--- its log tail ---");
    throw std::runtime_error("gradcert.ref." + module + " failed (log " + dir + "/rank0.log): " + msg);
  }
}

}  // namespace gradcert
