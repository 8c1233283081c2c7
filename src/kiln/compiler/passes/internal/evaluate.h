// Evaluates one node on constant operands, for constant folding. The semantics are the reference
// backend's (runtime/reference), reproduced here because the compiler sits above the runtime in
// the layer order: floats compute in double and round once to the result dtype
// (StoreFromDouble); integers compute exactly in int64 and wrap to the result width; float ->
// integer truncates toward zero and saturates, NaN -> 0. constant_fold_test checks every op of
// the subset against the reference backend bit for bit.
//
//   std::optional<Tensor> v = EvaluateNode(node, {&a, &b});   // nullopt: not in the subset
//
// The subset: elementwise unary (abs cos erf exp gelu log logical_not neg relu rsqrt sigmoid sign
// silu sin sqrt tanh), binary (add sub mul div pow max min logical_and logical_or), compare,
// select, convert, broadcast_in_dim, reshape, transpose, slice, concatenate, iota, reduce_sum,
// reduce_max, reduce_min. Dtypes are those the reference backend accepts for the op (f8 only in
// data movement and convert); anything else returns nullopt, so folding never turns a graph the
// backend would reject into one it accepts.
#ifndef KILN_COMPILER_PASSES_INTERNAL_EVALUATE_H_
#define KILN_COMPILER_PASSES_INTERNAL_EVALUATE_H_

#include <optional>
#include <vector>

#include "kiln/ir/graph.h"
#include "kiln/tensor/tensor.h"

namespace kiln::compiler::internal {

// True when EvaluateNode handles `op` (for some dtypes).
bool CanEvaluate(ir::Opcode op);

// The value of `n` given its operands' values (in operand order, with the operand types `n` was
// inferred from). nullopt when the op or a dtype is outside the subset.
std::optional<Tensor> EvaluateNode(const ir::Node& n, const std::vector<const Tensor*>& operands);

}  // namespace kiln::compiler::internal

#endif  // KILN_COMPILER_PASSES_INTERNAL_EVALUATE_H_
