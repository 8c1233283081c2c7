#include "kiln/ir/graph.h"

#include <algorithm>
#include <cstdlib>

#include "kiln/base/log.h"
#include "kiln/base/status.h"

namespace kiln::ir {
namespace {

const AttrValue& GetAttr(const Node& n, const std::string& name) {
  auto it = n.attrs().find(name);
  if (it == n.attrs().end()) {
    KILN_LOG(ERROR) << "node %" << n.id() << " (" << OpcodeName(n.opcode())
                    << "): missing attribute '" << name << "'";
    std::abort();
  }
  return it->second;
}

template <typename T>
const T& GetTyped(const Node& n, const std::string& name) {
  const AttrValue& v = GetAttr(n, name);
  if (!std::holds_alternative<T>(v)) {
    KILN_LOG(ERROR) << "node %" << n.id() << " (" << OpcodeName(n.opcode()) << "): attribute '"
                    << name << "' has the wrong kind";
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

int Graph::ParameterWithIndex(int64_t index) const {
  for (const Node& n : nodes_)
    if (n.opcode() == Opcode::kParameter && n.has_attr("index") && n.attr_int("index") == index)
      return n.id();
  return -1;
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

std::string_view FusionKindName(FusionKind kind) {
  switch (kind) {
    case FusionKind::kLoop:
      return "loop";
    case FusionKind::kReduction:
      return "reduction";
    case FusionKind::kMatmulEpilogue:
      return "matmul_epilogue";
    case FusionKind::kConvEpilogue:
      return "conv_epilogue";
  }
  return "?";
}

bool ParseFusionKind(std::string_view name, FusionKind* kind) {
  for (FusionKind k : {FusionKind::kLoop, FusionKind::kReduction, FusionKind::kMatmulEpilogue,
                       FusionKind::kConvEpilogue}) {
    if (FusionKindName(k) == name) {
      *kind = k;
      return true;
    }
  }
  return false;
}

int64_t FusionAttrOf(const Node& node) {
  auto it = node.attrs().find(kFusionAttr);
  if (it == node.attrs().end() || !std::holds_alternative<int64_t>(it->second)) return -1;
  return std::get<int64_t>(it->second);
}

const FusionGroup* Graph::FindFusionGroup(int64_t id) const {
  auto it = std::lower_bound(fusion_groups_.begin(), fusion_groups_.end(), id,
                             [](const FusionGroup& g, int64_t v) { return g.id < v; });
  return it != fusion_groups_.end() && it->id == id ? &*it : nullptr;
}

void Graph::AddFusionGroup(FusionGroup group) {
  auto it = std::lower_bound(fusion_groups_.begin(), fusion_groups_.end(), group.id,
                             [](const FusionGroup& g, int64_t v) { return g.id < v; });
  if (it != fusion_groups_.end() && it->id == group.id)
    *it = group;
  else
    fusion_groups_.insert(it, group);
}

void Graph::set_fusion_groups(std::vector<FusionGroup> groups) {
  fusion_groups_.clear();
  for (const FusionGroup& g : groups) AddFusionGroup(g);
}

int64_t Graph::FusionGroupOf(int id) const { return FusionAttrOf(nodes_[id]); }

std::vector<int> Graph::FusionMembers(int64_t group) const {
  std::vector<int> members;
  for (const Node& n : nodes_)
    if (FusionAttrOf(n) == group && group >= 0) members.push_back(n.id());
  return members;
}

std::map<int64_t, std::vector<int>> Graph::FusionMembersByGroup() const {
  std::map<int64_t, std::vector<int>> groups;
  for (const Node& n : nodes_) {
    int64_t g = FusionAttrOf(n);
    if (g >= 0 || n.has_attr(kFusionAttr)) groups[g].push_back(n.id());
  }
  return groups;
}

}  // namespace kiln::ir
