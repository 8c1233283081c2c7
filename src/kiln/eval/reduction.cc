// Reference kernels for reductions. Floats accumulate in double and round once; integers
// accumulate exactly in int64 and wrap to the output width. Elements are visited in row-major
// order, so a sum's rounding is reproducible.
#include <cmath>
#include <limits>

#include "kiln/base/status.h"
#include "kiln/eval/kernels.h"
#include "kiln/ir/element_semantics.h"

namespace kiln::eval {
namespace {

using ir::Opcode;

// Maps an operand element to the output element it reduces into: the kept dims' indices, raveled.
struct ReduceMap {
  std::vector<int64_t> in_dims;
  std::vector<int64_t> kept_stride;  // per operand dim: output stride, 0 for a reduced dim

  ReduceMap(const Shape& in, const std::vector<int64_t>& reduced) : in_dims(in.dims()) {
    std::vector<bool> is_reduced(in.rank(), false);
    for (int64_t d : reduced) is_reduced[d] = true;
    kept_stride.assign(in.rank(), 0);
    int64_t stride = 1;
    for (int d = in.rank() - 1; d >= 0; --d) {
      if (is_reduced[d]) continue;
      kept_stride[d] = stride;
      stride *= in.dim(d);
    }
  }
  int64_t operator()(int64_t i, std::vector<int64_t>& idx) const {
    Unravel(i, in_dims, idx);
    return Ravel(idx, kept_stride);
  }
};

// The listed dimensions are removed. Max and min propagate NaN; over zero elements they give the
// identity (sum 0, max -inf or the type's minimum, min +inf or the type's maximum).
absl::StatusOr<Kernel> Reduce(const ir::Node& n, OperandTypes types) {
  Opcode op = n.opcode();
  DType in_t = types[0].dtype, out_t = n.type().dtype;
  unsigned allowed = kFloatTypes | kIntTypes | (op == Opcode::kReduceSum ? 0 : kBoolTypes);
  KILN_RETURN_IF_ERROR(CheckDType(n, in_t, allowed, "operand"));
  ReduceMap map(types[0].shape, n.attr_ints("dimensions"));
  int64_t in_count = types[0].shape.num_elements();
  int64_t out_count = n.type().shape.num_elements();
  int x = 0, y = ResultSlot(n);
  if (IsFloating(in_t)) {
    double init = op == Opcode::kReduceSum   ? 0.0
                  : op == Opcode::kReduceMax ? -std::numeric_limits<double>::infinity()
                                             : std::numeric_limits<double>::infinity();
    return Kernel([=, acc = std::vector<double>(out_count)](Buffers ctx) mutable {
      std::fill(acc.begin(), acc.end(), init);
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < in_count; ++i) {
        double v = LoadAsDouble(In(ctx, x), in_t, i);
        double& a = acc[map(i, idx)];
        if (op == Opcode::kReduceSum)
          a += v;
        else if (std::isnan(v) || std::isnan(a))
          a = std::numeric_limits<double>::quiet_NaN();
        else if (op == Opcode::kReduceMax ? v > a : v < a)
          a = v;
      }
      for (int64_t o = 0; o < out_count; ++o) StoreFromDouble(Out(ctx, y), out_t, o, acc[o]);
    });
  }
  auto [lo, hi] = IntegerRange(in_t);
  int64_t init = op == Opcode::kReduceSum ? 0 : op == Opcode::kReduceMax ? lo : hi;
  return Kernel([=, acc = std::vector<int64_t>(out_count)](Buffers ctx) mutable {
    std::fill(acc.begin(), acc.end(), init);
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < in_count; ++i) {
      int64_t v = LoadAsInt64(In(ctx, x), in_t, i);
      int64_t& a = acc[map(i, idx)];
      if (op == Opcode::kReduceSum)
        a = ir::WrapAdd(a, v);
      else if (op == Opcode::kReduceMax ? v > a : v < a)
        a = v;
    }
    for (int64_t o = 0; o < out_count; ++o) StoreFromInt64(Out(ctx, y), out_t, o, acc[o]);
  });
}

// Index of the first maximum along `axis` (axis removed). As in PyTorch a NaN counts as larger
// than everything, so the first NaN wins. An empty axis gives 0.
absl::StatusOr<Kernel> ArgMax(const ir::Node& n, OperandTypes types) {
  DType in_t = types[0].dtype, out_t = n.type().dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, in_t, kFloatTypes | kIntTypes | kBoolTypes, "operand"));
  AxisSplit s = SplitAt(types[0].shape, static_cast<int>(n.attr_int("axis")));
  int x = 0, y = ResultSlot(n);
  bool floating = IsFloating(in_t);
  return Kernel([=](Buffers ctx) {
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i) {
        int64_t best = 0;
        for (int64_t k = 1; k < s.size; ++k) {
          int64_t at = (o * s.size + k) * s.inner + i, best_at = (o * s.size + best) * s.inner + i;
          bool better;
          if (floating) {
            double v = LoadAsDouble(In(ctx, x), in_t, at),
                   b = LoadAsDouble(In(ctx, x), in_t, best_at);
            better = !std::isnan(b) && (std::isnan(v) || v > b);
          } else {
            better = LoadAsInt64(In(ctx, x), in_t, at) > LoadAsInt64(In(ctx, x), in_t, best_at);
          }
          if (better) best = k;
        }
        StoreFromInt64(Out(ctx, y), out_t, o * s.inner + i, best);
      }
  });
}

}  // namespace

absl::StatusOr<Kernel> MakeReductionKernel(const ir::Node& n, OperandTypes types) {
  if (n.opcode() == Opcode::kArgmax) return ArgMax(n, types);
  return Reduce(n, types);
}

}  // namespace kiln::eval
