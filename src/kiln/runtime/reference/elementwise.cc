// Reference kernels for elementwise ops. Floats compute in double and round once on store;
// integers compute exactly in int64 and wrap to the output width (two's complement, as XLA and
// PyTorch do). Operands of binary ops have identical types (the builder inserts broadcasts).
#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/base/status.h"
#include "kiln/runtime/reference/kernels.h"

namespace kiln::runtime::reference {
namespace {

using ir::Opcode;

using FloatUnary = double (*)(double);
using IntUnary = int64_t (*)(int64_t);
using FloatBinary = double (*)(double, double);
using IntBinary = int64_t (*)(int64_t, int64_t);

// Wrapping int64 arithmetic (signed overflow is undefined in C++; unsigned wraps).
int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t WrapSub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t WrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// ---- abs ----
double AbsF(double x) { return std::fabs(x); }
int64_t AbsI(int64_t x) { return x < 0 ? WrapSub(0, x) : x; }

// ---- cos ----
double CosF(double x) { return std::cos(x); }

// ---- erf ----
double ErfF(double x) { return std::erf(x); }

// ---- exp ----
double ExpF(double x) { return std::exp(x); }

// ---- gelu ----
// approximate="none": 0.5 x (1 + erf(x / sqrt 2)); "tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
// x^3))).
double GeluErfF(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double GeluTanhF(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// ---- log ----
double LogF(double x) { return std::log(x); }

// ---- neg ----
double NegF(double x) { return -x; }
int64_t NegI(int64_t x) { return WrapSub(0, x); }

// ---- relu ----
// NaN stays NaN (as in PyTorch).
double ReluF(double x) { return std::isnan(x) ? x : (x > 0 ? x : 0.0); }
int64_t ReluI(int64_t x) { return x > 0 ? x : 0; }

// ---- rsqrt ----
double RsqrtF(double x) { return 1.0 / std::sqrt(x); }

// ---- sigmoid ----
double SigmoidF(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- sign ----
// sign(0) = 0 and, as in PyTorch, sign(NaN) = 0.
double SignF(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }
int64_t SignI(int64_t x) { return x > 0 ? 1 : (x < 0 ? -1 : 0); }

// ---- silu ----
double SiluF(double x) { return x / (1.0 + std::exp(-x)); }

// ---- sin ----
double SinF(double x) { return std::sin(x); }

// ---- sqrt ----
double SqrtF(double x) { return std::sqrt(x); }

// ---- tanh ----
double TanhF(double x) { return std::tanh(x); }

// ---- add ----
double AddF(double a, double b) { return a + b; }

// ---- sub ----
double SubF(double a, double b) { return a - b; }

// ---- mul ----
double MulF(double a, double b) { return a * b; }

// ---- div ----
// Integer division truncates toward zero; x / 0 = -1 (all ones, as in XLA) and MIN / -1 wraps.
double DivF(double a, double b) { return a / b; }
int64_t DivI(int64_t a, int64_t b) {
  if (b == 0) return -1;
  if (b == -1) return WrapSub(0, a);
  return a / b;
}

// ---- pow ----
// Floats follow std::pow. Integers: exact, wrapping, by repeated squaring; a negative exponent
// gives the truncated 1 / a^|b| (1 for a = 1, +-1 for a = -1, else 0; 0^negative = -1 like x/0).
double PowF(double a, double b) { return std::pow(a, b); }
int64_t PowI(int64_t a, int64_t b) {
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
}

// ---- max ----
// NaN propagates.
double MaxF(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a > b ? a : b;
}
int64_t MaxI(int64_t a, int64_t b) { return a > b ? a : b; }

// ---- min ----
double MinF(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a < b ? a : b;
}
int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }

struct UnaryOp {
  FloatUnary f = nullptr;
  IntUnary i = nullptr;  // null: floats only
};

UnaryOp UnaryFor(const ir::Node& n) {
  switch (n.opcode()) {
    case Opcode::kAbs:
      return {AbsF, AbsI};
    case Opcode::kCos:
      return {CosF, nullptr};
    case Opcode::kErf:
      return {ErfF, nullptr};
    case Opcode::kExp:
      return {ExpF, nullptr};
    case Opcode::kGelu:
      return {
          n.has_attr("approximate") && n.attr_str("approximate") == "tanh" ? GeluTanhF : GeluErfF,
          nullptr};
    case Opcode::kLog:
      return {LogF, nullptr};
    case Opcode::kNeg:
      return {NegF, NegI};
    case Opcode::kRelu:
      return {ReluF, ReluI};
    case Opcode::kRsqrt:
      return {RsqrtF, nullptr};
    case Opcode::kSigmoid:
      return {SigmoidF, nullptr};
    case Opcode::kSign:
      return {SignF, SignI};
    case Opcode::kSilu:
      return {SiluF, nullptr};
    case Opcode::kSin:
      return {SinF, nullptr};
    case Opcode::kSqrt:
      return {SqrtF, nullptr};
    case Opcode::kTanh:
      return {TanhF, nullptr};
    default:
      return {};
  }
}

struct BinaryOp {
  FloatBinary f = nullptr;
  IntBinary i = nullptr;
  bool allows_bool = false;
};

BinaryOp BinaryFor(Opcode op) {
  switch (op) {
    case Opcode::kAdd:
      return {AddF, WrapAdd};
    case Opcode::kSub:
      return {SubF, WrapSub};
    case Opcode::kMul:
      return {MulF, WrapMul};
    case Opcode::kDiv:
      return {DivF, DivI};
    case Opcode::kPow:
      return {PowF, PowI};
    case Opcode::kMax:
      return {MaxF, MaxI, true};
    case Opcode::kMin:
      return {MinF, MinI, true};
    default:
      return {};
  }
}

absl::StatusOr<Kernel> MakeUnary(const ir::Graph& g, const ir::Node& n) {
  UnaryOp op = UnaryFor(n);
  if (n.opcode() == Opcode::kGelu && n.has_attr("approximate")) {
    const std::string& a = n.attr_str("approximate");
    if (a != "none" && a != "tanh")
      return Unsupported(n, "approximate must be none or tanh, got '" + a + "'");
  }
  DType in_t = OperandType(g, n, 0).dtype;
  DType out_t = n.type().dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, in_t, kFloatTypes | (op.i ? kIntTypes : 0), "operand 0"));
  int x = n.operand(0), y = n.id();
  int64_t count = n.type().shape.num_elements();
  if (IsInteger(in_t)) {
    IntUnary f = op.i;
    return Kernel([=](RunContext& ctx) {
      for (int64_t i = 0; i < count; ++i)
        StoreInt(Out(ctx, y), out_t, i, f(LoadInt(In(ctx, x), in_t, i)));
    });
  }
  FloatUnary f = op.f;
  return Kernel([=](RunContext& ctx) {
    for (int64_t i = 0; i < count; ++i)
      StoreFromDouble(Out(ctx, y), out_t, i, f(LoadAsDouble(In(ctx, x), in_t, i)));
  });
}

absl::StatusOr<Kernel> MakeBinary(const ir::Graph& g, const ir::Node& n) {
  BinaryOp op = BinaryFor(n.opcode());
  DType in_t = OperandType(g, n, 0).dtype;
  DType out_t = n.type().dtype;
  unsigned allowed = kFloatTypes | kIntTypes | (op.allows_bool ? kBoolTypes : 0);
  KILN_RETURN_IF_ERROR(CheckDType(n, in_t, allowed, "operand 0"));
  KILN_RETURN_IF_ERROR(CheckDType(n, OperandType(g, n, 1).dtype, allowed, "operand 1"));
  int a = n.operand(0), b = n.operand(1), y = n.id();
  DType b_t = OperandType(g, n, 1).dtype;
  int64_t count = n.type().shape.num_elements();
  if (!IsFloating(in_t)) {
    IntBinary f = op.i;
    return Kernel([=](RunContext& ctx) {
      for (int64_t i = 0; i < count; ++i)
        StoreInt(Out(ctx, y), out_t, i,
                 f(LoadInt(In(ctx, a), in_t, i), LoadInt(In(ctx, b), b_t, i)));
    });
  }
  FloatBinary f = op.f;
  return Kernel([=](RunContext& ctx) {
    for (int64_t i = 0; i < count; ++i)
      StoreFromDouble(Out(ctx, y), out_t, i,
                      f(LoadAsDouble(In(ctx, a), in_t, i), LoadAsDouble(In(ctx, b), b_t, i)));
  });
}

// ---- compare ----
// -> bool. Floats compare as IEEE doubles (any comparison with NaN is false, except ne); integers
// and bool compare exactly.
absl::StatusOr<Kernel> MakeCompare(const ir::Graph& g, const ir::Node& n) {
  DType a_t = OperandType(g, n, 0).dtype, b_t = OperandType(g, n, 1).dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, a_t, kFloatTypes | kIntTypes | kBoolTypes, "operand 0"));
  KILN_RETURN_IF_ERROR(CheckDType(n, b_t, kFloatTypes | kIntTypes | kBoolTypes, "operand 1"));
  const std::string& dir = n.attr_str("direction");
  int d;
  if (dir == "eq")
    d = 0;
  else if (dir == "ne")
    d = 1;
  else if (dir == "lt")
    d = 2;
  else if (dir == "le")
    d = 3;
  else if (dir == "gt")
    d = 4;
  else if (dir == "ge")
    d = 5;
  else
    return Unsupported(n, "unknown direction '" + dir + "'");
  int a = n.operand(0), b = n.operand(1), y = n.id();
  DType out_t = n.type().dtype;
  int64_t count = n.type().shape.num_elements();
  bool floating = IsFloating(a_t) || IsFloating(b_t);
  return Kernel([=](RunContext& ctx) {
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
    for (int64_t i = 0; i < count; ++i) {
      bool r = floating ? cmp(LoadAsDouble(In(ctx, a), a_t, i), LoadAsDouble(In(ctx, b), b_t, i))
                        : cmp(LoadInt(In(ctx, a), a_t, i), LoadInt(In(ctx, b), b_t, i));
      StoreInt(Out(ctx, y), out_t, i, r ? 1 : 0);
    }
  });
}

