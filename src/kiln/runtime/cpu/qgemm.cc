// Kiln's exact widening int8 GEMM (internal/qgemm.h says what and why).
#include "kiln/runtime/cpu/internal/qgemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kiln/base/isa_dispatch.h"

// The templates below pass AVX vectors between functions compiled without AVX; each variant
// (TileV4 / TileV3 / TileBase) is flattened, so none of those calls survives into the binary,
// and GCC's notice about their ABI does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kiln::runtime::cpu {
namespace {

// One ISA's operations on a 16-column panel held as kVecs registers of 32-bit lanes (lane j: the
// column's k-pair as two s16 going in, its int32 sum coming out). kMaxRows rows are blocked in
// registers, with Panels(R) panels each: the accumulators (R * Panels(R) * kVecs registers) plus
// the widened panel and the broadcast stay within the register file.
//
// Each function carries its ISA's target attribute and is always inlined into the variant
// compiled for that ISA (TileV4 / TileV3 / TileBase below).

struct OpsV4 {  // AVX-512BW: one zmm per panel
  using V = __m512i;
  static constexpr int kVecs = 1;
  static constexpr int kMaxRows = 4;
  static constexpr int Panels(int rows) { return rows <= 4 ? 4 : 2; }
  KILN_TARGET_V4 static V Zero() { return _mm512_setzero_si512(); }
  // Block (32 bytes: 16 columns x 2 k) -> 32 s16.
  KILN_TARGET_V4 static V Load(const int8_t* block, int) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
  }
  KILN_TARGET_V4 static V Broadcast(int32_t pair) { return _mm512_set1_epi32(pair); }
  KILN_TARGET_V4 static V MulAdd(V acc, V a, V b) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
  }
  // f32(acc) * scale into 16 floats. (The zero-masked conversion: GCC 12's unmasked one warns.)
  KILN_TARGET_V4 static void StoreScaled(float* y, const V* acc, const float* col_scale, float s) {
    const __mmask16 all = 0xffff;
    const __m512 sv = col_scale ? _mm512_loadu_ps(col_scale) : _mm512_set1_ps(s);
    _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(all, acc[0]), sv));
  }
  KILN_TARGET_V4 static void Store(int32_t* t, const V* acc) { _mm512_storeu_si512(t, acc[0]); }
};

struct OpsV3 {  // AVX2: two ymm per panel
  using V = __m256i;
  static constexpr int kVecs = 2;
  static constexpr int kMaxRows = 5;
  static constexpr int Panels(int rows) { return rows == 1 ? 4 : rows == 2 ? 2 : 1; }
  KILN_TARGET_V3 static V Zero() { return _mm256_setzero_si256(); }
  KILN_TARGET_V3 static V Load(const int8_t* block, int v) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * v)));
  }
  KILN_TARGET_V3 static V Broadcast(int32_t pair) { return _mm256_set1_epi32(pair); }
  KILN_TARGET_V3 static V MulAdd(V acc, V a, V b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
  }
  KILN_TARGET_V3 static void StoreScaled(float* y, const V* acc, const float* col_scale, float s) {
    for (int v = 0; v < 2; ++v) {
      const __m256 sv = col_scale ? _mm256_loadu_ps(col_scale + 8 * v) : _mm256_set1_ps(s);
      _mm256_storeu_ps(y + 8 * v, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[v]), sv));
    }
  }
  KILN_TARGET_V3 static void Store(int32_t* t, const V* acc) {
    for (int v = 0; v < 2; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(t + 8 * v), acc[v]);
  }
};

struct OpsBase {  // SSE2 (the x86-64 baseline): four xmm per panel
  using V = __m128i;
  static constexpr int kVecs = 4;
  static constexpr int kMaxRows = 3;
  static constexpr int Panels(int rows) { return rows == 1 ? 2 : 1; }
  static V Zero() { return _mm_setzero_si128(); }
  // Sign extension without SSE4.1's pmovsxbw: each byte doubled into a word, shifted back.
  static V Load(const int8_t* block, int v) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * (v / 2)));
    return _mm_srai_epi16(v % 2 == 0 ? _mm_unpacklo_epi8(b, b) : _mm_unpackhi_epi8(b, b), 8);
  }
  static V Broadcast(int32_t pair) { return _mm_set1_epi32(pair); }
  static V MulAdd(V acc, V a, V b) { return _mm_add_epi32(acc, _mm_madd_epi16(a, b)); }
  static void StoreScaled(float* y, const V* acc, const float* col_scale, float s) {
    for (int v = 0; v < 4; ++v) {
      const __m128 sv = col_scale ? _mm_loadu_ps(col_scale + 4 * v) : _mm_set1_ps(s);
      _mm_storeu_ps(y + 4 * v, _mm_mul_ps(_mm_cvtepi32_ps(acc[v]), sv));
    }
  }
  static void Store(int32_t* t, const V* acc) {
    for (int v = 0; v < 4; ++v) _mm_storeu_si128(reinterpret_cast<__m128i*>(t + 4 * v), acc[v]);
  }
};

