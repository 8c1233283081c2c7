#include "kiln/tensor/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace kiln {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  std::string_view st_name;
  int64_t size;
};

constexpr DTypeInfo kInfo[kNumDTypes] = {
    {DType::kF32, "f32", "F32", 4},
    {DType::kBF16, "bf16", "BF16", 2},
    {DType::kF16, "f16", "F16", 2},
    {DType::kF8E4M3, "f8e4m3", "F8_E4M3", 1},
    {DType::kF8E5M2, "f8e5m2", "F8_E5M2", 1},
    {DType::kF64, "f64", "F64", 8},
    {DType::kS8, "s8", "I8", 1},
    {DType::kU8, "u8", "U8", 1},
    {DType::kS32, "s32", "I32", 4},
    {DType::kS64, "s64", "I64", 8},
    {DType::kBool, "bool", "BOOL", 1},
};

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds a finite float to a format with `mbits` mantissa bits and exponent bias `bias`, with
// `ebits` exponent bits, returning sign-less bits. Handles subnormals of the target. Values past
// `max_bits` saturate or become inf as the caller decides.
uint32_t RoundToSmallFloat(float a, int ebits, int mbits, int bias) {
  // a >= 0, finite.
  if (a == 0.0f) return 0;
  int exp;
  float m = std::frexp(a, &exp);  // a = m * 2^exp, m in [0.5, 1)
  int e = exp - 1 + bias;         // biased exponent for 1.m form
  if (e <= 0) {
    // Subnormal in target: value = k * 2^(1 - bias - mbits).
    float scaled = std::ldexp(a, bias - 1 + mbits);
    float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return static_cast<uint32_t>(r);   // may round up into the smallest normal: bits still right
  }
  float scaled = std::ldexp(m * 2.0f, mbits);  // in [2^mbits, 2^(mbits+1))
  float r = std::nearbyint(scaled);
  uint32_t mant = static_cast<uint32_t>(r);
  if (mant >= (1u << (mbits + 1))) {
    mant >>= 1;
    ++e;
  }
  (void)ebits;
  return (static_cast<uint32_t>(e) << mbits) | (mant & ((1u << mbits) - 1));
}

float SmallFloatToFloat(uint32_t bits, int ebits, int mbits, int bias, bool has_inf) {
  uint32_t sign = bits >> (ebits + mbits);
  uint32_t e = (bits >> mbits) & ((1u << ebits) - 1);
  uint32_t m = bits & ((1u << mbits) - 1);
  float v;
  if (e == 0) {
    v = std::ldexp(static_cast<float>(m), 1 - bias - mbits);
  } else if (has_inf && e == (1u << ebits) - 1) {
    v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    v = std::ldexp(static_cast<float>(m | (1u << mbits)), static_cast<int>(e) - bias - mbits);
  }
  return sign ? -v : v;
}

}  // namespace

std::string_view DTypeName(DType t) { return kInfo[static_cast<int>(t)].name; }
std::string_view SafetensorsName(DType t) { return kInfo[static_cast<int>(t)].st_name; }
int64_t DTypeSize(DType t) { return kInfo[static_cast<int>(t)].size; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.type;
  return std::nullopt;
}
std::optional<DType> DTypeFromSafetensorsName(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.st_name == name) return i.type;
  return std::nullopt;
}

bool IsFloating(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF64:
      return true;
    default:
      return false;
  }
}
bool IsInteger(DType t) {
  return t == DType::kS8 || t == DType::kU8 || t == DType::kS32 || t == DType::kS64;
}
std::pair<int64_t, int64_t> IntegerRange(DType t) {
  switch (t) {
    case DType::kS8:
      return {-128, 127};
    case DType::kU8:
      return {0, 255};
    case DType::kS32:
      return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    case DType::kBool:
      return {0, 1};
    default:
      return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}
bool IsStorageOnly(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }

uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t rounding = 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
float Bf16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToF16(float f) {
  uint32_t sign = (FloatBits(f) >> 16) & 0x8000;
  float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00);  // rounds past max -> inf
  return static_cast<uint16_t>(sign | RoundToSmallFloat(a, 5, 10, 15));
}
float F16ToFloat(uint16_t h) { return SmallFloatToFloat(h, 5, 10, 15, true); }

