// A failed launch whose cause is a full disk says so first (NOTE [disk full] in launcher.hpp).
#include "conformance/launch/launcher.hpp"

#include "conformance/core/format.hpp"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <filesystem>
#include <regex>

namespace gradcert {

namespace {

// The file a write failed on with ENOSPC, as gradcert's writers and Python say it ("" : none).
std::string enospc_file(const std::string& message) {
  static const std::regex ours(R"((/[^\s:]+): cannot write: No space left on device)");
  static const std::regex python(R"(\[Errno 28\] No space left on device: '([^']+)')");
  std::smatch m;
  if (std::regex_search(message, m, ours) || std::regex_search(message, m, python)) return m[1].str();
  return message.find("No space left on device") != std::string::npos ? "?" : "";
}

// The mount point holding `path`: the highest existing folder above it on the same device.
std::string mount_point(std::filesystem::path p) {
  namespace fs = std::filesystem;
  struct stat st{};
  while (!p.empty() && ::stat(p.c_str(), &st) != 0) p = p.parent_path();
  if (p.empty()) return "?";
  const dev_t dev = st.st_dev;
  for (fs::path up = p.parent_path(); !up.empty() && up != p; p = up, up = up.parent_path()) {
    struct stat above{};
    if (::stat(up.c_str(), &above) != 0 || above.st_dev != dev) break;
  }
  return p.string();
}

}  // namespace

std::string name_full_disk(const std::string& message) {
  const std::string file = enospc_file(message);
  if (file.empty()) return message;
  std::string where = "the output filesystem";
  if (file != "?") {
    const std::string mount = mount_point(std::filesystem::path(file).lexically_normal());
    struct statvfs fs{};
    where = "filesystem " + mount;
    if (::statvfs(mount.c_str(), &fs) == 0)
      where += " (" + human_bytes(double(fs.f_bavail) * fs.f_frsize) + " free of " +
               human_bytes(double(fs.f_blocks) * fs.f_frsize) + " now)";
  }
  return "the disk is full (ENOSPC): writing " + (file == "?" ? std::string("a file") : file) + " failed on " + where +
         "; free space there and run again\n" + message;
}

}  // namespace gradcert
