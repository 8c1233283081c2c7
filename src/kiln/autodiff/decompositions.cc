#include "kiln/autodiff/decompositions.h"

#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::autodiff {
namespace {

using ir::Value;

int64_t NormAxis(Value x, int64_t axis) { return axis < 0 ? axis + x.rank() : axis; }

// Broadcasts `r`, the result of reducing `like` over `axis`, back to `like`'s shape.
Value BroadcastBack(Value r, Value like, int64_t axis) {
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < like.rank(); ++i)
    if (i != axis) dims.push_back(i);
  return ir::BroadcastInDim(r, like.shape(), dims);
}

// x - max(x, axis), broadcast back.
Value MaxShifted(Value x, int64_t axis) {
  return x - BroadcastBack(ir::ReduceMax(x, {axis}), x, axis);
}

}  // namespace

// ---- softmax (decomposition) ----
Value DecomposeSoftmax(Value x, int64_t axis) {
  axis = NormAxis(x, axis);
  Value e = ir::Exp(MaxShifted(x, axis));
  return e / BroadcastBack(ir::ReduceSum(e, {axis}), x, axis);
}

// ---- log_softmax (decomposition) ----
Value DecomposeLogSoftmax(Value x, int64_t axis) {
  axis = NormAxis(x, axis);
  Value shifted = MaxShifted(x, axis);
  Value lse = ir::Log(ir::ReduceSum(ir::Exp(shifted), {axis}));
  return shifted - BroadcastBack(lse, x, axis);
}

// ---- layer_norm (decomposition) ----
Value DecomposeLayerNorm(Value x, Value gamma, Value beta, double epsilon) {
  int64_t last = x.rank() - 1;
  Value centered = x - BroadcastBack(ir::Mean(x, {last}), x, last);
  Value var = ir::Mean(centered * centered, {last});
  Value rstd = ir::Rsqrt(var + epsilon);
  return centered * BroadcastBack(rstd, x, last) * gamma + beta;
}

// ---- rms_norm (decomposition) ----
Value DecomposeRmsNorm(Value x, Value gamma, double epsilon) {
  int64_t last = x.rank() - 1;
  Value r = ir::Rsqrt(ir::Mean(x * x, {last}) + epsilon);
  return x * BroadcastBack(r, x, last) * gamma;
}

// The class index is a broadcast of a [num_classes] iota along the last dim, not an iota of the
// whole [..., num_classes] shape: nothing of that size is materialized for it, and the compare
// reads both sides through broadcasting views. With fewer than 2^24 classes the compare runs in
// f32 (every class index and every label that could equal one is exact in f32; a label at or
// above 2^24 rounds to a value that is still >= num_classes, so it matches nothing as before),
// which the loop fusion takes: the one-hot of a cross-entropy gradient over a 50257-word
// vocabulary then costs no pass over memory of its own.
Value LabelHit(Value labels, int64_t num_classes) {
  ir::Builder* b = labels.builder();
  std::vector<int64_t> dims = labels.shape().dims();
  std::vector<int64_t> bd(dims.size());
  for (size_t i = 0; i < bd.size(); ++i) bd[i] = static_cast<int64_t>(i);
  dims.push_back(num_classes);
  Shape shape(dims);
  const int64_t last = static_cast<int64_t>(dims.size()) - 1;
  const bool exact_in_f32 = num_classes <= (int64_t{1} << 24) && IsInteger(labels.dtype());
  const DType index_type = exact_in_f32 ? DType::kF32 : labels.dtype();
  Value classes = ir::BroadcastInDim(b->Iota(index_type, Shape{num_classes}, 0), shape, {last});
  Value as_index = labels.dtype() == index_type ? labels : ir::Convert(labels, index_type);
  return ir::Eq(classes, ir::BroadcastInDim(as_index, shape, bd));
}

Value OneHot(Value labels, int64_t num_classes, DType dtype) {
  ir::Builder* b = labels.builder();
  return ir::Select(LabelHit(labels, num_classes), b->Scalar(1.0, dtype), b->Scalar(0.0, dtype));
}

