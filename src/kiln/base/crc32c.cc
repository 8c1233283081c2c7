#include "kiln/base/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define KILN_CRC32C_X86 1
#endif

namespace kiln::crc32c {
namespace {

// Reflected Castagnoli polynomial.
constexpr uint32_t kPoly = 0x82f63b78u;

// Slicing-by-8 tables: kTables[0] is the classic byte table; kTables[k][b] is the CRC of byte b
// followed by k zero bytes.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

inline uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

// a * b modulo the polynomial, in the reflected bit order (bit 31 is x^0).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31;
  uint32_t p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// kX2N[k] = x^(2^k) mod P.
std::array<uint32_t, 32> MakeX2N() {
  std::array<uint32_t, 32> t{};
  uint32_t p = 1u << 30;  // x^1
  t[0] = p;
  for (int n = 1; n < 32; ++n) t[n] = p = MultModP(p, p);
  return t;
}

// x^(n * 2^k) mod P.
uint32_t X2NModP(uint64_t n, unsigned k) {
  static const std::array<uint32_t, 32> kX2N = MakeX2N();
  uint32_t p = 1u << 31;  // x^0
  while (n) {
    if (n & 1) p = MultModP(kX2N[k & 31], p);
    n >>= 1;
    ++k;
  }
  return p;
}

bool DetectSse42() {
#ifdef KILN_CRC32C_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

}  // namespace

namespace internal {

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = kTables[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --n;
  }
  while (n >= 8) {
    const uint64_t v = LoadLe64(p) ^ c;
    c = kTables[7][v & 0xff] ^ kTables[6][(v >> 8) & 0xff] ^ kTables[5][(v >> 16) & 0xff] ^
        kTables[4][(v >> 24) & 0xff] ^ kTables[3][(v >> 32) & 0xff] ^ kTables[2][(v >> 40) & 0xff] ^
        kTables[1][(v >> 48) & 0xff] ^ kTables[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = kTables[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --n;
  }
  return ~c;
}

#ifdef KILN_CRC32C_X86
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t c = static_cast<uint32_t>(~crc);
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  while (n >= 32) {
    c = _mm_crc32_u64(c, LoadLe64(p));
    c = _mm_crc32_u64(c, LoadLe64(p + 8));
    c = _mm_crc32_u64(c, LoadLe64(p + 16));
    c = _mm_crc32_u64(c, LoadLe64(p + 24));
    p += 32;
    n -= 32;
  }
  while (n >= 8) {
    c = _mm_crc32_u64(c, LoadLe64(p));
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(c);
}
#else
uint32_t ExtendSse42(uint32_t crc, const void* data, size_t n) {
  return ExtendPortable(crc, data, n);
}
#endif

}  // namespace internal

bool HardwareAccelerated() {
  static const bool kHas = DetectSse42();
  return kHas;
}

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  static const auto kImpl =
      HardwareAccelerated() ? internal::ExtendSse42 : internal::ExtendPortable;
  return kImpl(crc, data, n);
}

uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // Appending len_b bytes multiplies A's CRC by x^(8 len_b); B's CRC already accounts for the
  // pre- and post-conditioning, which cancel in the XOR (the zlib crc32_combine identity).
  return MultModP(X2NModP(len_b, 3), crc_a) ^ crc_b;
}

}  // namespace kiln::crc32c
