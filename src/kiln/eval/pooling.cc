// Reference kernels for 2-D pooling over NCHW and their gradients, with PyTorch's semantics
// (asymmetric padding [top, bottom, left, right] generalizes PyTorch's symmetric one).
#include <cmath>
#include <limits>

#include "kiln/base/status.h"
#include "kiln/eval/kernels.h"

namespace kiln::eval {
namespace {

using ir::Opcode;

struct PoolGeometry {
  int64_t n, c, h, w;  // input
  int64_t oh, ow;      // output
  int64_t kh, kw, sh, sw, top, bottom, left, right;
  bool count_include_pad;

  int64_t planes() const { return n * c; }
  int64_t in_at(int64_t plane, int64_t y, int64_t x) const { return (plane * h + y) * w + x; }
  int64_t out_at(int64_t plane, int64_t y, int64_t x) const { return (plane * oh + y) * ow + x; }

  // The window of output (y, x), clipped to the input: rows [y0, y1), columns [x0, x1).
  void Window(int64_t y, int64_t x, int64_t& y0, int64_t& y1, int64_t& x0, int64_t& x1) const {
    y0 = y * sh - top;
    x0 = x * sw - left;
    y1 = std::min(y0 + kh, h);
    x1 = std::min(x0 + kw, w);
    y0 = std::max<int64_t>(y0, 0);
    x0 = std::max<int64_t>(x0, 0);
  }

  // PyTorch's divisor: with count_include_pad the window clipped to the padded input, otherwise
  // only the real elements it covers. Zero (a window wholly in padding, excluded) means "no
  // elements": the average is taken as 0.
  int64_t Divisor(int64_t y, int64_t x) const {
    int64_t y0, y1, x0, x1;
    Window(y, x, y0, y1, x0, x1);
    if (!count_include_pad) return std::max<int64_t>(y1 - y0, 0) * std::max<int64_t>(x1 - x0, 0);
    int64_t py0 = y * sh - top, px0 = x * sw - left;
    int64_t py1 = std::min(py0 + kh, h + bottom), px1 = std::min(px0 + kw, w + right);
    return std::max<int64_t>(py1 - py0, 0) * std::max<int64_t>(px1 - px0, 0);
  }

  // The first position (row-major) holding the window's maximum, NaN counting as the maximum;
  // -1 for a window that covers no input element.
  int64_t ArgMax(const void* in, DType t, int64_t plane, int64_t y, int64_t x) const {
    int64_t y0, y1, x0, x1;
    Window(y, x, y0, y1, x0, x1);
    int64_t best = -1;
    double best_v = 0;
    for (int64_t iy = y0; iy < y1; ++iy)
      for (int64_t ix = x0; ix < x1; ++ix) {
        int64_t at = in_at(plane, iy, ix);
        double v = LoadAsDouble(in, t, at);
        if (best < 0 || (!std::isnan(best_v) && (std::isnan(v) || v > best_v))) {
          best = at;
          best_v = v;
        }
      }
    return best;
  }
};

absl::StatusOr<PoolGeometry> Geometry(const ir::Node& n, const Shape& in, const Shape& out) {
  std::vector<int64_t> k = n.attr_ints("window"), s = n.attr_ints("strides");
  std::vector<int64_t> p = n.attr_ints("padding");
  if (in.rank() != 4 || out.rank() != 4 || k.size() != 2 || s.size() != 2 || p.size() != 4 ||
      in.dim(0) != out.dim(0) || in.dim(1) != out.dim(1))
    return Unsupported(n, "inconsistent pooling shapes or attributes");
  bool include = n.has_attr("count_include_pad") && n.attr_int("count_include_pad") != 0;
  return PoolGeometry{in.dim(0),  in.dim(1), in.dim(2), in.dim(3), out.dim(2),
                      out.dim(3), k[0],      k[1],      s[0],      s[1],
                      p[0],       p[1],      p[2],      p[3],      include};
}

// Maximum over the window's real elements (padding never wins); NaN propagates; a window with no
// real element gives -inf.
// Sum over the window's real elements divided by Divisor().
absl::StatusOr<Kernel> Pool(const ir::Node& n, OperandTypes types) {
  DType in_t = types[0].dtype, out_t = n.type().dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, in_t, kFloatTypes, "operand"));
  KILN_ASSIGN_OR_RETURN(PoolGeometry geo, Geometry(n, types[0].shape, n.type().shape));
  bool is_max = n.opcode() == Opcode::kMaxPool2d;
  int x = 0, y = ResultSlot(n);
  return Kernel([=](Buffers ctx) {
    const void* in = In(ctx, x);
    for (int64_t pl = 0; pl < geo.planes(); ++pl)
      for (int64_t oy = 0; oy < geo.oh; ++oy)
        for (int64_t ox = 0; ox < geo.ow; ++ox) {
          double r;
          if (is_max) {
            int64_t at = geo.ArgMax(in, in_t, pl, oy, ox);
            r = at < 0 ? -std::numeric_limits<double>::infinity() : LoadAsDouble(in, in_t, at);
          } else {
            int64_t y0, y1, x0, x1;
            geo.Window(oy, ox, y0, y1, x0, x1);
            double sum = 0;
            for (int64_t iy = y0; iy < y1; ++iy)
              for (int64_t ix = x0; ix < x1; ++ix)
                sum += LoadAsDouble(in, in_t, geo.in_at(pl, iy, ix));
            int64_t div = geo.Divisor(oy, ox);
            r = div > 0 ? sum / static_cast<double>(div) : 0.0;
          }
          StoreFromDouble(Out(ctx, y), out_t, geo.out_at(pl, oy, ox), r);
        }
  });
}

