// Reference kernels for elementwise ops. Floats compute in double and round once on store;
// integers compute exactly in int64 and wrap to the output width (two's complement, as XLA and
// PyTorch do). Operands of binary ops have identical types (the builder inserts broadcasts).
#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/base/status.h"
#include "kiln/eval/kernels.h"
#include "kiln/ir/element_semantics.h"
#include "kiln/ir/op_traits.h"

namespace kiln::eval {
namespace {

using ir::Opcode;

// Scalar rules: ir/element_semantics.cc.
absl::StatusOr<Kernel> MakeUnary(const ir::Node& n, OperandTypes types) {
  ir::UnaryOp op = ir::UnaryFor(n);
  if (n.opcode() == Opcode::kGelu && n.has_attr("approximate")) {
    const std::string& a = n.attr_str("approximate");
    if (a != "none" && a != "tanh")
      return Unsupported(n, "approximate must be none or tanh, got '" + a + "'");
  }
  DType in_t = types[0].dtype;
  DType out_t = n.type().dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, in_t, kFloatTypes | (op.i ? kIntTypes : 0), "operand 0"));
  int x = 0, y = ResultSlot(n);
  int64_t count = n.type().shape.num_elements();
  if (IsInteger(in_t)) {
    ir::IntUnary f = op.i;
    return Kernel([=](Buffers ctx) {
      for (int64_t i = 0; i < count; ++i)
        StoreFromInt64(Out(ctx, y), out_t, i, f(LoadAsInt64(In(ctx, x), in_t, i)));
    });
  }
  ir::FloatUnary f = op.f;
  return Kernel([=](Buffers ctx) {
    for (int64_t i = 0; i < count; ++i)
      StoreFromDouble(Out(ctx, y), out_t, i, f(LoadAsDouble(In(ctx, x), in_t, i)));
  });
}

// Scalar rules: ir/element_semantics.cc.
absl::StatusOr<Kernel> MakeBinary(const ir::Node& n, OperandTypes types) {
  ir::BinaryOp op = ir::BinaryFor(n.opcode());
  DType in_t = types[0].dtype;
  DType out_t = n.type().dtype;
  unsigned allowed = kFloatTypes | kIntTypes | (op.allows_bool ? kBoolTypes : 0);
  KILN_RETURN_IF_ERROR(CheckDType(n, in_t, allowed, "operand 0"));
  KILN_RETURN_IF_ERROR(CheckDType(n, types[1].dtype, allowed, "operand 1"));
  int a = 0, b = 1, y = ResultSlot(n);
  DType b_t = types[1].dtype;
  int64_t count = n.type().shape.num_elements();
  if (!IsFloating(in_t)) {
    ir::IntBinary f = op.i;
    return Kernel([=](Buffers ctx) {
      for (int64_t i = 0; i < count; ++i)
        StoreFromInt64(Out(ctx, y), out_t, i,
                       f(LoadAsInt64(In(ctx, a), in_t, i), LoadAsInt64(In(ctx, b), b_t, i)));
    });
  }
  ir::FloatBinary f = op.f;
  return Kernel([=](Buffers ctx) {
    for (int64_t i = 0; i < count; ++i)
      StoreFromDouble(Out(ctx, y), out_t, i,
                      f(LoadAsDouble(In(ctx, a), in_t, i), LoadAsDouble(In(ctx, b), b_t, i)));
  });
}

// -> bool. Floats compare as IEEE doubles (any comparison with NaN is false, except ne); integers
// and bool compare exactly.
absl::StatusOr<Kernel> MakeCompare(const ir::Node& n, OperandTypes types) {
  DType a_t = types[0].dtype, b_t = types[1].dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, a_t, kFloatTypes | kIntTypes | kBoolTypes, "operand 0"));
  KILN_RETURN_IF_ERROR(CheckDType(n, b_t, kFloatTypes | kIntTypes | kBoolTypes, "operand 1"));
  const std::string& dir = n.attr_str("direction");
  int d = ir::CompareDirectionIndex(dir);
  if (d < 0) return Unsupported(n, "unknown direction '" + dir + "'");
  int a = 0, b = 1, y = ResultSlot(n);
  DType out_t = n.type().dtype;
  int64_t count = n.type().shape.num_elements();
  bool floating = IsFloating(a_t) || IsFloating(b_t);
  return Kernel([=](Buffers ctx) {
    for (int64_t i = 0; i < count; ++i) {
      bool r = floating ? ir::CompareValues(d, LoadAsDouble(In(ctx, a), a_t, i),
                                            LoadAsDouble(In(ctx, b), b_t, i))
                        : ir::CompareValues(d, LoadAsInt64(In(ctx, a), a_t, i),
                                            LoadAsInt64(In(ctx, b), b_t, i));
      StoreFromInt64(Out(ctx, y), out_t, i, r ? 1 : 0);
    }
  });
}

