// Element types Kiln knows, their names and sizes, and scalar conversions between them.
//
//   DType t = DType::kBF16;
//   DTypeName(t)            -> "bf16"    (IR text)
//   SafetensorsName(t)      -> "BF16"    (safetensors header)
//   uint16_t b = FloatToBf16(1.5f);      // round to nearest even
//
// f8e4m3 (the "fn" variant: no infinities, max 448) and f8e5m2 are storage types: compute ops
// reject them, convert moves values in and out. f64 exists so the reference backend can run
// finite-difference gradient checks in double precision.
#ifndef KILN_TENSOR_DTYPE_H_
#define KILN_TENSOR_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace kiln {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kF8E4M3,
  kF8E5M2,
  kF64,
  kS8,
  kU8,
  kS32,
  kS64,
  kBool,
};
inline constexpr int kNumDTypes = 11;

std::string_view DTypeName(DType t);        // "f32", "bf16", ..., "bool"
std::string_view SafetensorsName(DType t);  // "F32", "BF16", ..., "BOOL"
std::optional<DType> DTypeFromName(std::string_view name);
std::optional<DType> DTypeFromSafetensorsName(std::string_view name);
int64_t DTypeSize(DType t);  // bytes per element
bool IsFloating(DType t);    // f32, bf16, f16, f8*, f64
bool IsInteger(DType t);     // s8, u8, s32, s64
// The smallest and largest value an integer dtype holds ({0, 1} for bool; int64's range for s64
// and anything else).
std::pair<int64_t, int64_t> IntegerRange(DType t);
bool IsStorageOnly(DType t);  // f8e4m3, f8e5m2

// Scalar conversions. Float -> narrow float rounds to nearest even; NaN stays NaN.
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToF16(float f);
float F16ToFloat(uint16_t h);
uint8_t FloatToF8E4M3(float f);  // saturates to +-448, NaN -> 0x7f
float F8E4M3ToFloat(uint8_t b);
uint8_t FloatToF8E5M2(float f);  // overflow -> inf
float F8E5M2ToFloat(uint8_t b);

// Element i of a buffer of type t, widened to double (bool -> 0/1). Slow; for the reference
// backend and tests.
double LoadAsDouble(const void* base, DType t, int64_t i);
// Stores v into element i, rounding to t. Float -> integer truncates toward zero and saturates;
// NaN -> 0. Any nonzero -> true for bool.
void StoreFromDouble(void* base, DType t, int64_t i, double v);

// Element i as an exact int64: integers and bool exactly; floats truncate toward zero and
// saturate (NaN -> 0).
int64_t LoadAsInt64(const void* base, DType t, int64_t i);
// Stores an int64 into element i: integers wrap (two's complement, like a C++ cast), bool is
// v != 0, floats round from double.
void StoreFromInt64(void* base, DType t, int64_t i, int64_t v);

}  // namespace kiln

#endif  // KILN_TENSOR_DTYPE_H_
