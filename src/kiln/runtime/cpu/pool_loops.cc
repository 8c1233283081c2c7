// Pooling loops over NCHW planes (one parallel task per block of planes): max_pool2d_grad always
// (the gradient goes to the first max of each window in row-major order, which oneDNN's workspace
// does not promise on ties), and max_pool2d / avg_pool2d / avg_pool2d_grad when oneDNN cannot run
// them. Padding never wins a max; avg divisors follow PyTorch (window clipped to the padded bounds
// with count_include_pad, else the count of real input elements).
#include <limits>

#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using ir::Opcode;

struct PoolGeometry {
  int64_t planes, H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr;
  bool include_pad = false;

  // Window of output (oh, ow): input rows [h0, h1), cols [w0, w1), and the avg divisor.
  void Window(int64_t oh, int64_t ow, int64_t& h0, int64_t& h1, int64_t& w0, int64_t& w1,
              int64_t& divisor) const {
    int64_t hs = oh * sh - pt, ws = ow * sw - pl;
    int64_t he = std::min(hs + kh, H + pb), we = std::min(ws + kw, W + pr);
    int64_t padded = (he - hs) * (we - ws);
    h0 = std::max<int64_t>(hs, 0);
    w0 = std::max<int64_t>(ws, 0);
    h1 = std::min(he, H);
    w1 = std::min(we, W);
    divisor = include_pad ? padded : (h1 - h0) * (w1 - w0);
  }
};

PoolGeometry MakePoolGeometry(const ir::Node& n, const Shape& in, const Shape& out) {
  const auto& window = n.attr_ints("window");
  const auto& st = n.attr_ints("strides");
  const auto& pad = n.attr_ints("padding");
  PoolGeometry g;
  g.planes = in.dim(0) * in.dim(1);
  g.H = in.dim(2);
  g.W = in.dim(3);
  g.OH = out.dim(2);
  g.OW = out.dim(3);
  g.kh = window[0];
  g.kw = window[1];
  g.sh = st[0];
  g.sw = st[1];
  g.pt = pad[0];
  g.pb = pad[1];
  g.pl = pad[2];
  g.pr = pad[3];
  g.include_pad = n.has_attr("count_include_pad") && n.attr_int("count_include_pad") != 0;
  return g;
}

int64_t PlaneGrain(const PoolGeometry& g) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.H * g.W + g.OH * g.OW));
}

template <typename S>
std::unique_ptr<Thunk> PoolForward(const ir::Node& n, const PoolGeometry& g, bool max) {
  using C = typename Elem<S>::C;
  int in = n.operand(0), out = n.id();
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* x = static_cast<const S*>(ctx.buffers[in]);
    S* y = static_cast<S*>(ctx.buffers[out]);
    ParallelFor(g.planes, PlaneGrain(g), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const S* xp = x + p * g.H * g.W;
        S* yp = y + p * g.OH * g.OW;
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            int64_t h0, h1, w0, w1, div;
            g.Window(oh, ow, h0, h1, w0, w1, div);
            C acc = max ? -std::numeric_limits<C>::infinity() : C(0);
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) {
                C v = Elem<S>::Load(xp[h * g.W + w]);
                if (max) {
                  if (v > acc || (v != v && acc == acc)) acc = v;
                } else {
                  acc += v;
                }
              }
            if (!max) acc = div > 0 ? acc / static_cast<C>(div) : C(0);
            yp[oh * g.OW + ow] = Elem<S>::Store(acc);
          }
      }
    });
  });
}

// Scatters grad_out into grad_in: max (to the first max of the window of `input`) or avg.
// Narrow floats accumulate in f32 in the workspace, then round once.
template <typename S>
std::unique_ptr<Thunk> PoolBackward(const ir::Node& n, LowerContext& lc, const PoolGeometry& g,
                                    bool max) {
  using C = typename Elem<S>::C;
  constexpr bool kWide = !std::is_same_v<S, C>;
  int input = max ? n.operand(0) : -1;
  int grad_out = max ? n.operand(1) : n.operand(0);
  int out = n.id();
  int64_t count = g.planes * g.H * g.W;
  lc.cpu->RequireWorkspace(kWide ? count * static_cast<int64_t>(sizeof(C)) : 0);
  std::shared_ptr<CpuContext> cpu = lc.cpu;
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* x = input >= 0 ? static_cast<const S*>(ctx.buffers[input]) : nullptr;
    const S* dy = static_cast<const S*>(ctx.buffers[grad_out]);
    S* dx = static_cast<S*>(ctx.buffers[out]);
    C* acc_all = kWide ? reinterpret_cast<C*>(cpu->workspace()) : reinterpret_cast<C*>(dx);
    ParallelFor(g.planes, PlaneGrain(g), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        C* acc = acc_all + p * g.H * g.W;
        for (int64_t i = 0; i < g.H * g.W; ++i) acc[i] = C(0);
        const S* xp = x ? x + p * g.H * g.W : nullptr;
        const S* dyp = dy + p * g.OH * g.OW;
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            int64_t h0, h1, w0, w1, div;
            g.Window(oh, ow, h0, h1, w0, w1, div);
            C d = Elem<S>::Load(dyp[oh * g.OW + ow]);
            if (max) {
              int64_t best = -1;
              C bv = C(0);
              for (int64_t h = h0; h < h1; ++h)
                for (int64_t w = w0; w < w1; ++w) {
                  C v = Elem<S>::Load(xp[h * g.W + w]);
                  if (best < 0 || v > bv || (v != v && bv == bv)) {
                    best = h * g.W + w;
                    bv = v;
                  }
                }
              if (best >= 0) acc[best] += d;
            } else if (div > 0) {
              C share = d / static_cast<C>(div);
              for (int64_t h = h0; h < h1; ++h)
                for (int64_t w = w0; w < w1; ++w) acc[h * g.W + w] += share;
            }
          }
        if constexpr (kWide) {
          S* dxp = dx + p * g.H * g.W;
          for (int64_t i = 0; i < g.H * g.W; ++i) dxp[i] = Elem<S>::Store(acc[i]);
        }
      }
    });
  });
}

}  // namespace

LowerResult LowerMaxPoolGrad(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  PoolGeometry g = MakePoolGeometry(n, n.type().shape, lc.operand_type(n, 1).shape);
  return VisitFloat(
      t,
      [&](auto tag) -> LowerResult {
        return PoolBackward<typename decltype(tag)::type>(n, lc, g, /*max=*/true);
      },
      UnsupportedDType(n, t));
}

LowerResult LowerPoolLoop(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  bool grad = n.opcode() == Opcode::kAvgPool2dGrad;
  PoolGeometry g = grad ? MakePoolGeometry(n, n.type().shape, lc.operand_type(n, 0).shape)
                        : MakePoolGeometry(n, lc.operand_type(n, 0).shape, n.type().shape);
  bool max = n.opcode() == Opcode::kMaxPool2d;
  return VisitFloat(
      t,
      [&](auto tag) -> LowerResult {
        using S = typename decltype(tag)::type;
        if (grad) return PoolBackward<S>(n, lc, g, /*max=*/false);
        return PoolForward<S>(n, g, max);
      },
      UnsupportedDType(n, t));
}

}  // namespace kiln::runtime::cpu
