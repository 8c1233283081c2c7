// Reference kernels for dot_general and the conv2d family. Products accumulate in double (int64
// for integer dot_general) and round once to the output dtype.
#include <algorithm>

#include "kiln/base/status.h"
#include "kiln/eval/kernels.h"

namespace kiln::eval {
namespace {

using ir::Opcode;

// result[batch..., lhs_free..., rhs_free...] = sum over the contracting dims of lhs * rhs, with
// free dims in operand order (XLA's DotGeneral).
absl::StatusOr<Kernel> DotGeneral(const ir::Node& n, OperandTypes types) {
  const ir::Type& lt = types[0];
  const ir::Type& rt = types[1];
  DType out_t = n.type().dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, lt.dtype, kFloatTypes | kIntTypes, "lhs"));
  KILN_RETURN_IF_ERROR(CheckDType(n, rt.dtype, kFloatTypes | kIntTypes, "rhs"));
  std::vector<int64_t> lb = n.attr_ints("lhs_batch"), rb = n.attr_ints("rhs_batch");
  std::vector<int64_t> lc = n.attr_ints("lhs_contracting"), rc = n.attr_ints("rhs_contracting");
  auto free_dims = [](int rank, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    std::vector<int64_t> f;
    for (int d = 0; d < rank; ++d)
      if (std::find(a.begin(), a.end(), d) == a.end() &&
          std::find(b.begin(), b.end(), d) == b.end())
        f.push_back(d);
    return f;
  };
  std::vector<int64_t> lf = free_dims(lt.shape.rank(), lb, lc);
  std::vector<int64_t> rf = free_dims(rt.shape.rank(), rb, rc);
  std::vector<int64_t> ls = lt.shape.Strides(), rs = rt.shape.Strides();

  // For each output dim, how far one step moves in lhs and in rhs.
  std::vector<int64_t> out_dims = n.type().shape.dims();
  std::vector<int64_t> out_lstep, out_rstep;
  for (size_t k = 0; k < lb.size(); ++k) {
    out_lstep.push_back(ls[lb[k]]);
    out_rstep.push_back(rs[rb[k]]);
  }
  for (int64_t d : lf) {
    out_lstep.push_back(ls[d]);
    out_rstep.push_back(0);
  }
  for (int64_t d : rf) {
    out_lstep.push_back(0);
    out_rstep.push_back(rs[d]);
  }
  // The offsets of every contracting position in lhs and rhs, in row-major order of
  // lhs_contracting.
  std::vector<int64_t> c_dims;
  for (int64_t d : lc) c_dims.push_back(lt.shape.dim(static_cast<int>(d)));
  int64_t c_count = 1;
  for (int64_t d : c_dims) c_count *= d;
  std::vector<int64_t> c_loff(c_count), c_roff(c_count), idx;
  for (int64_t c = 0; c < c_count; ++c) {
    Unravel(c, c_dims, idx);
    int64_t lo = 0, ro = 0;
    for (size_t k = 0; k < lc.size(); ++k) {
      lo += idx[k] * ls[lc[k]];
      ro += idx[k] * rs[rc[k]];
    }
    c_loff[c] = lo;
    c_roff[c] = ro;
  }
  int64_t out_count = n.type().shape.num_elements();
  int lhs = 0, rhs = 1, y = ResultSlot(n);
  DType l_t = lt.dtype, r_t = rt.dtype;
  bool integer = IsInteger(l_t) && IsInteger(r_t);
  return Kernel([=](Buffers ctx) {
    std::vector<int64_t> oidx;
    for (int64_t o = 0; o < out_count; ++o) {
      Unravel(o, out_dims, oidx);
      int64_t lbase = 0, rbase = 0;
      for (size_t d = 0; d < oidx.size(); ++d) {
        lbase += oidx[d] * out_lstep[d];
        rbase += oidx[d] * out_rstep[d];
      }
      if (integer) {
        uint64_t acc = 0;  // wraps like the integer types do
        for (int64_t c = 0; c < c_count; ++c)
          acc += static_cast<uint64_t>(LoadAsInt64(In(ctx, lhs), l_t, lbase + c_loff[c])) *
                 static_cast<uint64_t>(LoadAsInt64(In(ctx, rhs), r_t, rbase + c_roff[c]));
        StoreFromInt64(Out(ctx, y), out_t, o, static_cast<int64_t>(acc));
      } else {
        double acc = 0;
        for (int64_t c = 0; c < c_count; ++c)
          acc += LoadAsDouble(In(ctx, lhs), l_t, lbase + c_loff[c]) *
                 LoadAsDouble(In(ctx, rhs), r_t, rbase + c_roff[c]);
        StoreFromDouble(Out(ctx, y), out_t, o, acc);
      }
    }
  });
}

// The geometry shared by conv2d and its two gradients: input [N,C,H,W], filter [O,C/groups,KH,KW],
// output [N,O,OH,OW]; output (oh, ow) reads input (oh*sh - top + kh*dh, ow*sw - left + kw*dw).
struct ConvGeometry {
  int64_t n, c, h, w;     // input
  int64_t o, cg, kh, kw;  // filter (cg = C / groups)
  int64_t oh, ow;         // output
  int64_t sh, sw, dh, dw, top, left, groups;

