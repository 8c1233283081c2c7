// exp, tanh and GELU (tanh form) over f32 arrays: FastExp / FastTanh (internal/common.h) in loops
// the compiler vectorizes, compiled once per ISA level (internal/dispatch.h: the process's capped
// level picks one; no -march=native). The fused loops and the per-op loops both call these, so a
// value computes the same whether or not its op was fused.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kiln/base/isa_dispatch.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {

namespace {

// FastExp's reduction and polynomial with the scale 2^n applied as two factors 2^(n/2) and
// 2^(n - n/2), so that n reaches 128 (x up to expf's overflow at 88.72) without leaving the
// normal range of either factor.
inline float ExpFull(float x) {
  constexpr float kOverflow = 88.7228394f;                    // expf(x) is +inf above this
  const float xc = std::min(std::max(x, -87.3f), kOverflow);  // NaN passes through both
  const float t = xc * 1.44269504088896341f + 12582912.f;     // round(x / ln2), 1.5 * 2^23 trick
  const float n = t - 12582912.f;
  const float r = xc - n * 0.693359375f - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.f;
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2, n2 = ni - n1;
  const int32_t e1 = (n1 + 127) << 23, e2 = (n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &e1, 4);
  std::memcpy(&s2, &e2, 4);
  const float result = y * s1 * s2;
  return x > kOverflow ? std::numeric_limits<float>::infinity() : (x < -87.3f ? 0.f : result);
}

KILN_ALWAYS_INLINE inline void ExpF32Body(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ExpFull(x[i]);
}

KILN_ALWAYS_INLINE inline void TanhF32Body(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = FastTanh(x[i]);
}

KILN_ALWAYS_INLINE inline void GeluTanhF32Body(const float* x, float* y, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.f + FastTanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
}

}  // namespace

KILN_ISA_VARIANTS(void, ExpF32, (const float* x, float* y, int64_t n), (x, y, n))
KILN_ISA_VARIANTS(void, TanhF32, (const float* x, float* y, int64_t n), (x, y, n))
KILN_ISA_VARIANTS(void, GeluTanhF32, (const float* x, float* y, int64_t n), (x, y, n))

}  // namespace kiln::runtime::cpu
