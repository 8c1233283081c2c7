#include "kiln/ir/opcode.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/ir/op_traits.h"

namespace kiln::ir {
namespace {

constexpr const std::array<OpInfo, kNumOpcodes>& kOps = internal::kOpInfo;

// The list must stay sorted by name: the parser binary-searches it and reviewers find ops fast.
constexpr bool IsSorted() {
  for (size_t i = 1; i < kOps.size(); ++i)
    if (!(kOps[i - 1].name < kOps[i].name)) return false;
  return true;
}
static_assert(IsSorted(), "opcodes.def must be sorted by text name");

}  // namespace

std::string_view OpcodeName(Opcode op) { return kOps[static_cast<int>(op)].name; }
int OpcodeArity(Opcode op) { return kOps[static_cast<int>(op)].arity; }
OpKind OpcodeKind(Opcode op) { return kOps[static_cast<int>(op)].kind; }

std::optional<Opcode> OpcodeFromName(std::string_view name) {
  auto it = std::lower_bound(kOps.begin(), kOps.end(), name,
                             [](const OpInfo& a, std::string_view n) { return a.name < n; });
  if (it == kOps.end() || it->name != name) return std::nullopt;
  return static_cast<Opcode>(it - kOps.begin());
}

}  // namespace kiln::ir
