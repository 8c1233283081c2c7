// Constant folding ("constant-fold"): evaluates nodes whose operands are all constant and
// replaces them with constants.
//
//   %0 = constant() {value=2.0} : f32[]            %3 = constant() {value=5.0} : f32[]
//   %1 = constant() {value=3.0} : f32[]      ->
//   %2 = add(%0, %1) : f32[]
//
// What it rewrites: a node is folded when every operand is constant-valued, its opcodes.def row
// has kFold (elementwise unary/binary/compare/select/convert/logical, broadcast_in_dim, reshape,
// transpose, slice, concatenate, iota, reduce_sum/max/min), the reference kernel accepts its
// dtypes and attributes, its result has at most `max_elements` elements (default
// kDefaultMaxFoldElements = 4096: a folded constant lives in the IR text, the compile-cache key
// and the executable, so large ones would cost more than the op) and its operands hold at most
// kMaxFoldInputElements in all (compile time).
// Constant-valued means a constant, or a broadcast_in_dim or iota of constant-valued operands:
// those two are evaluated but never replaced themselves (as in XLA, materializing a broadcast
// only costs memory), so add(broadcast(2.0), broadcast(3.0)) folds while broadcast(2.0) stays.
// Values are computed by the evaluator (eval/kernels.h, eval::EvaluateNode): the kernels the
// reference backend runs, so a folded constant is bit for bit what the backend computes.
// What it leaves alone: parameters, random_bits, contractions, convolutions, pooling,
// composites, gather/scatter, pad, collectives, and anything over the limits.
// Cost: O(nodes) plus the element work of each fold (bounded by the limits above).
#ifndef KILN_COMPILER_PASSES_CONSTANT_FOLD_H_
#define KILN_COMPILER_PASSES_CONSTANT_FOLD_H_

#include <cstdint>
#include <string>

#include "kiln/compiler/pass.h"

namespace kiln::compiler {

inline constexpr int64_t kDefaultMaxFoldElements = 4096;
inline constexpr int64_t kMaxFoldInputElements = int64_t{1} << 20;

class ConstantFoldPass : public Pass {
 public:
  explicit ConstantFoldPass(int64_t max_elements = kDefaultMaxFoldElements)
      : max_elements_(max_elements) {}
  std::string name() const override { return "constant-fold"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;

 private:
  int64_t max_elements_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_CONSTANT_FOLD_H_
