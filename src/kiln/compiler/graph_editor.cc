#include "kiln/compiler/graph_editor.h"

#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {

GraphEditor::GraphEditor(const ir::Graph& source)
    : source_(source), forward_(source.num_nodes(), -1) {}

const ir::Node& GraphEditor::node(int id) const {
  int ns = source_.num_nodes();
  return id < ns ? source_.node(id) : added_[id - ns];
}

int GraphEditor::Resolve(int id) const {
  while (forward_[id] >= 0) id = forward_[id];
  return id;
}

absl::StatusOr<int> GraphEditor::Add(ir::Opcode op, std::vector<int> operands, ir::AttrMap attrs,
                                     std::optional<ir::Type> declared) {
  std::vector<ir::Type> types;
  types.reserve(operands.size());
  for (int& o : operands) {
    if (o < 0 || o >= num_nodes())
      return absl::InternalError(absl::StrCat("GraphEditor::Add: operand %", o, " does not exist"));
    o = Resolve(o);
    types.push_back(type(o));
  }
  KILN_ASSIGN_OR_RETURN(ir::Type t, ir::InferType(op, types, attrs, declared));
  int id = num_nodes();
  added_.emplace_back(id, op, std::move(operands), std::move(t), std::move(attrs));
  added_position_.push_back(position_);
  forward_.push_back(-1);
  return id;
}

int GraphEditor::AddConstant(Tensor literal) {
  int id = num_nodes();
  ir::Type t{literal.dtype(), literal.shape()};
  added_.emplace_back(id, ir::Opcode::kConstant, std::vector<int>{}, std::move(t), ir::AttrMap{},
                      std::make_shared<const Tensor>(std::move(literal)));
  added_position_.push_back(position_);
  forward_.push_back(-1);
  return id;
}

absl::StatusOr<int> GraphEditor::AddSplat(double value, const ir::Type& type) {
  Tensor scalar(type.dtype, Shape{});
  scalar.SetDouble(0, value);
  int c = AddConstant(std::move(scalar));
  if (type.shape.rank() == 0) return c;
  return Add(ir::Opcode::kBroadcastInDim, {c},
             {{"shape", type.shape.dims()}, {"broadcast_dimensions", std::vector<int64_t>{}}});
}

absl::Status GraphEditor::Replace(int id, int by) {
  if (id < 0 || id >= num_nodes() || by < 0 || by >= num_nodes())
    return absl::InternalError(
        absl::StrCat("GraphEditor::Replace(%", id, ", %", by, "): no such node"));
  id = Resolve(id);
  by = Resolve(by);
  if (id == by) {
    return absl::InternalError(
        absl::StrCat("GraphEditor::Replace: %", id, " would stand for itself"));
  }
  if (node(id).opcode() == ir::Opcode::kParameter) {
    return absl::InternalError(
        absl::StrCat("GraphEditor::Replace: parameter %", id, " cannot be replaced"));
  }
  if (type(id) != type(by)) {
    return absl::InternalError(absl::StrCat("GraphEditor::Replace: %", id, " has type ",
                                            type(id).ToString(), " but its replacement %", by,
                                            " has type ", type(by).ToString()));
  }
  forward_[id] = by;
  changed_ = true;
  return absl::OkStatus();
}

int GraphEditor::AddCopy(const ir::Node& like, std::vector<int> operands, ir::AttrMap attrs) {
  for (int& o : operands) o = Resolve(o);
  int id = num_nodes();
  added_.emplace_back(id, like.opcode(), std::move(operands), like.type(), std::move(attrs),
                      like.shared_literal());
  added_position_.push_back(position_);
  forward_.push_back(-1);
  return id;
}

