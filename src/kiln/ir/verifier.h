// Checks a Graph's invariants: operands precede users (SSA order), every node's type equals the
// type InferType gives it, attributes are present and well-formed, parameter indices are 0..n-1
// and unique, parameter and output names are unique, outputs refer to existing nodes, and the
// fusion groups are well formed:
// - every `fusion` attribute is an integer naming a group in Graph::fusion_groups(), and every
//   group there has members;
// - a group's members are consecutive nodes (so no member reads a later member);
// - the kind fits the members: loop = loop-fusible elementwise ops (opcodes.def kLoop rows);
//   reduction = those plus at least one reduce_sum sink that no member reads; matmul_epilogue =
//   dot_general then, each reading the one before, [add] [activation] [add]; conv_epilogue =
//   conv2d then [add] [activation].
// Errors name the node and the group: "node %7 (exp): fusion group 2 (loop): ...".
#ifndef KILN_IR_VERIFIER_H_
#define KILN_IR_VERIFIER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

absl::Status Verify(const Graph& graph);

// Only the fusion-group checks of Verify.
absl::Status VerifyFusionGroups(const Graph& graph);
// What is wrong with group `group` whose members (in node order) are `members`, or "" when it is
// well formed (the kind and contiguity checks above). GraphEditor dissolves groups a rewrite broke.
std::string FusionGroupProblem(const Graph& graph, const FusionGroup& group,
                               const std::vector<int>& members);
// The kind a group with these members has: matmul_epilogue / conv_epilogue by its head,
// reduction when a member is a reduce_sum sink, loop otherwise. For IR text written before group
// declarations existed (the parser) only: passes know the kind they form.
FusionKind InferFusionKind(const Graph& graph, const std::vector<int>& members);

}  // namespace kiln::ir

#endif  // KILN_IR_VERIFIER_H_
