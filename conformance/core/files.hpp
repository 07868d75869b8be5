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

/// Writes a file of known pieces atomically without holding it whole: appended to the
/// temporary file `path`.tmp.<pid>, renamed into place by commit(); removed if never committed.
/// Errors as write_file's.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void append(const char* data, size_t n);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

/// What identifies a file's contents as gradcert read them (st_dev, st_ino, st_size, st_mtim).
struct FileIdentity {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity& o) const {
    return device == o.device && inode == o.inode && size == o.size && mtime_ns == o.mtime_ns;
  }
};

/// An artifact file opened for reading under NOTE [artifact files]: the constructor refuses a
/// symbolic link, a FIFO, a device, a file with more than one hard link, or one larger than
/// `max_bytes`, naming the path and what it is. Reads by offset.
class ArtifactFile {
 public:
  ArtifactFile(const std::string& path, uint64_t max_bytes);
  ~ArtifactFile();
  ArtifactFile(const ArtifactFile&) = delete;
  ArtifactFile& operator=(const ArtifactFile&) = delete;
  const FileIdentity& identity() const { return id_; }
  uint64_t size() const { return id_.size; }
  /// Reads exactly `n` bytes at `offset` into `dst`; a short file or a read error throws ArtifactError.
  void read_at(uint64_t offset, size_t n, char* dst) const;

 private:
  std::string path_;
  int fd_ = -1;
  FileIdentity id_;
};

/// Reads a whole regular file of at most `max_bytes` (NOTE [artifact files]): a symbolic
/// link, a FIFO, a device, a file with more than one hard link or a larger file throws
/// ArtifactError naming the path and what it is, never echoing its bytes.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

/// read_regular_file with the text cap (kMaxTextFileBytes).
std::string read_text_file(const std::string& path);

}  // namespace gradcert