absl::Status GraphEditor::SetOperand(int id, int i, int by) {
  if (id < 0 || id >= num_nodes() || by < 0 || by >= num_nodes() || i < 0 ||
      i >= static_cast<int>(operands_of(id).size()))
    return absl::InternalError(
        absl::StrCat("GraphEditor::SetOperand(%", id, ", ", i, ", %", by, "): no such operand"));
  by = Resolve(by);
  if (type(operand(id, i)) != type(by))
    return absl::InternalError(absl::StrCat("GraphEditor::SetOperand: operand ", i, " of %", id,
                                            " has type ", type(operand(id, i)).ToString(), " but %",
                                            by, " has type ", type(by).ToString()));
  std::vector<int> ops = operands_of(id);
  ops[i] = by;
  operand_edits_[id] = std::move(ops);
  changed_ = true;
  return absl::OkStatus();
}

void GraphEditor::SetAttrs(int id, ir::AttrMap attrs) { attr_edits_[id] = std::move(attrs); }

const std::vector<int>& GraphEditor::operands_of(int id) const {
  auto it = operand_edits_.find(id);
  return it != operand_edits_.end() ? it->second : node(id).operands();
}

const ir::AttrMap& GraphEditor::attrs_of(int id) const {
  auto it = attr_edits_.find(id);
  return it != attr_edits_.end() ? it->second : node(id).attrs();
}

// What to keep: everything reachable from the (resolved) outputs and the parameters, and what the
// dead-code mode adds, with all they use.
std::vector<char> GraphEditor::KeepSet(int n) const {
  const int ns = source_.num_nodes();
  // Nodes that were live in the source (reachable from an output).
  std::vector<char> live_before(ns, 0);
  std::vector<int> stack;
  if (dead_code_ == DeadCode::kDropOrphaned) {
    for (const ir::Output& o : source_.outputs()) stack.push_back(o.node);
    while (!stack.empty()) {
      int id = stack.back();
      stack.pop_back();
      if (live_before[id]) continue;
      live_before[id] = 1;
      for (int o : source_.node(id).operands()) stack.push_back(o);
    }
  }
  std::vector<char> keep(n, 0);
  for (const ir::Output& o : source_.outputs()) stack.push_back(Resolve(o.node));
  for (int id = 0; id < n; ++id) {
    if (forward_[id] >= 0) continue;  // replaced
    bool parameter = id < ns && source_.node(id).opcode() == ir::Opcode::kParameter;
    bool extra = dead_code_ == DeadCode::kKeep ||
                 (dead_code_ == DeadCode::kDropOrphaned && id < ns && !live_before[id]);
    if (parameter || extra) stack.push_back(id);
  }
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (keep[id]) continue;
    keep[id] = 1;
    for (int o : operands_of(id)) stack.push_back(Resolve(o));
  }
  return keep;
}

// Kahn's algorithm; among ready nodes the smallest (position, added-before-source, sequence)
// goes first, which reproduces the source order with added nodes slotted in.
absl::StatusOr<std::vector<int>> GraphEditor::KahnOrder(const std::vector<char>& keep) const {
  const int n = num_nodes();
  const int ns = source_.num_nodes();
  using Key = std::tuple<int, int, int, int>;  // position, rank, sequence, id
  auto key = [&](int id) -> Key {
    if (id < ns) return {id, 1, 0, id};
    int pos = added_position_[id - ns];
    return {pos < 0 ? ns : pos, 0, id - ns, id};
  };
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int>> users(n);
  for (int id = 0; id < n; ++id) {
    if (!keep[id]) continue;
    for (int o : operands_of(id)) {
      users[Resolve(o)].push_back(id);
      ++pending[id];
    }
  }
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
  for (int id = 0; id < n; ++id)
    if (keep[id] && pending[id] == 0) ready.push(key(id));
  std::vector<int> order;
  std::vector<char> placed(n, 0);
  while (!ready.empty()) {
    int id = std::get<3>(ready.top());
    ready.pop();
    order.push_back(id);
    placed[id] = 1;
    for (int u : users[id])
      if (--pending[u] == 0) ready.push(key(u));
  }
  for (int id = 0; id < n; ++id) {
    if (keep[id] && !placed[id]) {
      return absl::InternalError(
          absl::StrCat("GraphEditor: the replacements form a cycle through %", id, " (",
                       std::string(ir::OpcodeName(node(id).opcode())), ")"));
    }
  }
  return order;
}

