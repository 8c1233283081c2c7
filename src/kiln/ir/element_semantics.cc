#include "kiln/ir/element_semantics.h"

#include <cmath>
#include <limits>
#include <string>

namespace kiln::ir {
namespace {

// abs
double AbsF(double x) { return std::fabs(x); }
int64_t AbsI(int64_t x) { return x < 0 ? WrapSub(0, x) : x; }

// cos
double CosF(double x) { return std::cos(x); }

// erf
double ErfF(double x) { return std::erf(x); }

// exp
double ExpF(double x) { return std::exp(x); }

// gelu
// approximate="none": 0.5 x (1 + erf(x / sqrt 2)); "tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
// x^3))).
double GeluErfF(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double GeluTanhF(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// log
double LogF(double x) { return std::log(x); }

// neg
double NegF(double x) { return -x; }
int64_t NegI(int64_t x) { return WrapSub(0, x); }

// relu
// NaN stays NaN (as in PyTorch).
double ReluF(double x) { return std::isnan(x) ? x : (x > 0 ? x : 0.0); }
int64_t ReluI(int64_t x) { return x > 0 ? x : 0; }

// rsqrt
double RsqrtF(double x) { return 1.0 / std::sqrt(x); }

// sigmoid
double SigmoidF(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// sign
// sign(0) = 0 and, as in PyTorch, sign(NaN) = 0.
double SignF(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }
int64_t SignI(int64_t x) { return x > 0 ? 1 : (x < 0 ? -1 : 0); }

// silu
double SiluF(double x) { return x / (1.0 + std::exp(-x)); }

// sin
double SinF(double x) { return std::sin(x); }

// sqrt
double SqrtF(double x) { return std::sqrt(x); }

// tanh
double TanhF(double x) { return std::tanh(x); }

// add
double AddF(double a, double b) { return a + b; }

// sub
double SubF(double a, double b) { return a - b; }

// mul
double MulF(double a, double b) { return a * b; }

// div
// Integer division truncates toward zero; x / 0 = -1 (all ones, as in XLA) and MIN / -1 wraps.
double DivF(double a, double b) { return a / b; }
int64_t DivI(int64_t a, int64_t b) {
  if (b == 0) return -1;
  if (b == -1) return WrapSub(0, a);
  return a / b;
}

// pow
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

// max
// NaN propagates.
double MaxF(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a > b ? a : b;
}
int64_t MaxI(int64_t a, int64_t b) { return a > b ? a : b; }

// min
double MinF(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a < b ? a : b;
}
int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace

UnaryOp UnaryFor(const Node& n) {
  switch (n.opcode()) {
    case Opcode::kAbs:
      return {AbsF, AbsI};
    case Opcode::kCos:
      return {CosF, nullptr};
    case Opcode::kErf:
      return {ErfF, nullptr};
    case Opcode::kExp:
      return {ExpF, nullptr};
    case Opcode::kGelu: {
      std::string a = n.has_attr("approximate") ? n.attr_str("approximate") : "none";
      if (a == "none") return {GeluErfF, nullptr};
      if (a == "tanh") return {GeluTanhF, nullptr};
      return {};
    }
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

int CompareDirectionIndex(const std::string& direction) {
  static const char* kDirections[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  for (int k = 0; k < 6; ++k)
    if (direction == kDirections[k]) return k;
  return -1;
}

}  // namespace kiln::ir
