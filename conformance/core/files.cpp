#include "conformance/core/files.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "conformance/core/tensors.hpp"

namespace gradcert {

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw ArtifactError(path + ": cannot open temporary file '" + tmp + "' for writing");
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      throw ArtifactError(path + ": cannot write temporary file '" + tmp + "'");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw ArtifactError(path + ": cannot rename temporary file into place: " + why);
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ArtifactError(path + ": cannot be read (missing?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace gradcert
