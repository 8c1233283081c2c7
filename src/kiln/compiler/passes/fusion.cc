#include "kiln/compiler/passes/fusion.h"

#include <algorithm>
#include <queue>
#include <utility>
#include <vector>

#include "kiln/ir/op_traits.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;

bool FusibleType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kBool; }

// Union of groups as member lists; group_of[node] = group index or -1.
struct Groups {
  std::vector<int> group_of;
  std::vector<std::vector<int>> members;  // empty once merged away

  int Merge(int a, int b) {  // merges b into a, returns a
    for (int m : members[b]) group_of[m] = a;
    members[a].insert(members[a].end(), members[b].begin(), members[b].end());
    members[b].clear();
    return a;
  }
};

// True when some node outside `group` that a member reads (directly or through other groups)
// depends on a member of `group`: fusing would need the group's result before computing it.
bool CreatesCycle(const ir::Graph& g, const Groups& groups, int group, std::vector<int>& stamp,
                  int& epoch) {
  ++epoch;
  std::vector<char> expanded(groups.members.size(), 0);
  expanded[group] = 1;
  std::vector<int> stack;
  bool cycle = false;
  // Pushes the operands of `node`; reaching a member of `group` from outside is a cycle.
  auto push_operands_of = [&](int node, bool from_group) {
    for (int op : g.node(node).operands()) {
      if (groups.group_of[op] == group) {
        if (!from_group) cycle = true;
        continue;
      }
      if (stamp[op] != epoch) {
        stamp[op] = epoch;
        stack.push_back(op);
      }
    }
  };
  for (int m : groups.members[group]) push_operands_of(m, /*from_group=*/true);
  while (!stack.empty() && !cycle) {
    int x = stack.back();
    stack.pop_back();
    int gx = groups.group_of[x];
    if (gx >= 0) {
      // Another group runs as one unit: it waits for every member's operands.
      if (expanded[gx]) continue;
      expanded[gx] = 1;
      for (int m : groups.members[gx]) push_operands_of(m, false);
    } else {
      push_operands_of(x, false);
    }
  }
  return cycle;
}

}  // namespace

bool IsLoopReduction(const ir::Graph& graph, const ir::Node& n) {
  if (!ir::OpTraits(n.opcode()).loop_sink()) return false;
  DType t = n.type().dtype;
  if ((t != DType::kF32 && t != DType::kBF16) || graph.node(n.operand(0)).type().dtype != t)
    return false;
  return n.type().shape.num_elements() <= kMaxFusedReductionOutputs &&
         graph.node(n.operand(0)).type().shape.num_elements() > 0;
}

// The loop-fusible ops are the kLoop / kLoopBool rows of opcodes.def: the fused loop kernel
// (runtime/cpu/fused_loop.cc) checks at compile time that it runs exactly those.
bool IsLoopFusible(const ir::Graph& graph, const ir::Node& n) {
  const ir::OpInfo& t = ir::OpTraits(n.opcode());
  if (!t.loop_fusible()) return false;
  if (!FusibleType(n.type().dtype)) return false;
  for (int op : n.operands())
    if (!FusibleType(graph.node(op).type().dtype)) return false;
  // Arithmetic on bool (max/min of bools) stays with the dedicated loops.
  if (!t.loop_bool() && n.type().dtype == DType::kBool) return false;
  return n.type().shape.num_elements() > 0;
}

bool IsEpilogueActivation(Opcode op) { return ir::OpTraits(op).epilogue_activation(); }

bool IsBiasBroadcast(const ir::Graph& g, int id, int64_t axis) {
  const ir::Node& b = g.node(id);
  if (b.opcode() != Opcode::kBroadcastInDim) return false;
  const ir::Type& src = g.node(b.operand(0)).type();
  int64_t rank = b.type().shape.rank();
  return src.shape.rank() == 1 && axis >= 0 && axis < rank &&
         b.attr_ints("broadcast_dimensions") == std::vector<int64_t>{axis} &&
         src.shape.dim(0) == b.type().shape.dim(static_cast<int>(axis)) &&
         src.dtype == b.type().dtype;
}

int64_t EpilogueBiasAxis(const ir::Node& head) {
  return head.opcode() == Opcode::kConv2d ? 1 : head.type().shape.rank() - 1;
}

