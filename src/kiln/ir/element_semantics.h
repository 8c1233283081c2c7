// The value semantics of elementwise ops on one element, shared by every place that computes
// them exactly: the reference backend's kernels and the compiler's constant folder (which must
// agree bit for bit). Floats compute in double (the caller rounds once on store); integers compute
// exactly in int64 with two's-complement wrapping.
//
//   UnaryOp op = UnaryFor(node);             // node: abs, exp, gelu, ...
//   double y = op.f(x);                       // op.i is null for float-only ops
//   bool lt = CompareValues(CompareDirectionIndex("lt"), a, b);
#ifndef KILN_IR_ELEMENT_SEMANTICS_H_
#define KILN_IR_ELEMENT_SEMANTICS_H_

#include <cstdint>
#include <string>

#include "kiln/ir/graph.h"

namespace kiln::ir {

// Wrapping int64 arithmetic (signed overflow is undefined in C++; unsigned wraps).
inline int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline int64_t WrapSub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
inline int64_t WrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

using FloatUnary = double (*)(double);
using IntUnary = int64_t (*)(int64_t);
using FloatBinary = double (*)(double, double);
using IntBinary = int64_t (*)(int64_t, int64_t);

struct UnaryOp {
  FloatUnary f = nullptr;  // null: not an elementwise unary op (or a bad gelu `approximate`)
  IntUnary i = nullptr;    // null: floats only
};
// abs cos erf exp gelu log neg relu rsqrt sigmoid sign silu sin sqrt tanh.
UnaryOp UnaryFor(const Node& n);

struct BinaryOp {
  FloatBinary f = nullptr;  // null: not one of the ops below
  IntBinary i = nullptr;
  bool allows_bool = false;  // max and min also take bool
};
// add sub mul div pow max min. Integer div truncates, x / 0 = -1 (XLA), MIN / -1 wraps; max/min
// propagate NaN.
BinaryOp BinaryFor(Opcode op);

// compare's `direction`: eq ne lt le gt ge -> 0..5, anything else -> -1.
int CompareDirectionIndex(const std::string& direction);
template <typename T>
bool CompareValues(int direction, T x, T z) {
  switch (direction) {
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
}

}  // namespace kiln::ir

#endif  // KILN_IR_ELEMENT_SEMANTICS_H_
