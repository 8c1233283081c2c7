#include "kiln/compiler/passes/fusion.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/compiler/graph_editor.h"
#include "kiln/ir/op_traits.h"

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

namespace {

// Forms the groups of one graph: output fusions, loop groups, reduction sinks (FusionPass::Run).
class GroupFormer {
 public:
  GroupFormer(const ir::Graph& g, const FusionOptions& options)
      : g_(g), options_(options), n_(g.num_nodes()), stamp_(n_, 0), users_(n_), is_output_(n_, 0) {
    groups_.group_of.assign(n_, -1);
    // Uses per node (outputs count as uses that cannot be fused).
    for (const ir::Node& node : g.nodes())
      for (int op : node.operands()) users_[op].push_back(node.id());
    for (const ir::Output& o : g.outputs()) is_output_[o.node] = 1;
  }

  void OutputFusions();
  void LoopGroups();
  void ReductionSinks();
  void DropRefusedLoopGroups();
  // Topological order of the groups as units (members contiguous); Internal error on a cycle.
  absl::StatusOr<std::vector<int>> Order() const;

  const Groups& groups() const { return groups_; }
  ir::FusionKind kind(int group) const { return kind_[group]; }

 private:
  int NewGroup(int first, ir::FusionKind kind) {
    int gi = static_cast<int>(groups_.members.size());
    groups_.members.push_back({first});
    groups_.group_of[first] = gi;
    kind_.push_back(kind);
    return gi;
  }
  void Dissolve(int group) {
    for (int m : groups_.members[group]) groups_.group_of[m] = -1;
    groups_.members[group].clear();
  }
  int SoleUser(int id) const {
    if (is_output_[id] || users_[id].size() != 1) return -1;
    return users_[id][0];
  }
  // Adds ungrouped node `id` to `group` unless that makes the group graph cyclic.
  bool Join(int group, int id) {
    if (groups_.group_of[id] >= 0) return false;
    groups_.members[group].push_back(id);
    groups_.group_of[id] = group;
    if (!CreatesCycle(g_, groups_, group, stamp_, epoch_)) return true;
    groups_.members[group].pop_back();
    groups_.group_of[id] = -1;
    return false;
  }
  // Whether the backend runs `group` as one kernel (members sorted into graph order first).
  bool Accepted(int group) {
    std::vector<int>& members = groups_.members[group];
    if (members.empty() || !options_.can_fuse) return true;
    std::sort(members.begin(), members.end());
    return options_.can_fuse(g_, kind_[group], members);
  }
  // A dot_general or conv2d head with its bias and activation; -1 when `dot` is no head.
  int EpilogueChain(const ir::Node& dot, int* last);
  bool OpenConvChainEnd(int id) const;
  void Residuals(const std::vector<std::pair<int, int>>& chains);

