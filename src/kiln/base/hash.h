// Small non-cryptographic hashes and mixers with fixed, published definitions, so the values
// Kiln stores (cache keys, import fingerprints, config hashes, derived seeds) are the same on
// every compiler and standard library (std::hash is not). For checksums see crc32c.h; for
// content addresses compiler/internal/sha256.h.
//
//   uint64_t h = Fnv1a64("images|");           // FNV-1a, 64 bits
//   h = Fnv1a64(label, h);                     // continued over more bytes
//   uint64_t seed = SplitMix64(base ^ SplitMix64(epoch));  // a well-spread derived seed
//   uint64_t state = 1234567;
//   uint64_t a = SplitMix64Next(&state), b = SplitMix64Next(&state);  // the generator's stream
#ifndef KILN_BASE_HASH_H_
#define KILN_BASE_HASH_H_

#include <cstdint>
#include <string_view>

namespace kiln {

// FNV-1a (Fowler, Noll, Vo): for each byte, h ^= byte; h *= prime.
inline constexpr uint32_t kFnv1a32Offset = 0x811c9dc5u;            // 2166136261
inline constexpr uint32_t kFnv1a32Prime = 0x01000193u;             // 16777619
inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;  // 14695981039346656037
inline constexpr uint64_t kFnv1a64Prime = 0x100000001b3ull;        // 1099511628211

// FNV-1a of `bytes` continued from `h` (the offset basis for a fresh hash).
constexpr uint32_t Fnv1a32(std::string_view bytes, uint32_t h = kFnv1a32Offset) {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= kFnv1a32Prime;
  }
  return h;
}
constexpr uint64_t Fnv1a64(std::string_view bytes, uint64_t h = kFnv1a64Offset) {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= kFnv1a64Prime;
  }
  return h;
}

// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA'14;
// Vigna's reference splitmix64.c). SplitMix64Next advances *state by the golden-ratio increment
// 0x9e3779b97f4a7c15 and returns the mixed state: the reference generator's next().
inline constexpr uint64_t kSplitMix64Increment = 0x9e3779b97f4a7c15ull;

// The output finalizer alone (Stafford's "Mix13" variant the reference uses).
constexpr uint64_t SplitMix64Finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
constexpr uint64_t SplitMix64Next(uint64_t* state) {
  *state += kSplitMix64Increment;
  return SplitMix64Finalize(*state);
}
// The first output of the generator seeded with x: a bijective mixer of 64-bit values.
constexpr uint64_t SplitMix64(uint64_t x) { return SplitMix64Finalize(x + kSplitMix64Increment); }

}  // namespace kiln

#endif  // KILN_BASE_HASH_H_
