// Graph invariant checks (see verifier.h). Errors about a node start with "node %<id> (<op>): "
// so callers (the parser, pass tests) can point at it; graph-level errors start with "graph @".
// Never aborts: attributes are inspected through the variant, not the aborting typed getters.
#include "kiln/ir/verifier.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/ir/op_traits.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/ir/sharding.h"

namespace kiln::ir {
namespace {

constexpr int64_t kMaxElements = int64_t{1} << 48;  // as the parser (docs/ir.md)

// Dims >= 0 and at most kMaxElements elements in all (computed without overflow).
bool WithinElementLimit(const Shape& shape) {
  int64_t elements = 1;
  for (int64_t d : shape.dims()) {
    if (d < 0 || d > kMaxElements) return false;
    if (d != 0 && elements > kMaxElements / d) return false;
    elements *= d;
  }
  return true;
}

std::string NodeRef(const Node& n, int position) {
  return "node %" + std::to_string(position) + " (" + std::string(OpcodeName(n.opcode())) + ")";
}

absl::Status NodeError(const Node& n, int position, const std::string& msg) {
  return absl::InvalidArgumentError(NodeRef(n, position) + ": " + msg);
}

absl::Status CheckLiteral(const Node& n, int i) {
  const Tensor* lit = n.literal();
  if (n.opcode() != Opcode::kConstant) {
    if (lit != nullptr) return NodeError(n, i, "only constants carry a literal value");
    return absl::OkStatus();
  }
  if (lit == nullptr) return NodeError(n, i, "constant has no literal value");
  if (lit->dtype() != n.type().dtype || lit->shape() != n.type().shape)
    return NodeError(
        n, i, "literal is " + lit->TypeString() + " but the node's type is " + n.type().ToString());
  if (n.has_attr("value"))
    return NodeError(n, i, "attribute 'value' is reserved for the literal of a constant");
  if (lit->dtype() == DType::kBool) {
    const auto* b = static_cast<const uint8_t*>(lit->raw_data());
    for (int64_t k = 0; k < lit->num_elements(); ++k)
      if (b[k] > 1)
        return NodeError(n, i,
                         "bool literal element " + std::to_string(k) + " is byte " +
                             std::to_string(b[k]) + " (must be 0 or 1)");
  }
  return absl::OkStatus();
}

absl::Status CheckParameterAttrs(const Node& n, int i) {
  auto idx = n.attrs().find("index");
  if (idx == n.attrs().end() || !std::holds_alternative<int64_t>(idx->second))
    return NodeError(n, i, "parameter needs an integer attribute 'index'");
  auto name = n.attrs().find("name");
  if (name == n.attrs().end() || !std::holds_alternative<std::string>(name->second))
    return NodeError(n, i, "parameter needs a string attribute 'name'");
  if (std::get<std::string>(name->second).empty())
    return NodeError(n, i, "parameter name must not be empty");
  return absl::OkStatus();
}

std::string GroupRef(const FusionGroup& g) {
  return "fusion group " + std::to_string(g.id) + " (" + std::string(FusionKindName(g.kind)) + ")";
}

std::string MemberRef(const Graph& graph, int id) { return NodeRef(graph.node(id), id); }

// An epilogue after its head: [add] [activation] [add] (no second add for a convolution), each
// member reading the one before.
std::string EpilogueProblem(const Graph& graph, const FusionGroup& group,
                            const std::vector<int>& members, bool conv) {
  const Opcode head = conv ? Opcode::kConv2d : Opcode::kDotGeneral;
  if (graph.node(members[0]).opcode() != head)
    return MemberRef(graph, members[0]) + ": " + GroupRef(group) + " must start with " +
           std::string(OpcodeName(head));
  std::string steps;  // 'a' per add, 'f' per activation
  for (size_t i = 1; i < members.size(); ++i) {
    const Node& m = graph.node(members[i]);
    const std::string where = MemberRef(graph, members[i]) + ": " + GroupRef(group);
    bool reads_previous = false;
    for (int op : m.operands()) reads_previous |= op == members[i - 1];
    if (!reads_previous)
      return where + ": an epilogue member must read the member before it, %" +
             std::to_string(members[i - 1]);
    if (m.opcode() == Opcode::kAdd)
      steps += 'a';
    else if (OpTraits(m.opcode()).epilogue_activation())
      steps += 'f';
    else
      return where + ": an epilogue runs only add and the epilogue activations";
  }
  // A matmul: [bias] [activation] [residual]; a convolution: [bias] [residual] [activation].
  static const std::vector<std::string> kMatmul = {"", "a", "f", "af", "aa", "fa", "afa"};
  static const std::vector<std::string> kConv = {"", "a", "f", "af", "aa", "aaf"};
  const std::vector<std::string>& allowed = conv ? kConv : kMatmul;
  const bool ok = std::find(allowed.begin(), allowed.end(), steps) != allowed.end();
  if (!ok)
    return MemberRef(graph, members.back()) + ": " + GroupRef(group) + ": an epilogue is at most " +
           (conv ? "[bias add] [residual add] [activation]"
                 : "[bias add] [activation] [residual add]");
  return "";
}

// Loop and reduction groups: loop-fusible ops, plus reduce_sum sinks nothing in the group reads.
std::string LoopProblem(const Graph& graph, const FusionGroup& group,
                        const std::vector<int>& members) {
  const bool reduction = group.kind == FusionKind::kReduction;
  bool has_sink = false;
  for (int id : members) {
    const Node& m = graph.node(id);
    const OpInfo& t = OpTraits(m.opcode());
    const std::string where = MemberRef(graph, id) + ": " + GroupRef(group);
    if (t.loop_sink()) {
      if (!reduction) return where + ": a reduce_sum sink makes it a reduction group, not a loop";
      has_sink = true;
      continue;
    }
    if (!t.loop_fusible()) return where + ": not a loop-fusible elementwise op";
    for (int op : m.operands())
      if (op >= members.front() && OpTraits(graph.node(op).opcode()).loop_sink())
        return where + ": reads the reduction %" + std::to_string(op) + " of its own group";
  }
  if (reduction && !has_sink)
    return MemberRef(graph, members.front()) + ": " + GroupRef(group) + ": has no reduce_sum sink";
  return "";
}

}  // namespace

FusionKind InferFusionKind(const Graph& graph, const std::vector<int>& members) {
  if (members.empty()) return FusionKind::kLoop;
  Opcode head = graph.node(members[0]).opcode();
  if (head == Opcode::kDotGeneral) return FusionKind::kMatmulEpilogue;
  if (head == Opcode::kConv2d) return FusionKind::kConvEpilogue;
  for (int m : members)
    if (OpTraits(graph.node(m).opcode()).loop_sink()) return FusionKind::kReduction;
  return FusionKind::kLoop;
}

std::string FusionGroupProblem(const Graph& graph, const FusionGroup& group,
                               const std::vector<int>& members) {
  if (members.empty()) return "graph @" + graph.name() + ": " + GroupRef(group) + " has no members";
  for (size_t i = 1; i < members.size(); ++i)
    if (members[i] != members[i - 1] + 1)
      return MemberRef(graph, members[i]) + ": " + GroupRef(group) +
             ": members must be consecutive nodes, but the member before it is %" +
             std::to_string(members[i - 1]);
  switch (group.kind) {
    case FusionKind::kLoop:
    case FusionKind::kReduction:
      return LoopProblem(graph, group, members);
    case FusionKind::kMatmulEpilogue:
      return EpilogueProblem(graph, group, members, /*conv=*/false);
    case FusionKind::kConvEpilogue:
      return EpilogueProblem(graph, group, members, /*conv=*/true);
  }
  return "";
}

// Every in_place_of names an existing parameter of the output's type, and no parameter twice.
absl::Status VerifyInPlaceOutputs(const Graph& graph, const std::string& where);

absl::Status VerifyFusionGroups(const Graph& graph) {
  for (const Node& n : graph.nodes()) {
    auto it = n.attrs().find(kFusionAttr);
    if (it == n.attrs().end()) continue;
    if (!std::holds_alternative<int64_t>(it->second) || std::get<int64_t>(it->second) < 0)
      return NodeError(n, n.id(), "attribute 'fusion' must be a non-negative integer (a group id)");
    int64_t g = std::get<int64_t>(it->second);
    if (graph.FindFusionGroup(g) == nullptr)
      return NodeError(n, n.id(),
                       "fusion group " + std::to_string(g) +
                           " is not declared in the graph's fusion group table");
  }
  const std::map<int64_t, std::vector<int>> members = graph.FusionMembersByGroup();
  static const std::vector<int> kNone;
  for (const FusionGroup& group : graph.fusion_groups()) {
    auto it = members.find(group.id);
    std::string problem =
        FusionGroupProblem(graph, group, it == members.end() ? kNone : it->second);
    if (!problem.empty()) return absl::InvalidArgumentError(problem);
  }
  return absl::OkStatus();
}

absl::Status Verify(const Graph& graph) {
  const std::string where = "graph @" + graph.name();
  const int num_nodes = graph.num_nodes();
  std::map<int64_t, int> param_index;     // index -> node
  std::map<std::string, int> param_name;  // name -> node
  std::vector<int> params;
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = graph.node(i);
    if (n.id() != i)
      return NodeError(
          n, i,
          "stored at position " + std::to_string(i) + " but has id " + std::to_string(n.id()));
    if (!WithinElementLimit(n.type().shape))
      return NodeError(
          n, i, "type " + n.type().ToString() + " has a negative size or more than 2^48 elements");
    const int arity = OpcodeArity(n.opcode());
    const int count = static_cast<int>(n.operands().size());
    if (arity >= 0 && count != arity)
      return NodeError(
          n, i, "takes " + std::to_string(arity) + " operands, has " + std::to_string(count));
    if (arity < 0 && count == 0) return NodeError(n, i, "takes at least 1 operand, has 0");
    std::vector<Type> operand_types;
    for (int k = 0; k < count; ++k) {
      int op = n.operand(k);
      if (op < 0 || op >= i)
        return NodeError(n, i,
                         "operand " + std::to_string(k) + " is %" + std::to_string(op) +
                             ", which is not defined before it");
      operand_types.push_back(graph.node(op).type());
    }
    absl::Status s = CheckLiteral(n, i);
    if (!s.ok()) return s;
    if (n.has_attr(kShardingAttr)) {
      absl::StatusOr<Sharding> sharding = ShardingOf(n);
      if (!sharding.ok()) return NodeError(n, i, std::string(sharding.status().message()));
    }
    if (n.opcode() == Opcode::kParameter) {
      s = CheckParameterAttrs(n, i);
      if (!s.ok()) return s;
      params.push_back(i);
      auto [it, inserted] = param_name.emplace(n.attr_str("name"), i);
      if (!inserted)
        return NodeError(n, i,
                         "parameter name \"" + n.attr_str("name") + "\" is already used by %" +
                             std::to_string(it->second));
    }
    absl::StatusOr<Type> t = InferType(n.opcode(), operand_types, n.attrs(), n.type());
    if (!t.ok())
      return NodeError(n, i, std::string(t.status().message().data(), t.status().message().size()));
    if (*t != n.type())
      return NodeError(
          n, i,
          "type " + n.type().ToString() + " does not match the inferred type " + t->ToString());
  }

