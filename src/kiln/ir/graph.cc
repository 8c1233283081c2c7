#include "kiln/ir/graph.h"

#include <algorithm>

#include "kiln/base/status.h"

namespace kiln::ir {
namespace {

const AttrValue& GetAttr(const Node& n, const std::string& name) {
  auto it = n.attrs().find(name);
  if (it == n.attrs().end()) {
    std::fprintf(stderr, "node %%%d (%s): missing attribute '%s'\n", n.id(),
                 std::string(OpcodeName(n.opcode())).c_str(), name.c_str());
    std::abort();
  }
  return it->second;
}

template <typename T>
const T& GetTyped(const Node& n, const std::string& name) {
  const AttrValue& v = GetAttr(n, name);
  if (!std::holds_alternative<T>(v)) {
    std::fprintf(stderr, "node %%%d (%s): attribute '%s' has the wrong kind\n", n.id(),
                 std::string(OpcodeName(n.opcode())).c_str(), name.c_str());
    std::abort();
  }
  return std::get<T>(v);
}

}  // namespace

int64_t Node::attr_int(const std::string& name) const { return GetTyped<int64_t>(*this, name); }
double Node::attr_float(const std::string& name) const {
  const AttrValue& v = GetAttr(*this, name);
  if (std::holds_alternative<int64_t>(v)) return static_cast<double>(std::get<int64_t>(v));
  return GetTyped<double>(*this, name);
}
const std::string& Node::attr_str(const std::string& name) const {
  return GetTyped<std::string>(*this, name);
}
const std::vector<int64_t>& Node::attr_ints(const std::string& name) const {
  return GetTyped<std::vector<int64_t>>(*this, name);
}

std::vector<int> Graph::parameters() const {
  std::vector<int> ids;
  for (const Node& n : nodes_)
    if (n.opcode() == Opcode::kParameter) ids.push_back(n.id());
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) {
    return nodes_[a].attr_int("index") < nodes_[b].attr_int("index");
  });
  return ids;
}

int Graph::FindParameter(const std::string& name) const {
  for (const Node& n : nodes_)
    if (n.opcode() == Opcode::kParameter && n.attr_str("name") == name) return n.id();
  return -1;
}

int Graph::FindOutput(const std::string& name) const {
  for (size_t i = 0; i < outputs_.size(); ++i)
    if (outputs_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace kiln::ir
