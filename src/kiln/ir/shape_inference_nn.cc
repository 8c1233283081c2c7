// Shape and dtype inference for contractions (dot_general, conv2d and its gradients), 2-D pooling
// and composite NN ops. Dispatch and the remaining families are in shape_inference.cc.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/internal/shape_rules.h"
#include "kiln/ir/op_traits.h"
#include "kiln/ir/shape_inference.h"

namespace kiln::ir::internal {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

absl::StatusOr<Type> InferDotGeneral(const RuleContext& c) {
  KILN_RETURN_IF_ERROR(c.RequireNumeric(0));
  KILN_RETURN_IF_ERROR(c.RequireSameDType(0, 1));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> lb, c.Ints("lhs_batch"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> rb, c.Ints("rhs_batch"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> lc, c.Ints("lhs_contracting"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> rc, c.Ints("rhs_contracting"));
  if (lb.size() != rb.size())
    return c.Error("lhs_batch " + IntsToString(lb) + " and rhs_batch " + IntsToString(rb) +
                   " differ in length");
  if (lc.size() != rc.size())
    return c.Error("lhs_contracting " + IntsToString(lc) + " and rhs_contracting " +
                   IntsToString(rc) + " differ in length");
  // Each side's batch + contracting dims must be distinct and in range.
  for (int side = 0; side < 2; ++side) {
    const std::vector<int64_t>& b = side == 0 ? lb : rb;
    const std::vector<int64_t>& k = side == 0 ? lc : rc;
    std::set<int64_t> seen;
    for (const std::vector<int64_t>* list : {&b, &k})
      for (int64_t d : *list) {
        if (d < 0 || d >= c.rank(side))
          return c.Error(std::string(side == 0 ? "lhs " : "rhs ") + "dimension " + S(d) +
                         " out of range for " + c.T(side));
        if (!seen.insert(d).second)
          return c.Error(std::string(side == 0 ? "lhs " : "rhs ") + "dimension " + S(d) +
                         " is used twice in batch/contracting dims of " + c.T(side));
      }
  }
  for (size_t i = 0; i < lb.size(); ++i) {
    int64_t a = c.shape(0).dim(static_cast<int>(lb[i])),
            b = c.shape(1).dim(static_cast<int>(rb[i]));
    if (a != b)
      return c.Error("batch dimension sizes differ: lhs " + c.T(0) + " dim " + S(lb[i]) + " is " +
                     S(a) + ", rhs " + c.T(1) + " dim " + S(rb[i]) + " is " + S(b));
  }
  for (size_t i = 0; i < lc.size(); ++i) {
    int64_t a = c.shape(0).dim(static_cast<int>(lc[i])),
            b = c.shape(1).dim(static_cast<int>(rc[i]));
    if (a != b)
      return c.Error("contracting dimension sizes differ: lhs " + c.T(0) + " dim " + S(lc[i]) +
                     " is " + S(a) + ", rhs " + c.T(1) + " dim " + S(rc[i]) + " is " + S(b));
  }
  std::vector<int64_t> dims;
  for (int64_t d : lb) dims.push_back(c.shape(0).dim(static_cast<int>(d)));
  for (int side = 0; side < 2; ++side) {
    const std::vector<int64_t>& b = side == 0 ? lb : rb;
    const std::vector<int64_t>& k = side == 0 ? lc : rc;
    for (int d = 0; d < c.rank(side); ++d) {
      bool used = std::find(b.begin(), b.end(), d) != b.end() ||
                  std::find(k.begin(), k.end(), d) != k.end();
      if (!used) dims.push_back(c.shape(side).dim(d));
    }
  }
  return Type{c.in(0).dtype, Shape(dims)};
}

struct ConvAttrs {
  std::vector<int64_t> strides, padding, dilation;
  int64_t groups;
};

absl::StatusOr<ConvAttrs> ReadConvAttrs(const RuleContext& c) {
  ConvAttrs a;
  KILN_ASSIGN_OR_RETURN(a.strides, c.IntsOfSize("strides", 2, 1));
  KILN_ASSIGN_OR_RETURN(a.padding, c.IntsOfSize("padding", 4, 0));
  KILN_ASSIGN_OR_RETURN(a.dilation, c.IntsOfSize("dilation", 2, 1));
  KILN_ASSIGN_OR_RETURN(a.groups, c.Int("groups"));
  if (a.groups < 1) return c.Error("attribute 'groups' must be >= 1, got " + S(a.groups));
  return a;
}

// A [4] shape attribute with positive entries (input_shape, filter_shape).
absl::StatusOr<Shape> ShapeAttr4(const RuleContext& c, const std::string& attr) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, c.IntsOfSize(attr, 4, 1));
  return Shape(v);
}

// The conv2d forward output shape for input NCHW and filter OIHW, or an error naming both.
absl::StatusOr<Shape> ConvForwardShape(const RuleContext& c, const Shape& in, const Shape& filt,
                                       const ConvAttrs& a) {
  std::string both = "input [N,C,H,W] " + in.ToString() + ", filter [O,I,kH,kW] " + filt.ToString();
  if (in.rank() != 4 || filt.rank() != 4) return c.Error("expected rank-4 " + both);
  if (in.dim(1) % a.groups != 0)
    return c.Error("input channels " + S(in.dim(1)) + " not divisible by groups " + S(a.groups) +
                   " (" + both + ")");
  if (filt.dim(0) % a.groups != 0)
    return c.Error("output channels " + S(filt.dim(0)) + " not divisible by groups " + S(a.groups) +
                   " (" + both + ")");
  if (filt.dim(1) != in.dim(1) / a.groups)
    return c.Error("filter in-channels " + S(filt.dim(1)) +
                   " != input channels / groups = " + S(in.dim(1) / a.groups) + " (" + both + ")");
  if (filt.dim(2) < 1 || filt.dim(3) < 1) return c.Error("empty filter window (" + both + ")");
  int64_t ho = WindowOutputSize(in.dim(2), filt.dim(2), a.strides[0], a.padding[0], a.padding[1],
                                a.dilation[0]);
  int64_t wo = WindowOutputSize(in.dim(3), filt.dim(3), a.strides[1], a.padding[2], a.padding[3],
                                a.dilation[1]);
  if (ho < 1 || wo < 1)
    return c.Error("dilated filter window is larger than the padded input (" + both + ", padding " +
                   IntsToString(a.padding) + ", dilation " + IntsToString(a.dilation) + ")");
  return Shape{in.dim(0), filt.dim(0), ho, wo};
}

absl::StatusOr<Type> InferConv(const RuleContext& c) {
  KILN_RETURN_IF_ERROR(c.RequireFloat(0));
  KILN_RETURN_IF_ERROR(c.RequireSameDType(0, 1));
  KILN_ASSIGN_OR_RETURN(ConvAttrs a, ReadConvAttrs(c));
  DType dt = c.in(0).dtype;
  switch (c.op()) {
    case Opcode::kConv2d: {
      KILN_ASSIGN_OR_RETURN(Shape out, ConvForwardShape(c, c.shape(0), c.shape(1), a));
      return Type{dt, out};
    }
    case Opcode::kConv2dBackwardInput: {
      // ---- conv2d_backward_input ----  operands: grad_out, filter
      KILN_ASSIGN_OR_RETURN(Shape in, ShapeAttr4(c, "input_shape"));
      KILN_ASSIGN_OR_RETURN(Shape out, ConvForwardShape(c, in, c.shape(1), a));
      if (out != c.shape(0))
        return c.Error("grad_out " + c.T(0) + " does not match the conv2d output " +
                       out.ToString() + " for input_shape " + in.ToString() + " and filter " +
                       c.T(1));
      return Type{dt, in};
    }
    default: {
      // ---- conv2d_backward_filter ----  operands: input, grad_out
      KILN_ASSIGN_OR_RETURN(Shape filt, ShapeAttr4(c, "filter_shape"));
      KILN_ASSIGN_OR_RETURN(Shape out, ConvForwardShape(c, c.shape(0), filt, a));
      if (out != c.shape(1))
        return c.Error("grad_out " + c.T(1) + " does not match the conv2d output " +
                       out.ToString() + " for input " + c.T(0) + " and filter_shape " +
                       filt.ToString());
      return Type{dt, filt};
    }
  }
}

// ---- quantize, quantized_dot, quantized_conv2d ----
absl::Status RequireDType(const RuleContext& c, int i, DType want, const std::string& what) {
  if (c.in(i).dtype == want) return absl::OkStatus();
  return c.Error(what + " must be " + std::string(DTypeName(want)) + ", got " + c.T(i));
}

// The per-output-channel scale operand: f32[channels].
absl::Status RequireScale(const RuleContext& c, int i, int64_t channels) {
  KILN_RETURN_IF_ERROR(RequireDType(c, i, DType::kF32, "scale"));
  if (c.rank(i) != 1 || c.shape(i).dim(0) != channels)
    return c.Error("scale " + c.T(i) + " must be f32[" + S(channels) +
                   "] (one per output channel)");
  return absl::OkStatus();
}

// The int32 accumulator must hold any sum of `terms` products of two s8 values in [-127, 127].
absl::Status RequireInt32Sum(const RuleContext& c, int64_t terms) {
  constexpr int64_t kMaxTerms = 2147483647 / (127 * 127);  // 133144
  if (terms <= kMaxTerms) return absl::OkStatus();
  return c.Error("a sum of " + S(terms) + " int8 products may overflow the int32 accumulator (at " +
                 "most " + S(kMaxTerms) + ")");
}

absl::StatusOr<Type> InferQuantized(const RuleContext& c) {
  if (c.op() == Opcode::kQuantize) {
    KILN_RETURN_IF_ERROR(RequireDType(c, 0, DType::kF32, "operand"));
    KILN_ASSIGN_OR_RETURN(double scale, c.Float("scale"));
    if (!(scale > 0) || !std::isfinite(scale) || !std::isfinite(static_cast<float>(scale)) ||
        static_cast<float>(scale) == 0.f)
      return c.Error("attribute 'scale' must be a positive finite f32, got " +
                     std::to_string(scale));
    return Type{DType::kS8, c.shape(0)};
  }
  KILN_RETURN_IF_ERROR(RequireDType(c, 0, DType::kS8, "input"));
  KILN_RETURN_IF_ERROR(RequireDType(c, 1, DType::kS8, "weights"));
  if (c.op() == Opcode::kQuantizedConv2d) {
    KILN_ASSIGN_OR_RETURN(ConvAttrs a, ReadConvAttrs(c));
    KILN_ASSIGN_OR_RETURN(Shape out, ConvForwardShape(c, c.shape(0), c.shape(1), a));
    KILN_RETURN_IF_ERROR(RequireScale(c, 2, c.shape(1).dim(0)));
    KILN_RETURN_IF_ERROR(
        RequireInt32Sum(c, c.shape(1).dim(1) * c.shape(1).dim(2) * c.shape(1).dim(3)));
    return Type{DType::kF32, out};
  }
  // quantized_dot: x[..., K] x w[K, N].
  if (c.rank(0) < 1 || c.rank(1) != 2)
    return c.Error("expected x [..., K] and w [K, N], got " + c.T(0) + " and " + c.T(1));
  const int64_t k = c.shape(0).dim(c.rank(0) - 1);
  if (k != c.shape(1).dim(0))
    return c.Error("contracting sizes differ: x " + c.T(0) + " last dim is " + S(k) + ", w " +
                   c.T(1) + " dim 0 is " + S(c.shape(1).dim(0)));
  KILN_RETURN_IF_ERROR(RequireScale(c, 2, c.shape(1).dim(1)));
  KILN_RETURN_IF_ERROR(RequireInt32Sum(c, k));
  std::vector<int64_t> dims = c.shape(0).dims();
  dims.back() = c.shape(1).dim(1);
  return Type{DType::kF32, Shape(dims)};
}

struct PoolAttrs {
  std::vector<int64_t> window, strides, padding;
};

absl::StatusOr<PoolAttrs> ReadPoolAttrs(const RuleContext& c) {
  PoolAttrs a;
  KILN_ASSIGN_OR_RETURN(a.window, c.IntsOfSize("window", 2, 1));
  KILN_ASSIGN_OR_RETURN(a.strides, c.IntsOfSize("strides", 2, 1));
  KILN_ASSIGN_OR_RETURN(a.padding, c.IntsOfSize("padding", 4, 0));
  // Every window must overlap the input: padding never fills a whole window.
  for (int i = 0; i < 4; ++i)
    if (a.padding[i] >= a.window[i / 2])
      return c.Error("padding " + IntsToString(a.padding) + " must be smaller than the window " +
                     IntsToString(a.window));
  if (c.op() == Opcode::kAvgPool2d || c.op() == Opcode::kAvgPool2dGrad)
    KILN_RETURN_IF_ERROR(c.IntInRange("count_include_pad", 0, 1).status());
  return a;
}

absl::StatusOr<Shape> PoolForwardShape(const RuleContext& c, const Shape& in, const PoolAttrs& a) {
  if (in.rank() != 4) return c.Error("expected a rank-4 NCHW input, got " + in.ToString());
  int64_t ho =
      WindowOutputSize(in.dim(2), a.window[0], a.strides[0], a.padding[0], a.padding[1], 1);
  int64_t wo =
      WindowOutputSize(in.dim(3), a.window[1], a.strides[1], a.padding[2], a.padding[3], 1);
  if (ho < 1 || wo < 1)
    return c.Error("window " + IntsToString(a.window) + " is larger than the padded input " +
                   in.ToString() + " (padding " + IntsToString(a.padding) + ")");
  return Shape{in.dim(0), in.dim(1), ho, wo};
}

}  // namespace

