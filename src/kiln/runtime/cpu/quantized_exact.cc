// The int8 ops on the exact widening GEMM (internal/quantized_exact.h says what and why).
#include "kiln/runtime/cpu/internal/quantized_exact.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/base/memory.h"
#include "kiln/runtime/cpu/internal/qgemm.h"

namespace kiln::runtime::cpu {
namespace {

// Multiply-adds a thread should get at least before a loop splits (an OpenMP region costs a few
// microseconds; the kernel does about 16 s8 multiply-adds a cycle per core).
constexpr int64_t kMinMacsPerThread = int64_t{1} << 17;

int64_t GrainFor(int64_t work_per_task) {
  return std::max<int64_t>(1, kMinMacsPerThread / std::max<int64_t>(work_per_task, 1));
}

// ParallelFor's split, with each chunk's index (< slots) passed along for per-thread scratch.
template <typename F>
void ParallelForSlots(int64_t n, int64_t grain, int64_t slots, F&& f) {
  if (n <= 0) return;
  const int max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t chunks =
      std::min({int64_t{max_threads}, slots, (n + grain - 1) / std::max<int64_t>(grain, 1)});
  if (chunks <= 1) {
    f(int64_t{0}, int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast <int>(chunks))
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) f(t, begin, end);
  }
}

// Derives a packed form of s8 operand `node` (`bytes` bytes) with `pack`. While the operand is
// constant (Thunk::PrepareConstants: a bound weight) it is packed once, at binding, and a run
// that hands over that same constant buffer reads the pack without looking at the bytes.
// Otherwise the pack is made on the first run and again only when the bytes differ from the
// last packed copy (one memcmp of the operand per run: operands that change still give the
// right result). quantized.cc's WeightPacker, for Kiln's own layouts.
class OperandPacker {
 public:
  using PackFn = std::function<void(const int8_t* src, uint8_t* dst)>;
  OperandPacker(int node, int64_t bytes, int64_t packed_bytes, PackFn pack)
      : node_(node), bytes_(bytes), packed_bytes_(packed_bytes), pack_(std::move(pack)) {}

  void Prepare(const RunContext& ctx) {
    constant_from_ = nullptr;
    valid_ = false;
    last_.clear();
    last_.shrink_to_fit();
    if (!IsConstant(ctx)) return;
    Pack(ctx.buffers[node_]);
    constant_from_ = ctx.buffers[node_];
  }

  const uint8_t* Get(const RunContext& ctx) {
    const void* w = ctx.buffers[node_];
    if (constant_from_ != nullptr && w == constant_from_ && IsConstant(ctx)) return packed_.get();
    constant_from_ = nullptr;
    if (last_.empty()) last_.resize(static_cast<size_t>(bytes_));
    if (!valid_ || std::memcmp(w, last_.data(), last_.size()) != 0) {
      Pack(w);
      std::memcpy(last_.data(), w, last_.size());
      valid_ = true;
    }
    return packed_.get();
  }

 private:
  bool IsConstant(const RunContext& ctx) const {
    return node_ < static_cast<int>(ctx.constant.size()) && ctx.constant[node_] &&
           ctx.buffers[node_] != nullptr;
  }
  void Pack(const void* w) {
    if (!packed_) packed_ = AllocatePopulated(AlignUp(packed_bytes_), kBufferAlignment);
    pack_(static_cast<const int8_t*>(w), packed_.get());
  }

