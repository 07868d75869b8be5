// Files as gradcert writes and reads them: atomically, and with errors that name the path.
#pragma once
#include <string>

namespace gradcert {

/// Writes `text` to `path` atomically (temporary file in the same folder, then rename).
void write_file_atomic(const std::string& path, const std::string& text);

/// Reads a whole text file; throws ArtifactError naming it.
std::string read_text_file(const std::string& path);

}  // namespace gradcert