// One panel's int32 sums of row r: f32(sum) * scale into the output (QGemmOut's addressing),
// 16 at once where the panel is whole and within one segment, one by one otherwise (cvtdq2ps
// and static_cast both round to nearest even in the default MXCSR mode).
template <class Ops>
KILN_ALWAYS_INLINE inline void Epilogue(const QGemmArgs& a, int64_t r, int64_t panel,
                                        const typename Ops::V* acc) {
  const QGemmOut& o = a.out;
  const int64_t c0 = panel * kQGemmPanel;
  const int64_t cols = std::min(kQGemmPanel, a.N - c0);
  const int64_t g0 = o.col_offset + c0;
  const float rs = o.row_scale ? o.row_scale[r] : 0.f;
  float* row = o.y + r * o.row_stride;
  if (cols == kQGemmPanel && g0 % o.seg + kQGemmPanel <= o.seg) {
    Ops::StoreScaled(row + (g0 / o.seg) * o.seg_stride + g0 % o.seg, acc,
                     o.col_scale ? o.col_scale + c0 : nullptr, rs);
    return;
  }
  alignas(64) int32_t t[kQGemmPanel];
  Ops::Store(t, acc);
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t g = g0 + j;
    row[(g / o.seg) * o.seg_stride + g % o.seg] =
        static_cast<float>(t[j]) * (o.col_scale ? o.col_scale[c0 + j] : rs);
  }
}

// Rows [r0, r0 + R) x panels [p0, p0 + P): the int32 sums over all of K in registers, then the
// epilogue. Per k-pair: each panel widened once, each row's pair broadcast once.
template <class Ops, int R, int P>
KILN_ALWAYS_INLINE inline void Block(const QGemmArgs& a, int64_t r0, int64_t p0) {
  using V = typename Ops::V;
  constexpr int NV = Ops::kVecs;
  V acc[R][P][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][p][v] = Ops::Zero();
  const int16_t* ar[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) ar[r] = a.a + (r0 + r) * a.a_pairs * 2;
  const int64_t panel_bytes = a.K2 * kQGemmBlockBytes;
  const int8_t* b = a.b + p0 * panel_bytes;
  for (int64_t kp = 0; kp < a.K2; ++kp) {
    V w[P][NV];
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        w[p][v] = Ops::Load(b + p * panel_bytes + kp * kQGemmBlockBytes, v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, ar[r] + 2 * kp, sizeof(pair));
      const V x = Ops::Broadcast(pair);
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][p][v] = Ops::MulAdd(acc[r][p][v], x, w[p][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) Epilogue<Ops>(a, r0 + r, p0 + p, acc[r][p]);
}

// R rows over panels [p0, p1): groups of Panels(R), then one block of the 1..3 left.
template <class Ops, int R>
KILN_ALWAYS_INLINE inline void RowBlock(const QGemmArgs& a, int64_t r0, int64_t p0, int64_t p1) {
  constexpr int P = Ops::Panels(R);
  int64_t p = p0;
  for (; p + P <= p1; p += P) Block<Ops, R, P>(a, r0, p);
  const int64_t left = p1 - p;
  if constexpr (P >= 4) {
    if (left == 3) Block<Ops, R, 3>(a, r0, p);
  }
  if constexpr (P >= 3) {
    if (left == 2) Block<Ops, R, 2>(a, r0, p);
  }
  if constexpr (P >= 2) {
    if (left == 1) Block<Ops, R, 1>(a, r0, p);
  }
}

// The last `rows` (< kMaxRows) rows: the RowBlock of exactly that many.
template <class Ops, int R>
KILN_ALWAYS_INLINE inline void TailRows(const QGemmArgs& a, int64_t rows, int64_t r0, int64_t p0,
                                        int64_t p1) {
  if constexpr (R >= 1) {
    if (rows == R) {
      RowBlock<Ops, R>(a, r0, p0, p1);
    } else {
      TailRows<Ops, R - 1>(a, rows, r0, p0, p1);
    }
  }
}

// Row blocks outer, panels inner: a block's rows of A stay in L1 while the tile's panels (sized
// by the caller to fit L2) stream past.
template <class Ops>
KILN_ALWAYS_INLINE inline void TileBody(const QGemmArgs& a, int64_t r0, int64_t r1, int64_t p0,
                                        int64_t p1) {
  constexpr int kR = Ops::kMaxRows;
  int64_t r = r0;
  for (; r + kR <= r1; r += kR) RowBlock<Ops, kR>(a, r, p0, p1);
  if (r < r1) TailRows<Ops, kR - 1>(a, r1 - r, r, p0, p1);
}

using TileFn = void (*)(const QGemmArgs&, int64_t, int64_t, int64_t, int64_t);
KILN_TARGET_V4 __attribute__((flatten)) void TileV4(const QGemmArgs& a, int64_t r0, int64_t r1,
                                                    int64_t p0, int64_t p1) {
  TileBody<OpsV4>(a, r0, r1, p0, p1);
}
KILN_TARGET_V3 __attribute__((flatten)) void TileV3(const QGemmArgs& a, int64_t r0, int64_t r1,
                                                    int64_t p0, int64_t p1) {
  TileBody<OpsV3>(a, r0, r1, p0, p1);
}
__attribute__((flatten)) void TileBase(const QGemmArgs& a, int64_t r0, int64_t r1, int64_t p0,
                                       int64_t p1) {
  TileBody<OpsBase>(a, r0, r1, p0, p1);
}

// memcpy without a call for the short rows of small images.
inline void CopyBytes(int8_t* dst, const int8_t* src, int64_t n) {
  if (n >= 64) {
    std::memcpy(dst, src, static_cast<size_t>(n));
    return;
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) std::memcpy(dst + i, src + i, 8);
  for (; i < n; ++i) dst[i] = src[i];
}

// Two rows of 16 bytes (k even, k odd) -> one 32-byte block, the pairs adjacent.
inline void Interleave16(const int8_t* k0, const int8_t* k1, int8_t* block) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k0));
  const __m128i b =
      k1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(k1)) : _mm_setzero_si128();
  _mm_storeu_si128(reinterpret_cast<__m128i*>(block), _mm_unpacklo_epi8(a, b));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(block + 16), _mm_unpackhi_epi8(a, b));
}

}  // namespace

