// Vector-Jacobian products: for each differentiable op, how the cotangent of its result turns
// into cotangents of its operands, emitted as new ops in the same Builder. Grad (grad.h) walks a
// graph backwards and calls Vjp on every node between the parameters and the loss.
//
//   VjpArgs args{node, operands, out, cotangent, /*wanted=*/{true, false}};
//   KILN_ASSIGN_OR_RETURN(Cotangents cts, Vjp(args));   // cts[0]: cotangent of operand 0
//
// Conventions (each rule in vjp_rules.cc is marked `// ---- <opname> ----`):
//   - A cotangent has the type of the value it belongs to. nullopt means "zero": the operand is
//     not wanted, is an integer/bool, or the op is not differentiable in it.
//   - Non-differentiable ops (compare, logical_*, sign, argmax, iota, random_bits, parameter,
//     constant) have no rule; Vjp returns all-nullopt for them. Integer operands get nullopt.
//   - Ties and kinks follow PyTorch: max/min split the gradient equally between equal operands
//     (torch.maximum); reduce_max/min divide it evenly among all elements equal to the result
//     (torch.amax); relu'(0) = 0; abs'(0) = 0; pow's masks follow torch.pow.
//   - gather's indices clamp, so its cotangent scatters to the clamped index; scatter_add drops
//     out-of-range indices, so their updates get zero cotangent.
//   - max_pool2d_grad has no rule for grad_out yet (double-backward through max pooling):
//     Unimplemented. Its input operand gets zero (the op is piecewise constant in it).
#ifndef KILN_AUTODIFF_VJP_RULES_H_
#define KILN_AUTODIFF_VJP_RULES_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"

namespace kiln::autodiff {

// `node` must not live in the builder the rule emits into (its node list moves as nodes are
// added); Grad passes nodes of the source graph.
struct VjpArgs {
  const ir::Node& node;                    // the forward node: opcode, attributes, type
  const std::vector<ir::Value>& operands;  // its operands, as Values in the builder
  ir::Value out;                           // its result, as a Value in the builder
  ir::Value cotangent;                     // cotangent of the result (same type as `out`)
  const std::vector<bool>& wanted;         // which operand cotangents to build
};

using Cotangents = std::vector<std::optional<ir::Value>>;

using VjpRule = absl::StatusOr<Cotangents> (*)(const VjpArgs& args);

// The rule for `op`, or nullptr when `op` is not differentiable.
VjpRule FindVjpRule(ir::Opcode op);
inline bool IsDifferentiable(ir::Opcode op) { return FindVjpRule(op) != nullptr; }

// Runs the rule of args.node's op. Returns one entry per operand (all nullopt for
// non-differentiable ops). Builder errors surface later, from Builder::Build().
absl::StatusOr<Cotangents> Vjp(const VjpArgs& args);

}  // namespace kiln::autodiff

#endif  // KILN_AUTODIFF_VJP_RULES_H_
