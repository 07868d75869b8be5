#include "conformance/protocol/run_folder.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "conformance/core/files.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/core/tensors.hpp"

namespace gradcert {

namespace fs = std::filesystem;

std::string make_run_nonce() {
  std::random_device rd;
  std::seed_seq seq{rd(),
                    rd(),
                    rd(),
                    rd(),
                    static_cast<unsigned>(::getpid()),
                    static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::mt19937_64 gen(seq);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (int w = 0; w < 2; ++w) {
    uint64_t v = gen();
    for (int i = 0; i < 16; ++i, v >>= 4) out.push_back(hex[v & 0xf]);
  }
  return out;
}

std::string prepare_run_folder(const std::string& dir) {
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument("run folder '" + dir + "' " + why +
                                "; gradcert only empties run folders it made (marker " + kRunFolderMarker +
                                "): remove it or choose another --out");
  };
  if (dir.empty()) throw std::invalid_argument("run folder: empty path");
  const fs::path p(dir);
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(p, ec);
  if (!ec && fs::exists(st)) {
    if (fs::is_symlink(st)) refuse("is a symbolic link");
    if (!fs::is_directory(st)) refuse("exists and is not a folder");
    const bool empty = fs::is_empty(p, ec);
    if (ec) refuse("cannot be listed (" + ec.message() + ")");
    if (!empty) {
      const fs::file_status mst = fs::symlink_status(p / kRunFolderMarker, ec);
      if (ec || !fs::is_regular_file(mst)) refuse("holds files but no marker");
      fs::remove_all(p, ec);
      if (ec) throw std::invalid_argument("run folder '" + dir + "': cannot remove the previous run: " + ec.message());
    }
  }
  if (p.has_parent_path()) {
    fs::create_directories(p.parent_path(), ec);
    if (ec) throw std::invalid_argument("run folder '" + dir + "': cannot create its parent: " + ec.message());
  }
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw std::invalid_argument("run folder '" + dir + "': cannot create: " + std::strerror(errno));
  if (!fs::is_empty(p, ec) || ec) refuse("was filled by someone else while gradcert was preparing it");
  const std::string nonce = make_run_nonce();
  const nlohmann::json marker = {{"schema", "gradcert.run-folder/1"}, {"nonce", nonce}};
  write_file_atomic(dir + "/" + kRunFolderMarker, marker.dump() + "\n");
  return nonce;
}

std::string run_folder_nonce(const std::string& dir) {
  const std::string path = dir + "/" + kRunFolderMarker;
  const nlohmann::json j = parse_artifact_json(read_text_file(path), path);
  if (!j.is_object() || j.value("schema", "") != "gradcert.run-folder/1" || !j.contains("nonce") ||
      !j["nonce"].is_string() || j["nonce"].get<std::string>().empty())
    throw ArtifactError(path + ": not a gradcert run-folder marker");
  return j["nonce"].get<std::string>();
}

// NOTE [run record] A run folder says everything `gradcert check` needs to judge it again
// without launching anything: spec.json, plan.json and the artifacts, plus run.json, written
// by the harness before the launch: the backend, the topology it ran at, the launcher, the
// planted bug, the sampler audit, the external command and the nonce the artifacts must
// echo. A folder without it (or from before it) is refused, never guessed at.
void write_run_record(const std::string& dir, const RunRecord& r) {
  const nlohmann::json j = {{"schema", "gradcert.run/1"},
                            {"backend", r.backend},
                            {"world", r.world},
                            {"tp", r.tp},
                            {"pp", r.pp},
                            {"launcher", r.launcher},
                            {"inject", r.inject},
                            {"sampler_audit", r.sampler_audit},
                            {"command", r.command},
                            {"nonce", r.nonce}};
  write_file_atomic(dir + "/" + kRunRecordFile, j.dump(1) + "\n");
}

RunRecord read_run_record(const std::string& dir) {
  const std::string path = dir + "/" + kRunRecordFile;
  const nlohmann::json j = parse_artifact_json(read_text_file(path), path);
  auto fail = [&](const std::string& what) -> void { throw ArtifactError(path + ": " + what); };
  if (!j.is_object()) fail("expected a JSON object, got " + json_excerpt(j));
  auto at = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) fail(std::string("field '") + key + "' is missing");
    return j.at(key);
  };
  auto text = [&](const char* key) {
    const auto& v = at(key);
    if (!v.is_string()) fail(std::string("field '") + key + "' must be a string, got " + json_excerpt(v));
    return v.get<std::string>();
  };
  auto count = [&](const char* key) {
    const auto& v = at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 1 << 20)
      fail(std::string("field '") + key + "' must be an integer >= 1, got " + json_excerpt(v));
    return static_cast<int>(v.get<int64_t>());
  };
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!std::set<std::string>{"schema", "backend", "world", "tp", "pp", "launcher", "inject", "sampler_audit",
                               "command", "nonce"}
             .count(it.key()))
      fail("unknown field '" + it.key() + "'");
  if (text("schema") != "gradcert.run/1")
    fail("field 'schema' must be \"gradcert.run/1\", got " + json_excerpt(at("schema")));
  RunRecord r;
  r.backend = text("backend");
  if (r.backend.empty()) fail("field 'backend' is empty");
  r.world = count("world");
  r.tp = count("tp");
  r.pp = count("pp");
  if (r.world % (r.tp * r.pp) != 0)
    fail("world " + std::to_string(r.world) + " is not a multiple of tp x pp = " + std::to_string(r.tp * r.pp));
  r.launcher = text("launcher");
  if (r.launcher != "local" && r.launcher != "mpirun")
    fail("field 'launcher' must be \"local\" or \"mpirun\", got " + json_excerpt(at("launcher")));
  r.inject = text("inject");
  if (!at("sampler_audit").is_boolean())
    fail("field 'sampler_audit' must be true or false, got " + json_excerpt(at("sampler_audit")));
  r.sampler_audit = at("sampler_audit").get<bool>();
  r.command = text("command");
  r.nonce = text("nonce");
  if (r.nonce.empty()) fail("field 'nonce' is empty");
  return r;
}

}  // namespace gradcert
