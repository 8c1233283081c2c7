// Shape and dtype inference: the result type of an op from its operands' types and attributes.
// Errors name the op and the shapes involved, e.g.
//   "dot_general: contracting dimension sizes differ: lhs f32[2,3] dim 1 is 3, rhs f32[4,5] dim 0
//   is 4"
// Source ops (parameter, constant, iota, random_bits) and convert take `declared` as their type
// (checked for validity); for every other op `declared`, when given, must equal the inferred type.
#ifndef KILN_IR_SHAPE_INFERENCE_H_
#define KILN_IR_SHAPE_INFERENCE_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

absl::StatusOr<Type> InferType(Opcode op, const std::vector<Type>& operands, const AttrMap& attrs,
                               const std::optional<Type>& declared = std::nullopt);

}  // namespace kiln::ir

#endif  // KILN_IR_SHAPE_INFERENCE_H_
