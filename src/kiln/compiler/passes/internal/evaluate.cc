// Elementwise scalar rules come from ir/element_semantics.h, shared with the reference backend;
// the structural and reduction loops mirror runtime/reference/{structural,reduction}.cc
// (constant_fold_test compares the two bit for bit).
#include "kiln/compiler/passes/internal/evaluate.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kiln/ir/element_semantics.h"
#include "kiln/ir/op_traits.h"

namespace kiln::compiler::internal {
namespace {

using ir::Opcode;

bool IsFloatCompute(DType t) { return IsFloating(t) && !IsStorageOnly(t); }
bool IsIntOrBool(DType t) { return IsInteger(t) || t == DType::kBool; }

// ---- elementwise unary ----
std::optional<Tensor> EvalUnary(const ir::Node& n, const Tensor& x) {
  ir::UnaryOp op = ir::UnaryFor(n);
  DType in_t = x.dtype(), out_t = n.type().dtype;
  Tensor out(out_t, n.type().shape);
  int64_t count = out.num_elements();
  if (IsInteger(in_t) && op.i != nullptr) {
    for (int64_t i = 0; i < count; ++i)
      StoreFromInt64(out.raw_data(), out_t, i, op.i(LoadAsInt64(x.raw_data(), in_t, i)));
    return out;
  }
  if (!IsFloatCompute(in_t) || op.f == nullptr) return std::nullopt;
  for (int64_t i = 0; i < count; ++i)
    StoreFromDouble(out.raw_data(), out_t, i, op.f(LoadAsDouble(x.raw_data(), in_t, i)));
  return out;
}

// ---- elementwise binary ----
std::optional<Tensor> EvalBinary(const ir::Node& n, const Tensor& a, const Tensor& b) {
  ir::BinaryOp op = ir::BinaryFor(n.opcode());
  DType at = a.dtype(), bt = b.dtype(), out_t = n.type().dtype;
  auto allowed = [&](DType t) {
    return IsFloatCompute(t) || IsInteger(t) || (op.allows_bool && t == DType::kBool);
  };
  if (!allowed(at) || !allowed(bt)) return std::nullopt;
  Tensor out(out_t, n.type().shape);
  int64_t count = out.num_elements();
  if (!IsFloating(at)) {
    for (int64_t i = 0; i < count; ++i)
      StoreFromInt64(out.raw_data(), out_t, i,
                     op.i(LoadAsInt64(a.raw_data(), at, i), LoadAsInt64(b.raw_data(), bt, i)));
    return out;
  }
  for (int64_t i = 0; i < count; ++i)
    StoreFromDouble(out.raw_data(), out_t, i,
                    op.f(LoadAsDouble(a.raw_data(), at, i), LoadAsDouble(b.raw_data(), bt, i)));
  return out;
}

// ---- compare ----
std::optional<Tensor> EvalCompare(const ir::Node& n, const Tensor& a, const Tensor& b) {
  DType at = a.dtype(), bt = b.dtype();
  auto allowed = [](DType t) { return IsFloatCompute(t) || IsIntOrBool(t); };
  if (!allowed(at) || !allowed(bt)) return std::nullopt;
  int d = ir::CompareDirectionIndex(n.attr_str("direction"));
  if (d < 0) return std::nullopt;
  bool floating = IsFloating(at) || IsFloating(bt);
  Tensor out(n.type().dtype, n.type().shape);
  for (int64_t i = 0; i < out.num_elements(); ++i) {
    bool r = floating ? ir::CompareValues(d, LoadAsDouble(a.raw_data(), at, i),
                                          LoadAsDouble(b.raw_data(), bt, i))
                      : ir::CompareValues(d, LoadAsInt64(a.raw_data(), at, i),
                                          LoadAsInt64(b.raw_data(), bt, i));
    StoreFromInt64(out.raw_data(), out.dtype(), i, r ? 1 : 0);
  }
  return out;
}

// ---- logical_and / logical_or / logical_not ----
std::optional<Tensor> EvalLogical(const ir::Node& n, const std::vector<const Tensor*>& ops) {
  for (const Tensor* t : ops)
    if (!IsIntOrBool(t->dtype())) return std::nullopt;
  Tensor out(n.type().dtype, n.type().shape);
  for (int64_t i = 0; i < out.num_elements(); ++i) {
    bool a = LoadAsInt64(ops[0]->raw_data(), ops[0]->dtype(), i) != 0;
    bool r;
    if (n.opcode() == Opcode::kLogicalNot)
      r = !a;
    else if (n.opcode() == Opcode::kLogicalAnd)
      r = a && LoadAsInt64(ops[1]->raw_data(), ops[1]->dtype(), i) != 0;
    else
      r = a || LoadAsInt64(ops[1]->raw_data(), ops[1]->dtype(), i) != 0;
    StoreFromInt64(out.raw_data(), out.dtype(), i, r ? 1 : 0);
  }
  return out;
}

// ---- select ----
std::optional<Tensor> EvalSelect(const ir::Node& n, const Tensor& p, const Tensor& t,
                                 const Tensor& f) {
  if (!IsIntOrBool(p.dtype()) || t.dtype() != n.type().dtype || f.dtype() != n.type().dtype)
    return std::nullopt;
  Tensor out(n.type().dtype, n.type().shape);
  int64_t width = DTypeSize(out.dtype());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  for (int64_t i = 0; i < out.num_elements(); ++i) {
    const Tensor& src = LoadAsInt64(p.raw_data(), p.dtype(), i) != 0 ? t : f;
    std::memcpy(dst + i * width, static_cast<const uint8_t*>(src.raw_data()) + i * width, width);
  }
  return out;
}

// ---- convert ----
Tensor EvalConvert(const ir::Node& n, const Tensor& x) {
  DType in_t = x.dtype(), out_t = n.type().dtype;
  Tensor out(out_t, n.type().shape);
  int64_t count = out.num_elements();
  for (int64_t i = 0; i < count; ++i) {
    if (!IsFloating(in_t) && !IsFloating(out_t))
      StoreFromInt64(out.raw_data(), out_t, i, LoadAsInt64(x.raw_data(), in_t, i));
    else if (!IsFloating(in_t))
      StoreFromDouble(out.raw_data(), out_t, i,
                      static_cast<double>(LoadAsInt64(x.raw_data(), in_t, i)));
    else
      StoreFromDouble(out.raw_data(), out_t, i, LoadAsDouble(x.raw_data(), in_t, i));
  }
  return out;
}

// ---- data movement: broadcast_in_dim, transpose, slice, reshape, concatenate ----
void Unravel(int64_t linear, const std::vector<int64_t>& dims, std::vector<int64_t>& idx) {
  idx.resize(dims.size());
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    int64_t size = dims[d];
    idx[d] = size > 0 ? linear % size : 0;
    linear = size > 0 ? linear / size : 0;
  }
}

int64_t Ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& strides) {
  int64_t linear = 0;
  for (size_t d = 0; d < idx.size(); ++d) linear += idx[d] * strides[d];
  return linear;
}

