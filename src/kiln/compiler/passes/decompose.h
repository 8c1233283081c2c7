// Decompose: rewrites composite ops (kind kComposite in opcodes.def: softmax, log_softmax,
// layer_norm, rms_norm, cross_entropy, attention) into primitives, for backends that lack them.
//
//   // Keep attention for a backend with a fused kernel, decompose the rest:
//   KILN_ASSIGN_OR_RETURN(ir::Graph g2, DecomposeComposites(g, [](ir::Opcode op) {
//     return op == ir::Opcode::kAttention;
//   }));
//
// What it rewrites: every composite node for which `keep(op)` is false (all of them when `keep` is
// null). What it leaves alone: every other node, copied as is; parameter names and indices and
// output names and order are preserved. Cost: one linear copy of the graph; each composite becomes
// 5-20 primitive nodes (see autodiff/decompositions.h for the exact forms and their numerics:
// max-subtracted exponentials, biased variance, -inf causal mask). Unused nodes stay (DCE runs
// later in the pipeline).
#ifndef KILN_COMPILER_PASSES_DECOMPOSE_H_
#define KILN_COMPILER_PASSES_DECOMPOSE_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/autodiff/decompositions.h"
#include "kiln/compiler/pass.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

// The per-op decompositions, shared with autodiff (which sits above the compiler layer).
using autodiff::DecomposeAttention;
using autodiff::DecomposeCrossEntropy;
using autodiff::DecomposeLayerNorm;
using autodiff::DecomposeLogSoftmax;
using autodiff::DecomposeNode;
using autodiff::DecomposeRmsNorm;
using autodiff::DecomposeSoftmax;

// Returns a copy of `g` with the composites not kept by `keep` decomposed.
absl::StatusOr<ir::Graph> DecomposeComposites(
    const ir::Graph& g, const std::function<bool(ir::Opcode)>& keep = nullptr);

// The same as a pass ("decompose").
class DecomposePass : public Pass {
 public:
  explicit DecomposePass(std::function<bool(ir::Opcode)> keep = nullptr) : keep_(std::move(keep)) {}
  std::string name() const override { return "decompose"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;

 private:
  std::function<bool(ir::Opcode)> keep_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_DECOMPOSE_H_