// Operands input, grad_out. Each output gradient goes to its window's first maximum (row-major);
// overlapping windows add up.
// Operand grad_out; each output gradient is spread as g / Divisor() over the window's real
// elements: the exact gradient of avg_pool2d.
absl::StatusOr<Kernel> PoolGrad(const ir::Node& n, OperandTypes types) {
  bool is_max = n.opcode() == Opcode::kMaxPool2dGrad;
  int go_operand = is_max ? 1 : 0;
  const Shape& go_shape = types[go_operand].shape;
  DType go_t = types[go_operand].dtype, out_t = n.type().dtype;
  DType in_t = types[0].dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, go_t, kFloatTypes, "grad_out"));
  KILN_RETURN_IF_ERROR(CheckDType(n, in_t, kFloatTypes, "input"));
  KILN_ASSIGN_OR_RETURN(PoolGeometry geo, Geometry(n, n.type().shape, go_shape));
  int x = 0, go = go_operand, y = ResultSlot(n);
  int64_t count = n.type().shape.num_elements();
  return Kernel([=, acc = std::vector<double>(count)](Buffers ctx) mutable {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t pl = 0; pl < geo.planes(); ++pl)
      for (int64_t oy = 0; oy < geo.oh; ++oy)
        for (int64_t ox = 0; ox < geo.ow; ++ox) {
          double grad = LoadAsDouble(In(ctx, go), go_t, geo.out_at(pl, oy, ox));
          if (is_max) {
            int64_t at = geo.ArgMax(In(ctx, x), in_t, pl, oy, ox);
            if (at >= 0) acc[at] += grad;
            continue;
          }
          int64_t div = geo.Divisor(oy, ox);
          if (div == 0) continue;
          int64_t y0, y1, x0, x1;
          geo.Window(oy, ox, y0, y1, x0, x1);
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix)
              acc[geo.in_at(pl, iy, ix)] += grad / static_cast<double>(div);
        }
    for (int64_t e = 0; e < count; ++e) StoreFromDouble(Out(ctx, y), out_t, e, acc[e]);
  });
}

}  // namespace

absl::StatusOr<Kernel> MakePoolingKernel(const ir::Node& n, OperandTypes types) {
  if (n.opcode() == Opcode::kMaxPool2d || n.opcode() == Opcode::kAvgPool2d) return Pool(n, types);
  return PoolGrad(n, types);
}

}  // namespace kiln::eval