absl::StatusOr<bool> FusionPass::Run(ir::Graph& graph) {
  const ir::Graph& g = graph;
  const int n = g.num_nodes();
  Groups groups;
  groups.group_of.assign(n, -1);
  std::vector<int> stamp(n, 0);
  int epoch = 0;

  // Uses per node (outputs count as uses that cannot be fused).
  std::vector<std::vector<int>> users(n);
  std::vector<char> is_output(n, 0);
  for (const ir::Node& node : g.nodes())
    for (int op : node.operands()) users[op].push_back(node.id());
  for (const ir::Output& o : g.outputs()) is_output[o.node] = 1;
  auto sole_user = [&](int id) -> int {
    if (is_output[id] || users[id].size() != 1) return -1;
    return users[id][0];
  };
  // Adds ungrouped node `id` to `group` unless that makes the group graph cyclic.
  auto join = [&](int group, int id) {
    if (groups.group_of[id] >= 0) return false;
    groups.members[group].push_back(id);
    groups.group_of[id] = group;
    if (!CreatesCycle(g, groups, group, stamp, epoch)) return true;
    groups.members[group].pop_back();
    groups.group_of[id] = -1;
    return false;
  };

  // Output fusion: dot_general [+ bias] [+ activation] [+ residual], each step the only user of
  // the one before, becomes one group the backend runs as a matmul with post-ops. Residuals come
  // second, and an add whose two operands both end such a chain joins neither (so the result does
  // not depend on which matmul comes first, and a second run changes nothing).
  if (options_.fuse_matmul_epilogues) {
    std::vector<std::pair<int, int>> chains;  // (group, last member)
    for (const ir::Node& dot : g.nodes()) {
      // Heads: dot_general (bias along the last dim) and conv2d (bias along channels, no
      // residual: oneDNN's convolution takes it only in its own blocked layout).
      bool conv = dot.opcode() == Opcode::kConv2d;
      if (dot.opcode() != Opcode::kDotGeneral && !conv) continue;
      DType dt = dot.type().dtype;
      if (dt != DType::kF32 && dt != DType::kBF16) continue;
      if (g.node(dot.operand(0)).type().dtype != dt || g.node(dot.operand(1)).type().dtype != dt)
        continue;
      const ir::Type& type = dot.type();
      int gi = static_cast<int>(groups.members.size());
      groups.members.push_back({dot.id()});
      groups.group_of[dot.id()] = gi;
      int last = dot.id();
      int u = sole_user(last);
      if (u >= 0 && g.node(u).opcode() == Opcode::kAdd && g.node(u).type() == type) {
        const ir::Node& add = g.node(u);
        int other = add.operand(0) == last ? add.operand(1) : add.operand(0);
        if (add.operand(0) != add.operand(1) && g.node(other).type() == type &&
            IsBiasBroadcast(g, other, EpilogueBiasAxis(dot)) && join(gi, u))
          last = u;
      }
      u = sole_user(last);
      if (u >= 0 && IsEpilogueActivation(g.node(u).opcode()) && g.node(u).type() == type &&
          join(gi, u))
        last = u;
      if (!conv) chains.push_back({gi, last});
      if (conv && groups.members[gi].size() == 1) {  // a bare convolution
        groups.group_of[dot.id()] = -1;
        groups.members[gi].clear();
      }
    }
    std::vector<char> chain_end(n, 0);
    for (auto [gi, last] : chains) chain_end[last] = 1;
    for (auto [gi, last] : chains) {
      const ir::Type& type = g.node(last).type();
      int u = sole_user(last);
      if (u < 0 || g.node(u).opcode() != Opcode::kAdd || g.node(u).type() != type ||
          groups.group_of[u] >= 0)
        continue;
      const ir::Node& add = g.node(u);
      if (add.operand(0) == add.operand(1)) continue;
      int other = add.operand(0) == last ? add.operand(1) : add.operand(0);
      if (g.node(other).type() != type || g.node(other).opcode() == Opcode::kBroadcastInDim ||
          chain_end[other])
        continue;
      join(gi, u);
    }
    for (auto [gi, last] : chains) {
      if (groups.members[gi].size() == 1) {  // a bare matmul: nothing to fuse
        groups.group_of[groups.members[gi][0]] = -1;
        groups.members[gi].clear();
      }
    }
    // What the backend cannot run as one matmul or convolution with post-ops is not formed.
    for (std::vector<int>& members : groups.members) {
      if (members.empty() || !options_.can_fuse) continue;
      std::sort(members.begin(), members.end());
      if (options_.can_fuse(g, members)) continue;
      for (int m : members) groups.group_of[m] = -1;
      members.clear();
    }
  }
  const int num_output_groups = static_cast<int>(groups.members.size());

  for (const ir::Node& node : g.nodes()) {
    if (groups.group_of[node.id()] >= 0) continue;  // in an output fusion
    if (!IsLoopFusible(g, node)) continue;
    int mine = static_cast<int>(groups.members.size());
    groups.members.push_back({node.id()});
    groups.group_of[node.id()] = mine;
    std::vector<int> candidates;
    for (int op : node.operands()) {
      int go = groups.group_of[op];
      if (go < num_output_groups) continue;  // output fusions stay as they are
      if (go < 0 || go == mine || g.node(op).type().shape != node.type().shape) continue;
      if (std::find(candidates.begin(), candidates.end(), go) == candidates.end())
        candidates.push_back(go);
    }
    for (int c : candidates) {
      if (groups.members[c].empty()) continue;  // merged already through another operand
      if (groups.members[mine].size() + groups.members[c].size() >
          static_cast<size_t>(options_.max_group_size))
        continue;
      // Tentatively merge c into mine; undo when it would create a cycle.
      std::vector<int> saved_c = groups.members[c];
      size_t saved_size = groups.members[mine].size();
      groups.Merge(mine, c);
      if (CreatesCycle(g, groups, mine, stamp, epoch)) {
        groups.members[mine].resize(saved_size);
        groups.members[c] = saved_c;
        for (int m : saved_c) groups.group_of[m] = c;
      }
    }
  }

  // Reductions: a reduce_sum of a loop group member joins the group as a sink (the kernel
  // accumulates it while the values are in registers: the reduced tensor is never stored unless
  // something else reads it).
  if (options_.fuse_reductions) {
    for (const ir::Node& node : g.nodes()) {
      if (!IsLoopReduction(g, node) || groups.group_of[node.id()] >= 0) continue;
      int go = groups.group_of[node.operand(0)];
      if (go < num_output_groups || go < 0) continue;
      if (groups.members[go].size() + 1 > static_cast<size_t>(options_.max_group_size)) continue;
      join(go, node.id());
    }
  }

  // Loop groups the backend refuses are dissolved (fewer groups never make the group graph cyclic).
  if (options_.can_fuse) {
    for (int gi = num_output_groups; gi < static_cast<int>(groups.members.size()); ++gi) {
      std::vector<int>& members = groups.members[gi];
      if (members.empty()) continue;
      std::sort(members.begin(), members.end());
      if (options_.can_fuse(g, members)) continue;
      for (int m : members) groups.group_of[m] = -1;
      members.clear();
    }
  }

  // Topological order of the quotient graph (groups as single units), each unit keyed by its
  // last member's source id so the order stays close to the source.
  std::vector<int> unit_of(n);  // unit id: group index, or groups.size() + node id
  const int num_groups = static_cast<int>(groups.members.size());
  for (int i = 0; i < n; ++i)
    unit_of[i] = groups.group_of[i] >= 0 ? groups.group_of[i] : num_groups + i;
  const int num_units = num_groups + n;
  std::vector<int> key(num_units, -1), pending(num_units, 0);
  std::vector<std::vector<int>> consumers(num_units);
  for (int i = 0; i < n; ++i) key[unit_of[i]] = std::max(key[unit_of[i]], i);
  for (const ir::Node& node : g.nodes()) {
    int u = unit_of[node.id()];
    for (int op : node.operands()) {
      int uo = unit_of[op];
      if (uo == u) continue;
      consumers[uo].push_back(u);
      ++pending[u];
    }
  }
  using Item = std::pair<int, int>;  // (key, unit)
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
  for (int u = 0; u < num_units; ++u)
    if (key[u] >= 0 && pending[u] == 0) ready.push({key[u], u});
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    int u = ready.top().second;
    ready.pop();
    if (u < num_groups) {
      std::vector<int> m = groups.members[u];
      std::sort(m.begin(), m.end());
      order.insert(order.end(), m.begin(), m.end());
    } else {
      order.push_back(u - num_groups);
    }
    for (int c : consumers[u])
      if (--pending[c] == 0) ready.push({key[c], c});
  }
  if (static_cast<int>(order.size()) != n)
    return absl::InternalError("fusion: the group graph has a cycle (a bug in the cycle check)");

  // Group numbers in order of appearance.
  std::vector<int> number(num_groups, -1);
  int next = 0;
  for (int id : order) {
    int gi = groups.group_of[id];
    if (gi >= 0 && number[gi] < 0) number[gi] = next++;
  }

  // Unchanged when the order is the identity and every attribute already matches.
  bool changed = false;
  for (int i = 0; i < n && !changed; ++i) {
    if (order[i] != i) changed = true;
    const ir::Node& node = g.node(i);
    int want = groups.group_of[i] >= 0 ? number[groups.group_of[i]] : -1;
    auto it = node.attrs().find(kFusionAttr);
    int have = -1;
    if (it != node.attrs().end() && std::holds_alternative<int64_t>(it->second))
      have = static_cast<int>(std::get<int64_t>(it->second));
    else if (it != node.attrs().end())
      changed = true;
    if (have != want) changed = true;
  }
  if (!changed) return false;

  ir::Graph out(g.name());
  std::vector<int> new_id(n, -1);
  for (int old : order) {
    const ir::Node& node = g.node(old);
    std::vector<int> operands;
    operands.reserve(node.operands().size());
    for (int op : node.operands()) operands.push_back(new_id[op]);
    ir::AttrMap attrs = node.attrs();
    attrs.erase(kFusionAttr);
    if (groups.group_of[old] >= 0)
      attrs[kFusionAttr] = static_cast<int64_t>(number[groups.group_of[old]]);
    new_id[old] = out.AddNode(node.opcode(), std::move(operands), node.type(), std::move(attrs),
                              node.shared_literal());
  }
  for (const ir::Output& o : g.outputs()) out.AddOutput(o.name, new_id[o.node]);
  graph = std::move(out);
  return true;
}

}  // namespace kiln::compiler