// ---- logical_and ----
// ---- logical_or ----
// ---- logical_not ----
// Operands are bool or integers (nonzero is true); the result is 1/0 in the node's dtype.
absl::StatusOr<Kernel> MakeLogical(const ir::Graph& g, const ir::Node& n) {
  std::vector<int> ins = n.operands();
  std::vector<DType> types;
  for (size_t k = 0; k < ins.size(); ++k) {
    types.push_back(OperandType(g, n, static_cast<int>(k)).dtype);
    KILN_RETURN_IF_ERROR(
        CheckDType(n, types.back(), kIntTypes | kBoolTypes, "operand " + std::to_string(k)));
  }
  Opcode op = n.opcode();
  int y = n.id();
  DType out_t = n.type().dtype;
  int64_t count = n.type().shape.num_elements();
  return Kernel([=](RunContext& ctx) {
    for (int64_t i = 0; i < count; ++i) {
      bool a = LoadInt(In(ctx, ins[0]), types[0], i) != 0;
      bool r;
      if (op == Opcode::kLogicalNot)
        r = !a;
      else if (op == Opcode::kLogicalAnd)
        r = a && LoadInt(In(ctx, ins[1]), types[1], i) != 0;
      else
        r = a || LoadInt(In(ctx, ins[1]), types[1], i) != 0;
      StoreInt(Out(ctx, y), out_t, i, r ? 1 : 0);
    }
  });
}