// Fills each output element from the input element whose multi-index `source` gives.
template <typename Fn>
Tensor GatherByIndex(const ir::Node& n, const Tensor& x, Fn source) {
  Tensor out(n.type().dtype, n.type().shape);
  std::vector<int64_t> out_dims = out.shape().dims();
  std::vector<int64_t> in_strides = x.shape().Strides();
  int64_t width = DTypeSize(out.dtype());
  std::vector<int64_t> out_idx, in_idx(x.shape().rank());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  const auto* src = static_cast<const uint8_t*>(x.raw_data());
  for (int64_t i = 0; i < out.num_elements(); ++i) {
    Unravel(i, out_dims, out_idx);
    source(out_idx, in_idx);
    std::memcpy(dst + i * width, src + Ravel(in_idx, in_strides) * width, width);
  }
  return out;
}

Tensor EvalBroadcast(const ir::Node& n, const Tensor& x) {
  std::vector<int64_t> bd = n.attr_ints("broadcast_dimensions");
  std::vector<int64_t> in_dims = x.shape().dims();
  return GatherByIndex(n, x, [&](const std::vector<int64_t>& o, std::vector<int64_t>& in) {
    for (size_t i = 0; i < bd.size(); ++i) in[i] = in_dims[i] == 1 ? 0 : o[bd[i]];
  });
}

