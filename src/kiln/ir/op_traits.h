// Per-op properties that compiler passes and backends dispatch on, read from the columns of
// opcodes.def (the one list of ops) instead of switches over opcodes, so adding an op is one row.
//
//   const ir::OpInfo& t = ir::OpTraits(Opcode::kRelu);
//   t.family == ir::KernelFamily::kUnary;  t.alg == ir::EltwiseAlg::kRelu;
//   t.loop_fusible() && t.epilogue_activation();
//   ir::InPlaceOperands(Opcode::kMax) == std::vector<int>{0, 1};
//
// The columns say what an op is (its semantics and which library algorithm matches them); they
// never name a library's types: runtime/cpu maps EltwiseAlg to oneDNN in one place.
#ifndef KILN_IR_OP_TRAITS_H_
#define KILN_IR_OP_TRAITS_H_

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/ir/opcode.h"

namespace kiln::ir {

// How a backend groups the op's kernels (opcodes.def header has the list). The cpu backend's
// LowerNode and the reference backend dispatch on this, not on the opcode.
enum class KernelFamily : uint8_t {
  kNone,  // parameter, constant: bound to a tensor, never computed
  kUnary,
  kBinary,
  kCompare,
  kSelect,
  kLogical,
  kConvert,
  kStructural,
  kIndexing,
  kReduce,
  kArgmax,
  kDot,
  kConv,
  kPool,
  kMaxPoolGrad,
  kSoftmax,
  kLayerNorm,
  kRmsNorm,
  kCrossEntropy,
  kAttention,
  kRandom,
  kCollective,
  kQuantized,  // quantize, quantized_dot, quantized_conv2d (int8; no fusion group takes them)
};

// The math-library algorithm whose semantics are exactly the op's (oneDNN's names): eltwise for
// unary ops, binary for binary ops. kGelu is gelu_erf, or gelu_tanh with approximate="tanh";
// kSwish takes alpha = 1 (silu).
enum class EltwiseAlg : uint8_t {
  kNone,
  kAbs,
  kExp,
  kGelu,
  kLogistic,
  kRelu,
  kSqrt,
  kSwish,
  kTanh,
  kAdd,
  kSub,
  kMul,
  kDiv,
};

// The traits column's flags (opcodes.def header says what each means).
namespace op_traits {
inline constexpr uint32_t kFloatOnly = 1u << 0;
inline constexpr uint32_t kInPlace0 = 1u << 1;
inline constexpr uint32_t kInPlace1 = 1u << 2;
inline constexpr uint32_t kLoop = 1u << 3;
inline constexpr uint32_t kLoopBool = 1u << 4;
inline constexpr uint32_t kLoopSink = 1u << 5;
inline constexpr uint32_t kEpilogue = 1u << 6;
inline constexpr uint32_t kFold = 1u << 7;
inline constexpr uint32_t kPositive = 1u << 8;
inline constexpr uint32_t kKinkAtZero = 1u << 9;
}  // namespace op_traits

struct OpInfo {
  std::string_view name;
  int arity;  // -1 = variadic
  OpKind kind;
  KernelFamily family;
  EltwiseAlg alg;
  uint32_t flags;

  constexpr bool has(uint32_t f) const { return (flags & f) != 0; }
  // Elementwise op defined on floats only.
  constexpr bool float_only() const { return has(op_traits::kFloatOnly); }
  // The fused loop kernel runs it (on f32/bf16 values; on bool values too when loop_bool()).
  constexpr bool loop_fusible() const { return has(op_traits::kLoop | op_traits::kLoopBool); }
  constexpr bool loop_bool() const { return has(op_traits::kLoopBool); }
  // A reduction a loop group may end in (accumulated while the values are in registers).
  constexpr bool loop_sink() const { return has(op_traits::kLoopSink); }
  // An activation a matmul or conv2d runs as a post-op.
  constexpr bool epilogue_activation() const { return has(op_traits::kEpilogue); }
  constexpr bool constant_foldable() const { return has(op_traits::kFold); }
  // Where a unary op is smooth: positive inputs only, or everywhere but 0 (tests draw inputs
  // there).
  constexpr bool positive_domain() const { return has(op_traits::kPositive); }
  constexpr bool kink_at_zero() const { return has(op_traits::kKinkAtZero); }
  // Its result type is declared by the caller, not inferred: the sources (parameter, constant,
  // iota, random_bits) and convert (its new dtype).
  constexpr bool declared_type() const {
    return kind == OpKind::kSource || family == KernelFamily::kConvert;
  }
  // A plain elementwise op: unary or binary family, its builder function generated from its row.
  constexpr bool plain_elementwise() const {
    return family == KernelFamily::kUnary || family == KernelFamily::kBinary;
  }
  // Whether a one-node kernel may write its result over operand i.
  constexpr bool in_place(int i) const {
    return (i == 0 && has(op_traits::kInPlace0)) || (i == 1 && has(op_traits::kInPlace1));
  }
};

namespace internal {
using namespace op_traits;  // the flag names in the table's last column
inline constexpr std::array<OpInfo, kNumOpcodes> kOpInfo = {{
#define KILN_OP(name, text, arity, kind, family, alg, flags) \
  {text, arity, OpKind::kind, KernelFamily::family, EltwiseAlg::alg, flags},
#include "kiln/ir/opcodes.def"
#undef KILN_OP
}};

// Rules that tie columns together; a row that breaks one fails the build.
constexpr bool RowsConsistent() {
  for (const OpInfo& t : kOpInfo) {
    const bool elementwise = t.kind == OpKind::kElementwise;
    if ((t.float_only() || t.loop_fusible() || t.epilogue_activation()) && !elementwise)
      return false;
    if (t.alg != EltwiseAlg::kNone && t.family != KernelFamily::kUnary &&
        t.family != KernelFamily::kBinary)
      return false;
    if (t.epilogue_activation() && (t.arity != 1 || t.alg == EltwiseAlg::kNone)) return false;
    if (t.in_place(1) && t.arity < 2) return false;
    if (t.loop_sink() && t.kind != OpKind::kReduction) return false;
    if ((t.positive_domain() || t.kink_at_zero()) && t.family != KernelFamily::kUnary) return false;
  }
  return true;
}
static_assert(kOpInfo.size() == static_cast<size_t>(kNumOpcodes), "one opcodes.def row per op");
static_assert(RowsConsistent(), "an opcodes.def row breaks a rule tying its columns together");
}  // namespace internal

constexpr const OpInfo& OpTraits(Opcode op) { return internal::kOpInfo[static_cast<int>(op)]; }

// The operand indices a one-node kernel may overwrite with its result (ascending).
inline std::vector<int> InPlaceOperands(Opcode op) {
  std::vector<int> r;
  for (int i = 0; i < 2; ++i)
    if (OpTraits(op).in_place(i)) r.push_back(i);
  return r;
}

}  // namespace kiln::ir

#endif  // KILN_IR_OP_TRAITS_H_
