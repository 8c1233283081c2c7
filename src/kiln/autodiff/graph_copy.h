// Copies a Graph node by node into a Builder, mapping old node ids to new Values. Passes and the
// autodiff transformation rebuild graphs this way: copy what they keep, emit new ops for what they
// rewrite, and let the builder re-infer (and check) every type.
//
//   ir::Builder b(g.name());
//   KILN_ASSIGN_OR_RETURN(ValueMap map, CopyGraph(g, b, [](const ir::Node& n,
//       const std::vector<ir::Value>& ops) -> std::optional<ir::Value> {
//     if (n.opcode() == ir::Opcode::kRelu) return ir::Max(ops[0], ops[0] * 0.0);
//     return std::nullopt;                         // copy as is
//   }));
//   CopyOutputs(g, map, b);
//   KILN_ASSIGN_OR_RETURN(ir::Graph out, b.Build());
//
// Parameters are created first, in index order, so the copy keeps every parameter's name and
// index; outputs keep their names and order.
#ifndef KILN_AUTODIFF_GRAPH_COPY_H_
#define KILN_AUTODIFF_GRAPH_COPY_H_

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"

namespace kiln::autodiff {

// map[id] is the Value standing for node `id` of the source graph.
using ValueMap = std::vector<ir::Value>;

// Returns a replacement for node `n` whose operands are already mapped to `operands`, or nullopt
// to copy the node unchanged. A replacement must have the node's type.
using NodeRewriter = std::function<absl::StatusOr<std::optional<ir::Value>>(
    const ir::Node& n, const std::vector<ir::Value>& operands)>;

// Creates `g`'s parameters in `b`, in index order, and returns a map (sized g.num_nodes()) with
// their entries filled. `b` must not have parameters yet, so the indices line up.
ValueMap CopyParameters(const ir::Graph& g, ir::Builder& b);

// Re-creates `n` in `b` with the given operands: same opcode and attributes, the literal of a
// constant, and the declared type of source ops and convert. Parameters are not copied this way
// (use CopyParameters).
ir::Value CopyNode(ir::Builder& b, const ir::Node& n, const std::vector<ir::Value>& operands);

// Copies all of `g` into `b` (parameters first, then every other node in order), applying
// `rewrite` when given. Errors: the builder's first error, or a replacement of the wrong type.
absl::StatusOr<ValueMap> CopyGraph(const ir::Graph& g, ir::Builder& b,
                                   const NodeRewriter& rewrite = nullptr);

// Adds `g`'s outputs to `b` under the same names, in the same order.
void CopyOutputs(const ir::Graph& g, const ValueMap& map, ir::Builder& b);

}  // namespace kiln::autodiff

#endif  // KILN_AUTODIFF_GRAPH_COPY_H_
