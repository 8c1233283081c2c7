// The blocked f32 matmul over packed constant weights (internal/sgemm.h says what and why).
#include "kiln/runtime/cpu/internal/sgemm.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>

#include "kiln/base/memory.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

// The variants' native vectors: 8 floats (one ymm) at x86-64-v3, 4 (one xmm) at the baseline.
// A vector wider than the target's registers would go through the stack (see gemv.cc).
typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));

// K block: one panel's strip of it is 256 x 16 floats = 16 KiB, which stays in L1 (32 KiB on the
// AVX2 parts seen) while every R-row strip of the A block is multiplied with it.
constexpr int64_t kKc = 256;
// Floats of packed x per thread: the A block stays in L2 while every panel of the thread's group
// streams past it; as many rows as fit, so the weights are read from L3 fewer times. BLIS's
// Haswell blocking, 168 rows x 256 (168 KiB), is for a 256 KiB L2; with 512 KiB and up the block
// takes up to 264 rows (two thirds of L2 at most), so that a 256-row batch is one row block whose
// panels the threads split. Two row blocks of 132 rows, each thread streaming all of the weights
// past its own, measured 147 against 191 GFLOP/s (256x1024x1024, avx2, 2 threads, 1 MiB L2).
int64_t ABlockFloats() {
  static const int64_t floats = [] {
    int64_t l2 = 0;
    if (std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index2/size", "r")) {
      char unit = 0;
      long long v = 0;
      if (std::fscanf(f, "%lld%c", &v, &unit) >= 1)
        l2 = v * (unit == 'K' ? 1024 : unit == 'M' ? 1 << 20 : 1);
      std::fclose(f);
    }
    if (l2 <= 0) l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 <= 0) l2 = 256 << 10;
    const int64_t fit = l2 * 2 / 3 / static_cast<int64_t>(sizeof(float));
    return std::clamp<int64_t>(fit, 168 * 256, 264 * 256);
  }();
  return floats;
}
// Panels per unit of work split between the threads.
constexpr int64_t kGroup = 4;
// Least multiply-adds per thread before a product is split: an OpenMP region costs a few
// microseconds.
constexpr int64_t kMinFmaPerThread = int64_t{1} << 20;

// By reference, not by value: a vector return would change the baseline variant's ABI.
template <typename V>
KILN_ALWAYS_INLINE inline void Load(V& v, const float* p) {
  std::memcpy(&v, p, sizeof(v));
}
// The first `n` lanes (0 < n <= lanes), the rest zero: the last, partial panel's columns.
template <typename V>
KILN_ALWAYS_INLINE inline void LoadN(V& v, const float* p, int64_t n) {
  v = V{};
  std::memcpy(&v, p, static_cast<size_t>(n) * sizeof(float));
}
template <typename V>
KILN_ALWAYS_INLINE inline void StoreN(float* p, const V& v, int64_t n) {
  std::memcpy(p, &v, static_cast<size_t>(n) * sizeof(float));
}

// Copies of each packed x value: the baseline (SSE2) has no broadcast from memory (a load and a
// shuffle per value), so its packing stores each value as a whole vector and the kernel loads it
// as one; AVX2's vbroadcastss reads the single float.
template <typename V>
constexpr int kBcast = std::is_same_v<V, V4> ? 4 : 1;

struct Blocking {
  int64_t kc = 0, nk = 0;  // K blocks: nk of kc (the last may be shorter)
  // Row blocks: nm of at most mc rows, each a run of R-row strips (the strips split as evenly as
  // the count allows, so threads that take equal numbers of blocks get equal work).
  int64_t mc = 0, nm = 0, strips = 0;
  int64_t panels = 0, groups = 0;
  bool residual_first = false;  // the residual is added with the first K block (no activation)
};