Tensor EvalTranspose(const ir::Node& n, const Tensor& x) {
  std::vector<int64_t> perm = n.attr_ints("permutation");
  return GatherByIndex(n, x, [&](const std::vector<int64_t>& o, std::vector<int64_t>& in) {
    for (size_t i = 0; i < perm.size(); ++i) in[perm[i]] = o[i];
  });
}

Tensor EvalSlice(const ir::Node& n, const Tensor& x) {
  std::vector<int64_t> start = n.attr_ints("start");
  std::vector<int64_t> stride =
      n.has_attr("stride") ? n.attr_ints("stride") : std::vector<int64_t>();
  if (stride.empty()) stride.assign(start.size(), 1);
  return GatherByIndex(n, x, [&](const std::vector<int64_t>& o, std::vector<int64_t>& in) {
    for (size_t d = 0; d < start.size(); ++d) in[d] = start[d] + o[d] * stride[d];
  });
}

Tensor EvalReshape(const ir::Node& n, const Tensor& x) {
  Tensor out(n.type().dtype, n.type().shape);
  if (out.byte_size() > 0) std::memcpy(out.raw_data(), x.raw_data(), out.byte_size());
  return out;
}

Tensor EvalConcatenate(const ir::Node& n, const std::vector<const Tensor*>& ops) {
  int dim = static_cast<int>(n.attr_int("dimension"));
  Tensor out(n.type().dtype, n.type().shape);
  std::vector<int64_t> out_strides = out.shape().Strides();
  int64_t width = DTypeSize(out.dtype());
  int64_t offset = 0;
  std::vector<int64_t> idx;
  for (const Tensor* t : ops) {
    std::vector<int64_t> dims = t->shape().dims();
    for (int64_t i = 0; i < t->num_elements(); ++i) {
      Unravel(i, dims, idx);
      idx[dim] += offset;
      std::memcpy(static_cast<uint8_t*>(out.raw_data()) + Ravel(idx, out_strides) * width,
                  static_cast<const uint8_t*>(t->raw_data()) + i * width, width);
    }
    offset += dims[dim];
  }
  return out;
}

// ---- iota ----
std::optional<Tensor> EvalIota(const ir::Node& n) {
  DType t = n.type().dtype;
  if (!IsFloatCompute(t) && !IsInteger(t)) return std::nullopt;
  const Shape& shape = n.type().shape;
  int dim = static_cast<int>(n.attr_int("dimension"));
  int64_t outer = 1, size = shape.dim(dim), inner = 1;
  for (int d = 0; d < shape.rank(); ++d) {
    if (d < dim) outer *= shape.dim(d);
    if (d > dim) inner *= shape.dim(d);
  }
  Tensor out(t, shape);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < size; ++k)
      for (int64_t i = 0; i < inner; ++i)
        StoreFromInt64(out.raw_data(), t, (o * size + k) * inner + i, k);
  return out;
}