void QGemmPackPanels(const int8_t* b, int64_t k_stride, int64_t K, int64_t N, int64_t p0,
                     int64_t p1, int8_t* pack) {
  const int64_t K2 = QGemmPairs(K);
  for (int64_t p = p0; p < p1; ++p) {
    int8_t* dst = pack + p * K2 * kQGemmBlockBytes;
    const int64_t c0 = p * kQGemmPanel, cols = std::min(kQGemmPanel, N - c0);
    for (int64_t kp = 0; kp < K2; ++kp) {
      int8_t* block = dst + kp * kQGemmBlockBytes;
      const int64_t k = 2 * kp;
      const int8_t* r0 = b + k * k_stride + c0;
      const int8_t* r1 = k + 1 < K ? r0 + k_stride : nullptr;
      if (cols == kQGemmPanel) {
        Interleave16(r0, r1, block);
        continue;
      }
      std::memset(block, 0, kQGemmBlockBytes);
      for (int64_t j = 0; j < cols; ++j) {
        block[2 * j] = r0[j];
        block[2 * j + 1] = r1 ? r1[j] : int8_t{0};
      }
    }
  }
}

void QGemmPack(const int8_t* b, int64_t k_stride, int64_t K, int64_t N, int8_t* pack) {
  QGemmPackPanels(b, k_stride, K, N, 0, QGemmPanels(N), pack);
}

void QGemmWidenRows(const int8_t* x, int64_t row_stride, int64_t rows, int64_t K, int16_t* a) {
  const int64_t width = 2 * QGemmPairs(K);
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* src = x + r * row_stride;
    int16_t* dst = a + r * width;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k),
                       _mm_srai_epi16(_mm_unpacklo_epi8(v, v), 8));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k + 8),
                       _mm_srai_epi16(_mm_unpackhi_epi8(v, v), 8));
    }
    for (; k < K; ++k) dst[k] = src[k];
    for (; k < width; ++k) dst[k] = 0;
  }
}

void QGemmTile(const QGemmArgs& a, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
  static const TileFn fn = PickVariant<TileFn>(ActiveKernelLevel(), &TileV4, &TileV3, &TileBase);
  if (r0 < r1 && p0 < p1) fn(a, r0, r1, p0, p1);
}

const char* QGemmIsa() {
  switch (ActiveKernelLevel()) {
    case KernelLevel::kV4:
      return "avx512";
    case KernelLevel::kV3:
      return "avx2";
    case KernelLevel::kBase:
      break;
  }
  return "sse2";
}

int64_t QGemmRowBlock() {
  switch (ActiveKernelLevel()) {
    case KernelLevel::kV4:
      return OpsV4::kMaxRows;
    case KernelLevel::kV3:
      return OpsV3::kMaxRows;
    case KernelLevel::kBase:
      break;
  }
  return OpsBase::kMaxRows;
}

