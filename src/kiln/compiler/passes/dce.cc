#include "kiln/compiler/passes/dce.h"

#include <vector>

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
  // Nodes are already in topological order: keep the live ones in place and renumber.
  ir::Graph out(graph.name());
  std::vector<int> new_id(n, -1);
  for (const ir::Node& node : graph.nodes()) {
    if (!live[node.id()]) continue;
    std::vector<int> operands;
    operands.reserve(node.operands().size());
    for (int o : node.operands()) operands.push_back(new_id[o]);
    new_id[node.id()] = out.AddNode(node.opcode(), std::move(operands), node.type(), node.attrs(),
                                    node.shared_literal());
  }
  for (const ir::Output& o : graph.outputs()) out.AddOutput(o.name, new_id[o.node]);
  graph = std::move(out);
  return true;
}

}  // namespace kiln::compiler