  int node_;
  int64_t bytes_, packed_bytes_;
  PackFn pack_;
  std::shared_ptr<uint8_t> packed_;
  std::vector<uint8_t> last_;  // the bytes last packed (memcmp path only)
  bool valid_ = false;
  const void* constant_from_ = nullptr;  // the constant buffer packed at binding
};

// ---- quantized_dot ----

class ExactDotThunk : public Thunk {
 public:
  struct Plan {
    std::string name;
    int x = -1, w = -1, scale = -1, y = -1;
    int64_t M = 0, K = 0, N = 0;
    int64_t a_off = 0;  // the widened activations in the workspace
  };
  ExactDotThunk(std::shared_ptr<CpuContext> cpu, Plan p)
      : cpu_(std::move(cpu)),
        p_(std::move(p)),
        packer_(p_.w, p_.K * p_.N, QGemmPackedBytes(p_.K, p_.N),
                [K = p_.K, N = p_.N](const int8_t* w, uint8_t* dst) {
                  int8_t* pack = reinterpret_cast<int8_t*>(dst);
                  const int64_t panel_macs = QGemmPairs(K) * 2 * kQGemmPanel;
                  ParallelFor(QGemmPanels(N), GrainFor(panel_macs), [&](int64_t b, int64_t e) {
                    QGemmPackPanels(w, N, K, N, b, e, pack);
                  });
                }) {
    const int64_t K2 = QGemmPairs(p_.K), panels = QGemmPanels(p_.N);
    // Tiles: row chunks of whole register blocks, panel chunks of ~64 KiB of weights (with the
    // chunk's rows of activations, L2-resident while the rows sweep it).
    row_chunk_ = QGemmRowBlock() * 8;
    panel_chunk_ = std::clamp<int64_t>((64 << 10) / (K2 * kQGemmBlockBytes), 1, panels);
    row_chunks_ = (p_.M + row_chunk_ - 1) / row_chunk_;
    const int64_t panel_chunks = (panels + panel_chunk_ - 1) / panel_chunk_;
    tasks_ = row_chunks_ * panel_chunks;
    grain_ = GrainFor(std::min(row_chunk_, p_.M) * panel_chunk_ * kQGemmPanel * p_.K);
  }

  void Run(RunContext& ctx) override {
    const int8_t* pack = reinterpret_cast<const int8_t*>(packer_.Get(ctx));
    const int8_t* x = static_cast<const int8_t*>(ctx.buffers[p_.x]);
    const int64_t M = p_.M, K = p_.K, K2 = QGemmPairs(K), panels = QGemmPanels(p_.N);
    int16_t* a = reinterpret_cast<int16_t*>(cpu_->workspace() + p_.a_off);
    ParallelFor(M, std::max<int64_t>(1, kElementwiseGrain / K), [&](int64_t b, int64_t e) {
      QGemmWidenRows(x + b * K, K, e - b, K, a + b * 2 * K2);
    });
    QGemmArgs g;
    g.a = a;
    g.a_pairs = K2;
    g.b = pack;
    g.K2 = K2;
    g.N = p_.N;
    g.out.y = static_cast<float*>(ctx.buffers[p_.y]);
    g.out.row_stride = p_.N;
    g.out.seg = p_.N;
    g.out.col_scale = static_cast<const float*>(ctx.buffers[p_.scale]);
    // Task t: panel chunk t / row_chunks, row chunk t % row_chunks, so a thread's consecutive
    // tasks share a panel chunk.
    ParallelFor(tasks_, grain_, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t r0 = (t % row_chunks_) * row_chunk_, p0 = (t / row_chunks_) * panel_chunk_;
        QGemmTile(g, r0, std::min(M, r0 + row_chunk_), p0, std::min(panels, p0 + panel_chunk_));
      }
    });
  }
  std::string name() const override { return p_.name; }
  absl::Status PrepareConstants(const RunContext& ctx) override {
    packer_.Prepare(ctx);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<CpuContext> cpu_;
  Plan p_;
  OperandPacker packer_;
  int64_t row_chunk_ = 0, panel_chunk_ = 0, row_chunks_ = 0, tasks_ = 0, grain_ = 1;
};

// ---- quantized_conv2d ----

