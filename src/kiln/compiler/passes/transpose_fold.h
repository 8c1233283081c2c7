// Transpose folding ("transpose-fold"): absorbs a transpose that feeds a dot_general operand into
// the dot's dimension numbers (XLA's TransposeFolding).
//
//   %2 = transpose(%0) {permutation=[1,0]} : f32[3,2]       # %0 : f32[2,3]
//   %3 = dot_general(%2, %1) {lhs_contracting=[1], rhs_contracting=[0], ...} : f32[3,4]
//     ->
//   %3 = dot_general(%0, %1) {lhs_contracting=[0], rhs_contracting=[0], ...} : f32[3,4]
//
// What it rewrites:
// - operands: for each dot_general operand that is transpose(x, p), the operand becomes x and its
//   batch / contracting dims d become p[d], provided (a) the result layout stays identical: the
//   operand's free dims, in increasing order, map through p to increasing dims of x (the dot's
//   result lists free dims in operand dim order), and (b) every user of the transpose is a
//   dot_general (so the transpose disappears instead of being computed as well as read strided);
// - results: transpose(dot_general(a, b)) whose permutation keeps the batch dims in place and
//   swaps the block of lhs free dims with the block of rhs free dims becomes dot_general(b, a)
//   with the dimension numbers swapped, provided the transpose is the dot's only user. This is
//   what autodiff's matmul rule emits for weight gradients: transpose(dot(dy, x)) = dot(x, dy).
//   Each output element is the same sum of the same products in the same order.
// Both backends' dot_general take any dimension numbers: the cpu backend passes a transposed
// operand to oneDNN as a strided view at no cost, or copies it once, which is what the transpose
// did anyway.
// What it leaves alone: transposes with other users (or that are outputs), transposes whose
// folding would reorder the result's free dims, dots with several users, other permutations of
// a dot's result, and every other op. Reshapes are not folded.
// Cost: one pass over the nodes plus a use count.
#ifndef KILN_COMPILER_PASSES_TRANSPOSE_FOLD_H_
#define KILN_COMPILER_PASSES_TRANSPOSE_FOLD_H_

#include <string>

#include "kiln/compiler/pass.h"

namespace kiln::compiler {

class TransposeFoldPass : public Pass {
 public:
  std::string name() const override { return "transpose-fold"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_TRANSPOSE_FOLD_H_
