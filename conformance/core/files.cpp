#include "conformance/core/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "conformance/core/tensors.hpp"

namespace gradcert {

// NOTE [write errors] Every file gradcert writes (reports, run inputs, rank artifacts) goes
// through write_file, with POSIX calls rather than a stream, so a failure says why in
// strerror's words with the path: "...: cannot write: No space left on device" on a full
// disk, never a bare "cannot write". close(2) is checked too (a delayed write error).
void write_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw ArtifactError(path + ": cannot open for writing: " + std::strerror(errno));
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw ArtifactError(path + ": cannot write: " + std::strerror(err));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::close(fd) != 0) throw ArtifactError(path + ": cannot write: " + std::strerror(errno));
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write_file(tmp, text);
  } catch (const ArtifactError&) {
    std::remove(tmp.c_str());
    throw;  // names the temporary file, which names the path
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw ArtifactError(path + ": cannot rename temporary file into place: " + why);
  }
}

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw ArtifactError(tmp_ + ": cannot open for writing: " + std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    std::remove(tmp_.c_str());
  }
}

void AtomicFileWriter::append(const char* p, size_t left) {
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw ArtifactError(tmp_ + ": cannot write: " + std::strerror(n < 0 ? errno : EIO));
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_.c_str());
    throw ArtifactError(tmp_ + ": cannot write: " + why);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_.c_str());
    throw ArtifactError(path_ + ": cannot rename temporary file into place: " + why);
  }
}

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a folder";
  return "not a plain file";
}

}  // namespace

// NOTE [artifact files] A run folder is written by a stack gradcert does not trust, so every
// file read back from it is opened without following a symbolic link (O_NOFOLLOW: a link to
// /dev/zero or to a file outside the run folder is refused, never read) and without blocking
// (O_NONBLOCK: a FIFO would wait for a writer forever, after the run's timeout no longer
// applies), must then be a regular file (fstat) with one name (st_nlink 1: a hard link to a
// file outside the run folder is the same file as the outside one, so no path check can
// tell; gradcert, its ranks and the Python client write every file anew, never by link),
// and is read only up to the reader's cap: the bytes the plan implies for a tensor file,
// kMaxTextFileBytes for JSON. The manifest names plain files (no '/', no ".."), so every read
// stays inside the run folder. A refused file is named with what it is, never with its bytes.
ArtifactFile::ArtifactFile(const std::string& path, uint64_t max_bytes) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) throw ArtifactError(path + ": cannot be read (missing?)");
    if (err == ELOOP)
      throw ArtifactError(path + ": is a symbolic link (gradcert reads only regular files inside the run folder)");
    throw ArtifactError(path + ": cannot be opened: " + std::strerror(err));
  }
  try {
    struct stat st{};
    if (::fstat(fd_, &st) != 0) throw ArtifactError(path + ": cannot stat: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw ArtifactError(path + ": not a regular file (" + file_kind(st.st_mode) + ")");
    if (st.st_nlink > 1)
      throw ArtifactError(path + ": has " + std::to_string(st.st_nlink) +
                          " hard links (gradcert reads only files the run wrote: a hard link may point outside the "
                          "run folder)");
    id_.device = static_cast<uint64_t>(st.st_dev);
    id_.inode = static_cast<uint64_t>(st.st_ino);
    id_.size = static_cast<uint64_t>(st.st_size);
    id_.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (id_.size > max_bytes)
      throw ArtifactError(path + ": is " + std::to_string(id_.size) + " bytes, more than the " +
                          std::to_string(max_bytes) + " bytes gradcert reads for it");
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ArtifactFile::~ArtifactFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ArtifactFile::read_at(uint64_t offset, size_t n, char* dst) const {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw ArtifactError(path_ + ": cannot be read: " + std::strerror(errno));
    }
    if (got == 0)
      throw ArtifactError(path_ + ": ends at byte " + std::to_string(offset + done) + ", before the " +
                          std::to_string(offset + n) + " its header promised (truncated while read?)");
    done += static_cast<size_t>(got);
  }
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  const ArtifactFile f(path, max_bytes);
  // The size fstat saw: a file that grows meanwhile is read only that far (the cap holds).
  std::string out(static_cast<size_t>(f.size()), '\0');
  f.read_at(0, out.size(), out.data());
  return out;
}

std::string read_text_file(const std::string& path) { return read_regular_file(path, kMaxTextFileBytes); }

}  // namespace gradcert
