// Scalar rules below mirror runtime/reference/{elementwise,structural,reduction}.cc one for one;
// a change there must be made here too (constant_fold_test compares the two bit for bit).
#include "kiln/compiler/passes/internal/evaluate.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace kiln::compiler::internal {
namespace {

using ir::Opcode;

bool IsFloatCompute(DType t) { return IsFloating(t) && !IsStorageOnly(t); }
bool IsIntOrBool(DType t) { return IsInteger(t) || t == DType::kBool; }

// ---- element access (reference backend: LoadInt / StoreInt) ----
int64_t LoadInt(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kS8:
      return static_cast<const int8_t*>(base)[i];
    case DType::kU8:
      return static_cast<const uint8_t*>(base)[i];
    case DType::kS32:
      return static_cast<const int32_t*>(base)[i];
    case DType::kS64:
      return static_cast<const int64_t*>(base)[i];
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[i] ? 1 : 0;
    default: {
      double v = LoadAsDouble(base, t, i);
      if (std::isnan(v)) return 0;
      if (v >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
      if (v <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(v);
    }
  }
}

void StoreInt(void* base, DType t, int64_t i, int64_t v) {
  switch (t) {
    case DType::kS8:
      static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      return;
    case DType::kS32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      return;
    case DType::kS64:
      static_cast<int64_t*>(base)[i] = v;
      return;
    case DType::kBool:
      static_cast<uint8_t*>(base)[i] = v != 0 ? 1 : 0;
      return;
    default:
      StoreFromDouble(base, t, i, static_cast<double>(v));
      return;
  }
}

int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t WrapSub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t WrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// ---- elementwise unary ----
using FloatUnary = double (*)(double);
using IntUnary = int64_t (*)(int64_t);

double GeluErf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double GeluTanh(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

struct Unary {
  FloatUnary f = nullptr;
  IntUnary i = nullptr;
};

Unary UnaryFor(const ir::Node& n) {
  switch (n.opcode()) {
    case Opcode::kAbs:
      return {[](double x) { return std::fabs(x); },
              [](int64_t x) { return x < 0 ? WrapSub(0, x) : x; }};
    case Opcode::kCos:
      return {[](double x) { return std::cos(x); }};
    case Opcode::kErf:
      return {[](double x) { return std::erf(x); }};
    case Opcode::kExp:
      return {[](double x) { return std::exp(x); }};
    case Opcode::kGelu: {
      std::string a = n.has_attr("approximate") ? n.attr_str("approximate") : "none";
      if (a == "none") return {GeluErf};
      if (a == "tanh") return {GeluTanh};
      return {};
    }
    case Opcode::kLog:
      return {[](double x) { return std::log(x); }};
    case Opcode::kNeg:
      return {[](double x) { return -x; }, [](int64_t x) { return WrapSub(0, x); }};
    case Opcode::kRelu:
      return {[](double x) { return std::isnan(x) ? x : (x > 0 ? x : 0.0); },
              [](int64_t x) { return x > 0 ? x : int64_t{0}; }};
    case Opcode::kRsqrt:
      return {[](double x) { return 1.0 / std::sqrt(x); }};
    case Opcode::kSigmoid:
      return {[](double x) { return 1.0 / (1.0 + std::exp(-x)); }};
    case Opcode::kSign:
      return {[](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); },
              [](int64_t x) { return x > 0 ? int64_t{1} : (x < 0 ? int64_t{-1} : int64_t{0}); }};
    case Opcode::kSilu:
      return {[](double x) { return x / (1.0 + std::exp(-x)); }};
    case Opcode::kSin:
      return {[](double x) { return std::sin(x); }};
    case Opcode::kSqrt:
      return {[](double x) { return std::sqrt(x); }};
    case Opcode::kTanh:
      return {[](double x) { return std::tanh(x); }};
    default:
      return {};
  }
}

std::optional<Tensor> EvalUnary(const ir::Node& n, const Tensor& x) {
  Unary op = UnaryFor(n);
  DType in_t = x.dtype(), out_t = n.type().dtype;
  Tensor out(out_t, n.type().shape);
  int64_t count = out.num_elements();
  if (IsInteger(in_t) && op.i != nullptr) {
    for (int64_t i = 0; i < count; ++i)
      StoreInt(out.raw_data(), out_t, i, op.i(LoadInt(x.raw_data(), in_t, i)));
    return out;
  }
  if (!IsFloatCompute(in_t) || op.f == nullptr) return std::nullopt;
  for (int64_t i = 0; i < count; ++i)
    StoreFromDouble(out.raw_data(), out_t, i, op.f(LoadAsDouble(x.raw_data(), in_t, i)));
  return out;
}

// ---- elementwise binary ----
using FloatBinary = double (*)(double, double);
using IntBinary = int64_t (*)(int64_t, int64_t);

struct Binary {
  FloatBinary f = nullptr;
  IntBinary i = nullptr;
  bool allows_bool = false;
};

Binary BinaryFor(Opcode op) {
  switch (op) {
    case Opcode::kAdd:
      return {[](double a, double b) { return a + b; }, WrapAdd};
    case Opcode::kSub:
      return {[](double a, double b) { return a - b; }, WrapSub};
    case Opcode::kMul:
      return {[](double a, double b) { return a * b; }, WrapMul};
    case Opcode::kDiv:
      // Integer division truncates toward zero; x / 0 = -1 (as XLA), MIN / -1 wraps.
      return {[](double a, double b) { return a / b; },
              [](int64_t a, int64_t b) -> int64_t {
                if (b == 0) return -1;
                if (b == -1) return WrapSub(0, a);
                return a / b;
              }};
    case Opcode::kPow:
      return {[](double a, double b) { return std::pow(a, b); },
              [](int64_t a, int64_t b) -> int64_t {
                if (b < 0) {
                  if (a == 1) return 1;
                  if (a == -1) return (b % 2 == 0) ? 1 : -1;
                  return a == 0 ? -1 : 0;
                }
                int64_t result = 1;
                while (b > 0) {
                  if (b & 1) result = WrapMul(result, a);
                  a = WrapMul(a, a);
                  b >>= 1;
                }
                return result;
              }};
    case Opcode::kMax:
      return {[](double a, double b) {
                if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
                return a > b ? a : b;
              },
              [](int64_t a, int64_t b) { return a > b ? a : b; }, true};
    case Opcode::kMin:
      return {[](double a, double b) {
                if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
                return a < b ? a : b;
              },
              [](int64_t a, int64_t b) { return a < b ? a : b; }, true};
    default:
      return {};
  }
}

std::optional<Tensor> EvalBinary(const ir::Node& n, const Tensor& a, const Tensor& b) {
  Binary op = BinaryFor(n.opcode());
  DType at = a.dtype(), bt = b.dtype(), out_t = n.type().dtype;
  auto allowed = [&](DType t) {
    return IsFloatCompute(t) || IsInteger(t) || (op.allows_bool && t == DType::kBool);
  };
  if (!allowed(at) || !allowed(bt)) return std::nullopt;
  Tensor out(out_t, n.type().shape);
  int64_t count = out.num_elements();
  if (!IsFloating(at)) {
    for (int64_t i = 0; i < count; ++i)
      StoreInt(out.raw_data(), out_t, i,
               op.i(LoadInt(a.raw_data(), at, i), LoadInt(b.raw_data(), bt, i)));
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
  const std::string& dir = n.attr_str("direction");
  static const char* kDirs[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  int d = -1;
  for (int k = 0; k < 6; ++k)
    if (dir == kDirs[k]) d = k;
  if (d < 0) return std::nullopt;
  auto cmp = [d](auto x, auto z) {
    switch (d) {
      case 0:
        return x == z;
      case 1:
        return x != z;
      case 2:
        return x < z;
      case 3:
        return x <= z;
      case 4:
        return x > z;
      default:
        return x >= z;
    }
  };
  bool floating = IsFloating(at) || IsFloating(bt);
  Tensor out(n.type().dtype, n.type().shape);
  for (int64_t i = 0; i < out.num_elements(); ++i) {
    bool r = floating ? cmp(LoadAsDouble(a.raw_data(), at, i), LoadAsDouble(b.raw_data(), bt, i))
                      : cmp(LoadInt(a.raw_data(), at, i), LoadInt(b.raw_data(), bt, i));
    StoreInt(out.raw_data(), out.dtype(), i, r ? 1 : 0);
  }
  return out;
}

// ---- logical_and / logical_or / logical_not ----
std::optional<Tensor> EvalLogical(const ir::Node& n, const std::vector<const Tensor*>& ops) {
  for (const Tensor* t : ops)
    if (!IsIntOrBool(t->dtype())) return std::nullopt;
  Tensor out(n.type().dtype, n.type().shape);
  for (int64_t i = 0; i < out.num_elements(); ++i) {
    bool a = LoadInt(ops[0]->raw_data(), ops[0]->dtype(), i) != 0;
    bool r;
    if (n.opcode() == Opcode::kLogicalNot)
      r = !a;
    else if (n.opcode() == Opcode::kLogicalAnd)
      r = a && LoadInt(ops[1]->raw_data(), ops[1]->dtype(), i) != 0;
    else
      r = a || LoadInt(ops[1]->raw_data(), ops[1]->dtype(), i) != 0;
    StoreInt(out.raw_data(), out.dtype(), i, r ? 1 : 0);
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
    const Tensor& src = LoadInt(p.raw_data(), p.dtype(), i) != 0 ? t : f;
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
      StoreInt(out.raw_data(), out_t, i, LoadInt(x.raw_data(), in_t, i));
    else if (!IsFloating(in_t))
      StoreFromDouble(out.raw_data(), out_t, i,
                      static_cast<double>(LoadInt(x.raw_data(), in_t, i)));
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
        StoreInt(out.raw_data(), t, (o * size + k) * inner + i, k);
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
    int64_t v = LoadInt(x.raw_data(), in_t, i);
    Unravel(i, in.dims(), idx);
    int64_t& a = acc[Ravel(idx, kept_stride)];
    if (op == Opcode::kReduceSum)
      a = WrapAdd(a, v);
    else if (op == Opcode::kReduceMax ? v > a : v < a)
      a = v;
  }
  for (int64_t o = 0; o < out_count; ++o) StoreInt(out.raw_data(), out_t, o, acc[o]);
  return out;
}

}  // namespace

bool CanEvaluate(Opcode op) {
  switch (op) {
    case Opcode::kAbs:
    case Opcode::kCos:
    case Opcode::kErf:
    case Opcode::kExp:
    case Opcode::kGelu:
    case Opcode::kLog:
    case Opcode::kLogicalNot:
    case Opcode::kNeg:
    case Opcode::kRelu:
    case Opcode::kRsqrt:
    case Opcode::kSigmoid:
    case Opcode::kSign:
    case Opcode::kSilu:
    case Opcode::kSin:
    case Opcode::kSqrt:
    case Opcode::kTanh:
    case Opcode::kAdd:
    case Opcode::kSub:
    case Opcode::kMul:
    case Opcode::kDiv:
    case Opcode::kPow:
    case Opcode::kMax:
    case Opcode::kMin:
    case Opcode::kLogicalAnd:
    case Opcode::kLogicalOr:
    case Opcode::kCompare:
    case Opcode::kSelect:
    case Opcode::kConvert:
    case Opcode::kBroadcastInDim:
    case Opcode::kReshape:
    case Opcode::kTranspose:
    case Opcode::kSlice:
    case Opcode::kConcatenate:
    case Opcode::kIota:
    case Opcode::kReduceSum:
    case Opcode::kReduceMax:
    case Opcode::kReduceMin:
      return true;
    default:
      return false;
  }
}

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