uint8_t FloatToF8E4M3(float f) {
  uint32_t sign = (FloatBits(f) >> 24) & 0x80;
  if (std::isnan(f)) return 0x7f;
  float a = std::fabs(f);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7e);  // saturate to max finite
  uint32_t r = RoundToSmallFloat(a, 4, 3, 7);
  if (r > 0x7e) r = 0x7e;
  return static_cast<uint8_t>(sign | r);
}
float F8E4M3ToFloat(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  return SmallFloatToFloat(b, 4, 3, 7, false);
}

uint8_t FloatToF8E5M2(float f) {
  uint32_t sign = (FloatBits(f) >> 24) & 0x80;
  if (std::isnan(f)) return static_cast<uint8_t>(sign | 0x7e);
  float a = std::fabs(f);
  if (a >= 61440.0f) return static_cast<uint8_t>(sign | 0x7c);  // past max (57344) -> inf
  return static_cast<uint8_t>(sign | RoundToSmallFloat(a, 5, 2, 15));
}
float F8E5M2ToFloat(uint8_t b) { return SmallFloatToFloat(b, 5, 2, 15, true); }

namespace {
template <typename T>
T SaturatingCast(double v) {
  if (std::isnan(v)) return 0;
  double t = std::trunc(v);
  if (t <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  if (t >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(t);
}
}  // namespace

double LoadAsDouble(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kF8E4M3:
      return F8E4M3ToFloat(static_cast<const uint8_t*>(base)[i]);
    case DType::kF8E5M2:
      return F8E5M2ToFloat(static_cast<const uint8_t*>(base)[i]);
    case DType::kF64:
      return static_cast<const double*>(base)[i];
    case DType::kS8:
      return static_cast<const int8_t*>(base)[i];
    case DType::kU8:
      return static_cast<const uint8_t*>(base)[i];
    case DType::kS32:
      return static_cast<const int32_t*>(base)[i];
    case DType::kS64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[i] ? 1.0 : 0.0;
  }
  return 0;
}

void StoreFromDouble(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBf16(static_cast<float>(v));
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = FloatToF16(static_cast<float>(v));
      return;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(base)[i] = FloatToF8E4M3(static_cast<float>(v));
      return;
    case DType::kF8E5M2:
      static_cast<uint8_t*>(base)[i] = FloatToF8E5M2(static_cast<float>(v));
      return;
    case DType::kF64:
      static_cast<double*>(base)[i] = v;
      return;
    case DType::kS8:
      static_cast<int8_t*>(base)[i] = SaturatingCast<int8_t>(v);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(base)[i] = SaturatingCast<uint8_t>(v);
      return;
    case DType::kS32:
      static_cast<int32_t*>(base)[i] = SaturatingCast<int32_t>(v);
      return;
    case DType::kS64:
      static_cast<int64_t*>(base)[i] = SaturatingCast<int64_t>(v);
      return;
    case DType::kBool:
      static_cast<uint8_t*>(base)[i] = (v != 0.0) ? 1 : 0;
      return;
  }
}

int64_t LoadAsInt64(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kS8:
      return static_cast<const int8_t*>(base)[i];
    case DType::kU8:
      return static_cast<const uint8_t*>(base)[i];
    case DType::kS32:
      return static_cast<const int32_t*>(base)[i];
    case DType::kS64:
      return static_cast<const int64_t*>(base)[i];
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[i] ? 1 : 0;
    default: {
      double v = LoadAsDouble(base, t, i);
      if (std::isnan(v)) return 0;
      if (v >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
      if (v <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(v);
    }
  }
}

void StoreFromInt64(void* base, DType t, int64_t i, int64_t v) {
  switch (t) {
    case DType::kS8:
      static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      return;
    case DType::kS32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      return;
    case DType::kS64:
      static_cast<int64_t*>(base)[i] = v;
      return;
    case DType::kBool:
      static_cast<uint8_t*>(base)[i] = v != 0 ? 1 : 0;
      return;
    default:
      StoreFromDouble(base, t, i, static_cast<double>(v));
      return;
  }
}

}  // namespace kiln
