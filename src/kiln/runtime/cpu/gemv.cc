// The small-batch matmul over pre-packed constant weights (internal/gemv.h says what and why).
#include "kiln/runtime/cpu/internal/gemv.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "kiln/base/isa_dispatch.h"
#include "kiln/base/memory.h"
#include "kiln/runtime/cpu/internal/common.h"
#include "kiln/runtime/cpu/internal/sgemm.h"

namespace kiln::runtime::cpu {
namespace {

constexpr int64_t kPanel = kPackPanel;  // columns per packed panel: one AVX-512 register
constexpr int kGroup = 4;               // panels per unit of work split between threads

// The vector types of the variants: 16, 8 and 4 floats, one zmm, ymm or xmm register. A panel
// of 16 columns is 16 / lanes vectors. Each variant uses the width its ISA has natively: GCC
// lowers a generic vector wider than the target's registers through the stack (a V16 at x86-64-v3
// spilled and reloaded every product, 3x slower than v4 at batch 1).
typedef float V16 __attribute__((vector_size(64)));
typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));

// By reference, not by value: a vector return would change the baseline variant's ABI.
template <typename V>
inline __attribute__((always_inline)) void Load(V& v, const float* p) {
  std::memcpy(&v, p, sizeof(v));
}

using Args = PackedMatmulArgs;

// Rows [m0, m0 + R) x panels [p0, p0 + P): accumulate over all of K, then the epilogue and store.
// V is the variant's vector (L lanes); each panel is S = 16 / L vectors.
template <typename V, int R, int P>
inline __attribute__((always_inline)) void Block(const Args& a, int64_t m0, int64_t p0) {
  constexpr int L = sizeof(V) / sizeof(float);
  constexpr int S = kPanel / L;
  constexpr int C = P * S;  // vectors per row of the block
  V acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = V{};
  const float* w[P];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p) w[p] = a.pack + (p0 + p) * a.K * kPanel;
  const float* x[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) x[r] = a.x + (m0 + r) * a.xs_m;
  for (int64_t k = 0; k < a.K; ++k) {
    V wv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) Load(wv[c], w[c / S] + k * kPanel + (c % S) * L);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float xv = x[r][k * a.xs_k];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] += wv[c] * xv;
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    const int64_t n0 = (p0 + c / S) * kPanel + (c % S) * L;
    const int64_t cols = std::min<int64_t>(L, a.N - n0);
    if (cols <= 0) continue;
    V b = V{};
    if (a.bias != nullptr) {
      if (cols == L) {
        Load(b, a.bias + n0);
      } else {
        for (int64_t j = 0; j < cols; ++j) b[j] = a.bias[n0 + j];
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      V v = acc[r][c] + b;
      if (a.relu) v = v > V{} ? v : V{};
      float* o = a.out + (m0 + r) * a.N + n0;
      const float* res = a.residual != nullptr ? a.residual + (m0 + r) * a.N + n0 : nullptr;
      if (cols == L) {
        if (res) {
          V rv;
          Load(rv, res);
          v += rv;
        }
        std::memcpy(o, &v, sizeof(v));
      } else {
        for (int64_t j = 0; j < cols; ++j) o[j] = v[j] + (res ? res[j] : 0.f);
      }
    }
  }
}

// Rows of R at a time (then the 1..R-1 left) over the P panels at p0.
template <typename V, int P, int R>
inline __attribute__((always_inline)) void Rows(const Args& a, int64_t p0) {
  int64_t m = 0;
  for (; m + R <= a.M; m += R) Block<V, R, P>(a, m, p0);
  switch (a.M - m) {
    case 3:
      if constexpr (R > 3) Block<V, 3, P>(a, m, p0);
      break;
    case 2:
      if constexpr (R > 2) Block<V, 2, P>(a, m, p0);
      break;
    case 1:
      if constexpr (R > 1) Block<V, 1, P>(a, m, p0);
      break;
    default:
      break;
  }
}

// Panels [begin, end): groups of G panels whose R x G accumulators stay in registers, then the
// rest one panel at a time. G and R fit the ISA's register file: a 16-float panel is one zmm at
// v4 (R=4 x G=4 accumulators plus 4 weight registers of 32), two ymm at v3 (R=2 x G=2 x 2 plus 4
// of 16), four xmm at the baseline (R=2 x G=1 x 4 plus 4 of 16): 8 to 16 independent FMA chains,
// none spilled.
template <typename V, int G, int R>
inline __attribute__((always_inline)) void PanelsBody(const Args& a, int64_t begin, int64_t end) {
  int64_t p = begin;
  for (; p + G <= end; p += G) Rows<V, G, R>(a, p);
  for (; p < end; ++p) Rows<V, 1, R>(a, p);
}

KILN_TARGET_V4 void RunPanelsV4(const Args& a, int64_t begin, int64_t end) {
  PanelsBody<V16, 4, 4>(a, begin, end);
}
KILN_TARGET_V3 void RunPanelsV3(const Args& a, int64_t begin, int64_t end) {
  PanelsBody<V8, 2, 2>(a, begin, end);
}
void RunPanelsBase(const Args& a, int64_t begin, int64_t end) {
  PanelsBody<V4, 1, 2>(a, begin, end);
}
void RunPanels(const Args& a, int64_t begin, int64_t end) {
  static const auto fn =
      PickVariant(ActiveKernelLevel(), &RunPanelsV4, &RunPanelsV3, &RunPanelsBase);
  fn(a, begin, end);
}

