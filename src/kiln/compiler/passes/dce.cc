#include "kiln/compiler/passes/dce.h"

#include <vector>

#include "kiln/base/status.h"
#include "kiln/compiler/graph_editor.h"

namespace kiln::compiler {

absl::StatusOr<bool> DcePass::Run(ir::Graph& graph) {
  const int n = graph.num_nodes();
  std::vector<char> live(n, 0);
  std::vector<int> stack;
  for (const ir::Output& o : graph.outputs()) stack.push_back(o.node);
  for (const ir::Node& node : graph.nodes())
    if (node.opcode() == ir::Opcode::kParameter) stack.push_back(node.id());
  int num_live = 0;
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (live[id]) continue;
    live[id] = 1;
    ++num_live;
    for (int o : graph.node(id).operands()) stack.push_back(o);
  }
  if (num_live == n) return false;
  // Nodes are already in topological order: the editor keeps the live ones in place.
  GraphEditor e(graph);
  e.set_dead_code(GraphEditor::DeadCode::kDrop);
  KILN_ASSIGN_OR_RETURN(graph, std::move(e).Build());
  return true;
}

}  // namespace kiln::compiler
