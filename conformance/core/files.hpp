// Files as gradcert writes and reads them: atomically, and with errors that name the path.
#pragma once
#include <cstdint>
#include <string>

namespace gradcert {

/// The most bytes read_text_file reads (64 MiB): gradcert's JSON files are far smaller.
constexpr uint64_t kMaxTextFileBytes = 64ull << 20;

/// Writes `text` to `path` in place; throws ArtifactError naming the path and the cause
/// ("No space left on device", NOTE [write errors]).
void write_file(const std::string& path, const std::string& text);

/// Writes `text` to `path` atomically (temporary file `path`.tmp.<pid> in the same folder,
/// then rename); errors as write_file's, naming the temporary file.
void write_file_atomic(const std::string& path, const std::string& text);

/// Reads a whole regular file of at most `max_bytes` (NOTE [artifact files]): a symbolic
/// link, a FIFO, a device, a file with more than one hard link or a larger file throws
/// ArtifactError naming the path and what it is, never echoing its bytes.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

/// read_regular_file with the text cap (kMaxTextFileBytes).
std::string read_text_file(const std::string& path);

}  // namespace gradcert