class GemvThunk : public Thunk {
 public:
  GemvThunk(const GemvSpec& spec, std::unique_ptr<Thunk> fallback)
      : spec_(spec), fallback_(std::move(fallback)) {
    panels_ = (spec_.N + kPanel - 1) / kPanel;
  }

  std::string name() const override {
    if (pack_) return spec_.name;
    if (PacksPerRun()) return spec_.per_run_name;
    return fallback_->name();
  }

  absl::Status PrepareConstants(const RunContext& ctx) override {
    pack_.reset();
    packed_from_ = nullptr;
    if (!IsConstant(ctx)) return absl::OkStatus();  // the fallback, or a pack per run
    std::shared_ptr<uint8_t> mem = AllocatePopulated(
        AlignUp(PackFloats() * static_cast<int64_t>(sizeof(float))), kBufferAlignment);
    Pack(static_cast<const float*>(ctx.buffers[spec_.rhs]), reinterpret_cast<float*>(mem.get()));
    pack_ = std::move(mem);
    packed_from_ = ctx.buffers[spec_.rhs];
    return absl::OkStatus();
  }

  void Run(RunContext& ctx) override {
    const float* pack = nullptr;
    if (pack_ && ctx.buffers[spec_.rhs] == packed_from_ && IsConstant(ctx)) {
      pack = reinterpret_cast<const float*>(pack_.get());
    } else if (PacksPerRun()) {
      // The calling thread's scratch, grown to the largest weight it has packed: no allocation
      // per step, and one buffer for all the executable's matmuls (each packs, then runs).
      float* scratch = ThreadScratchFloats<PackTag>(PackFloats());
      Pack(static_cast<const float*>(ctx.buffers[spec_.rhs]), scratch);
      pack = scratch;
    } else {
      fallback_->Run(ctx);
      return;
    }
    Args a;
    a.x = static_cast<const float*>(ctx.buffers[spec_.lhs]);
    a.xs_m = spec_.x_row_stride;
    a.xs_k = spec_.x_col_stride;
    a.pack = pack;
    a.bias = spec_.bias >= 0 ? static_cast<const float*>(ctx.buffers[spec_.bias]) : nullptr;
    a.residual =
        spec_.residual >= 0 ? static_cast<const float*>(ctx.buffers[spec_.residual]) : nullptr;
    a.out = static_cast<float*>(ctx.buffers[spec_.out]);
    a.M = spec_.M;
    a.K = spec_.K;
    a.N = spec_.N;
    a.relu = spec_.relu;
    // Above the gemv's rows the product is compute-bound: the blocked kernel (sgemm.cc).
    if (a.M > kGemvMaxRows) {
      PackedSgemm(a);
      return;
    }
    // Whole groups per thread; a thread gets at least ~256 KiB of weights, so small layers stay on
    // the calling thread (an OpenMP region costs more than they do).
    const int64_t groups = (panels_ + kGroup - 1) / kGroup;
    const int64_t group_bytes = kGroup * kPanel * a.K * static_cast<int64_t>(sizeof(float));
    const int64_t grain = std::max<int64_t>(1, (256 << 10) / std::max<int64_t>(group_bytes, 1));
    const int64_t panels = panels_;
    ParallelFor(groups, grain, [&](int64_t b, int64_t e) {
      RunPanels(a, b * kGroup, std::min(panels, e * kGroup));
    });
  }

 private:
  bool IsConstant(const RunContext& ctx) const {
    const int rhs = spec_.rhs;
    return rhs < static_cast<int>(ctx.constant.size()) && ctx.constant[rhs] &&
           ctx.buffers[rhs] != nullptr;
  }
  int64_t PackFloats() const { return panels_ * spec_.K * kPanel; }
  bool PacksPerRun() const { return spec_.pack_per_run && spec_.M > kGemvMaxRows; }

  // W (through its strides) into [panels][K][16], the last panel's missing columns zero.
  void Pack(const float* w, float* pack) const {
    const int64_t K = spec_.K, N = spec_.N, sk = spec_.w_k_stride, sn = spec_.w_n_stride;
    ParallelFor(panels_, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        float* dst = pack + p * K * kPanel;
        const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
        for (int64_t k = 0; k < K; ++k) {
          for (int64_t j = 0; j < cols; ++j) dst[k * kPanel + j] = w[k * sk + (n0 + j) * sn];
          for (int64_t j = cols; j < kPanel; ++j) dst[k * kPanel + j] = 0.f;
        }
      }
    });
  }

  struct PackTag {};  // the per-run weight pack of the calling thread (ThreadScratchFloats)

  GemvSpec spec_;
  std::unique_ptr<Thunk> fallback_;
  int64_t panels_ = 0;
  std::shared_ptr<uint8_t> pack_;  // [panels][K][16] floats, while the weight is constant
  const void* packed_from_ = nullptr;
};

}  // namespace

std::unique_ptr<Thunk> MakeGemvThunk(const GemvSpec& spec, std::unique_ptr<Thunk> fallback) {
  return std::make_unique<GemvThunk>(spec, std::move(fallback));
}

}  // namespace kiln::runtime::cpu
