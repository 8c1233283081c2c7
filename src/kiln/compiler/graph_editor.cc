#include "kiln/compiler/graph_editor.h"

#include <queue>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/ir/shape_inference.h"

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

absl::StatusOr<ir::Graph> GraphEditor::Build() && {
  const int n = num_nodes();
  const int ns = source_.num_nodes();

  // Nodes that were live in the source (reachable from an output).
  std::vector<char> live_before(ns, 0);
  std::vector<int> stack;
  for (const ir::Output& o : source_.outputs()) stack.push_back(o.node);
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (live_before[id]) continue;
    live_before[id] = 1;
    for (int o : source_.node(id).operands()) stack.push_back(o);
  }

  // What to keep: everything reachable from the (resolved) outputs, the parameters, and source
  // nodes that were dead already and were not replaced, with all they use.
  std::vector<char> keep(n, 0);
  for (const ir::Output& o : source_.outputs()) stack.push_back(Resolve(o.node));
  for (int id = 0; id < ns; ++id) {
    const ir::Node& s = source_.node(id);
    if (s.opcode() == ir::Opcode::kParameter || (!live_before[id] && forward_[id] < 0))
      stack.push_back(id);
  }
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (keep[id]) continue;
    keep[id] = 1;
    for (int o : node(id).operands()) stack.push_back(Resolve(o));
  }

  // Kahn's algorithm; among ready nodes the smallest (position, added-before-source, sequence)
  // goes first, which reproduces the source order with added nodes slotted in.
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
    for (int o : node(id).operands()) {
      int r = Resolve(o);
      users[r].push_back(id);
      ++pending[id];
    }
  }
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
  for (int id = 0; id < n; ++id)
    if (keep[id] && pending[id] == 0) ready.push(key(id));
  std::vector<int> new_id(n, -1);
  ir::Graph out(source_.name());
  while (!ready.empty()) {
    int id = std::get<3>(ready.top());
    ready.pop();
    const ir::Node& s = node(id);
    std::vector<int> operands;
    operands.reserve(s.operands().size());
    for (int o : s.operands()) operands.push_back(new_id[Resolve(o)]);
    new_id[id] =
        out.AddNode(s.opcode(), std::move(operands), s.type(), s.attrs(), s.shared_literal());
    for (int u : users[id])
      if (--pending[u] == 0) ready.push(key(u));
  }
  for (int id = 0; id < n; ++id) {
    if (keep[id] && new_id[id] < 0) {
      return absl::InternalError(
          absl::StrCat("GraphEditor: the replacements form a cycle through %", id, " (",
                       std::string(ir::OpcodeName(node(id).opcode())), ")"));
    }
  }
  for (const ir::Output& o : source_.outputs()) out.AddOutput(o.name, new_id[Resolve(o.node)]);
  return out;
}

}  // namespace kiln::compiler