absl::StatusOr<Type> InferContraction(const RuleContext& c) {
  if (c.op() == Opcode::kDotGeneral) return InferDotGeneral(c);
  if (OpTraits(c.op()).family == KernelFamily::kQuantized) return InferQuantized(c);
  return InferConv(c);
}

absl::StatusOr<Type> InferPooling(const RuleContext& c) {
  KILN_ASSIGN_OR_RETURN(PoolAttrs a, ReadPoolAttrs(c));
  switch (c.op()) {
    case Opcode::kMaxPool2d:
    case Opcode::kAvgPool2d: {
      if (c.op() == Opcode::kAvgPool2d)
        KILN_RETURN_IF_ERROR(c.RequireFloat(0));
      else
        KILN_RETURN_IF_ERROR(c.RequireNumeric(0));
      KILN_ASSIGN_OR_RETURN(Shape out, PoolForwardShape(c, c.shape(0), a));
      return Type{c.in(0).dtype, out};
    }
    case Opcode::kMaxPool2dGrad: {
      // ---- max_pool2d_grad ----  operands: input, grad_out
      KILN_RETURN_IF_ERROR(c.RequireFloat(0));
      KILN_RETURN_IF_ERROR(c.RequireSameDType(0, 1));
      KILN_ASSIGN_OR_RETURN(Shape out, PoolForwardShape(c, c.shape(0), a));
      if (out != c.shape(1))
        return c.Error("grad_out " + c.T(1) + " does not match the pooled output " +
                       out.ToString() + " of input " + c.T(0));
      return c.in(0);
    }
    default: {
      // ---- avg_pool2d_grad ----  operand: grad_out
      KILN_RETURN_IF_ERROR(c.RequireFloat(0));
      KILN_ASSIGN_OR_RETURN(std::vector<int64_t> in, c.IntsOfSize("input_shape", 4, 1));
      KILN_ASSIGN_OR_RETURN(Shape out, PoolForwardShape(c, Shape(in), a));
      if (out != c.shape(0))
        return c.Error("grad_out " + c.T(0) + " does not match the pooled output " +
                       out.ToString() + " of input_shape " + IntsToString(in));
      return Type{c.in(0).dtype, Shape(in)};
    }
  }
}

