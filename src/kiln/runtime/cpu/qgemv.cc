// The small-batch int8 matmul over pre-packed constant s8 weights (internal/qgemv.h says what and
// why).
#include "kiln/runtime/cpu/internal/qgemv.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "kiln/base/cpu_isa.h"
#include "kiln/base/memory.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

constexpr int64_t kPanel = 16;       // columns per panel: one zmm of int32 sums
constexpr int64_t kBlockBytes = 64;  // one panel's 4 k x 16 columns

#define KILN_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

struct Args {
  const uint8_t* xu;    // [M][K4 * 4]: x + 128, zero-padded in K
  const int8_t* pack;   // [panels][K4][16][4]
  const int32_t* comp;  // [panels * 16]: -128 * column sums (0 in the padding)
  const float* scale;   // [N]
  float* out;           // [M, N]
  int64_t M, K4, N;
};

// Rows [0, R) x panels [p0, p0 + P): the int32 sums over all of K in registers, then the
// epilogue (f32 conversion in the MXCSR mode, nearest even as static_cast; channel scale) and one
// masked store per row and panel. (The zero-masked conversion: GCC 12's unmasked one warns.)
template <int R, int P>
KILN_VNNI inline __attribute__((always_inline)) void Block(const Args& a, int64_t p0) {
  __m512i acc[R][P];
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) {
    const __m512i c = _mm512_load_si512(a.comp + (p0 + p) * kPanel);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][p] = c;
  }
  const int8_t* w = a.pack + p0 * a.K4 * kBlockBytes;
  const int64_t panel_bytes = a.K4 * kBlockBytes, xs = a.K4 * 4;
  for (int64_t k4 = 0; k4 < a.K4; ++k4) {
    __m512i wv[P];
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) wv[p] = _mm512_load_si512(w + p * panel_bytes + k4 * kBlockBytes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, a.xu + r * xs + k4 * 4, sizeof(four));
      const __m512i xv = _mm512_set1_epi32(four);
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_dpbusd_epi32(acc[r][p], xv, wv[p]);
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) {
    const int64_t n0 = (p0 + p) * kPanel;
    const int64_t cols = std::min<int64_t>(kPanel, a.N - n0);
    const __mmask16 m = cols == kPanel ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
    const __m512 s = _mm512_maskz_loadu_ps(m, a.scale + n0);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_ps(a.out + r * a.N + n0, m,
                            _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(m, acc[r][p]), s));
  }
}

// Panels [begin, end) of R rows: groups of P panels, then one group of the 1..P-1 left.
template <int R, int P>
KILN_VNNI void Panels(const Args& a, int64_t begin, int64_t end) {
  int64_t p = begin;
  for (; p + P <= end; p += P) Block<R, P>(a, p);
  if constexpr (P >= 4) {
    if (end - p == 3) Block<R, 3>(a, p);
  }
  if constexpr (P >= 3) {
    if (end - p == 2) Block<R, 2>(a, p);
  }
  if (end - p == 1) Block<R, 1>(a, p);
}

// 16 accumulators whatever M is: 4 panels for up to 4 rows, 2 for 5..8.
constexpr int64_t GroupPanels(int64_t rows) { return rows <= 4 ? 4 : 2; }

void RunPanels(const Args& a, int64_t begin, int64_t end) {
  switch (a.M) {
    case 1:
      return Panels<1, 4>(a, begin, end);
    case 2:
      return Panels<2, 4>(a, begin, end);
    case 3:
      return Panels<3, 4>(a, begin, end);
    case 4:
      return Panels<4, 4>(a, begin, end);
    case 5:
      return Panels<5, 2>(a, begin, end);
    case 6:
      return Panels<6, 2>(a, begin, end);
    case 7:
      return Panels<7, 2>(a, begin, end);
    case 8:
      return Panels<8, 2>(a, begin, end);
    default:
      return;  // MakeQGemvThunk's caller guarantees 1 <= M <= kQGemvMaxRows
  }
}

class QGemvThunk : public Thunk {
 public:
  QGemvThunk(const QGemvSpec& spec, std::unique_ptr<Thunk> fallback)
      : spec_(spec), fallback_(std::move(fallback)) {
    panels_ = (spec_.N + kPanel - 1) / kPanel;
    k4_ = (spec_.K + 3) / 4;
    xu_.assign(static_cast<size_t>(spec_.M * k4_ * 4), 0);
  }

  std::string name() const override { return pack_ ? spec_.name : fallback_->name(); }

