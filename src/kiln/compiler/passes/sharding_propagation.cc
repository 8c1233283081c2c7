#include "kiln/compiler/passes/sharding_propagation.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/compiler/passes/spmd_partitioner.h"
#include "kiln/ir/op_traits.h"

namespace kiln::compiler {
namespace {

using ir::Sharding;

// Ops that can produce a value split as their user wants at no cost.
bool Hintable(const ir::Node& n) {
  switch (n.opcode()) {
    case ir::Opcode::kBroadcastInDim:
    case ir::Opcode::kIota:
    case ir::Opcode::kScatterAdd:
      return true;
    default:
      return ir::OpTraits(n.opcode()).kind == ir::OpKind::kElementwise;
  }
}

}  // namespace

absl::StatusOr<bool> ShardingPropagation::Run(ir::Graph& graph) {
  if (parameter_shardings_.empty()) return Propagate(graph);
  bool annotates = false;  // does an annotation change a parameter?
  for (int id : graph.parameters()) {
    const ir::Node& p = graph.node(id);
    auto it = parameter_shardings_.find(p.attr_str("name"));
    if (it == parameter_shardings_.end()) continue;
    annotates = annotates || !p.has_attr(ir::kShardingAttr) ||
                p.attr_str(ir::kShardingAttr) != it->second.ToString();
  }
  ir::Graph annotated = graph;  // on a copy: an error leaves `graph` unchanged
  KILN_RETURN_IF_ERROR(
      Annotate(AnnotateParameters(annotated, parameter_shardings_), "sharding-propagation"));
  KILN_ASSIGN_OR_RETURN(bool propagated, Propagate(annotated));
  graph = std::move(annotated);
  return annotates || propagated;
}

absl::StatusOr<bool> ShardingPropagation::Propagate(ir::Graph& graph) {
  if (mesh_.size < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("sharding-propagation: mesh axis size must be >= 1, got ", mesh_.size));
  const int n = graph.num_nodes();
  std::vector<Sharding> s(n);
  bool any = false;
  for (const ir::Node& node : graph.nodes()) {
    if (node.opcode() != ir::Opcode::kParameter) continue;
    absl::StatusOr<Sharding> a = ir::ShardingOf(node);
    if (!a.ok())
      return absl::InvalidArgumentError(absl::StrCat("sharding-propagation: parameter \"",
                                                     node.attr_str("name"),
                                                     "\": ", a.status().message()));
    if (!a->partial.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("sharding-propagation: parameter \"", node.attr_str("name"),
                       "\": a parameter cannot be partial (", a->ToString(), ")"));
    const int d = a->split_dim();
    if (d >= 0) {
      if (a->dims[d].axis != mesh_.axis)
        return absl::InvalidArgumentError(absl::StrCat(
            "sharding-propagation: parameter \"", node.attr_str("name"), "\" is split over axis '",
            a->dims[d].axis, "', but the program is partitioned over '", mesh_.axis, "'"));
      KILN_RETURN_IF_ERROR(
          Annotate(ir::CheckSharding(*a, node.type(), mesh_.size),
                   "sharding-propagation: parameter \"" + node.attr_str("name") + "\""));
      any = true;
    }
    s[node.id()] = *a;
  }

  std::vector<std::optional<Sharding>> hint(n);
  std::vector<std::vector<Sharding>> wanted(n);
  for (const ir::Output& o : graph.outputs()) {
    if (o.in_place_of < 0) continue;
    const int p = graph.ParameterWithIndex(o.in_place_of);
    if (p >= 0 && s[p].split_dim() >= 0 && !hint[o.node]) hint[o.node] = s[p];
  }
  if (any) {
    for (int sweep = 0; sweep <= n; ++sweep) {
      for (const ir::Node& node : graph.nodes()) {
        if (node.opcode() == ir::Opcode::kParameter) continue;
        std::vector<ir::Type> types;
        std::vector<Sharding> in;
        for (int op : node.operands()) {
          types.push_back(graph.node(op).type());
          in.push_back(sharding::Resolved(s[op]));
        }
        sharding::Plan p = sharding::PlanNode(node, types, in,
                                              hint[node.id()] ? &*hint[node.id()] : nullptr, mesh_);
        s[node.id()] = std::move(p.out);
        wanted[node.id()] = std::move(p.operands);
      }
      bool changed = false;
      for (int id = n - 1; id >= 0; --id) {
        const ir::Node& node = graph.node(id);
        for (size_t i = 0; i < node.operands().size() && i < wanted[id].size(); ++i) {
          const int op = node.operand(static_cast<int>(i));
          const Sharding& w = wanted[id][i];
          if (w.split_dim() < 0 || hint[op] || !s[op].replicated() || !Hintable(graph.node(op)))
            continue;
          hint[op] = w;
          changed = true;
        }
      }
      if (!changed) break;
    }
  }

  bool changed = false;
  ir::Graph out(graph.name());
  for (const ir::Node& node : graph.nodes()) {
    ir::AttrMap attrs = node.attrs();
    if (node.opcode() != ir::Opcode::kParameter) {
      const bool had = attrs.count(ir::kShardingAttr) > 0;
      if (any && !s[node.id()].replicated()) {
        std::string text = s[node.id()].ToString();
        auto it = attrs.find(ir::kShardingAttr);
        if (it == attrs.end() || !std::holds_alternative<std::string>(it->second) ||
            std::get<std::string>(it->second) != text) {
          attrs[ir::kShardingAttr] = text;
          changed = true;
        }
      } else if (had) {
        attrs.erase(ir::kShardingAttr);
        changed = true;
      }
    }
    out.AddNode(node.opcode(), node.operands(), node.type(), std::move(attrs),
                node.shared_literal());
  }
  if (!changed) return false;
  for (const ir::Output& o : graph.outputs()) out.AddOutput(o.name, o.node, o.in_place_of);
  out.set_fusion_groups(graph.fusion_groups());
  graph = std::move(out);
  return true;
}

}  // namespace kiln::compiler
