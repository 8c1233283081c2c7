#include "kiln/serve/rebatch.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/ir/verifier.h"

namespace kiln::serve {
namespace {

// `attrs[name]` with its leading entry `from` replaced by `to`; true when replaced.
bool ReplaceLeading(ir::AttrMap& attrs, const std::string& name, int64_t from, int64_t to) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return false;
  auto* list = std::get_if<std::vector<int64_t>>(&it->second);
  if (list == nullptr || list->empty() || (*list)[0] != from) return false;
  (*list)[0] = to;
  return true;
}

}  // namespace

absl::StatusOr<ir::Graph> Rebatch(const ir::Graph& program,
                                  const std::set<std::string>& batched_inputs, int64_t from,
                                  int64_t to) {
  ir::Graph g(program.name());
  g.set_fusion_groups(program.fusion_groups());
  for (const ir::Node& n : program.nodes()) {
    ir::AttrMap attrs = n.attrs();
    ir::Type type = n.type();
    const bool leading_is_batch = type.shape.rank() > 0 && type.shape.dim(0) == from;
    if (n.opcode() == ir::Opcode::kParameter) {
      const std::string name = n.has_attr("name") ? n.attr_str("name") : "";
      if (batched_inputs.count(name) && leading_is_batch) type.shape.mutable_dims()[0] = to;
      g.AddNode(n.opcode(), n.operands(), type, std::move(attrs), n.shared_literal());
      continue;
    }
    if (n.operands().empty()) {  // constant, iota, ...: declared types stay
      g.AddNode(n.opcode(), n.operands(), type, std::move(attrs), n.shared_literal());
      continue;
    }
    if (leading_is_batch) {
      ReplaceLeading(attrs, "shape", from, to);
      if (n.opcode() == ir::Opcode::kSlice) ReplaceLeading(attrs, "limit", from, to);
    }
    std::vector<ir::Type> operand_types;
    for (int op : n.operands()) operand_types.push_back(g.node(op).type());
    std::optional<ir::Type> declared;
    if (n.opcode() == ir::Opcode::kConvert)
      declared = ir::Type{type.dtype, operand_types.empty() ? type.shape : operand_types[0].shape};
    absl::StatusOr<ir::Type> t = ir::InferType(n.opcode(), operand_types, attrs, declared);
    if (!t.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("the program cannot be rebatched from ", from,
                                                     " to ", to, ": node %", n.id(), ": ",
                                                     t.status().message()));
    }
    g.AddNode(n.opcode(), n.operands(), *t, std::move(attrs), n.shared_literal());
  }
  for (const ir::Output& o : program.outputs()) g.AddOutput(o.name, o.node, o.in_place_of);
  absl::Status v = ir::Verify(g);
  if (!v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the program rebatched from ", from, " to ", to,
                                                   " does not verify: ", v.message()));
  }
  return g;
}

}  // namespace kiln::serve