// Depends only on the shapes and R, so the summation order of every element is fixed.
Blocking Plan(const PackedMatmulArgs& a, int64_t R) {
  Blocking bl;
  const int64_t mn = a.M * a.N;
  const bool aliased = a.residual != nullptr && a.residual < a.out + mn && a.out < a.residual + mn;
  // Partial sums are kept in the output between K blocks. The residual comes after the
  // activation; without one it is added up front, which is also right when it is the output
  // itself. With a relu and the residual in the output's buffer the first partial sum would
  // overwrite it, so K is not blocked then.
  bl.residual_first = a.residual != nullptr && !a.relu;
  bl.nk = aliased && a.relu ? 1 : std::max<int64_t>(1, (a.K + kKc - 1) / kKc);
  bl.kc = std::max<int64_t>(1, (a.K + bl.nk - 1) / bl.nk);
  const int64_t mc_max = std::max<int64_t>(R, ABlockFloats() / bl.kc / R * R);
  bl.strips = (a.M + R - 1) / R;
  bl.nm = (a.M + mc_max - 1) / mc_max;
  bl.mc = (bl.strips + bl.nm - 1) / bl.nm * R;
  bl.panels = (a.N + kPackPanel - 1) / kPackPanel;
  bl.groups = (bl.panels + kGroup - 1) / kGroup;
  return bl;
}

struct ABufferTag {};  // the packed x of one thread (ThreadScratchFloats)

// x[m0 + i, k0 + k] for i < rows, k < kc into dst[i / R][k][i % R] (B copies of each): the R
// values one step of the micro-kernel broadcasts are adjacent, whatever x's strides. Strip by
// strip, so the writes are sequential.
template <typename V, int R, int B>
KILN_ALWAYS_INLINE inline void PackA(const PackedMatmulArgs& a, int64_t m0, int64_t rows,
                                     int64_t k0, int64_t kc, float* dst) {
  for (int64_t s = 0; s < rows; s += R) {
    const int64_t rr = std::min<int64_t>(R, rows - s);
    float* d = dst + (s / R) * kc * R * B;
    // A short last strip repeats its last row: the lanes are never read, and every strip is then
    // one unrolled loop of R reads and R writes per k.
    const float* src[R];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) src[i] = a.x + (m0 + s + std::min<int64_t>(i, rr - 1)) * a.xs_m;
    const int64_t xs_k = a.xs_k;
    for (int64_t k = 0; k < kc; ++k) {
      const int64_t off = (k0 + k) * xs_k;
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        if constexpr (B == 1) {
          d[k * R + i] = src[i][off];
        } else {
          V v = V{} + src[i][off];
          std::memcpy(d + (k * R + i) * B, &v, sizeof(v));
        }
      }
    }
  }
}

