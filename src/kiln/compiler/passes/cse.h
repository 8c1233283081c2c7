// CSE ("cse"): merges nodes that compute the same value.
//
//   %2 = exp(%0)                      %2 = exp(%0)
//   %3 = exp(%0)               ->     %4 = add(%2, %2)
//   %4 = add(%2, %3)
//
// Two nodes are the same when they have the same opcode, the same operands (after earlier merges,
// so whole duplicated subgraphs collapse in one run), bit-identical attributes (so pad value 0.0
// and -0.0 stay apart) and the same type; constants also need identical literal bytes (dtype and
// shape included). The operands of commutative ops (add, mul, max, min, logical_and, logical_or,
// compare eq/ne) are compared as an unordered pair. random_bits is a pure function of its seed
// and counter operands, so equal calls merge too; so do collectives (every replica runs the same
// graph). The later node is replaced by the earlier one.
// What it leaves alone: parameters (each is its own input); anything that differs in any of the
// above. Cost: O(nodes) hash lookups, plus hashing every constant's bytes once.
#ifndef KILN_COMPILER_PASSES_CSE_H_
#define KILN_COMPILER_PASSES_CSE_H_

#include <string>

#include "kiln/compiler/pass.h"

namespace kiln::compiler {

class CsePass : public Pass {
 public:
  std::string name() const override { return "cse"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_CSE_H_