void QConvPadPlanes(const QConvGeometry& g, const int8_t* x, int64_t p0, int64_t p1, int8_t* xp) {
  const int64_t hp = g.H + g.pt + g.pb, wp = g.W + g.pl + g.pr;
  // Zeros everywhere, then the rows in place: a small image's rows are a few bytes, where a
  // memset and a memcpy per row cost more than the bytes.
  std::memset(xp + p0 * hp * wp, 0, static_cast<size_t>((p1 - p0) * hp * wp));
  for (int64_t p = p0; p < p1; ++p) {
    const int8_t* src = x + p * g.H * g.W;
    int8_t* dst = xp + (p * hp + g.pt) * wp + g.pl;
    for (int64_t y = 0; y < g.H; ++y) CopyBytes(dst + y * wp, src + y * g.W, g.W);
  }
}

void QConvIm2colPanels(const QConvGeometry& g, const int8_t* x, int64_t x_bytes, int64_t group,
                       int64_t c0, int64_t cols, int8_t* col, int8_t* panels) {
  const int64_t K = g.K(), cs = QGemmPanels(cols) * kQGemmPanel, ohw = g.OH * g.OW;
  const int64_t rs = cs + kQGemmPanel;  // a row's bytes: 16 of slack for the 16-byte stores
  // The chunk's runs: columns on one output row of one image, whose bytes for any k are one
  // (strided) piece of one input row, at src + k's offset. The input is padded (the caller's
  // QConvPadPlanes), so every window is in bounds.
  QConvRun* runs = reinterpret_cast<QConvRun*>(col + K * rs);
  int64_t n_runs = 0;
  for (int64_t j = 0; j < cols;) {
    const int64_t c = c0 + j, n = c / ohw, oy = (c % ohw) / g.OW, ox0 = c % g.OW;
    const int64_t len = std::min(g.OW - ox0, cols - j);
    runs[n_runs++] = {(n * g.C + group * g.CG) * g.H * g.W + oy * g.sh * g.W + ox0 * g.sw, j, len};
    j += len;
  }
  // Per k, every run: an output row of a small image is a handful of bytes, too short for a
  // memcpy call, so stride-1 runs move 16 bytes at a time, each store's excess overwritten by the
  // next run or left in the row's slack. Loads past the input's end are avoided: runs ascend in
  // the input, so the ones that could read past it (for the last k) are a suffix, from `safe` on.
  const int64_t last_k_offset = ((g.CG - 1) * g.H + (g.KH - 1) * g.dh) * g.W + (g.KW - 1) * g.dw;
  int64_t safe = n_runs;
  while (safe > 0 &&
         runs[safe - 1].src + last_k_offset + QGemmPanels(runs[safe - 1].len) * kQGemmPanel >
             x_bytes)
    --safe;
  const bool short_runs = g.OW <= kQGemmPanel;
  for (int64_t ci = 0; ci < g.CG; ++ci)
    for (int64_t ky = 0; ky < g.KH; ++ky)
      for (int64_t kx = 0; kx < g.KW; ++kx) {
        const int64_t k = (ci * g.KH + ky) * g.KW + kx;
        const int8_t* src = x + (ci * g.H + ky * g.dh) * g.W + kx * g.dw;
        int8_t* dst = col + k * rs;
        int64_t r = 0;
        if (g.sw != 1) {
          for (; r < n_runs; ++r) {
            const int8_t* s = src + runs[r].src;
            int8_t* d = dst + runs[r].dst;
            for (int64_t t = 0; t < runs[r].len; ++t) d[t] = s[t * g.sw];
          }
          continue;
        }
        if (short_runs) {
          for (; r < safe; ++r)
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + runs[r].dst),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + runs[r].src)));
        } else {
          for (; r < safe; ++r)
            for (int64_t t = 0; t < runs[r].len; t += 16)
              _mm_storeu_si128(
                  reinterpret_cast<__m128i*>(dst + runs[r].dst + t),
                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + runs[r].src + t)));
        }
        for (; r < n_runs; ++r)
          std::memcpy(dst + runs[r].dst, src + runs[r].src, static_cast<size_t>(runs[r].len));
      }
  if (cs > cols)
    for (int64_t k = 0; k < K; ++k)
      std::memset(col + k * rs + cols, 0, static_cast<size_t>(cs - cols));
  // Whole panels over the zero-extended rows: the vector interleave everywhere.
  QGemmPackPanels(col, rs, K, cs, 0, QGemmPanels(cols), panels);
}

}  // namespace kiln::runtime::cpu
