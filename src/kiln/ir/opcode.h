// The Opcode enum and per-op metadata, generated from opcodes.def (the single list of ops).
// What passes and backends dispatch on (kernel family, fusibility, in-place operands, ...) is in
// op_traits.h, read from the same rows.
//
//   Opcode op = Opcode::kAdd;
//   OpcodeName(op) == "add";  OpcodeFromName("add") == Opcode::kAdd;
#ifndef KILN_IR_OPCODE_H_
#define KILN_IR_OPCODE_H_

#include <optional>
#include <string_view>

namespace kiln::ir {

enum class OpKind {
  kSource,
  kElementwise,
  kStructural,
  kReduction,
  kContraction,
  kComposite,
  kCollective,
  kOther
};

enum class Opcode {
#define KILN_OP(name, ...) k##name,
#include "kiln/ir/opcodes.def"
#undef KILN_OP
};

inline constexpr int kNumOpcodes = 0
#define KILN_OP(name, ...) +1
#include "kiln/ir/opcodes.def"
#undef KILN_OP
    ;

std::string_view OpcodeName(Opcode op);
std::optional<Opcode> OpcodeFromName(std::string_view name);
int OpcodeArity(Opcode op);  // -1 = variadic
OpKind OpcodeKind(Opcode op);
inline bool IsComposite(Opcode op) { return OpcodeKind(op) == OpKind::kComposite; }

}  // namespace kiln::ir

#endif  // KILN_IR_OPCODE_H_
