// CRC32C (Castagnoli), the checksum of every block Kiln writes: TFRecord framing, checkpoint
// manifests, event files. Uses the SSE4.2 crc32 instruction when the CPU has it (picked at run
// time), a table otherwise.
//
//   uint32_t c = crc32c::Value(data, n);
//   c = crc32c::Extend(c, more, m);             // == Value(data ++ more)
//   uint32_t m = crc32c::Mask(c);               // TFRecord / LevelDB masked form
//   crc32c::Combine(Value(a, na), Value(b, nb), nb) == Value(a ++ b)
#ifndef KILN_BASE_CRC32C_H_
#define KILN_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace kiln::crc32c {

// CRC of data[0, n) appended to a stream whose CRC so far is `crc` (0 for an empty stream).
uint32_t Extend(uint32_t crc, const void* data, size_t n);
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

// CRC of the concatenation A ++ B from crc_a = Value(A), crc_b = Value(B) and B's length, in
// O(log len_b) time without touching the data: lets a writer checksum pieces separately (per
// tensor) and still state the CRC of the whole (per file).
uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// True when Extend uses the SSE4.2 crc32 instruction on this CPU.
bool HardwareAccelerated();

namespace internal {
// The two implementations behind Extend, exposed so tests can check that they agree.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
// Requires HardwareAccelerated().
uint32_t ExtendSse42(uint32_t crc, const void* data, size_t n);
}  // namespace internal

inline constexpr uint32_t kMaskDelta = 0xa282ead8u;
// ((crc >> 15) | (crc << 17)) + 0xa282ead8, as TFRecord and LevelDB store CRCs.
inline uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }
inline uint32_t Unmask(uint32_t masked) {
  uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

}  // namespace kiln::crc32c

#endif  // KILN_BASE_CRC32C_H_
