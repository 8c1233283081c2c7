// One VJP rule per differentiable op (see vjp_rules.h for the conventions), then the dispatch.
// Rules may assume at least one operand is wanted; unary rules therefore build operand 0.
#include "kiln/autodiff/vjp_rules.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kiln/autodiff/decompositions.h"
#include "kiln/autodiff/internal/vjp_helpers.h"

namespace kiln::autodiff {
namespace {

using absl::StatusOr;
using internal::BroadcastReduced;
using internal::Zero;
using internal::Zeros;
using ir::Value;

StatusOr<Cotangents> AbsVjp(const VjpArgs& a) {
  return Cotangents{a.cotangent * ir::Sign(a.operands[0])};
}

StatusOr<Cotangents> AddVjp(const VjpArgs& a) {
  Cotangents c(2);
  if (a.wanted[0]) c[0] = a.cotangent;
  if (a.wanted[1]) c[1] = a.cotangent;
  return c;
}

StatusOr<Cotangents> AllGatherVjp(const VjpArgs& a) {
  return Cotangents{
      ir::ReduceScatter(a.cotangent, a.node.attr_int("dimension"), a.node.attr_int("replicas"))};
}

StatusOr<Cotangents> AllReduceVjp(const VjpArgs& a) {
  if (a.node.attr_str("reduction") != "sum") {
    return absl::UnimplementedError("all_reduce: no VJP for reduction '" +
                                    a.node.attr_str("reduction") + "'");
  }
  return Cotangents{ir::AllReduce(a.cotangent)};
}

// With S = scale * q k^T (masked), P = softmax(S), O = P v:
//   dv = P^T dO, dP = dO v^T, dS = P * (dP - rowsum(dP * P)), dq = scale dS k, dk = scale dS^T q.
// Masked entries have P = 0, so they get no gradient.
StatusOr<Cotangents> AttentionVjp(const VjpArgs& a) {
  const Value &q = a.operands[0], &k = a.operands[1], &v = a.operands[2];
  const Value& g = a.cotangent;
  const double scale = a.node.attr_float("scale");
  const int nb = q.rank() - 2;
  auto dims = [nb](int64_t lc, int64_t rc) {
    ir::DotDims d;
    for (int i = 0; i < nb; ++i) {
      d.lhs_batch.push_back(i);
      d.rhs_batch.push_back(i);
    }
    d.lhs_contracting = {lc};
    d.rhs_contracting = {rc};
    return d;
  };
  Value p = ir::Softmax(AttentionScores(q, k, a.node.attr_int("causal") != 0, scale), -1);
  Cotangents c(3);
  if (a.wanted[2]) c[2] = ir::DotGeneral(p, g, dims(nb, nb));
  if (a.wanted[0] || a.wanted[1]) {
    Value dp = ir::DotGeneral(g, v, dims(nb + 1, nb + 1));
    Value row = BroadcastReduced(ir::ReduceSum(dp * p, {nb + 1}), p.shape(), {nb + 1});
    Value ds = p * (dp - row) * scale;
    if (a.wanted[0]) c[0] = ir::DotGeneral(ds, k, dims(nb + 1, nb));
    if (a.wanted[1]) c[1] = ir::DotGeneral(ds, q, dims(nb, nb));
  }
  return c;
}

StatusOr<Cotangents> AvgPool2dVjp(const VjpArgs& a) {
  return Cotangents{
      ir::AvgPool2dGrad(a.cotangent, a.operands[0].shape(), internal::PoolOptionsOf(a.node))};
}

// avg_pool2d_grad is the transpose of avg_pool2d (a linear map), so its transpose is avg_pool2d.
StatusOr<Cotangents> AvgPool2dGradVjp(const VjpArgs& a) {
  return Cotangents{ir::AvgPool2d(a.cotangent, internal::PoolOptionsOf(a.node))};
}

// Sum over the output dims the operand does not have and over its stretched size-1 dims.
StatusOr<Cotangents> BroadcastInDimVjp(const VjpArgs& a) {
  const Value& x = a.operands[0];
  const std::vector<int64_t>& bd = a.node.attr_ints("broadcast_dimensions");
  const Shape out = a.out.shape();  // a copy: the node list moves as nodes are added
  std::vector<bool> reduce(out.rank(), true);
  for (size_t i = 0; i < bd.size(); ++i)
    reduce[bd[i]] = x.shape().dim(static_cast<int>(i)) == 1 && out.dim(bd[i]) != 1;
  std::vector<int64_t> dims;
  for (int j = 0; j < out.rank(); ++j)
    if (reduce[j]) dims.push_back(j);
  Value g = dims.empty() ? a.cotangent : ir::ReduceSum(a.cotangent, dims);
  return Cotangents{internal::ReshapeIfNeeded(g, x.shape())};
}

StatusOr<Cotangents> ConcatenateVjp(const VjpArgs& a) {
  const int64_t dim = a.node.attr_int("dimension");
  const Shape out = a.out.shape();  // a copy: the node list moves as nodes are added
  Cotangents c(a.operands.size());
  int64_t offset = 0;
  for (size_t i = 0; i < a.operands.size(); ++i) {
    const int64_t n = a.operands[i].dim(static_cast<int>(dim));
    if (a.wanted[i] && n > 0) {
      std::vector<int64_t> start(out.rank(), 0), limit = out.dims();
      start[dim] = offset;
      limit[dim] = offset + n;
      c[i] = ir::Slice(a.cotangent, start, limit);
    }
    offset += n;
  }
  return c;
}

StatusOr<Cotangents> Conv2dVjp(const VjpArgs& a) {
  const Value &x = a.operands[0], &w = a.operands[1];
  const ir::Conv2dOptions opts = internal::ConvOptionsOf(a.node);
  Cotangents c(2);
  if (a.wanted[0]) c[0] = ir::Conv2dBackwardInput(a.cotangent, w, x.shape(), opts);
  if (a.wanted[1]) c[1] = ir::Conv2dBackwardFilter(x, a.cotangent, w.shape(), opts);
  return c;
}

// dW = F(x, dy) is bilinear with <C, F(x, dy)> = <conv2d(x, C), dy>.
StatusOr<Cotangents> Conv2dBackwardFilterVjp(const VjpArgs& a) {
  const Value &x = a.operands[0], &dy = a.operands[1];
  const ir::Conv2dOptions opts = internal::ConvOptionsOf(a.node);
  Cotangents c(2);
  if (a.wanted[0]) c[0] = ir::Conv2dBackwardInput(dy, a.cotangent, x.shape(), opts);
  if (a.wanted[1]) c[1] = ir::Conv2d(x, a.cotangent, opts);
  return c;
}

// dx = B(dy, W) is bilinear with <C, B(dy, W)> = <conv2d(C, W), dy>.
StatusOr<Cotangents> Conv2dBackwardInputVjp(const VjpArgs& a) {
  const Value &dy = a.operands[0], &w = a.operands[1];
  const ir::Conv2dOptions opts = internal::ConvOptionsOf(a.node);
  Cotangents c(2);
  if (a.wanted[0]) c[0] = ir::Conv2d(a.cotangent, w, opts);
  if (a.wanted[1]) c[1] = ir::Conv2dBackwardFilter(a.cotangent, dy, w.shape(), opts);
  return c;
}

StatusOr<Cotangents> ConvertVjp(const VjpArgs& a) {
  const Value& x = a.operands[0];
  if (!IsFloating(x.dtype())) return Cotangents(1);
  return Cotangents{ir::Convert(a.cotangent, x.dtype())};
}

StatusOr<Cotangents> CosVjp(const VjpArgs& a) {
  return Cotangents{-(a.cotangent * ir::Sin(a.operands[0]))};
}

// d logits = (softmax(logits) - onehot(labels)) * g; labels are integers (no cotangent). Rows
// with an out-of-range label have a constant loss of 0, hence a zero cotangent.
StatusOr<Cotangents> CrossEntropyVjp(const VjpArgs& a) {
  const Value &logits = a.operands[0], &labels = a.operands[1];
  const int64_t last = logits.rank() - 1;
  Cotangents c(2);
  if (a.wanted[0]) {
    const int64_t classes = logits.dim(static_cast<int>(last));
    Value valid = ValidLabels(labels, classes);
    Value g = ir::Select(valid, a.cotangent, Zero(a.cotangent));
    if (logits.dtype() != DType::kF32 || classes < 2) {
      Value diff = ir::Softmax(logits, last) - OneHot(labels, classes, logits.dtype());
      c[0] = diff * BroadcastReduced(g, logits.shape(), {last});
      return c;
    }
    // f32: softmax(x) = exp(x - lse(x)), with each row's log-sum-exp recovered from the forward's
    // output (loss = lse - x[label]) plus the label's logit. The gradient is then one loop-fused
    // pass over the logits (read once, written once, in place when they die here) instead of a
    // softmax kernel and a second [rows, classes] buffer. The label's logit is written as a
    // masked row sum, sum(select(class == label, logits, 0)), not a gather from the flattened
    // logits, so that a vocabulary-split (tensor-parallel) logits tensor stays split: the sum
    // partitions into a local sum and one all-reduce of a value per row. Where the logits are
    // whole, the algebraic simplifier turns that sum back into a gather of one logit per row
    // (docs/compiler.md), so no pass over the logits is spent on it. lse is off by at most an f32
    // rounding of the loss (a relative error of ~1e-7 in each probability). Rows with an invalid
    // label have a meaningless lse (their exp may overflow): they are zeroed by the final select,
    // as their loss is.
    Value onehot = OneHot(labels, classes, logits.dtype());
    Value picked =
        ir::ReduceSum(ir::Select(LabelHit(labels, classes), logits, Zero(logits)), {last});
    Value lse = a.out + picked;
    Value p = ir::Exp(logits - BroadcastReduced(lse, logits.shape(), {last}));
    Value grad = (p - onehot) * BroadcastReduced(g, logits.shape(), {last});
    c[0] = ir::Select(BroadcastReduced(valid, logits.shape(), {last}), grad, Zero(grad));
  }
  return c;
}

StatusOr<Cotangents> DivVjp(const VjpArgs& a) {
  Value da = a.cotangent / a.operands[1];
  Cotangents c(2);
  if (a.wanted[0]) c[0] = da;
  if (a.wanted[1]) c[1] = -(da * a.out);
  return c;
}

// Each operand's cotangent is a dot_general of the cotangent with the other operand, contracting
// the other operand's free dims, then a transpose back into the operand's dim order.
StatusOr<Cotangents> DotGeneralVjp(const VjpArgs& a) {
  const Value &lhs = a.operands[0], &rhs = a.operands[1];
  const std::vector<int64_t>& lb = a.node.attr_ints("lhs_batch");
  const std::vector<int64_t>& rb = a.node.attr_ints("rhs_batch");
  const std::vector<int64_t>& lc = a.node.attr_ints("lhs_contracting");
  const std::vector<int64_t>& rc = a.node.attr_ints("rhs_contracting");
  auto free_dims = [](int rank, const std::vector<int64_t>& batch,
                      const std::vector<int64_t>& contracting) {
    std::vector<int64_t> f;
    for (int64_t d = 0; d < rank; ++d) {
      bool used = false;
      for (int64_t x : batch) used |= x == d;
      for (int64_t x : contracting) used |= x == d;
      if (!used) f.push_back(d);
    }
    return f;
  };
  const std::vector<int64_t> lf = free_dims(lhs.rank(), lb, lc);
  const std::vector<int64_t> rf = free_dims(rhs.rank(), rb, rc);
  const int64_t nb = static_cast<int64_t>(lb.size());
  // The cotangent's dims: [batch | lhs free | rhs free].
  std::vector<int64_t> g_batch, g_lfree, g_rfree;
  for (int64_t i = 0; i < nb; ++i) g_batch.push_back(i);
  for (size_t i = 0; i < lf.size(); ++i) g_lfree.push_back(nb + static_cast<int64_t>(i));
  for (size_t i = 0; i < rf.size(); ++i)
    g_rfree.push_back(nb + static_cast<int64_t>(lf.size() + i));

  // `other`'s dims that survive the product (its contracting dims, ascending) map to the
  // operand's matching contracting dims.
  auto back = [&](const Value& prod, const std::vector<int64_t>& own_batch,
                  const std::vector<int64_t>& own_free, const std::vector<int64_t>& own_c,
                  const std::vector<int64_t>& other_c, int rank) {
    std::vector<int64_t> src;  // src[k] = operand dim of product dim k
    src.insert(src.end(), own_batch.begin(), own_batch.end());
    src.insert(src.end(), own_free.begin(), own_free.end());
    std::vector<size_t> order(other_c.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return other_c[x] < other_c[y]; });
    for (size_t i : order) src.push_back(own_c[i]);
    std::vector<int64_t> perm(rank);
    for (int k = 0; k < rank; ++k) perm[src[k]] = k;
    return internal::TransposeIfNeeded(prod, perm);
  };
  Cotangents c(2);
  if (a.wanted[0]) {
    Value prod = ir::DotGeneral(a.cotangent, rhs, {g_batch, rb, g_rfree, rf});
    c[0] = back(prod, lb, lf, lc, rc, lhs.rank());
  }
  if (a.wanted[1]) {
    Value prod = ir::DotGeneral(a.cotangent, lhs, {g_batch, lb, g_lfree, lf});
    c[1] = back(prod, rb, rf, rc, lc, rhs.rank());
  }
  return c;
}

StatusOr<Cotangents> ErfVjp(const VjpArgs& a) {
  const Value& x = a.operands[0];
  return Cotangents{a.cotangent * (ir::Exp(-(x * x)) * (2.0 / std::sqrt(M_PI)))};
}

StatusOr<Cotangents> ExpVjp(const VjpArgs& a) { return Cotangents{a.cotangent * a.out}; }

// gather clamps its indices, so the cotangent lands on the clamped rows.
StatusOr<Cotangents> GatherVjp(const VjpArgs& a) {
  const Value &table = a.operands[0], &idx = a.operands[1];
  const int64_t axis = a.node.attr_int("axis");
  ir::Builder* b = idx.builder();
  Value clamped =
      ir::Min(ir::Max(idx, b->Scalar(0, idx.dtype())),
              b->Scalar(static_cast<double>(table.dim(static_cast<int>(axis)) - 1), idx.dtype()));
  Cotangents c(2);
  c[0] = ir::ScatterAdd(Zeros(b, table.type()), clamped, a.cotangent, axis);
  return c;
}

StatusOr<Cotangents> GeluVjp(const VjpArgs& a) {
  const Value& x = a.operands[0];
  if (a.node.attr_str("approximate") == "tanh") {
    // y = x/2 (1 + tanh(u)), u = k (x + c x^3).
    const double k = std::sqrt(2.0 / M_PI), c3 = 0.044715;
    Value t = ir::Tanh((x + x * x * x * c3) * k);
    Value du = (x * x * (3.0 * c3) + 1.0) * k;
    Value d = (t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * du;
    return Cotangents{a.cotangent * d};
  }
  // y = x Phi(x): y' = Phi(x) + x phi(x).
  Value cdf = (ir::Erf(x * M_SQRT1_2) + 1.0) * 0.5;
  Value pdf = ir::Exp(x * x * -0.5) * (1.0 / std::sqrt(2.0 * M_PI));
  return Cotangents{a.cotangent * (cdf + x * pdf)};
}

// xhat = (x - mean) * rstd, y = xhat * gamma + beta over the last dim (biased variance):
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * gamma.
StatusOr<Cotangents> LayerNormVjp(const VjpArgs& a) {
  const Value &x = a.operands[0], &gamma = a.operands[1];
  const Value& g = a.cotangent;
  const int64_t last = x.rank() - 1;
  auto back = [&](Value r) { return BroadcastReduced(r, x.shape(), {last}); };
  Value centered = x - back(ir::Mean(x, {last}));
  Value rstd =
      back(ir::Rsqrt(ir::Mean(centered * centered, {last}) + a.node.attr_float("epsilon")));
  Value xhat = centered * rstd;
  Cotangents c(3);
  if (a.wanted[0]) {
    Value dxhat = g * gamma;
    c[0] = rstd *
           (dxhat - back(ir::Mean(dxhat, {last})) - xhat * back(ir::Mean(dxhat * xhat, {last})));
  }
  if (a.wanted[1]) c[1] = internal::SumLeading(g * xhat, 1);
  if (a.wanted[2]) c[2] = internal::SumLeading(g, 1);
  return c;
}

StatusOr<Cotangents> LogVjp(const VjpArgs& a) { return Cotangents{a.cotangent / a.operands[0]}; }

StatusOr<Cotangents> LogSoftmaxVjp(const VjpArgs& a) {
  const int64_t axis = a.node.attr_int("axis");
  Value sum = BroadcastReduced(ir::ReduceSum(a.cotangent, {axis}), a.out.shape(), {axis});
  return Cotangents{a.cotangent - ir::Exp(a.out) * sum};
}

// Like torch.maximum: the larger operand gets g; equal operands get g / 2 each.
StatusOr<Cotangents> MaxVjp(const VjpArgs& a) {
  const Value &x = a.operands[0], &y = a.operands[1];
  const Value& g = a.cotangent;
  Value dx = ir::Select(ir::Gt(x, y), g, ir::Select(ir::Eq(x, y), g * 0.5, Zero(g)));
  Cotangents c(2);
  if (a.wanted[0]) c[0] = dx;
  if (a.wanted[1]) c[1] = g - dx;
  return c;
}

StatusOr<Cotangents> MaxPool2dVjp(const VjpArgs& a) {
  return Cotangents{ir::MaxPool2dGrad(a.operands[0], a.cotangent, internal::PoolOptionsOf(a.node))};
}

// Piecewise constant in the pooled input (zero cotangent). Linear in grad_out, but its transpose
// (pick each window's first-max element of the cotangent) has no primitive yet.
StatusOr<Cotangents> MaxPool2dGradVjp(const VjpArgs& a) {
  if (a.wanted[1]) {
    return absl::UnimplementedError(
        "max_pool2d_grad: the VJP with respect to grad_out (double-backward through "
        "max_pool2d) is not implemented");
  }
  return Cotangents(2);
}

// Like torch.minimum: the smaller operand gets g; equal operands get g / 2 each.
StatusOr<Cotangents> MinVjp(const VjpArgs& a) {
  const Value &x = a.operands[0], &y = a.operands[1];
  const Value& g = a.cotangent;
  Value dx = ir::Select(ir::Lt(x, y), g, ir::Select(ir::Eq(x, y), g * 0.5, Zero(g)));
  Cotangents c(2);
  if (a.wanted[0]) c[0] = dx;
  if (a.wanted[1]) c[1] = g - dx;
  return c;
}

StatusOr<Cotangents> MulVjp(const VjpArgs& a) {
  Cotangents c(2);
  if (a.wanted[0]) c[0] = a.cotangent * a.operands[1];
  if (a.wanted[1]) c[1] = a.cotangent * a.operands[0];
  return c;
}

StatusOr<Cotangents> NegVjp(const VjpArgs& a) { return Cotangents{-a.cotangent}; }

// The operand's elements sit at low + i * (interior + 1): a strided slice picks them back out.
StatusOr<Cotangents> PadVjp(const VjpArgs& a) {
  const Value& x = a.operands[0];
  const std::vector<int64_t>& low = a.node.attr_ints("low");
  const std::vector<int64_t>& interior = a.node.attr_ints("interior");
  if (x.shape().num_elements() == 0) return Cotangents(1);
  std::vector<int64_t> start(low), limit(x.rank()), stride(x.rank());
  for (int d = 0; d < x.rank(); ++d) {
    stride[d] = interior[d] + 1;
    limit[d] = low[d] + (x.dim(d) - 1) * stride[d] + 1;
  }
  return Cotangents{ir::Slice(a.cotangent, start, limit, stride)};
}

// As torch.pow: d/da = b a^(b-1) (0 where b == 0); d/db = a^b log(a) (0 where a == 0, b >= 0).
StatusOr<Cotangents> PowVjp(const VjpArgs& a) {
  const Value &x = a.operands[0], &y = a.operands[1];
  const Value& g = a.cotangent;
  Value zero = Zero(g);
  Cotangents c(2);
  if (a.wanted[0]) {
    c[0] = ir::Select(ir::Eq(y, zero), zero, g * y * ir::Pow(x, y - 1.0));
  }
  if (a.wanted[1]) {
    Value skip = ir::LogicalAnd(ir::Eq(x, zero), ir::Ge(y, zero));
    c[1] = ir::Select(skip, zero, g * a.out * ir::Log(x));
  }
  return c;
}

// Like torch.amax: g is divided evenly among the elements equal to the maximum.
StatusOr<Cotangents> ReduceMaxVjp(const VjpArgs& a) {
  const Value& x = a.operands[0];
  const std::vector<int64_t>& dims = a.node.attr_ints("dimensions");
  Value hit = ir::Eq(x, BroadcastReduced(a.out, x.shape(), dims));
  Value mask = ir::Select(hit, x.builder()->Scalar(1.0, x.dtype()), Zero(x));
  Value share = a.cotangent / ir::ReduceSum(mask, dims);
  return Cotangents{mask * BroadcastReduced(share, x.shape(), dims)};
}

// Like torch.amin: g is divided evenly among the elements equal to the minimum.
StatusOr<Cotangents> ReduceMinVjp(const VjpArgs& a) { return ReduceMaxVjp(a); }

StatusOr<Cotangents> ReduceScatterVjp(const VjpArgs& a) {
  return Cotangents{
      ir::AllGather(a.cotangent, a.node.attr_int("dimension"), a.node.attr_int("replicas"))};
}

StatusOr<Cotangents> ReduceSumVjp(const VjpArgs& a) {
  return Cotangents{
      BroadcastReduced(a.cotangent, a.operands[0].shape(), a.node.attr_ints("dimensions"))};
}

// Reads the output (relu(x) > 0 exactly when x > 0, NaN included), as PyTorch does: the
// pre-activation can die at the relu, and a matmul + bias + relu fuses into one kernel.
StatusOr<Cotangents> ReluVjp(const VjpArgs& a) {
  const Value& y = a.out;
  return Cotangents{ir::Select(ir::Gt(y, Zero(y)), a.cotangent, Zero(y))};
}

StatusOr<Cotangents> ReshapeVjp(const VjpArgs& a) {
  return Cotangents{ir::Reshape(a.cotangent, a.operands[0].shape())};
}

// xhat = x * r, r = rsqrt(mean(x^2) + eps), y = xhat * gamma:
//   dx = r * (dxhat - xhat * mean(dxhat * xhat)), dxhat = g * gamma.
StatusOr<Cotangents> RmsNormVjp(const VjpArgs& a) {
  const Value &x = a.operands[0], &gamma = a.operands[1];
  const Value& g = a.cotangent;
  const int64_t last = x.rank() - 1;
  auto back = [&](Value r) { return BroadcastReduced(r, x.shape(), {last}); };
  Value r = back(ir::Rsqrt(ir::Mean(x * x, {last}) + a.node.attr_float("epsilon")));
  Value xhat = x * r;
  Cotangents c(2);
  if (a.wanted[0]) {
    Value dxhat = g * gamma;
    c[0] = r * (dxhat - xhat * back(ir::Mean(dxhat * xhat, {last})));
  }
  if (a.wanted[1]) c[1] = internal::SumLeading(g * xhat, 1);
  return c;
}

StatusOr<Cotangents> RsqrtVjp(const VjpArgs& a) {
  return Cotangents{a.cotangent * a.out * a.out * a.out * -0.5};
}

// The operand passes g through; each update gets g at its (in-range) index, as a gather.
StatusOr<Cotangents> ScatterAddVjp(const VjpArgs& a) {
  const Value &operand = a.operands[0], &idx = a.operands[1], &updates = a.operands[2];
  const int64_t axis = a.node.attr_int("axis");
  ir::Builder* b = idx.builder();
  Cotangents c(3);
  if (a.wanted[0]) c[0] = a.cotangent;
  if (a.wanted[2]) {
    const int64_t n = operand.dim(static_cast<int>(axis));
    Value lo = b->Scalar(0, idx.dtype());
    Value hi = b->Scalar(static_cast<double>(n - 1), idx.dtype());
    Value clamped = ir::Min(ir::Max(idx, lo), hi);
    Value in_range = ir::Eq(clamped, idx);
    std::vector<int64_t> bd;
    for (int i = 0; i < idx.rank(); ++i) bd.push_back(axis + i);
    Value mask = ir::BroadcastInDim(in_range, updates.shape(), bd);
    c[2] = ir::Select(mask, ir::Gather(a.cotangent, clamped, axis), Zero(updates));
  }
  return c;
}

StatusOr<Cotangents> SelectVjp(const VjpArgs& a) {
  const Value& pred = a.operands[0];
  const Value& g = a.cotangent;
  Cotangents c(3);
  if (a.wanted[1]) c[1] = ir::Select(pred, g, Zero(g));
  if (a.wanted[2]) c[2] = ir::Select(pred, Zero(g), g);
  return c;
}

StatusOr<Cotangents> SigmoidVjp(const VjpArgs& a) {
  return Cotangents{a.cotangent * a.out * (1.0 - a.out)};
}

// y = x s(x): y' = s (1 + x (1 - s)).
StatusOr<Cotangents> SiluVjp(const VjpArgs& a) {
  const Value& x = a.operands[0];
  Value s = ir::Sigmoid(x);
  return Cotangents{a.cotangent * s * (x * (1.0 - s) + 1.0)};
}

StatusOr<Cotangents> SinVjp(const VjpArgs& a) {
  return Cotangents{a.cotangent * ir::Cos(a.operands[0])};
}

// Pads the cotangent back into place; strides become interior padding.
StatusOr<Cotangents> SliceVjp(const VjpArgs& a) {
  const Value& x = a.operands[0];
  const std::vector<int64_t>& start = a.node.attr_ints("start");
  const std::vector<int64_t>& stride = a.node.attr_ints("stride");
  const Shape out = a.out.shape();  // a copy: the node list moves as nodes are added
  if (out.num_elements() == 0) return Cotangents{Zeros(x.builder(), x.type())};
  std::vector<int64_t> high(x.rank()), interior(x.rank());
  for (int d = 0; d < x.rank(); ++d) {
    interior[d] = stride[d] - 1;
    high[d] = x.dim(d) - (start[d] + (out.dim(d) - 1) * stride[d] + 1);
  }
  return Cotangents{ir::Pad(a.cotangent, start, high, interior, 0.0)};
}

StatusOr<Cotangents> SoftmaxVjp(const VjpArgs& a) {
  const int64_t axis = a.node.attr_int("axis");
  const Value& y = a.out;
  Value dot = BroadcastReduced(ir::ReduceSum(a.cotangent * y, {axis}), y.shape(), {axis});
  return Cotangents{y * (a.cotangent - dot)};
}

StatusOr<Cotangents> SqrtVjp(const VjpArgs& a) { return Cotangents{a.cotangent * 0.5 / a.out}; }

StatusOr<Cotangents> SubVjp(const VjpArgs& a) {
  Cotangents c(2);
  if (a.wanted[0]) c[0] = a.cotangent;
  if (a.wanted[1]) c[1] = -a.cotangent;
  return c;
}

StatusOr<Cotangents> TanhVjp(const VjpArgs& a) {
  return Cotangents{a.cotangent * (1.0 - a.out * a.out)};
}

StatusOr<Cotangents> TransposeVjp(const VjpArgs& a) {
  const std::vector<int64_t>& perm = a.node.attr_ints("permutation");
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return Cotangents{ir::Transpose(a.cotangent, inverse)};
}

}  // namespace

VjpRule FindVjpRule(ir::Opcode op) {
  using ir::Opcode;
  switch (op) {
    case Opcode::kAbs:
      return &AbsVjp;
    case Opcode::kAdd:
      return &AddVjp;
    case Opcode::kAllGather:
      return &AllGatherVjp;
    case Opcode::kAllReduce:
      return &AllReduceVjp;
    case Opcode::kArgmax:
      return nullptr;  // integer result
    case Opcode::kAttention:
      return &AttentionVjp;
    case Opcode::kAvgPool2d:
      return &AvgPool2dVjp;
    case Opcode::kAvgPool2dGrad:
      return &AvgPool2dGradVjp;
    case Opcode::kBroadcastInDim:
      return &BroadcastInDimVjp;
    case Opcode::kCompare:
      return nullptr;  // bool result
    case Opcode::kConcatenate:
      return &ConcatenateVjp;
    case Opcode::kConstant:
      return nullptr;  // no operands
    case Opcode::kConv2d:
      return &Conv2dVjp;
    case Opcode::kConv2dBackwardFilter:
      return &Conv2dBackwardFilterVjp;
    case Opcode::kConv2dBackwardInput:
      return &Conv2dBackwardInputVjp;
    case Opcode::kConvert:
      return &ConvertVjp;
    case Opcode::kCos:
      return &CosVjp;
    case Opcode::kCrossEntropy:
      return &CrossEntropyVjp;
    case Opcode::kDiv:
      return &DivVjp;
    case Opcode::kDotGeneral:
      return &DotGeneralVjp;
    case Opcode::kErf:
      return &ErfVjp;
    case Opcode::kExp:
      return &ExpVjp;
    case Opcode::kGather:
      return &GatherVjp;
    case Opcode::kGelu:
      return &GeluVjp;
    case Opcode::kIota:
      return nullptr;  // no operands
    case Opcode::kLayerNorm:
      return &LayerNormVjp;
    case Opcode::kLog:
      return &LogVjp;
    case Opcode::kLogSoftmax:
      return &LogSoftmaxVjp;
    case Opcode::kLogicalAnd:
      return nullptr;  // bool/integer
    case Opcode::kLogicalNot:
      return nullptr;  // bool/integer
    case Opcode::kLogicalOr:
      return nullptr;  // bool/integer
    case Opcode::kMax:
      return &MaxVjp;
    case Opcode::kMaxPool2d:
      return &MaxPool2dVjp;
    case Opcode::kMaxPool2dGrad:
      return &MaxPool2dGradVjp;
    case Opcode::kMin:
      return &MinVjp;
    case Opcode::kMul:
      return &MulVjp;
    case Opcode::kNeg:
      return &NegVjp;
    case Opcode::kPad:
      return &PadVjp;
    case Opcode::kParameter:
      return nullptr;  // a leaf
    case Opcode::kPow:
      return &PowVjp;
    case Opcode::kQuantize:
    case Opcode::kQuantizedConv2d:
    case Opcode::kQuantizedDot:
      return nullptr;  // int8 inference ops: Grad refuses them (grad.cc)
    case Opcode::kRandomBits:
      return nullptr;  // integer seed/counter
    case Opcode::kReduceMax:
      return &ReduceMaxVjp;
    case Opcode::kReduceMin:
      return &ReduceMinVjp;
    case Opcode::kReduceScatter:
      return &ReduceScatterVjp;
    case Opcode::kReduceSum:
      return &ReduceSumVjp;
    case Opcode::kRelu:
      return &ReluVjp;
    case Opcode::kReshape:
      return &ReshapeVjp;
    case Opcode::kRmsNorm:
      return &RmsNormVjp;
    case Opcode::kRsqrt:
      return &RsqrtVjp;
    case Opcode::kScatterAdd:
      return &ScatterAddVjp;
    case Opcode::kSelect:
      return &SelectVjp;
    case Opcode::kSigmoid:
      return &SigmoidVjp;
    case Opcode::kSign:
      return nullptr;  // derivative zero almost everywhere
    case Opcode::kSilu:
      return &SiluVjp;
    case Opcode::kSin:
      return &SinVjp;
    case Opcode::kSlice:
      return &SliceVjp;
    case Opcode::kSoftmax:
      return &SoftmaxVjp;
    case Opcode::kSqrt:
      return &SqrtVjp;
    case Opcode::kSub:
      return &SubVjp;
    case Opcode::kTanh:
      return &TanhVjp;
    case Opcode::kTranspose:
      return &TransposeVjp;
  }
  return nullptr;
}

absl::StatusOr<Cotangents> Vjp(const VjpArgs& args) {
  const size_t n = args.operands.size();
  bool any = false;
  for (size_t i = 0; i < n; ++i) any |= i < args.wanted.size() && args.wanted[i];
  VjpRule rule = FindVjpRule(args.node.opcode());
  if (!any || rule == nullptr) return Cotangents(n);
  if (args.wanted.size() != n) {
    return absl::InternalError(
        absl::StrCat("Vjp: ", n, " operands but ", args.wanted.size(), " wanted flags"));
  }
  absl::StatusOr<Cotangents> c = rule(args);
  if (!c.ok()) return c.status();
  if (c->size() != n) {
    return absl::InternalError(
        absl::StrCat("VJP of ", std::string(ir::OpcodeName(args.node.opcode())), " returned ",
                     c->size(), " cotangents for ", n, " operands"));
  }
  // Integer operands and unwanted ones never carry a cotangent.
  for (size_t i = 0; i < n; ++i)
    if (!args.wanted[i] || !IsFloating(args.operands[i].dtype())) (*c)[i].reset();
  return c;
}

}  // namespace kiln::autodiff
