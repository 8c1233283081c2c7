// Mixed precision ("mixed-precision"): rewrites an f32 graph to compute chosen ops in bf16 under a
// precision policy, keeping every parameter and output at its declared type (parameters are the
// f32 "master weights"). This is the JAX/jmp recipe done as a graph rewrite: run it on a loss
// graph before autodiff::Grad and the backward matmuls are bf16 too (through convert's VJP), while
// gradients arrive in f32 for the f32 parameters and the optimizer update stays f32.
//
//   %0 = parameter() {index=0, name="x"} : f32[8,16]
//   %1 = parameter() {index=1, name="w"} : f32[16,4]
//   %2 = dot_general(%0, %1) {...} : f32[8,4]
//   %3 = relu(%2) : f32[8,4]
//     -> (policy mixed_bf16)
//   %2 = convert(%0) : bf16[8,16]
//   %3 = convert(%1) : bf16[16,4]
//   %4 = dot_general(%2, %3) {...} : bf16[8,4]      # oneDNN accumulates in f32, rounds on store
//   %5 = convert(%4) : f32[8,4]
//   %6 = relu(%5) : f32[8,4]
//
//   MixedPrecisionPass pass(PrecisionPolicy::kMixedBf16, /*master_weights=*/{"w"});
//   KILN_ASSIGN_OR_RETURN(bool changed, pass.Run(graph));
//
// compiler::Compile runs it first, in its "program" pipeline (CompileOptions::program.precision,
// compile.h); a training step runs that pipeline on its loss graph before autodiff instead.
//
// Policies (ParsePrecisionPolicy takes their names):
// - f32: no change.
// - mixed_bf16: contractions (dot_general, conv2d, conv2d_backward_input, conv2d_backward_filter)
//   whose operands are f32 take bf16 copies of their operands, compute in bf16 and are followed by
//   a convert back to f32, so every consumer still reads f32. Everything else stays f32:
//   reductions, softmax, log_softmax, layer_norm, rms_norm, cross_entropy, attention, all
//   elementwise math. Results differ from f32 by bf16 rounding of the contraction inputs and
//   outputs only (both backends accumulate bf16 contractions in f32).
// - bf16: mixed_bf16, and also every elementwise op (opcodes.def kind kElementwise) with an f32
//   result computes in bf16 (its f32 operands are converted; a select's bool predicate is not),
//   except on scalars (rank 0): they cost nothing and carry the loss (a mean's division), which
//   stays f32.
//   Reductions (reduce_sum/max/min, argmax), softmax, log_softmax, layer_norm, rms_norm,
//   cross_entropy and attention stay f32: they read the f32 up-convert of a bf16 producer.
// Under both bf16 policies, data movement (reshape, transpose, broadcast_in_dim, slice) of a value
// that is an up-convert of a bf16 value moves the bf16 value instead (exact: it only copies), so
// e.g. a reshape between two matmuls does not cost a convert pair.
//
// Converts are memoized: one f32 -> bf16 convert per value however many bf16 consumers it has,
// and the bf16 copy of convert(y: bf16 -> f32) is y itself, so no convert(convert(..)) chain is
// made. Up-converts nobody reads are dropped (GraphEditor::Build). Running the simplify pipeline
// after (algebraic, constant-fold, cse, dce) folds converted constants.
// What it leaves alone: integer and bool values, f64/f16 values, ops already in bf16 (so a second
// Run returns false), parameters and outputs (their types never change), sources (constant,
// iota, random_bits), gather/scatter_add/pad/concatenate, collectives, pooling.
// Cost: one pass over the nodes; at most one extra convert per rewritten op and per value it
// reads.
#ifndef KILN_COMPILER_PASSES_MIXED_PRECISION_H_
#define KILN_COMPILER_PASSES_MIXED_PRECISION_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/compiler/pass.h"

namespace kiln::compiler {

enum class PrecisionPolicy { kF32, kMixedBf16, kBf16 };

// "f32" | "mixed_bf16" | "bf16". InvalidArgument naming the allowed values otherwise.
absl::StatusOr<PrecisionPolicy> ParsePrecisionPolicy(const std::string& name);
// The text name ParsePrecisionPolicy takes.
std::string PrecisionPolicyName(PrecisionPolicy policy);

class MixedPrecisionPass : public Pass {
 public:
  // Parameters named in `master_weights` must be f32 under a policy other than f32 (Run returns
  // InvalidArgument naming the first that is not: a policy keeps f32 master weights); names the
  // graph lacks are ignored.
  explicit MixedPrecisionPass(PrecisionPolicy policy, std::vector<std::string> master_weights = {})
      : policy_(policy), master_weights_(std::move(master_weights)) {}
  std::string name() const override { return "mixed-precision"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;

 private:
  PrecisionPolicy policy_;
  std::vector<std::string> master_weights_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_MIXED_PRECISION_H_
