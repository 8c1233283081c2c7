#include "kiln/compiler/passes/cse.h"

#include <cstring>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/compiler/graph_editor.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;

size_t Mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

uint64_t Bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

bool IsCommutative(const ir::Node& n) {
  switch (n.opcode()) {
    case Opcode::kAdd:
    case Opcode::kMul:
    case Opcode::kMax:
    case Opcode::kMin:
    case Opcode::kLogicalAnd:
    case Opcode::kLogicalOr:
      return true;
    case Opcode::kCompare: {
      const std::string& d = n.attr_str("direction");
      return d == "eq" || d == "ne";
    }
    default:
      return false;
  }
}

// Attribute maps equal with doubles compared bit for bit.
bool AttrsIdentical(const ir::AttrMap& a, const ir::AttrMap& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
    if (ia->first != ib->first || ia->second.index() != ib->second.index()) return false;
    if (const double* d = std::get_if<double>(&ia->second)) {
      if (Bits(*d) != Bits(std::get<double>(ib->second))) return false;
    } else if (ia->second != ib->second) {
      return false;
    }
  }
  return true;
}

size_t HashAttrs(const ir::AttrMap& attrs) {
  size_t h = 0;
  for (const auto& [name, v] : attrs) {
    h = Mix(h, std::hash<std::string>()(name));
    if (const int64_t* i = std::get_if<int64_t>(&v)) h = Mix(h, std::hash<int64_t>()(*i));
    if (const double* d = std::get_if<double>(&v)) h = Mix(h, std::hash<uint64_t>()(Bits(*d)));
    if (const std::string* s = std::get_if<std::string>(&v))
      h = Mix(h, std::hash<std::string>()(*s));
    if (const auto* l = std::get_if<std::vector<int64_t>>(&v))
      for (int64_t x : *l) h = Mix(h, std::hash<int64_t>()(x));
  }
  return h;
}

size_t HashLiteral(const Tensor& t) {
  std::string_view bytes(static_cast<const char*>(t.raw_data()),
                         static_cast<size_t>(t.byte_size()));
  return std::hash<std::string_view>()(bytes);
}

}  // namespace

absl::StatusOr<bool> CsePass::Run(ir::Graph& graph) {
  GraphEditor e(graph);
  // hash -> ids of earlier distinct nodes with that hash
  std::unordered_multimap<size_t, int> seen;
  std::vector<std::vector<int>> operands(graph.num_nodes());
  for (const ir::Node& n : graph.nodes()) {
    if (n.opcode() == Opcode::kParameter) continue;
    std::vector<int>& ops = operands[n.id()];
    for (int i = 0; i < static_cast<int>(n.operands().size()); ++i)
      ops.push_back(e.operand(n.id(), i));
    if (IsCommutative(n) && ops.size() == 2 && ops[0] > ops[1]) std::swap(ops[0], ops[1]);

    size_t h = Mix(static_cast<size_t>(n.opcode()), static_cast<size_t>(n.type().dtype));
    for (int64_t d : n.type().shape.dims()) h = Mix(h, std::hash<int64_t>()(d));
    for (int o : ops) h = Mix(h, std::hash<int>()(o));
    h = Mix(h, HashAttrs(n.attrs()));
    if (n.literal() != nullptr) h = Mix(h, HashLiteral(*n.literal()));

    int match = -1;
    auto [lo, hi] = seen.equal_range(h);
    for (auto it = lo; it != hi && match < 0; ++it) {
      const ir::Node& m = graph.node(it->second);
      if (m.opcode() != n.opcode() || m.type() != n.type() || operands[m.id()] != ops ||
          !AttrsIdentical(m.attrs(), n.attrs()))
        continue;
      if ((m.literal() == nullptr) != (n.literal() == nullptr)) continue;
      if (n.literal() != nullptr && !n.literal()->BitwiseEquals(*m.literal())) continue;
      match = m.id();
    }
    if (match >= 0) {
      KILN_RETURN_IF_ERROR(e.Replace(n.id(), match));
    } else {
      seen.emplace(h, n.id());
    }
  }
  if (!e.changed()) return false;
  KILN_ASSIGN_OR_RETURN(graph, std::move(e).Build());
  return true;
}

}  // namespace kiln::compiler