  for (int id : params) {
    const Node& n = graph.node(id);
    int64_t index = n.attr_int("index");
    if (index < 0 || index >= static_cast<int64_t>(params.size()))
      return NodeError(n, id,
                       "parameter index " + std::to_string(index) +
                           " is out of range: the graph has " + std::to_string(params.size()) +
                           " parameters");
    auto [it, inserted] = param_index.emplace(index, id);
    if (!inserted)
      return NodeError(n, id,
                       "parameter index " + std::to_string(index) + " is already used by %" +
                           std::to_string(it->second));
  }

  if (graph.outputs().empty()) return absl::InvalidArgumentError(where + ": has no outputs");
  std::map<std::string, int> output_names;
  for (size_t k = 0; k < graph.outputs().size(); ++k) {
    const Output& o = graph.outputs()[k];
    if (o.name.empty())
      return absl::InvalidArgumentError(where + ": output " + std::to_string(k) +
                                        " has an empty name");
    if (!output_names.emplace(o.name, static_cast<int>(k)).second)
      return absl::InvalidArgumentError(where + ": duplicate output name \"" + o.name + "\"");
    if (o.node < 0 || o.node >= num_nodes)
      return absl::InvalidArgumentError(where + ": output \"" + o.name + "\" refers to %" +
                                        std::to_string(o.node) + ", which does not exist");
  }
  return VerifyInPlaceOutputs(graph, where);
}

absl::Status VerifyInPlaceOutputs(const Graph& graph, const std::string& where) {
  std::map<int64_t, std::string> donors;  // parameter index -> the output in its place
  for (const Output& o : graph.outputs()) {
    if (o.in_place_of < 0) continue;
    const std::string what = where + ": output \"" + o.name + "\" in_place_of parameter index " +
                             std::to_string(o.in_place_of);
    const int p = graph.ParameterWithIndex(o.in_place_of);
    if (p < 0) return absl::InvalidArgumentError(what + ": no such parameter");
    if (graph.node(p).type() != graph.node(o.node).type())
      return absl::InvalidArgumentError(what + ": the output is " +
                                        graph.node(o.node).type().ToString() + ", the parameter " +
                                        graph.node(p).type().ToString());
    auto [it, fresh] = donors.emplace(o.in_place_of, o.name);
    if (!fresh)
      return absl::InvalidArgumentError(what + ": output \"" + it->second +
                                        "\" is already in its place");
  }
  return VerifyFusionGroups(graph);
}

}  // namespace kiln::ir
