// Fixed-width little-endian integers and protobuf-style base-128 varints: the byte-level codecs
// behind every Kiln file format (TFRecord framing, safetensors headers, checkpoint manifests,
// event files, tf.train.Example, the compile cache). One implementation, so a format's bytes do
// not depend on which copy wrote them.
//
//   std::string buf;
//   PutFixed64(&buf, length);                  // 8 bytes, least significant first
//   PutVarint64(&buf, step);                   // 1..10 bytes, 7 bits each, high bit = "more"
//   uint64_t n = DecodeFixed64(buf.data());
//   std::string_view in = buf;
//   in.remove_prefix(8);
//   uint64_t step;
//   if (!GetVarint64(&in, &step)) return absl::DataLossError("truncated varint");
//
// Decoders never read past what they are given: the Decode* functions take a pointer to at least
// as many bytes as their width; the Get* functions check the bounds and return false (leaving the
// input unchanged) on truncated or overlong input.
#ifndef KILN_BASE_CODING_H_
#define KILN_BASE_CODING_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kiln {

// ---- fixed width, little-endian ----

inline void EncodeFixed16(char* dst, uint16_t v) {
  for (int i = 0; i < 2; ++i) dst[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void EncodeFixed32(char* dst, uint32_t v) {
  for (int i = 0; i < 4; ++i) dst[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void EncodeFixed64(char* dst, uint64_t v) {
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

inline uint16_t DecodeFixed16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
inline uint32_t DecodeFixed32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint64_t DecodeFixed64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// IEEE-754 bit patterns (the bits, not a conversion).
inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint64_t DoubleBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
inline double DoubleFromBits(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

inline void EncodeFloat32(char* dst, float f) { EncodeFixed32(dst, FloatBits(f)); }
inline float DecodeFloat32(const char* p) { return FloatFromBits(DecodeFixed32(p)); }

// Append to a string.
inline void PutFixed16(std::string* out, uint16_t v) {
  char b[2];
  EncodeFixed16(b, v);
  out->append(b, 2);
}
inline void PutFixed32(std::string* out, uint32_t v) {
  char b[4];
  EncodeFixed32(b, v);
  out->append(b, 4);
}
inline void PutFixed64(std::string* out, uint64_t v) {
  char b[8];
  EncodeFixed64(b, v);
  out->append(b, 8);
}
inline void PutFloat32(std::string* out, float f) { PutFixed32(out, FloatBits(f)); }

// Bounds-checked reads from the front of *input: false (and *input unchanged) when fewer bytes
// are left than the width.
bool GetFixed32(std::string_view* input, uint32_t* value);
bool GetFixed64(std::string_view* input, uint64_t* value);

// ---- varints (protobuf base-128) ----

inline constexpr size_t kMaxVarint64Bytes = 10;

// Bytes PutVarint64(v) writes: 1 for v < 128, up to 10 for v >= 2^63.
inline size_t VarintLength(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Writes v into dst (room for VarintLength(v) bytes); returns the end of what it wrote.
inline char* EncodeVarint64(char* dst, uint64_t v) {
  while (v >= 0x80) {
    *dst++ = static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  *dst++ = static_cast<char>(v);
  return dst;
}

inline void PutVarint64(std::string* out, uint64_t v) {
  char b[kMaxVarint64Bytes];
  out->append(b, EncodeVarint64(b, v) - b);
}

// Why a varint did not decode.
enum class VarintResult {
  kOk,
  kTruncated,  // the input ended before a byte without the continuation bit
  kOverflow,   // the value does not fit 64 bits (the 10th byte is above 1)
};

// Decodes the varint at the front of *input. kOk: *value set and *input advanced past it;
// otherwise both unchanged.
VarintResult ParseVarint64(std::string_view* input, uint64_t* value);
inline bool GetVarint64(std::string_view* input, uint64_t* value) {
  return ParseVarint64(input, value) == VarintResult::kOk;
}

}  // namespace kiln

#endif  // KILN_BASE_CODING_H_
