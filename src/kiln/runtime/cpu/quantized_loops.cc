// The int8 ops' loops (internal/quantized_loops.h says what and why).
#include "kiln/runtime/cpu/internal/quantized_loops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kiln/base/cpu_isa.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

// clamp(rint(x / scale), -127, 127), NaN -> 0: the reference kernel's formula.
inline int8_t QuantizeOne(float x, float scale) {
  float q = x / scale;
  if (q != q) return 0;
  q = std::fmin(std::fmax(q, -127.f), 127.f);
  return static_cast<int8_t>(std::nearbyint(q));
}

// QuantizeOne of 4 values as int32: the division, NaN -> 0 (an ordered mask), the clamp
// (minps/maxps), and cvtps2dq, which rounds to nearest even (the default MXCSR mode) like rint.
inline __m128i Quantize4(const float* x, __m128 s) {
  const __m128 lo = _mm_set1_ps(-127.f), hi = _mm_set1_ps(127.f);
  __m128 q = _mm_div_ps(_mm_loadu_ps(x), s);
  q = _mm_and_ps(q, _mm_cmpord_ps(q, q));
  return _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(q, lo), hi));
}

// 16 values to 16 s8: two saturating packs (no-ops on values in [-127, 127]).
inline __m128i Quantize16(const float* x, __m128 s) {
  const __m128i a = _mm_packs_epi32(Quantize4(x, s), Quantize4(x + 4, s));
  const __m128i c = _mm_packs_epi32(Quantize4(x + 8, s), Quantize4(x + 12, s));
  return _mm_packs_epi16(a, c);
}

// r[i] byte j -> r[j] byte i: four rounds of unpacks (bytes, words, dwords, qwords).
inline void Transpose16x16(__m128i r[16]) {
  __m128i t[16], u[16], v[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm_unpacklo_epi16(t[4 * i + 0], t[4 * i + 2]);
    u[4 * i + 1] = _mm_unpackhi_epi16(t[4 * i + 0], t[4 * i + 2]);
    u[4 * i + 2] = _mm_unpacklo_epi16(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm_unpackhi_epi16(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int h = 0; h < 2; ++h)
    for (int q = 0; q < 4; ++q) {
      v[8 * h + 2 * q] = _mm_unpacklo_epi32(u[8 * h + q], u[8 * h + 4 + q]);
      v[8 * h + 2 * q + 1] = _mm_unpackhi_epi32(u[8 * h + q], u[8 * h + 4 + q]);
    }
  for (int m = 0; m < 8; ++m) {
    r[2 * m] = _mm_unpacklo_epi64(v[m], v[8 + m]);
    r[2 * m + 1] = _mm_unpackhi_epi64(v[m], v[8 + m]);
  }
}

// 16 values to 16 s8 with SSE2 (the baseline).
struct Sse2Quantizer {
  explicit Sse2Quantizer(float scale) : s(_mm_set1_ps(scale)) {}
  __m128i operator()(const float* x) const { return Quantize16(x, s); }
  __m128 s;
};

#define KILN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

// The same with AVX-512, one zmm per 16 values: the division, NaN -> 0 (the max zero-masked by
// an ordered compare), the clamp, vcvtps2dq in the MXCSR mode (nearest even, as rint) and a
// saturating pack to bytes. (Zero-masked forms throughout: GCC 12's unmasked ones warn.)
struct Avx512Quantizer {
  KILN_AVX512 explicit Avx512Quantizer(float scale) : s(_mm512_set1_ps(scale)) {}
  KILN_AVX512 __m128i operator()(const float* x) const {
    const __mmask16 all = 0xffff;
    __m512 q = _mm512_div_ps(_mm512_loadu_ps(x), s);
    q = _mm512_maskz_max_ps(_mm512_cmp_ps_mask(q, q, _CMP_ORD_Q), q, _mm512_set1_ps(-127.f));
    q = _mm512_maskz_min_ps(all, q, _mm512_set1_ps(127.f));
    return _mm512_maskz_cvtsepi32_epi8(all, _mm512_maskz_cvtps_epi32(all, q));
  }
  __m512 s;
};

template <class Q>
inline __attribute__((always_inline)) void QuantizeRangeT(const float* x, int8_t* y, float scale,
                                                          int64_t b, int64_t e) {
  const Q q(scale);
  int64_t i = b;
  for (; i + 16 <= e; i += 16) _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), q(x + i));
  for (; i < e; ++i) y[i] = QuantizeOne(x[i], scale);
}

// One image: x [C][hw] -> y [hw][C].
template <class Q>
inline __attribute__((always_inline)) void QuantizeImageToNhwcT(const float* x, int8_t* y,
                                                                float scale, int64_t C,
                                                                int64_t hw) {
  const Q q(scale);
  const int64_t c16 = C / 16 * 16, p16 = hw / 16 * 16;
  for (int64_t p0 = 0; p0 < p16; p0 += 16) {
    for (int64_t c0 = 0; c0 < c16; c0 += 16) {
      __m128i r[16];
      for (int i = 0; i < 16; ++i) r[i] = q(x + (c0 + i) * hw + p0);
      Transpose16x16(r);
      for (int j = 0; j < 16; ++j)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + (p0 + j) * C + c0), r[j]);
    }
    for (int64_t c = c16; c < C; ++c)
      for (int64_t p = p0; p < p0 + 16; ++p) y[p * C + c] = QuantizeOne(x[c * hw + p], scale);
  }
  for (int64_t p = p16; p < hw; ++p)
    for (int64_t c = 0; c < C; ++c) y[p * C + c] = QuantizeOne(x[c * hw + p], scale);
}

