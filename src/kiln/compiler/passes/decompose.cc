#include "kiln/compiler/passes/decompose.h"

#include <optional>
#include <vector>

#include "kiln/autodiff/graph_copy.h"
#include "kiln/base/status.h"
#include "kiln/ir/builder.h"

namespace kiln::compiler {
namespace {

bool ShouldDecompose(ir::Opcode op, const std::function<bool(ir::Opcode)>& keep) {
  return ir::IsComposite(op) && !(keep && keep(op));
}

}  // namespace

absl::StatusOr<ir::Graph> DecomposeComposites(const ir::Graph& g,
                                              const std::function<bool(ir::Opcode)>& keep) {
  ir::Builder b(g.name());
  KILN_ASSIGN_OR_RETURN(
      autodiff::ValueMap map,
      autodiff::CopyGraph(
          g, b,
          [&](const ir::Node& n,
              const std::vector<ir::Value>& operands) -> absl::StatusOr<std::optional<ir::Value>> {
            if (!ShouldDecompose(n.opcode(), keep)) return std::nullopt;
            KILN_ASSIGN_OR_RETURN(ir::Value v, autodiff::DecomposeNode(n, operands));
            return std::optional<ir::Value>(v);
          }));
  autodiff::CopyOutputs(g, map, b);
  absl::StatusOr<ir::Graph> out = b.Build();
  if (!out.ok()) return Annotate(out.status(), "decompose");
  return out;
}

absl::StatusOr<bool> DecomposePass::Run(ir::Graph& graph) {
  bool any = false;
  for (const ir::Node& n : graph.nodes()) any = any || ShouldDecompose(n.opcode(), keep_);
  if (!any) return false;
  KILN_ASSIGN_OR_RETURN(ir::Graph out, DecomposeComposites(graph, keep_));
  graph = std::move(out);
  return true;
}

}  // namespace kiln::compiler
