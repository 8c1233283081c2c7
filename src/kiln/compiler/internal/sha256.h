// SHA-256 (FIPS 180-4), for content keys: compile-cache keys (cache.h) and the program hash of
// exported artifacts (artifact.h). A plain portable implementation (~200 MB/s); it is not used on
// large weight files, which CRC32C covers.
//
//   Sha256 h;
//   h.Update("abc");
//   std::string hex = DigestHex(h.Finish());  // "ba7816bf..."
//   std::string hex2 = Sha256Hex("abc");      // the same, in one call
#ifndef KILN_COMPILER_INTERNAL_SHA256_H_
#define KILN_COMPILER_INTERNAL_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::compiler::internal {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t n);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  // Returns the digest; the object must not be updated afterwards.
  Sha256Digest Finish();

 private:
  void Block(const uint8_t* p);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lowercase hex of a digest (64 characters).
std::string DigestHex(const Sha256Digest& d);
std::string Sha256Hex(std::string_view data);

}  // namespace kiln::compiler::internal

#endif  // KILN_COMPILER_INTERNAL_SHA256_H_