// ---- reduce_sum / reduce_max / reduce_min ----
std::optional<Tensor> EvalReduce(const ir::Node& n, const Tensor& x) {
  Opcode op = n.opcode();
  DType in_t = x.dtype(), out_t = n.type().dtype;
  bool ok =
      IsFloatCompute(in_t) || IsInteger(in_t) || (op != Opcode::kReduceSum && in_t == DType::kBool);
  if (!ok) return std::nullopt;
  // Each operand element reduces into the output element of its kept dims.
  const Shape& in = x.shape();
  std::vector<bool> reduced(in.rank(), false);
  for (int64_t d : n.attr_ints("dimensions")) reduced[d] = true;
  std::vector<int64_t> kept_stride(in.rank(), 0);
  int64_t stride = 1;
  for (int d = in.rank() - 1; d >= 0; --d) {
    if (reduced[d]) continue;
    kept_stride[d] = stride;
    stride *= in.dim(d);
  }
  Tensor out(out_t, n.type().shape);
  int64_t out_count = out.num_elements();
  std::vector<int64_t> idx;
  if (IsFloating(in_t)) {
    double init = op == Opcode::kReduceSum   ? 0.0
                  : op == Opcode::kReduceMax ? -std::numeric_limits<double>::infinity()
                                             : std::numeric_limits<double>::infinity();
    std::vector<double> acc(out_count, init);
    for (int64_t i = 0; i < x.num_elements(); ++i) {
      double v = LoadAsDouble(x.raw_data(), in_t, i);
      Unravel(i, in.dims(), idx);
      double& a = acc[Ravel(idx, kept_stride)];
      if (op == Opcode::kReduceSum)
        a += v;
      else if (std::isnan(v) || std::isnan(a))
        a = std::numeric_limits<double>::quiet_NaN();
      else if (op == Opcode::kReduceMax ? v > a : v < a)
        a = v;
    }
    for (int64_t o = 0; o < out_count; ++o) StoreFromDouble(out.raw_data(), out_t, o, acc[o]);
    return out;
  }
  int64_t lo, hi;
  switch (in_t) {
    case DType::kS8:
      lo = -128, hi = 127;
      break;
    case DType::kU8:
      lo = 0, hi = 255;
      break;
    case DType::kS32:
      lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
      break;
    case DType::kBool:
      lo = 0, hi = 1;
      break;
    default:
      lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  }
  int64_t init = op == Opcode::kReduceSum ? 0 : op == Opcode::kReduceMax ? lo : hi;
  std::vector<int64_t> acc(out_count, init);
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    int64_t v = LoadAsInt64(x.raw_data(), in_t, i);
    Unravel(i, in.dims(), idx);
    int64_t& a = acc[Ravel(idx, kept_stride)];
    if (op == Opcode::kReduceSum)
      a = ir::WrapAdd(a, v);
    else if (op == Opcode::kReduceMax ? v > a : v < a)
      a = v;
  }
  for (int64_t o = 0; o < out_count; ++o) StoreFromInt64(out.raw_data(), out_t, o, acc[o]);
  return out;
}

}  // namespace

// The kFold rows of opcodes.def.
bool CanEvaluate(Opcode op) { return ir::OpTraits(op).constant_foldable(); }

std::optional<Tensor> EvaluateNode(const ir::Node& n, const std::vector<const Tensor*>& ops) {
  if (!CanEvaluate(n.opcode()) || ops.size() != n.operands().size()) return std::nullopt;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i] == nullptr) return std::nullopt;
  switch (n.opcode()) {
    case Opcode::kLogicalNot:
    case Opcode::kLogicalAnd:
    case Opcode::kLogicalOr:
      return EvalLogical(n, ops);
    case Opcode::kAdd:
    case Opcode::kSub:
    case Opcode::kMul:
    case Opcode::kDiv:
    case Opcode::kPow:
    case Opcode::kMax:
    case Opcode::kMin:
      return EvalBinary(n, *ops[0], *ops[1]);
    case Opcode::kCompare:
      return EvalCompare(n, *ops[0], *ops[1]);
    case Opcode::kSelect:
      return EvalSelect(n, *ops[0], *ops[1], *ops[2]);
    case Opcode::kConvert:
      return EvalConvert(n, *ops[0]);
    case Opcode::kBroadcastInDim:
      return EvalBroadcast(n, *ops[0]);
    case Opcode::kReshape:
      return EvalReshape(n, *ops[0]);
    case Opcode::kTranspose:
      return EvalTranspose(n, *ops[0]);
    case Opcode::kSlice:
      return EvalSlice(n, *ops[0]);
    case Opcode::kConcatenate:
      return EvalConcatenate(n, ops);
    case Opcode::kIota:
      return EvalIota(n);
    case Opcode::kReduceSum:
    case Opcode::kReduceMax:
    case Opcode::kReduceMin:
      return EvalReduce(n, *ops[0]);
    default:
      return EvalUnary(n, *ops[0]);
  }
}

}  // namespace kiln::compiler::internal
