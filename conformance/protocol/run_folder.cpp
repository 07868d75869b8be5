#include "conformance/protocol/run_folder.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "conformance/core/files.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/core/tensors.hpp"

namespace gradcert {

namespace fs = std::filesystem;

std::string make_run_nonce() {
  std::random_device rd;
  std::seed_seq seq{rd(), rd(), rd(), rd(), static_cast<unsigned>(::getpid()),
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

}  // namespace gradcert
