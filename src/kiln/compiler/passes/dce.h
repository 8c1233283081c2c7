// DCE ("dce"): removes nodes that no output depends on.
//
//   %2 = exp(%0)            # unused          ->  (gone)
//   return y=%1                                   return y=%1
//
// What it rewrites: every non-parameter node not reachable from an output is dropped, and ids are
// renumbered compactly in the same relative order. What it leaves alone: parameters (always kept,
// used or not, so the signature never changes) and everything reachable. Every op in the opset
// is pure (random_bits is stateless, collectives are values), so nothing else needs keeping.
// Cost: O(nodes + edges).
#ifndef KILN_COMPILER_PASSES_DCE_H_
#define KILN_COMPILER_PASSES_DCE_H_

#include <string>

#include "kiln/compiler/pass.h"

namespace kiln::compiler {

class DcePass : public Pass {
 public:
  std::string name() const override { return "dce"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_DCE_H_