class ExactConvThunk : public Thunk {
 public:
  struct Plan {
    std::string name;
    int x = -1, w = -1, scale = -1, y = -1;
    QConvGeometry geom;
    int64_t O = 0, groups = 1;
    int64_t chunk_cols = 0;   // output columns per task (a multiple of 16)
    int64_t padded_off = -1;  // the zero-padded input in the workspace (-1: no padding)
    int64_t scratch_off = 0, slot_bytes = 0, slots = 1;
  };
  ExactConvThunk(std::shared_ptr<CpuContext> cpu, Plan p)
      : cpu_(std::move(cpu)),
        p_(std::move(p)),
        packer_(p_.w, p_.O * p_.geom.K(), p_.O * 2 * QGemmPairs(p_.geom.K()) * 2,
                [O = p_.O, K = p_.geom.K()](const int8_t* w, uint8_t* dst) {
                  QGemmWidenRows(w, K, O, K, reinterpret_cast<int16_t*>(dst));
                }) {
    chunks_ = (p_.geom.columns() + p_.chunk_cols - 1) / p_.chunk_cols;
    const int64_t og = p_.O / p_.groups, K = p_.geom.K();
    grain_ = GrainFor((og + 1) * p_.chunk_cols * K);  // + 1: the im2col's bytes
  }

  void Run(RunContext& ctx) override {
    const int16_t* filter = reinterpret_cast<const int16_t*>(packer_.Get(ctx));
    const int8_t* x = static_cast<const int8_t*>(ctx.buffers[p_.x]);
    const float* scale = static_cast<const float*>(ctx.buffers[p_.scale]);
    float* y = static_cast<float*>(ctx.buffers[p_.y]);
    const QConvGeometry geom = p_.geom.Padded();
    const int64_t K = geom.K(), K2 = QGemmPairs(K), og = p_.O / p_.groups;
    const int64_t ohw = geom.OH * geom.OW, total = geom.columns(), chunks = chunks_;
    const int64_t x_bytes = geom.N * geom.C * geom.H * geom.W;
    // The zero-padded copy first (one pass over the input), so the im2col copies runs without
    // bounds checks.
    if (p_.padded_off >= 0) {
      int8_t* xp = reinterpret_cast<int8_t*>(cpu_->workspace() + p_.padded_off);
      const int64_t planes = geom.N * geom.C, plane = geom.H * geom.W;
      ParallelFor(planes, std::max<int64_t>(1, kElementwiseGrain / plane),
                  [&](int64_t b, int64_t e) { QConvPadPlanes(p_.geom, x, b, e, xp); });
      x = xp;
    }
    uint8_t* scratch = cpu_->workspace() + p_.scratch_off;
    const int64_t col_bytes = AlignUp(QConvColBytes(K, p_.chunk_cols));
    ParallelForSlots(p_.groups * chunks, grain_, p_.slots, [&](int64_t slot, int64_t b, int64_t e) {
      int8_t* col = reinterpret_cast<int8_t*>(scratch + slot * p_.slot_bytes);
      int8_t* panels = col + col_bytes;
      for (int64_t t = b; t < e; ++t) {
        const int64_t g = t / chunks, c0 = (t % chunks) * p_.chunk_cols;
        const int64_t cols = std::min(p_.chunk_cols, total - c0);
        QConvIm2colPanels(geom, x, x_bytes, g, c0, cols, col, panels);
        QGemmArgs a;
        a.a = filter + g * og * 2 * K2;
        a.a_pairs = K2;
        a.b = panels;
        a.K2 = K2;
        a.N = cols;
        a.out.y = y + g * og * ohw;
        a.out.row_stride = ohw;
        a.out.seg = ohw;
        a.out.seg_stride = p_.O * ohw;
        a.out.col_offset = c0;
        a.out.row_scale = scale + g * og;
        QGemmTile(a, 0, og, 0, QGemmPanels(cols));
      }
    });
  }
  std::string name() const override { return p_.name; }
  absl::Status PrepareConstants(const RunContext& ctx) override {
    packer_.Prepare(ctx);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<CpuContext> cpu_;
  Plan p_;
  OperandPacker packer_;
  int64_t chunks_ = 1, grain_ = 1;
};

}  // namespace