absl::StatusOr<Type> InferComposite(const RuleContext& c) {
  switch (c.op()) {
    case Opcode::kSoftmax:
    case Opcode::kLogSoftmax: {
      KILN_RETURN_IF_ERROR(c.RequireFloat(0));
      KILN_RETURN_IF_ERROR(c.RequireMinRank(0, 1));
      KILN_RETURN_IF_ERROR(c.Axis("axis", c.rank(0)).status());
      return c.in(0);
    }
    case Opcode::kLayerNorm:
    case Opcode::kRmsNorm: {
      KILN_RETURN_IF_ERROR(c.RequireFloat(0));
      KILN_RETURN_IF_ERROR(c.RequireMinRank(0, 1));
      KILN_ASSIGN_OR_RETURN(double eps, c.Float("epsilon"));
      if (!(eps >= 0))
        return c.Error("attribute 'epsilon' must be >= 0, got " + std::to_string(eps));
      int64_t d = c.shape(0).dim(c.rank(0) - 1);
      for (int i = 1; i < c.num_operands(); ++i) {
        KILN_RETURN_IF_ERROR(c.RequireSameDType(0, i));
        if (c.shape(i) != Shape{d})
          return c.Error(std::string(i == 1 ? "gamma " : "beta ") + c.T(i) + " must be [" + S(d) +
                         "] to match the last dim of x " + c.T(0));
      }
      return c.in(0);
    }
    case Opcode::kAttention: {
      // ---- attention ----  q[...,Sq,D] k[...,Sk,D] v[...,Sk,Dv] -> [...,Sq,Dv]
      KILN_RETURN_IF_ERROR(c.RequireFloat(0));
      KILN_RETURN_IF_ERROR(c.RequireSameDType(0, 1));
      KILN_RETURN_IF_ERROR(c.RequireSameDType(0, 2));
      KILN_RETURN_IF_ERROR(c.IntInRange("causal", 0, 1).status());
      KILN_RETURN_IF_ERROR(c.Float("scale").status());
      std::string all = "q " + c.T(0) + ", k " + c.T(1) + ", v " + c.T(2);
      int r = c.rank(0);
      if (r < 2 || c.rank(1) != r || c.rank(2) != r)
        return c.Error("q, k and v must have the same rank >= 2 (" + all + ")");
      for (int i = 0; i < r - 2; ++i)
        if (c.shape(1).dim(i) != c.shape(0).dim(i) || c.shape(2).dim(i) != c.shape(0).dim(i))
          return c.Error("batch dims of q, k and v differ (" + all + ")");
      if (c.shape(1).dim(r - 1) != c.shape(0).dim(r - 1))
        return c.Error("head dim D of q and k differ (" + all + ")");
      if (c.shape(1).dim(r - 2) != c.shape(2).dim(r - 2))
        return c.Error("sequence length Sk of k and v differ (" + all + ")");
      std::vector<int64_t> dims = c.shape(0).dims();
      dims[r - 1] = c.shape(2).dim(r - 1);
      return Type{c.in(0).dtype, Shape(dims)};
    }
    default: {
      // ---- cross_entropy ----  logits[...,C] (float), labels[...] (s32/s64) -> [...]
      KILN_RETURN_IF_ERROR(c.RequireFloat(0));
      KILN_RETURN_IF_ERROR(c.RequireMinRank(0, 1));
      KILN_RETURN_IF_ERROR(c.RequireIndex(1, "labels"));
      std::vector<int64_t> dims(c.shape(0).dims().begin(), c.shape(0).dims().end() - 1);
      if (c.shape(1) != Shape(dims))
        return c.Error("labels " + c.T(1) + " must have shape " + IntsToString(dims) + " (logits " +
                       c.T(0) + " without its class dim)");
      return Type{c.in(0).dtype, Shape(dims)};
    }
  }
}

}  // namespace kiln::ir::internal