Value ValidLabels(Value labels, int64_t num_classes) {
  ir::Builder* b = labels.builder();
  return ir::LogicalAnd(
      ir::Ge(labels, b->Scalar(0.0, labels.dtype())),
      ir::Lt(labels, b->Scalar(static_cast<double>(num_classes), labels.dtype())));
}

// ---- cross_entropy (decomposition) ----
Value DecomposeCrossEntropy(Value logits, Value labels) {
  int64_t last = logits.rank() - 1;
  Value shifted = MaxShifted(logits, last);
  Value lse = ir::Log(ir::ReduceSum(ir::Exp(shifted), {last}));
  const int64_t classes = logits.dim(static_cast<int>(last));
  Value picked = ir::ReduceSum(shifted * OneHot(labels, classes, logits.dtype()), {last});
  return ir::Select(ValidLabels(labels, classes), lse - picked,
                    logits.builder()->Scalar(0.0, logits.dtype()));
}

Value AttentionScores(Value q, Value k, bool causal, double scale) {
  ir::Builder* b = q.builder();
  int nb = q.rank() - 2;
  ir::DotDims dims;
  for (int i = 0; i < nb; ++i) {
    dims.lhs_batch.push_back(i);
    dims.rhs_batch.push_back(i);
  }
  dims.lhs_contracting = {nb + 1};
  dims.rhs_contracting = {nb + 1};
  Value s = ir::DotGeneral(q, k, dims) * scale;
  if (!causal) return s;
  int64_t sq = q.dim(nb), sk = k.dim(nb);
  Shape qk{sq, sk};
  Value row = b->Iota(DType::kS64, qk, 0);
  Value col = b->Iota(DType::kS64, qk, 1);
  // Query i sits at key position i + (sk - sq): the sequences are aligned at the end.
  if (sk != sq) row = row + static_cast<double>(sk - sq);
  Value visible = ir::Le(col, row);
  Value mask = ir::BroadcastInDim(visible, s.shape(), {nb, nb + 1});
  return ir::Select(mask, s, b->Scalar(-std::numeric_limits<double>::infinity(), s.dtype()));
}

// ---- attention (decomposition) ----
Value DecomposeAttention(Value q, Value k, Value v, bool causal, double scale) {
  int nb = q.rank() - 2;
  Value p = DecomposeSoftmax(AttentionScores(q, k, causal, scale), nb + 1);
  ir::DotDims dims;
  for (int i = 0; i < nb; ++i) {
    dims.lhs_batch.push_back(i);
    dims.rhs_batch.push_back(i);
  }
  dims.lhs_contracting = {nb + 1};
  dims.rhs_contracting = {nb};
  return ir::DotGeneral(p, v, dims);
}

absl::StatusOr<Value> DecomposeNode(const ir::Node& n, const std::vector<Value>& operands) {
  const int arity = ir::OpcodeArity(n.opcode());
  if (arity >= 0 && static_cast<int>(operands.size()) != arity) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(ir::OpcodeName(n.opcode())),
                                                   ": expected ", arity, " operands, got ",
                                                   operands.size()));
  }
  switch (n.opcode()) {
    case ir::Opcode::kSoftmax:
      return DecomposeSoftmax(operands[0], n.attr_int("axis"));
    case ir::Opcode::kLogSoftmax:
      return DecomposeLogSoftmax(operands[0], n.attr_int("axis"));
    case ir::Opcode::kLayerNorm:
      return DecomposeLayerNorm(operands[0], operands[1], operands[2], n.attr_float("epsilon"));
    case ir::Opcode::kRmsNorm:
      return DecomposeRmsNorm(operands[0], operands[1], n.attr_float("epsilon"));
    case ir::Opcode::kCrossEntropy:
      return DecomposeCrossEntropy(operands[0], operands[1]);
    case ir::Opcode::kAttention:
      return DecomposeAttention(operands[0], operands[1], operands[2], n.attr_int("causal") != 0,
                                n.attr_float("scale"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "DecomposeNode: ", std::string(ir::OpcodeName(n.opcode())), " is not a composite op"));
  }
}

}  // namespace kiln::autodiff
