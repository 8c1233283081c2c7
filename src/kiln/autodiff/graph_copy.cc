#include "kiln/autodiff/graph_copy.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kiln/ir/op_traits.h"

namespace kiln::autodiff {

ValueMap CopyParameters(const ir::Graph& g, ir::Builder& b) {
  ValueMap map(g.num_nodes());
  for (int id : g.parameters()) {
    const ir::Node& n = g.node(id);
    map[id] = b.Parameter(n.attr_str("name"), n.type().dtype, n.type().shape);
  }
  return map;
}

ir::Value CopyNode(ir::Builder& b, const ir::Node& n, const std::vector<ir::Value>& operands) {
  switch (n.opcode()) {
    case ir::Opcode::kConstant:
      if (n.literal() == nullptr) {
        b.SetError(
            absl::InvalidArgumentError(absl::StrCat("constant %", n.id(), " has no literal")));
        return ir::Value();
      }
      return b.Constant(*n.literal());
    case ir::Opcode::kParameter:
      b.SetError(absl::InternalError(
          absl::StrCat("CopyNode: parameter %", n.id(), " must be copied by CopyParameters")));
      return ir::Value();
    default:
      break;
  }
  // Fusion group membership is not copied: the copy is a new program (rewrites may insert nodes
  // between members, and the builder's graph has no group table), so the fusion pass forms its
  // groups again when it is compiled.
  ir::AttrMap attrs = n.attrs();
  attrs.erase(ir::kFusionAttr);
  // iota, random_bits and convert carry their declared type over; the rest infer theirs again.
  if (ir::OpTraits(n.opcode()).declared_type())
    return b.AddNode(n.opcode(), operands, std::move(attrs), n.type());
  return b.AddNode(n.opcode(), operands, std::move(attrs));
}

absl::StatusOr<ValueMap> CopyGraph(const ir::Graph& g, ir::Builder& b,
                                   const NodeRewriter& rewrite) {
  ValueMap map = CopyParameters(g, b);
  std::vector<ir::Value> operands;
  for (const ir::Node& n : g.nodes()) {
    if (n.opcode() == ir::Opcode::kParameter) continue;
    operands.clear();
    for (int o : n.operands()) operands.push_back(map[o]);
    std::optional<ir::Value> replacement;
    if (rewrite) {
      absl::StatusOr<std::optional<ir::Value>> r = rewrite(n, operands);
      if (!r.ok()) return r.status();
      replacement = *r;
    }
    if (!b.status().ok()) return b.status();
    if (replacement.has_value()) {
      if (!replacement->valid() || replacement->type() != n.type()) {
        return absl::InternalError(absl::StrCat(
            "rewrite of %", n.id(), " (", std::string(ir::OpcodeName(n.opcode())),
            ") changed its type from ", n.type().ToString(), " to ",
            replacement->valid() ? replacement->type().ToString() : std::string("<invalid>")));
      }
      map[n.id()] = *replacement;
    } else {
      map[n.id()] = CopyNode(b, n, operands);
    }
    if (!b.status().ok()) {
      return absl::Status(
          b.status().code(),
          absl::StrCat("copying %", n.id(), " (", std::string(ir::OpcodeName(n.opcode())),
                       "): ", std::string(b.status().message())));
    }
  }
  return map;
}

void CopyOutputs(const ir::Graph& g, const ValueMap& map, ir::Builder& b) {
  for (const ir::Output& o : g.outputs()) {
    const int donor = o.in_place_of >= 0 ? g.ParameterWithIndex(o.in_place_of) : -1;
    if (donor >= 0)
      b.Output(o.name, map[o.node], map[donor]);
    else
      b.Output(o.name, map[o.node]);
  }
}

}  // namespace kiln::autodiff