// Rows [m0, m0 + r) x the panel at column n0, over one K block: r x 16 accumulators in
// registers (ap: the packed strip, R values per k; bp: the panel's kc x 16 strip), then added to
// the partial sums in the output, and on the last K block the epilogue.
template <typename V, int R, int r>
KILN_ALWAYS_INLINE inline void Tile(const PackedMatmulArgs& a, const Blocking& bl, const float* ap,
                                    const float* bp, int64_t kc, int64_t m0, int64_t n0, bool first,
                                    bool last) {
  constexpr int L = sizeof(V) / sizeof(float);
  constexpr int S = kPackPanel / L;
  V acc[r][S];
#pragma GCC unroll 8
  for (int i = 0; i < r; ++i)
#pragma GCC unroll 4
    for (int c = 0; c < S; ++c) acc[i][c] = V{};
  // The partial sums this tile adds to at its end: rows a row stride apart, on lines no hardware
  // prefetcher predicts; fetched now, they arrive while the products run.
  if (!first || bl.residual_first) {
    const float* base = !first ? a.out : a.residual;
    if (base != nullptr) {
#pragma GCC unroll 8
      for (int i = 0; i < r; ++i) {
        const float* p = base + (m0 + i) * a.N + n0;
        __builtin_prefetch(p, 0, 3);
        __builtin_prefetch(p + kPackPanel - 1, 0, 3);
      }
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    V w[S];
#pragma GCC unroll 4
    for (int c = 0; c < S; ++c) Load(w[c], bp + k * kPackPanel + c * L);
#pragma GCC unroll 8
    for (int i = 0; i < r; ++i) {
      constexpr int B = kBcast<V>;
      auto xv = [&] {
        if constexpr (B == 1) {
          return ap[k * R + i];
        } else {
          V t;
          Load(t, ap + (k * R + i) * B);
          return t;
        }
      }();
#pragma GCC unroll 4
      for (int c = 0; c < S; ++c) acc[i][c] += w[c] * xv;
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < S; ++c) {
    const int64_t n = n0 + c * L;
    const int64_t cols = std::min<int64_t>(L, a.N - n);
    if (cols <= 0) break;
    V b = V{};
    if (last && a.bias != nullptr) {
      if (cols == L)
        Load(b, a.bias + n);
      else
        LoadN(b, a.bias + n, cols);
    }
#pragma GCC unroll 8
    for (int i = 0; i < r; ++i) {
      float* o = a.out + (m0 + i) * a.N + n;
      const float* res = a.residual != nullptr ? a.residual + (m0 + i) * a.N + n : nullptr;
      V v = acc[i][c], t;
      // Earlier K blocks' sum, or (first block) the residual when it goes in up front.
      const float* add = !first ? o : (bl.residual_first ? res : nullptr);
      if (add != nullptr) {
        if (cols == L)
          Load(t, add);
        else
          LoadN(t, add, cols);
        v += t;
      }
      if (last) {
        v += b;
        if (a.relu) v = v > V{} ? v : V{};
        if (res != nullptr && !bl.residual_first) {
          if (cols == L)
            Load(t, res);
          else
            LoadN(t, res, cols);
          v += t;
        }
      }
      if (cols == L)
        std::memcpy(o, &v, sizeof(v));
      else
        StoreN(o, v, cols);
    }
  }
}

// The last, short strip of a row block: r in [1, R).
template <typename V, int R, int r = R - 1>
KILN_ALWAYS_INLINE inline void TailTile(int64_t rows, const PackedMatmulArgs& a, const Blocking& bl,
                                        const float* ap, const float* bp, int64_t kc, int64_t m0,
                                        int64_t n0, bool first, bool last) {
  if constexpr (r >= 1) {
    if (rows == r) {
      Tile<V, R, r>(a, bl, ap, bp, kc, m0, n0, first, last);
    } else {
      TailTile<V, R, r - 1>(rows, a, bl, ap, bp, kc, m0, n0, first, last);
    }
  }
}

// Row block `rb` x panels [p0, p1), all K blocks: per K block the rows are packed once and every
// panel's strip is multiplied with all of them while it sits in L1. The next panel's strip is in
// L3 or memory, 16 KiB that the hardware prefetchers only find once its first lines miss: each
// tile asks for its share of it (into L2) so that it is there when its turn comes.
template <typename V, int R>
KILN_ALWAYS_INLINE inline void Segment(const PackedMatmulArgs& a, const Blocking& bl, int64_t rb,
                                       int64_t p0, int64_t p1, float* abuf) {
  const int64_t m0 = rb * bl.strips / bl.nm * R;
  const int64_t rows = std::min(a.M, (rb + 1) * bl.strips / bl.nm * R) - m0;
  for (int64_t kb = 0; kb < bl.nk; ++kb) {
    const int64_t k0 = kb * bl.kc, kc = std::min(bl.kc, a.K - k0);
    const bool first = kb == 0, last = kb == bl.nk - 1;
    PackA<V, R, kBcast<V>>(a, m0, rows, k0, kc, abuf);
    const int64_t strips = (rows + R - 1) / R;
    for (int64_t p = p0; p < p1; ++p) {
      const float* bp = a.pack + p * a.K * kPackPanel + k0 * kPackPanel;
      const float* next = p + 1 < p1 ? bp + a.K * kPackPanel : nullptr;
      for (int64_t i = 0; i < rows; i += R) {
        if (next != nullptr) {
          const int64_t s = i / R, l0 = s * kc / strips, l1 = (s + 1) * kc / strips;
          for (int64_t l = l0; l < l1; ++l) __builtin_prefetch(next + l * kPackPanel, 0, 2);
        }
        const float* ap = abuf + (i / R) * kc * R * kBcast<V>;
        if (rows - i >= R) {
          Tile<V, R, R>(a, bl, ap, bp, kc, m0 + i, p * kPackPanel, first, last);
        } else {
          TailTile<V, R>(rows - i, a, bl, ap, bp, kc, m0 + i, p * kPackPanel, first, last);
        }
      }
    }
  }
}

// Work units [b, e) of (row block, panel group), row-block major: each run of units in one row
// block is one Segment, so a thread packs each of its row blocks once per K block.
template <typename V, int R>
KILN_ALWAYS_INLINE inline void UnitsBody(const PackedMatmulArgs& a, const Blocking& bl, int64_t b,
                                         int64_t e) {
  float* abuf = ThreadScratchFloats<ABufferTag>(bl.mc * bl.kc * kBcast<V>);
  for (int64_t t = b; t < e;) {
    const int64_t rb = t / bl.groups, g0 = t % bl.groups;
    const int64_t g1 = std::min(bl.groups, g0 + (e - t));
    Segment<V, R>(a, bl, rb, g0 * kGroup, std::min(bl.panels, g1 * kGroup), abuf);
    t += g1 - g0;
  }
}

// Rows per strip, fitted to the register file (16 vector registers): at v3 a panel is two ymm,
// 6 x 2 accumulators plus 2 weight vectors and a broadcast (8 loads per 12 FMAs; 3 rows x 2
// panels, the other 12-accumulator shape, measured 40% slower: GCC re-reads the weights from
// memory for each row); at the baseline four xmm, 3 x 4 accumulators plus the 3 broadcast rows
// and a product (SSE has no FMA, so each multiply needs a register of its own).
constexpr int kRowsV3 = 6;
constexpr int kRowsBase = 3;

KILN_TARGET_V3 void UnitsV3(const PackedMatmulArgs& a, const Blocking& bl, int64_t b, int64_t e) {
  UnitsBody<V8, kRowsV3>(a, bl, b, e);
}
void UnitsBase(const PackedMatmulArgs& a, const Blocking& bl, int64_t b, int64_t e) {
  UnitsBody<V4, kRowsBase>(a, bl, b, e);
}

}  // namespace

// v3 only. At v4 oneDNN's brgemm over its own layout is as fast. At the baseline this kernel
// measured 0.77-1.16x oneDNN's sse41 gemm:jit (2 threads, 64-256 rows, K and N 768-3072; ahead
// only with the bias + relu epilogue), not clearly faster, so oneDNN keeps those; the baseline
// variant stays for direct callers (and the kernel tests at sse41).
bool PackedSgemmRunsAt(KernelLevel level) { return level == KernelLevel::kV3; }

void PackedSgemm(const PackedMatmulArgs& a) {
  if (a.M <= 0 || a.N <= 0) return;
  // v4 runs the v3 kernel: at that level matmul.cc uses oneDNN's brgemm instead, so this is only
  // reached by direct callers.
  const bool v3 = ActiveKernelLevel() != KernelLevel::kBase;
  const Blocking bl = Plan(a, v3 ? kRowsV3 : kRowsBase);
  const int64_t units = bl.nm * bl.groups;
  const int64_t unit_fma = bl.mc * kGroup * kPackPanel * std::max<int64_t>(a.K, 1);
  const int64_t grain = std::max<int64_t>(1, kMinFmaPerThread / std::max<int64_t>(unit_fma, 1));
  ParallelFor(units, grain, [&](int64_t b, int64_t e) {
    if (v3) {
      UnitsV3(a, bl, b, e);
    } else {
      UnitsBase(a, bl, b, e);
    }
  });
}

}  // namespace kiln::runtime::cpu
