// SHA-256 (FIPS 180-4) of bytes and of files: the digests of a run's artifacts (NOTE [artifact digests]).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace gradcert {

/// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  /// The digest as 64 lowercase hex digits; the object is spent after it.
  std::string hex();

 private:
  void block(const unsigned char* p);
  uint32_t h_[8];
  unsigned char buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

/// The SHA-256 of `bytes`, 64 lowercase hex digits.
std::string sha256_hex(const std::string& bytes);
/// The SHA-256 of the file at `path`, read in pieces; throws ArtifactError naming the file when it
/// cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace gradcert
