#include "kiln/compiler/passes/constant_fold.h"

#include <optional>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/compiler/graph_editor.h"
#include "kiln/eval/kernels.h"
#include "kiln/ir/op_traits.h"

namespace kiln::compiler {

absl::StatusOr<bool> ConstantFoldPass::Run(ir::Graph& graph) {
  GraphEditor e(graph);
  // value[id]: the value of source node `id` when it is constant-valued (shares storage with the
  // literal for constants).
  std::vector<std::optional<Tensor>> value(graph.num_nodes());
  std::vector<const Tensor*> operands;
  for (const ir::Node& n : graph.nodes()) {
    ir::Opcode op = n.opcode();
    if (op == ir::Opcode::kConstant) {
      if (n.literal() != nullptr) value[n.id()] = *n.literal();
      continue;
    }
    if (!ir::OpTraits(op).constant_foldable()) continue;
    if (n.type().shape.num_elements() > max_elements_) continue;
    operands.clear();
    int64_t input_elements = 0;
    for (int o : n.operands()) {
      operands.push_back(value[o] ? &*value[o] : nullptr);
      input_elements += graph.node(o).type().shape.num_elements();
    }
    bool all_constant = true;
    for (const Tensor* t : operands) all_constant = all_constant && t != nullptr;
    if (!all_constant || input_elements > kMaxFoldInputElements) continue;
    // The reference kernel computes it; a dtype or attribute it rejects leaves the node alone, so
    // folding never turns a graph the backends would reject into one they accept.
    absl::StatusOr<Tensor> v = eval::EvaluateNode(n, operands);
    if (!v.ok()) continue;
    value[n.id()] = *v;
    if (op == ir::Opcode::kBroadcastInDim || op == ir::Opcode::kIota) continue;
    e.set_position(n.id());
    KILN_RETURN_IF_ERROR(e.Replace(n.id(), e.AddConstant(std::move(*v))));
  }
  if (!e.changed()) return false;
  KILN_ASSIGN_OR_RETURN(graph, std::move(e).Build());
  return true;
}

}  // namespace kiln::compiler