  const ir::Graph& g_;
  const FusionOptions& options_;
  const int n_;
  Groups groups_;
  std::vector<ir::FusionKind> kind_;  // per group
  std::vector<int> stamp_;
  int epoch_ = 0;
  std::vector<std::vector<int>> users_;
  std::vector<char> is_output_;
  int num_output_groups_ = 0;
};

// Whether `id` ends a convolution chain that could still take a residual add: a conv2d, or a
// conv2d + bias, each the sole user of the one before (the chain EpilogueChain forms from it).
bool GroupFormer::OpenConvChainEnd(int id) const {
  const ir::Node* n = &g_.node(id);
  if (n->opcode() == Opcode::kAdd) {
    for (int k = 0; k < 2; ++k) {
      const ir::Node& c = g_.node(n->operand(k));
      if (c.opcode() == Opcode::kConv2d && SoleUser(c.id()) == id &&
          IsBiasBroadcast(g_, n->operand(1 - k), EpilogueBiasAxis(c)))
        return true;
    }
    return false;
  }
  return n->opcode() == Opcode::kConv2d;
}

int GroupFormer::EpilogueChain(const ir::Node& dot, int* last) {
  // Heads: dot_general (bias along the last dim, then an activation, then a residual add: see
  // Residuals) and conv2d (bias along channels, then a residual add, then an activation: ResNet's
  // relu(conv(x) + b + skip), which oneDNN runs as binary-add and eltwise post-ops).
  const bool conv = dot.opcode() == Opcode::kConv2d;
  if (dot.opcode() != Opcode::kDotGeneral && !conv) return -1;
  DType dt = dot.type().dtype;
  if (dt != DType::kF32 && dt != DType::kBF16) return -1;
  if (g_.node(dot.operand(0)).type().dtype != dt || g_.node(dot.operand(1)).type().dtype != dt)
    return -1;
  const ir::Type& type = dot.type();
  int gi =
      NewGroup(dot.id(), conv ? ir::FusionKind::kConvEpilogue : ir::FusionKind::kMatmulEpilogue);
  *last = dot.id();
  int u = SoleUser(*last);
  if (u >= 0 && g_.node(u).opcode() == Opcode::kAdd && g_.node(u).type() == type) {
    const ir::Node& add = g_.node(u);
    int other = add.operand(0) == *last ? add.operand(1) : add.operand(0);
    if (add.operand(0) != add.operand(1) && g_.node(other).type() == type &&
        IsBiasBroadcast(g_, other, EpilogueBiasAxis(dot)) && Join(gi, u))
      *last = u;
  }
  u = SoleUser(*last);
  if (conv && u >= 0 && g_.node(u).opcode() == Opcode::kAdd && g_.node(u).type() == type) {
    // The residual: a same-typed value that is no broadcast, and no other convolution chain that
    // could take this add itself (two such chains meeting in one add: it joins neither, so the
    // grouping does not depend on which convolution comes first).
    const ir::Node& add = g_.node(u);
    int other = add.operand(0) == *last ? add.operand(1) : add.operand(0);
    if (add.operand(0) != add.operand(1) && g_.node(other).type() == type &&
        g_.node(other).opcode() != Opcode::kBroadcastInDim && !OpenConvChainEnd(other) &&
        Join(gi, u))
      *last = u;
  }
  u = SoleUser(*last);
  if (u >= 0 && IsEpilogueActivation(g_.node(u).opcode()) && g_.node(u).type() == type &&
      Join(gi, u))
    *last = u;
  return gi;
}

// Residuals come second, and an add whose two operands both end such a chain joins neither (so the
// result does not depend on which matmul comes first, and a second run changes nothing).
void GroupFormer::Residuals(const std::vector<std::pair<int, int>>& chains) {
  std::vector<char> chain_end(n_, 0);
  for (auto [gi, last] : chains) chain_end[last] = 1;
  for (auto [gi, last] : chains) {
    const ir::Type& type = g_.node(last).type();
    int u = SoleUser(last);
    if (u < 0 || g_.node(u).opcode() != Opcode::kAdd || g_.node(u).type() != type ||
        groups_.group_of[u] >= 0)
      continue;
    const ir::Node& add = g_.node(u);
    if (add.operand(0) == add.operand(1)) continue;
    int other = add.operand(0) == last ? add.operand(1) : add.operand(0);
    if (g_.node(other).type() != type || g_.node(other).opcode() == Opcode::kBroadcastInDim ||
        chain_end[other])
      continue;
    Join(gi, u);
  }
}

// Output fusion: dot_general [+ bias] [+ activation] [+ residual] and conv2d [+ bias] [+ residual]
// [+ activation], each step the only user of the one before, becomes one group the backend runs as
// a matmul or convolution with post-ops.
void GroupFormer::OutputFusions() {
  if (options_.fuse_matmul_epilogues) {
    std::vector<std::pair<int, int>> chains;  // (group, last member) of dot_general heads
    for (const ir::Node& dot : g_.nodes()) {
      int last = -1;
      int gi = EpilogueChain(dot, &last);
      if (gi < 0) continue;
      if (kind_[gi] == ir::FusionKind::kMatmulEpilogue)
        chains.push_back({gi, last});
      else if (groups_.members[gi].size() == 1)
        Dissolve(gi);  // a bare convolution
    }
    Residuals(chains);
    for (auto [gi, last] : chains)
      if (groups_.members[gi].size() == 1) Dissolve(gi);  // a bare matmul: nothing to fuse
    // What the backend cannot run as one matmul or convolution with post-ops is not formed.
    for (int gi = 0; gi < static_cast<int>(groups_.members.size()); ++gi)
      if (!Accepted(gi)) Dissolve(gi);
  }
  num_output_groups_ = static_cast<int>(groups_.members.size());
}

// A node joins the loop groups of its operands that have its shape; groups merge through it.
void GroupFormer::LoopGroups() {
  for (const ir::Node& node : g_.nodes()) {
    if (groups_.group_of[node.id()] >= 0) continue;  // in an output fusion
    if (!IsLoopFusible(g_, node)) continue;
    int mine = NewGroup(node.id(), ir::FusionKind::kLoop);
    std::vector<int> candidates;
    for (int op : node.operands()) {
      int go = groups_.group_of[op];
      if (go < num_output_groups_) continue;  // output fusions stay as they are
      if (go < 0 || go == mine || g_.node(op).type().shape != node.type().shape) continue;
      if (std::find(candidates.begin(), candidates.end(), go) == candidates.end())
        candidates.push_back(go);
    }
    for (int c : candidates) {
      if (groups_.members[c].empty()) continue;  // merged already through another operand
      if (groups_.members[mine].size() + groups_.members[c].size() >
          static_cast<size_t>(options_.max_group_size))
        continue;
      // Tentatively merge c into mine; undo when it would create a cycle.
      std::vector<int> saved_c = groups_.members[c];
      size_t saved_size = groups_.members[mine].size();
      groups_.Merge(mine, c);
      if (CreatesCycle(g_, groups_, mine, stamp_, epoch_)) {
        groups_.members[mine].resize(saved_size);
        groups_.members[c] = saved_c;
        for (int m : saved_c) groups_.group_of[m] = c;
      }
    }
  }
}

// A reduce_sum of a loop group member joins the group as a sink (the kernel accumulates it while
// the values are in registers: the reduced tensor is never stored unless something else reads it).
void GroupFormer::ReductionSinks() {
  if (!options_.fuse_reductions) return;
  for (const ir::Node& node : g_.nodes()) {
    if (!IsLoopReduction(g_, node) || groups_.group_of[node.id()] >= 0) continue;
    int go = groups_.group_of[node.operand(0)];
    if (go < num_output_groups_ || go < 0) continue;
    if (groups_.members[go].size() + 1 > static_cast<size_t>(options_.max_group_size)) continue;
    if (Join(go, node.id())) kind_[go] = ir::FusionKind::kReduction;
  }
}

// Loop groups the backend refuses are dissolved (fewer groups never make the group graph cyclic).
void GroupFormer::DropRefusedLoopGroups() {
  for (int gi = num_output_groups_; gi < static_cast<int>(groups_.members.size()); ++gi)
    if (!Accepted(gi)) Dissolve(gi);
}

// Topological order of the quotient graph (groups as single units), each unit keyed by its last
// member's source id so the order stays close to the source.
absl::StatusOr<std::vector<int>> GroupFormer::Order() const {
  std::vector<int> unit_of(n_);  // unit id: group index, or groups.size() + node id
  const int num_groups = static_cast<int>(groups_.members.size());
  for (int i = 0; i < n_; ++i)
    unit_of[i] = groups_.group_of[i] >= 0 ? groups_.group_of[i] : num_groups + i;
  const int num_units = num_groups + n_;
  std::vector<int> key(num_units, -1), pending(num_units, 0);
  std::vector<std::vector<int>> consumers(num_units);
  for (int i = 0; i < n_; ++i) key[unit_of[i]] = std::max(key[unit_of[i]], i);
  for (const ir::Node& node : g_.nodes()) {
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
  order.reserve(n_);
  while (!ready.empty()) {
    int u = ready.top().second;
    ready.pop();
    if (u < num_groups) {
      std::vector<int> m = groups_.members[u];
      std::sort(m.begin(), m.end());
      order.insert(order.end(), m.begin(), m.end());
    } else {
      order.push_back(u - num_groups);
    }
    for (int c : consumers[u])
      if (--pending[c] == 0) ready.push({key[c], c});
  }
  if (static_cast<int>(order.size()) != n_)
    return absl::InternalError("fusion: the group graph has a cycle (a bug in the cycle check)");
  return order;
}

// True when `graph` already is `order` (the identity) with exactly these attributes and table.
bool AlreadyFused(const ir::Graph& graph, const std::vector<int>& order,
                  const std::vector<int64_t>& want, const std::vector<ir::FusionGroup>& table) {
  if (graph.fusion_groups() != table) return false;
  for (int i = 0; i < graph.num_nodes(); ++i) {
    if (order[i] != i) return false;
    auto it = graph.node(i).attrs().find(kFusionAttr);
    if (it == graph.node(i).attrs().end()) {
      if (want[i] >= 0) return false;
    } else if (!std::holds_alternative<int64_t>(it->second) ||
               std::get<int64_t>(it->second) != want[i]) {
      return false;
    }
  }
  return true;
}

// Generators: loop-fusible nodes that read no stored tensor of their own size, only
// broadcast_in_dim views (of smaller tensors) and other generators, at most kMaxGeneratorDepth
// deep: a one-hot (convert(compare(broadcast(iota), broadcast(labels)))) or a mask. Recomputing
// one in every fusion group that reads it costs a few instructions per element; sharing it would
// store and reload a tensor of its size. So each fusible user of a generator (a same-shaped loop
// op, or a loop reduction) gets its own copy of the generator's chain; the original stays with
// the users that would read it from memory anyway (and the graph outputs), or else with the first
// fusible user. Returns whether it copied anything; a second run finds nothing to copy.
constexpr int kMaxGeneratorDepth = 4;

bool IsGenerator(const ir::Graph& g, int id, int depth, std::vector<signed char>& memo) {
  if (memo[id] >= 0) return memo[id] != 0 && depth <= kMaxGeneratorDepth;
  const ir::Node& n = g.node(id);
  bool gen = depth <= kMaxGeneratorDepth && IsLoopFusible(g, n);
  const int64_t size = n.type().shape.num_elements();
  for (int op : n.operands()) {
    if (!gen) break;
    const ir::Node& o = g.node(op);
    if (o.opcode() == Opcode::kBroadcastInDim) {
      gen = g.node(o.operand(0)).type().shape.num_elements() < size;
    } else {
      gen = o.type().shape.num_elements() == size && IsGenerator(g, op, depth + 1, memo);
    }
  }
  // Memoized only at depth 1 (a deeper "no" may be a depth limit, not the node's nature).
  if (depth == 1) memo[id] = gen ? 1 : 0;
  return gen;
}

absl::StatusOr<bool> CopyGenerators(ir::Graph& graph, const FusionOptions& options) {
  const ir::Graph& g = graph;
  const int n = g.num_nodes();
  std::vector<signed char> memo(n, -1);
  std::vector<std::vector<int>> users(n);
  std::vector<char> is_output(n, 0);
  for (const ir::Node& node : g.nodes())
    for (int op : node.operands()) users[op].push_back(node.id());
  for (const ir::Output& o : g.outputs()) is_output[o.node] = 1;
  auto fusible_user = [&](int gen, int user) {
    const ir::Node& u = g.node(user);
    if (options.fuse_reductions && IsLoopReduction(g, u)) return true;
    return IsLoopFusible(g, u) && u.type().shape == g.node(gen).type().shape;
  };
  GraphEditor e(g);
  // A copy of generator `id`'s chain (generators copied, everything else shared) placed before
  // `before`.
  std::function<int(int, int)> copy = [&](int id, int before) {
    const ir::Node& node = g.node(id);
    std::vector<int> ops;
    for (int op : node.operands())
      ops.push_back(g.node(op).opcode() == Opcode::kBroadcastInDim ? op : copy(op, before));
    e.set_position(before);
    return e.AddCopy(node, std::move(ops), node.attrs());
  };
  bool copied = false;
  for (const ir::Node& node : g.nodes()) {
    const int id = node.id();
    if (users[id].size() + is_output[id] < 2 || !IsGenerator(g, id, 1, memo)) continue;
    std::vector<int> fusible;
    bool stays = is_output[id] != 0;
    for (int u : users[id]) {
      if (!fusible_user(id, u)) {
        stays = true;
      } else if (std::find(fusible.begin(), fusible.end(), u) == fusible.end()) {
        fusible.push_back(u);
      }
    }
    for (size_t k = stays ? 0 : 1; k < fusible.size(); ++k) {
      const int u = fusible[k];
      const int c = copy(id, u);
      const std::vector<int> ops = e.operands_of(u);
      for (int i = 0; i < static_cast<int>(ops.size()); ++i)
        if (ops[i] == id) KILN_RETURN_IF_ERROR(e.SetOperand(u, i, c));
      copied = true;
    }
  }
  if (!copied) return false;
  KILN_ASSIGN_OR_RETURN(graph, std::move(e).Build());
  return true;
}

}  // namespace

absl::StatusOr<bool> FusionPass::Run(ir::Graph& graph) {
  KILN_ASSIGN_OR_RETURN(const bool copied, CopyGenerators(graph, options_));
  const ir::Graph& g = graph;
  GroupFormer former(g, options_);
  former.OutputFusions();
  former.LoopGroups();
  former.ReductionSinks();
  former.DropRefusedLoopGroups();
  KILN_ASSIGN_OR_RETURN(std::vector<int> order, former.Order());

  // Group numbers in order of appearance; the table records each group's kind.
  const Groups& groups = former.groups();
  std::vector<int64_t> number(groups.members.size(), -1);
  std::vector<ir::FusionGroup> table;
  for (int id : order) {
    int gi = groups.group_of[id];
    if (gi < 0 || number[gi] >= 0) continue;
    number[gi] = static_cast<int64_t>(table.size());
    table.push_back({number[gi], former.kind(gi)});
  }
  std::vector<int64_t> want(g.num_nodes(), -1);
  for (int i = 0; i < g.num_nodes(); ++i)
    if (groups.group_of[i] >= 0) want[i] = number[groups.group_of[i]];
  if (AlreadyFused(g, order, want, table)) return copied;

  GraphEditor e(g);
  e.set_dead_code(GraphEditor::DeadCode::kKeep);
  e.set_order(order);
  e.set_fusion_groups(table);
  for (const ir::Node& node : g.nodes()) {
    if (want[node.id()] < 0 && !node.has_attr(kFusionAttr)) continue;
    ir::AttrMap attrs = node.attrs();
    attrs.erase(kFusionAttr);
    if (want[node.id()] >= 0) attrs[kFusionAttr] = want[node.id()];
    e.SetAttrs(node.id(), std::move(attrs));
  }
  KILN_ASSIGN_OR_RETURN(graph, std::move(e).Build());
  return true;
}

}  // namespace kiln::compiler