  absl::Status PrepareConstants(const RunContext& ctx) override {
    pack_.reset();
    comp_.reset();
    packed_from_ = nullptr;
    const int w = spec_.w;
    const bool constant =
        w < static_cast<int>(ctx.constant.size()) && ctx.constant[w] && ctx.buffers[w] != nullptr;
    if (!constant) return fallback_->PrepareConstants(ctx);
    Pack(static_cast<const int8_t*>(ctx.buffers[w]));
    packed_from_ = ctx.buffers[w];
    // The fallback runs only if a run hands over another buffer: it must not keep a pack of its
    // own (memory, and a second reorder at every bind), so it sees W as not constant.
    RunContext unbound = ctx;
    unbound.constant[w] = 0;
    return fallback_->PrepareConstants(unbound);
  }

  void Run(RunContext& ctx) override {
    const int w = spec_.w;
    if (!pack_ || ctx.buffers[w] != packed_from_ || w >= static_cast<int>(ctx.constant.size()) ||
        !ctx.constant[w]) {
      fallback_->Run(ctx);
      return;
    }
    const int8_t* x = static_cast<const int8_t*>(ctx.buffers[spec_.x]);
    const int64_t K = spec_.K, xs = k4_ * 4;
    for (int64_t m = 0; m < spec_.M; ++m) {
      uint8_t* dst = xu_.data() + m * xs;
      const int8_t* src = x + m * K;
      for (int64_t k = 0; k < K; ++k) dst[k] = static_cast<uint8_t>(src[k]) ^ 0x80;  // x + 128
    }
    Args a;
    a.xu = xu_.data();
    a.pack = reinterpret_cast<const int8_t*>(pack_.get());
    a.comp = reinterpret_cast<const int32_t*>(comp_.get());
    a.scale = static_cast<const float*>(ctx.buffers[spec_.scale]);
    a.out = static_cast<float*>(ctx.buffers[spec_.out]);
    a.M = spec_.M;
    a.K4 = k4_;
    a.N = spec_.N;
    // Whole groups per thread; a thread gets at least ~256 KiB of weights, so small layers stay on
    // the calling thread (an OpenMP region costs more than they do).
    const int64_t gp = GroupPanels(spec_.M);
    const int64_t groups = (panels_ + gp - 1) / gp;
    const int64_t group_bytes = gp * k4_ * kBlockBytes;
    const int64_t grain = std::max<int64_t>(1, (256 << 10) / std::max<int64_t>(group_bytes, 1));
    const int64_t panels = panels_;
    ParallelFor(groups, grain,
                [&](int64_t b, int64_t e) { RunPanels(a, b * gp, std::min(panels, e * gp)); });
  }

 private:
  // W [K, N] row-major -> [panels][K4][16 columns][4 k], zeros past K and N; comp = -128 * the
  // column sums.
  void Pack(const int8_t* w) {
    const int64_t K = spec_.K, N = spec_.N, K4 = k4_;
    pack_ = AllocatePopulated(AlignUp(panels_ * K4 * kBlockBytes), kBufferAlignment);
    comp_ = AllocatePopulated(AlignUp(panels_ * kPanel * static_cast<int64_t>(sizeof(int32_t))),
                              kBufferAlignment);
    int8_t* pack = reinterpret_cast<int8_t*>(pack_.get());
    int32_t* comp = reinterpret_cast<int32_t*>(comp_.get());
    ParallelFor(panels_, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        int8_t* dst = pack + p * K4 * kBlockBytes;
        for (int64_t j = 0; j < kPanel; ++j) {
          const int64_t n = p * kPanel + j;
          int32_t sum = 0;
          for (int64_t k = 0; k < K4 * 4; ++k) {
            const int8_t v = (n < N && k < K) ? w[k * N + n] : int8_t{0};
            dst[(k / 4) * kBlockBytes + j * 4 + k % 4] = v;
            sum += v;
          }
          // Unsigned arithmetic: -128 * sum wraps like the int32 accumulators do.
          comp[n] = static_cast<int32_t>(0u - 128u * static_cast<uint32_t>(sum));
        }
      }
    });
  }

  QGemvSpec spec_;
  std::unique_ptr<Thunk> fallback_;
  int64_t panels_ = 0, k4_ = 0;
  std::vector<uint8_t> xu_;        // the biased x of the current run
  std::shared_ptr<uint8_t> pack_;  // while W is constant
  std::shared_ptr<uint8_t> comp_;  // [panels * 16] int32
  const void* packed_from_ = nullptr;
};

}  // namespace

bool QGemvSupported() { return ActiveCpuIsa() >= CpuIsa::kAvx512Vnni; }

std::unique_ptr<Thunk> MakeQGemvThunk(const QGemvSpec& spec, std::unique_ptr<Thunk> fallback) {
  return std::make_unique<QGemvThunk>(spec, std::move(fallback));
}

}  // namespace kiln::runtime::cpu