// ---- select ----
// pred ? on_true : on_false, element by element; a byte copy, so any value dtype works.
absl::StatusOr<Kernel> MakeSelect(const ir::Graph& g, const ir::Node& n) {
  DType p_t = OperandType(g, n, 0).dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, p_t, kBoolTypes | kIntTypes, "predicate"));
  if (OperandType(g, n, 1).dtype != n.type().dtype || OperandType(g, n, 2).dtype != n.type().dtype)
    return Unsupported(n, "on_true and on_false must have the result dtype");
  int p = n.operand(0), t = n.operand(1), f = n.operand(2), y = n.id();
  int64_t count = n.type().shape.num_elements();
  int64_t width = DTypeSize(n.type().dtype);
  return Kernel([=](RunContext& ctx) {
    auto* out = static_cast<uint8_t*>(Out(ctx, y));
    const auto* on_true = static_cast<const uint8_t*>(In(ctx, t));
    const auto* on_false = static_cast<const uint8_t*>(In(ctx, f));
    for (int64_t i = 0; i < count; ++i) {
      const uint8_t* src = LoadInt(In(ctx, p), p_t, i) != 0 ? on_true : on_false;
      std::memcpy(out + i * width, src + i * width, width);
    }
  });
}

// ---- convert ----
// Same shape, new dtype. Integer/bool -> integer/bool is exact and wraps like a C++ cast; anything
// -> float rounds to nearest even; float -> integer truncates toward zero and saturates (NaN -> 0);
// -> bool is "nonzero" (NaN -> true). f8 types are allowed on either side.
absl::StatusOr<Kernel> MakeConvert(const ir::Graph& g, const ir::Node& n) {
  DType in_t = OperandType(g, n, 0).dtype, out_t = n.type().dtype;
  int x = n.operand(0), y = n.id();
  int64_t count = n.type().shape.num_elements();
  if (!IsFloating(in_t) && !IsFloating(out_t)) {
    return Kernel([=](RunContext& ctx) {
      for (int64_t i = 0; i < count; ++i)
        StoreInt(Out(ctx, y), out_t, i, LoadInt(In(ctx, x), in_t, i));
    });
  }
  if (!IsFloating(in_t)) {  // integer -> float: exact int64 first
    return Kernel([=](RunContext& ctx) {
      for (int64_t i = 0; i < count; ++i)
        StoreFromDouble(Out(ctx, y), out_t, i, static_cast<double>(LoadInt(In(ctx, x), in_t, i)));
    });
  }
  return Kernel([=](RunContext& ctx) {
    for (int64_t i = 0; i < count; ++i)
      StoreFromDouble(Out(ctx, y), out_t, i, LoadAsDouble(In(ctx, x), in_t, i));
  });
}

}  // namespace

absl::StatusOr<Kernel> MakeElementwiseKernel(const ir::Graph& g, const ir::Node& n) {
  switch (n.opcode()) {
    case Opcode::kCompare:
      return MakeCompare(g, n);
    case Opcode::kConvert:
      return MakeConvert(g, n);
    case Opcode::kLogicalAnd:
    case Opcode::kLogicalNot:
    case Opcode::kLogicalOr:
      return MakeLogical(g, n);
    case Opcode::kSelect:
      return MakeSelect(g, n);
    case Opcode::kAdd:
    case Opcode::kSub:
    case Opcode::kMul:
    case Opcode::kDiv:
    case Opcode::kPow:
    case Opcode::kMax:
    case Opcode::kMin:
      return MakeBinary(g, n);
    default:
      if (UnaryFor(n).f != nullptr) return MakeUnary(g, n);
      return absl::InternalError("elementwise: unexpected op " +
                                 std::string(ir::OpcodeName(n.opcode())));
  }
}

}  // namespace kiln::runtime::reference