void QuantizeRangeSse2(const float* x, int8_t* y, float scale, int64_t b, int64_t e) {
  QuantizeRangeT<Sse2Quantizer>(x, y, scale, b, e);
}
KILN_AVX512 void QuantizeRangeAvx512(const float* x, int8_t* y, float scale, int64_t b, int64_t e) {
  QuantizeRangeT<Avx512Quantizer>(x, y, scale, b, e);
}
void QuantizeImageSse2(const float* x, int8_t* y, float scale, int64_t C, int64_t hw) {
  QuantizeImageToNhwcT<Sse2Quantizer>(x, y, scale, C, hw);
}
KILN_AVX512 void QuantizeImageAvx512(const float* x, int8_t* y, float scale, int64_t C,
                                     int64_t hw) {
  QuantizeImageToNhwcT<Avx512Quantizer>(x, y, scale, C, hw);
}

// From the process's capped ISA level (base/cpu_isa.h; the baseline build is SSE2, no
// -march=native).
bool HaveAvx512() { return ActiveCpuIsa() >= CpuIsa::kAvx512; }

// One image: acc [hw][C] -> y [C][hw], times the channel scales.
void ScaleImageToNchw(const float* acc, const float* scale, float* y, int64_t C, int64_t hw) {
  const int64_t c4 = C / 4 * 4, p4 = hw / 4 * 4;
  for (int64_t c0 = 0; c0 < c4; c0 += 4) {
    const __m128 s0 = _mm_set1_ps(scale[c0]), s1 = _mm_set1_ps(scale[c0 + 1]),
                 s2 = _mm_set1_ps(scale[c0 + 2]), s3 = _mm_set1_ps(scale[c0 + 3]);
    for (int64_t p0 = 0; p0 < p4; p0 += 4) {
      __m128 r0 = _mm_loadu_ps(acc + (p0 + 0) * C + c0), r1 = _mm_loadu_ps(acc + (p0 + 1) * C + c0),
             r2 = _mm_loadu_ps(acc + (p0 + 2) * C + c0), r3 = _mm_loadu_ps(acc + (p0 + 3) * C + c0);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);  // r_k: channel c0 + k at positions p0..p0+3
      _mm_storeu_ps(y + (c0 + 0) * hw + p0, _mm_mul_ps(r0, s0));
      _mm_storeu_ps(y + (c0 + 1) * hw + p0, _mm_mul_ps(r1, s1));
      _mm_storeu_ps(y + (c0 + 2) * hw + p0, _mm_mul_ps(r2, s2));
      _mm_storeu_ps(y + (c0 + 3) * hw + p0, _mm_mul_ps(r3, s3));
    }
    for (int64_t c = c0; c < c0 + 4; ++c)
      for (int64_t p = p4; p < hw; ++p) y[c * hw + p] = acc[p * C + c] * scale[c];
  }
  for (int64_t c = c4; c < C; ++c)
    for (int64_t p = 0; p < hw; ++p) y[c * hw + p] = acc[p * C + c] * scale[c];
}

// Images per thread: at least kElementwiseGrain elements each.
int64_t ImageGrain(int64_t per_image) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(per_image, 1));
}

}  // namespace

const char* QuantizeLoopIsa() { return HaveAvx512() ? "avx512" : "sse2"; }

void QuantizeRange(const float* x, int8_t* y, float scale, int64_t b, int64_t e, bool baseline) {
  if (!baseline && HaveAvx512()) {
    QuantizeRangeAvx512(x, y, scale, b, e);
  } else {
    QuantizeRangeSse2(x, y, scale, b, e);
  }
}

void QuantizeNchwToNhwc(const float* x, int8_t* y, float scale, int64_t batch, int64_t channels,
                        int64_t hw, bool baseline) {
  const int64_t per = channels * hw;
  ParallelFor(batch, ImageGrain(per), [&](int64_t b, int64_t e) {
    const bool avx512 = !baseline && HaveAvx512();
    for (int64_t n = b; n < e; ++n) {
      if (avx512) {
        QuantizeImageAvx512(x + n * per, y + n * per, scale, channels, hw);
      } else {
        QuantizeImageSse2(x + n * per, y + n * per, scale, channels, hw);
      }
    }
  });
}

void ScaleNhwcToNchw(const float* acc, const float* scale, float* y, int64_t batch,
                     int64_t channels, int64_t hw) {
  const int64_t per = channels * hw;
  ParallelFor(batch, ImageGrain(per), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n)
      ScaleImageToNchw(acc + n * per, scale, y + n * per, channels, hw);
  });
}

}  // namespace kiln::runtime::cpu