LowerResult LowerQuantizedDotExact(const ir::Node& n, LowerContext& lc) {
  ExactDotThunk::Plan p;
  p.K = lc.operand_type(n, 1).shape.dim(0);
  p.N = lc.operand_type(n, 1).shape.dim(1);
  p.M = p.K == 0 ? 0 : lc.operand_type(n, 0).shape.num_elements() / p.K;
  if (p.M == 0 || p.K == 0 || p.N == 0) return Unimplemented(n, "empty quantized_dot");
  WorkspaceLayout layout;
  p.a_off = layout.Add(p.M * 2 * QGemmPairs(p.K) * static_cast<int64_t>(sizeof(int16_t)));
  lc.cpu->RequireWorkspace(layout.size());
  p.name = ThunkName(
      n, std::string("exact int8 gemm ") + QGemmIsa() + " (s16 pmaddwd), packed s8 weights");
  p.x = n.operand(0);
  p.w = n.operand(1);
  p.scale = n.operand(2);
  p.y = n.id();
  return std::unique_ptr<Thunk>(new ExactDotThunk(lc.cpu, std::move(p)));
}

LowerResult LowerQuantizedConvExact(const ir::Node& n, LowerContext& lc) {
  const Shape& in = lc.operand_type(n, 0).shape;
  const Shape& f = lc.operand_type(n, 1).shape;
  const Shape& out = n.type().shape;
  const std::vector<int64_t> st = n.attr_ints("strides"), pad = n.attr_ints("padding"),
                             dil = n.attr_ints("dilation");
  ExactConvThunk::Plan p;
  QConvGeometry& g = p.geom;
  g.N = in.dim(0);
  g.C = in.dim(1);
  g.H = in.dim(2);
  g.W = in.dim(3);
  g.CG = f.dim(1);
  g.KH = f.dim(2);
  g.KW = f.dim(3);
  g.OH = out.dim(2);
  g.OW = out.dim(3);
  g.sh = st[0];
  g.sw = st[1];
  g.pt = pad[0];
  g.pb = pad[1];
  g.pl = pad[2];
  g.pr = pad[3];
  g.dh = dil[0];
  g.dw = dil[1];
  p.O = f.dim(0);
  p.groups = n.attr_int("groups");
  if (g.columns() == 0 || p.O == 0 || g.K() == 0) return Unimplemented(n, "empty quantized_conv2d");
  // A task's im2col rows and panels (about 2 K x chunk_cols bytes) within ~96 KiB, so they stay
  // in L2 while the group's rows of filter sweep them; and columns split finer where the groups
  // alone would not give each thread two tasks (the grain merges them again when the whole
  // convolution is too small to split).
  const int64_t K = g.K(), threads = std::max(1, omp_get_max_threads());
  const int64_t cache_cols =
      std::clamp<int64_t>((48 << 10) / K / kQGemmPanel * kQGemmPanel, kQGemmPanel, 512);
  const int64_t want_chunks = std::max<int64_t>(1, (2 * threads + p.groups - 1) / p.groups);
  const int64_t split_cols =
      QGemmPanels((g.columns() + want_chunks - 1) / want_chunks) * kQGemmPanel;
  p.chunk_cols = std::min(cache_cols, split_cols);
  p.slot_bytes =
      AlignUp(QConvColBytes(K, p.chunk_cols)) + AlignUp(QGemmPackedBytes(K, p.chunk_cols));
  p.slots = threads;
  WorkspaceLayout layout;
  if (g.padded()) {
    const QConvGeometry pg = g.Padded();
    p.padded_off = layout.Add(pg.N * pg.C * pg.H * pg.W);
  }
  p.scratch_off = layout.Add(p.slots * p.slot_bytes);
  lc.cpu->RequireWorkspace(layout.size());
  p.name = ThunkName(n, std::string("exact int8 im2col + gemm ") + QGemmIsa() + " (s16 pmaddwd)");
  p.x = n.operand(0);
  p.w = n.operand(1);
  p.scale = n.operand(2);
  p.y = n.id();
  return std::unique_ptr<Thunk>(new ExactConvThunk(lc.cpu, std::move(p)));
}

}  // namespace kiln::runtime::cpu