absl::Status GraphEditor::CheckOrder(const std::vector<int>& order) const {
  const int n = num_nodes();
  std::vector<char> placed(n, 0);
  for (int id : order) {
    if (id < 0 || id >= n || placed[id] || forward_[id] >= 0)
      return absl::InvalidArgumentError(
          absl::StrCat("GraphEditor: order: %", id, " is out of range, repeated or replaced"));
    for (int o : operands_of(id))
      if (!placed[Resolve(o)])
        return absl::InvalidArgumentError(
            absl::StrCat("GraphEditor: order: %", id, " is placed before its operand %", o));
    placed[id] = 1;
  }
  for (const ir::Output& o : source_.outputs())
    if (!placed[Resolve(o.node)])
      return absl::InvalidArgumentError(
          absl::StrCat("GraphEditor: order: output \"", o.name, "\" is not placed"));
  return absl::OkStatus();
}

// The graph of `order`, without the `fusion` attribute on members of the `dissolve` groups.
ir::Graph GraphEditor::Emit(const std::vector<int>& order,
                            const std::set<int64_t>& dissolve) const {
  std::vector<int> new_id(num_nodes(), -1);
  ir::Graph out(source_.name());
  for (int id : order) {
    const ir::Node& s = node(id);
    std::vector<int> operands;
    operands.reserve(operands_of(id).size());
    for (int o : operands_of(id)) operands.push_back(new_id[Resolve(o)]);
    const ir::AttrMap& attrs = attrs_of(id);
    if (!dissolve.empty() && attrs.count(ir::kFusionAttr) && dissolve.count(ir::FusionAttrOf(s))) {
      ir::AttrMap stripped = attrs;
      stripped.erase(ir::kFusionAttr);
      new_id[id] = out.AddNode(s.opcode(), std::move(operands), s.type(), std::move(stripped),
                               s.shared_literal());
    } else {
      new_id[id] =
          out.AddNode(s.opcode(), std::move(operands), s.type(), attrs, s.shared_literal());
    }
  }
  for (const ir::Output& o : source_.outputs())
    out.AddOutput(o.name, new_id[Resolve(o.node)], o.in_place_of);
  std::vector<ir::FusionGroup> groups;
  for (const ir::FusionGroup& g : groups_ ? *groups_ : source_.fusion_groups())
    if (!dissolve.count(g.id)) groups.push_back(g);
  out.set_fusion_groups(std::move(groups));
  return out;
}

absl::StatusOr<ir::Graph> GraphEditor::Build() && {
  std::vector<int> order;
  if (order_) {
    KILN_RETURN_IF_ERROR(CheckOrder(*order_));
    order = *order_;
  } else {
    KILN_ASSIGN_OR_RETURN(order, KahnOrder(KeepSet(num_nodes())));
  }
  ir::Graph out = Emit(order, {});
  // Groups the rewrite emptied or broke are dissolved (their members run node by node).
  std::set<int64_t> broken;
  const std::map<int64_t, std::vector<int>> members = out.FusionMembersByGroup();
  for (const auto& [id, m] : members)
    if (out.FindFusionGroup(id) == nullptr) broken.insert(id);  // a stale attribute
  static const std::vector<int> kNone;
  for (const ir::FusionGroup& g : out.fusion_groups()) {
    auto it = members.find(g.id);
    if (!ir::FusionGroupProblem(out, g, it == members.end() ? kNone : it->second).empty())
      broken.insert(g.id);
  }
  if (!broken.empty()) out = Emit(order, broken);
  return out;
}

}  // namespace kiln::compiler