// Operands are bool or integers (nonzero is true); the result is 1/0 in the node's dtype.
absl::StatusOr<Kernel> MakeLogical(const ir::Node& n, OperandTypes types) {
  std::vector<DType> dtypes;
  for (size_t k = 0; k < types.size(); ++k) {
    dtypes.push_back(types[k].dtype);
    KILN_RETURN_IF_ERROR(
        CheckDType(n, dtypes.back(), kIntTypes | kBoolTypes, "operand " + std::to_string(k)));
  }
  Opcode op = n.opcode();
  int y = ResultSlot(n);
  DType out_t = n.type().dtype;
  int64_t count = n.type().shape.num_elements();
  return Kernel([=](Buffers ctx) {
    for (int64_t i = 0; i < count; ++i) {
      bool a = LoadAsInt64(In(ctx, 0), dtypes[0], i) != 0;
      bool r;
      if (op == Opcode::kLogicalNot)
        r = !a;
      else if (op == Opcode::kLogicalAnd)
        r = a && LoadAsInt64(In(ctx, 1), dtypes[1], i) != 0;
      else
        r = a || LoadAsInt64(In(ctx, 1), dtypes[1], i) != 0;
      StoreFromInt64(Out(ctx, y), out_t, i, r ? 1 : 0);
    }
  });
}

// pred ? on_true : on_false, element by element; a byte copy, so any value dtype works.
absl::StatusOr<Kernel> MakeSelect(const ir::Node& n, OperandTypes types) {
  DType p_t = types[0].dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, p_t, kBoolTypes | kIntTypes, "predicate"));
  if (types[1].dtype != n.type().dtype || types[2].dtype != n.type().dtype)
    return Unsupported(n, "on_true and on_false must have the result dtype");
  int p = 0, t = 1, f = 2, y = ResultSlot(n);
  int64_t count = n.type().shape.num_elements();
  int64_t width = DTypeSize(n.type().dtype);
  return Kernel([=](Buffers ctx) {
    auto* out = static_cast<uint8_t*>(Out(ctx, y));
    const auto* on_true = static_cast<const uint8_t*>(In(ctx, t));
    const auto* on_false = static_cast<const uint8_t*>(In(ctx, f));
    for (int64_t i = 0; i < count; ++i) {
      const uint8_t* src = LoadAsInt64(In(ctx, p), p_t, i) != 0 ? on_true : on_false;
      std::memcpy(out + i * width, src + i * width, width);
    }
  });
}

// Same shape, new dtype. Integer/bool -> integer/bool is exact and wraps like a C++ cast; anything
// -> float rounds to nearest even; float -> integer truncates toward zero and saturates (NaN -> 0);
// -> bool is "nonzero" (NaN -> true). f8 types are allowed on either side.
absl::StatusOr<Kernel> MakeConvert(const ir::Node& n, OperandTypes types) {
  DType in_t = types[0].dtype, out_t = n.type().dtype;
  int x = 0, y = ResultSlot(n);
  int64_t count = n.type().shape.num_elements();
  if (!IsFloating(in_t) && !IsFloating(out_t)) {
    return Kernel([=](Buffers ctx) {
      for (int64_t i = 0; i < count; ++i)
        StoreFromInt64(Out(ctx, y), out_t, i, LoadAsInt64(In(ctx, x), in_t, i));
    });
  }
  if (!IsFloating(in_t)) {  // integer -> float: exact int64 first
    return Kernel([=](Buffers ctx) {
      for (int64_t i = 0; i < count; ++i)
        StoreFromDouble(Out(ctx, y), out_t, i,
                        static_cast<double>(LoadAsInt64(In(ctx, x), in_t, i)));
    });
  }
  return Kernel([=](Buffers ctx) {
    for (int64_t i = 0; i < count; ++i)
      StoreFromDouble(Out(ctx, y), out_t, i, LoadAsDouble(In(ctx, x), in_t, i));
  });
}

}  // namespace

absl::StatusOr<Kernel> MakeElementwiseKernel(const ir::Node& n, OperandTypes types) {
  using F = ir::KernelFamily;
  switch (ir::OpTraits(n.opcode()).family) {
    case F::kCompare:
      return MakeCompare(n, types);
    case F::kConvert:
      return MakeConvert(n, types);
    case F::kLogical:
      return MakeLogical(n, types);
    case F::kSelect:
      return MakeSelect(n, types);
    case F::kBinary:
      return MakeBinary(n, types);
    case F::kUnary:
      if (ir::UnaryFor(n).f != nullptr) return MakeUnary(n, types);
      break;
    default:
      break;
  }
  return absl::InternalError("elementwise: unexpected op " +
                             std::string(ir::OpcodeName(n.opcode())));
}

}  // namespace kiln::eval