  int64_t in_at(int64_t b, int64_t ch, int64_t y, int64_t x) const {
    return ((b * c + ch) * h + y) * w + x;
  }
  int64_t f_at(int64_t oc, int64_t ci, int64_t y, int64_t x) const {
    return ((oc * cg + ci) * kh + y) * kw + x;
  }
  int64_t out_at(int64_t b, int64_t oc, int64_t y, int64_t x) const {
    return ((b * o + oc) * oh + y) * ow + x;
  }

  // Calls fn(input index, filter index, output index) for every tap that reads inside the input,
  // in the order output element, then input channel, then kernel row, then kernel column.
  template <typename Fn>
  void ForEachTap(Fn fn) const {
    int64_t per_group = o / groups;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t oc = 0; oc < o; ++oc) {
        int64_t first_ch = (oc / per_group) * cg;
        for (int64_t y = 0; y < oh; ++y)
          for (int64_t x = 0; x < ow; ++x)
            for (int64_t ci = 0; ci < cg; ++ci)
              for (int64_t ky = 0; ky < kh; ++ky) {
                int64_t iy = y * sh - top + ky * dh;
                if (iy < 0 || iy >= h) continue;
                for (int64_t kx = 0; kx < kw; ++kx) {
                  int64_t ix = x * sw - left + kx * dw;
                  if (ix < 0 || ix >= w) continue;
                  fn(in_at(b, first_ch + ci, iy, ix), f_at(oc, ci, ky, kx), out_at(b, oc, y, x));
                }
              }
      }
  }
};

absl::StatusOr<ConvGeometry> Geometry(const ir::Node& n, const Shape& in, const Shape& filter,
                                      const Shape& out) {
  std::vector<int64_t> s = n.attr_ints("strides"), p = n.attr_ints("padding");
  std::vector<int64_t> d = n.attr_ints("dilation");
  int64_t groups = n.attr_int("groups");
  if (in.rank() != 4 || filter.rank() != 4 || out.rank() != 4 || s.size() != 2 || p.size() != 4 ||
      d.size() != 2 || groups < 1 || out.dim(1) % groups != 0 || filter.dim(0) != out.dim(1) ||
      in.dim(1) != filter.dim(1) * groups)
    return Unsupported(n, "inconsistent conv2d shapes or attributes");
  return ConvGeometry{in.dim(0),     in.dim(1),     in.dim(2),     in.dim(3),  filter.dim(0),
                      filter.dim(1), filter.dim(2), filter.dim(3), out.dim(2), out.dim(3),
                      s[0],          s[1],          d[0],          d[1],       p[0],
                      p[2],          groups};
}

// conv2d is torch.nn.functional.conv2d (cross-correlation) with padding [top,bottom,left,right].
// The gradients walk the same taps and accumulate grad_out * filter into the input position, and
// input * grad_out into the filter position: exactly the transposes of conv2d.
absl::StatusOr<Kernel> Conv(const ir::Node& n, OperandTypes types) {
  for (int k = 0; k < 2; ++k)
    KILN_RETURN_IF_ERROR(
        CheckDType(n, types[k].dtype, kFloatTypes, "operand " + std::to_string(k)));
  KILN_RETURN_IF_ERROR(CheckDType(n, n.type().dtype, kFloatTypes, "result"));
  Opcode op = n.opcode();
  const Shape& a = types[0].shape;
  const Shape& b = types[1].shape;
  const Shape& r = n.type().shape;
  ConvGeometry geo;
  if (op == Opcode::kConv2d) {
    KILN_ASSIGN_OR_RETURN(geo, Geometry(n, a, b, r));  // input, filter -> out
  } else if (op == Opcode::kConv2dBackwardInput) {
    KILN_ASSIGN_OR_RETURN(geo, Geometry(n, r, b, a));  // grad_out, filter -> input
  } else {
    KILN_ASSIGN_OR_RETURN(geo, Geometry(n, a, r, b));  // input, grad_out -> filter
  }
  DType a_t = types[0].dtype, b_t = types[1].dtype, out_t = n.type().dtype;
  int x = 0, z = 1, y = ResultSlot(n);
  int64_t count = r.num_elements();
  return Kernel([=, acc = std::vector<double>(count)](Buffers ctx) mutable {
    std::fill(acc.begin(), acc.end(), 0.0);
    const void* A = In(ctx, x);
    const void* B = In(ctx, z);
    if (op == Opcode::kConv2d) {
      geo.ForEachTap([&](int64_t i, int64_t f, int64_t o) {
        acc[o] += LoadAsDouble(A, a_t, i) * LoadAsDouble(B, b_t, f);
      });
    } else if (op == Opcode::kConv2dBackwardInput) {
      geo.ForEachTap([&](int64_t i, int64_t f, int64_t o) {
        acc[i] += LoadAsDouble(A, a_t, o) * LoadAsDouble(B, b_t, f);
      });
    } else {
      geo.ForEachTap([&](int64_t i, int64_t f, int64_t o) {
        acc[f] += LoadAsDouble(A, a_t, i) * LoadAsDouble(B, b_t, o);
      });
    }
    for (int64_t e = 0; e < count; ++e) StoreFromDouble(Out(ctx, y), out_t, e, acc[e]);
  });
}

}  // namespace

absl::StatusOr<Kernel> MakeContractionKernel(const ir::Node& n, OperandTypes types) {
  if (n.opcode() == Opcode::kDotGeneral) return DotGeneral(n, types);
  return Conv(n, types);
}

}  // namespace kiln::eval
