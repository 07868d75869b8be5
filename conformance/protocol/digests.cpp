#include "conformance/protocol/digests.hpp"

#include "conformance/core/files.hpp"
#include "conformance/core/sha256.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/fields.hpp"

#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

namespace gradcert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool scratch(const std::string& top) { return top == kDigestsFile || top == "reference" || top == "reference-log"; }

// Every regular file under `dir` as (path relative to dir, its digest), scratch left out.
std::map<std::string, std::string> digests_now(const std::string& dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path rel = it->path().lexically_relative(dir);
    if (scratch(rel.begin()->string())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) out[rel.generic_string()] = sha256_file(it->path().string());
  }
  if (ec) throw ArtifactError(dir + ": cannot list the run folder for its digests: " + ec.message());
  return out;
}

}  // namespace

void write_digests(const std::string& dir, const std::string& nonce) {
  json files = json::object();
  for (const auto& [name, digest] : digests_now(dir)) files[name] = digest;
  write_file_atomic(
      dir + "/" + kDigestsFile,
      json{{"schema", "gradcert.digests/1"}, {"nonce", nonce}, {"algorithm", "sha256"}, {"files", files}}.dump(1));
}

void verify_digests(const std::string& dir, const std::string& nonce) {
  const std::string path = dir + "/" + kDigestsFile;
  const json j = parse_artifact_json(read_text_file(path), path);
  const Fields f{j, path};
  f.schema("gradcert.digests/1");
  f.nonce(nonce);
  const json& files = f.at("files");
  if (!files.is_object()) f.fail("field 'files' must be an object of file -> sha256, got " + json_excerpt(files));
  for (auto it = files.begin(); it != files.end(); ++it) {
    const std::string& name = it.key();
    if (name.empty() || name.front() == '/' || name.find("..") != std::string::npos || !it->is_string())
      f.fail("entry " + json_excerpt(name) + " is not a file inside the run folder with a digest");
    std::error_code ec;
    if (!fs::is_regular_file(fs::symlink_status(dir + "/" + name, ec)))
      throw ArtifactError(dir + "/" + name + ": listed in " + kDigestsFile +
                          " but missing (or no longer a plain file): the run folder is not as the run left it");
    if (sha256_file(dir + "/" + name) != it->get<std::string>())
      throw ArtifactError(dir + "/" + name + ": its bytes are not those the run wrote (its SHA-256 differs from " +
                          kDigestsFile + "): the run folder was changed after the run");
  }
}

}  // namespace gradcert
