#include "kiln/compiler/passes/schedule.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/compiler/graph_editor.h"

namespace kiln::compiler {
namespace {

// The graph as kernels ("units": a loop fusion group, or one node) with what each reads and
// stores, under the memory model of schedule.h.
struct Model {
  int num_units = 0;
  std::vector<std::vector<int>> members;  // per unit: node ids, in input order
  std::vector<int> unit_of;               // per node
  std::vector<std::vector<int>> deps;     // per unit: the units it depends on (distinct)
  std::vector<std::vector<int>> users;    // per unit: the units that depend on it (distinct)
  std::vector<std::vector<int>> reads;    // per unit: stored values its kernel reads (distinct)
  std::vector<std::vector<int>> defs;     // per unit: the values it stores
  std::vector<int64_t> size;              // per node: bytes it occupies when stored, else 0
  std::vector<char> output;               // per node: a graph output (lives to the end)
  std::vector<int> num_readers;           // per node: units reading it
  bool groups_contiguous = true;          // the plan's
};

void AddInPlaceOrder(const ir::Graph& g, const ExecutionPlan& plan, Model& m);

Model BuildModel(const ir::Graph& g, const ExecutionPlan& plan) {
  const int n = g.num_nodes();
  Model m;
  m.unit_of.assign(n, -1);
  m.size.assign(n, 0);
  m.output.assign(n, 0);
  m.num_readers.assign(n, 0);
  for (const ir::Output& o : g.outputs()) m.output[o.node] = 1;
  m.groups_contiguous = plan.groups_contiguous;

  // Units: the plan's fusion groups (running or not: they stay contiguous), and single nodes.
  std::vector<int> group_unit(plan.groups.size(), -1);
  for (const ir::Node& node : g.nodes()) {
    int k = plan.group_of[node.id()];
    if (k >= 0 && group_unit[k] < 0) {
      group_unit[k] = m.num_units++;
      m.members.emplace_back();
    }
    int u = k >= 0 ? group_unit[k] : m.num_units++;
    if (k < 0) m.members.emplace_back();
    m.unit_of[node.id()] = u;
    m.members[u].push_back(node.id());
  }
  // What is stored in the arena, and what each kernel reads: the plan's.
  for (int id = 0; id < n; ++id)
    if (plan.in_arena[id]) m.size[id] = ArenaBytes(g.node(id).type());

  m.deps.resize(m.num_units);
  m.users.resize(m.num_units);
  m.reads.resize(m.num_units);
  m.defs.resize(m.num_units);
  for (int u = 0; u < m.num_units; ++u) {
    for (int id : m.members[u]) {
      if (m.size[id] > 0) m.defs[u].push_back(id);
      for (int o : g.node(id).operands())  // order constraints: every operand, stored or not
        if (m.unit_of[o] != u) m.deps[u].push_back(m.unit_of[o]);
      for (int r : plan.reads[id])
        if (m.size[r] > 0 && m.unit_of[r] != u) m.reads[u].push_back(r);
    }
    for (auto* v : {&m.deps[u], &m.reads[u]}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
    for (int d : m.deps[u]) m.users[d].push_back(u);
    for (int r : m.reads[u]) ++m.num_readers[r];
  }
  AddInPlaceOrder(g, plan, m);
  return m;
}

// Ordering-only dependencies for outputs computed in place of a parameter (ir::Output's
// in_place_of): the unit computing the output runs after every other unit that reads the
// parameter, so that the execution plan can write it in place (ExecutionPlan::in_place_outputs).
// Skipped for an output when some reader itself depends on the output's unit (no order can
// satisfy it: the plan will copy instead).
void AddInPlaceOrder(const ir::Graph& g, const ExecutionPlan& plan, Model& m) {
  // Per parameter node: the units whose kernels read it (once each, in node order).
  std::map<int, std::vector<int>> readers_of;
  bool any = false;
  for (const ir::Output& o : g.outputs()) any |= o.in_place_of >= 0;
  if (!any) return;
  for (int id = 0; id < g.num_nodes(); ++id)
    for (int b : plan.reads[id])
      if (g.node(b).opcode() == ir::Opcode::kParameter) {
        std::vector<int>& units = readers_of[b];
        if (units.empty() || units.back() != m.unit_of[id]) units.push_back(m.unit_of[id]);
      }
  for (const ir::Output& o : g.outputs()) {
    const int param = o.in_place_of >= 0 ? g.ParameterWithIndex(o.in_place_of) : -1;
    if (param < 0) continue;
    const int u = m.unit_of[o.node];
    std::vector<int> readers;
    for (int r : readers_of[param])
      if (r != u) readers.push_back(r);
    if (readers.empty()) continue;
    std::vector<char> after(m.num_units, 0);  // units that depend on u
    std::vector<int> stack = {u};
    while (!stack.empty()) {
      int x = stack.back();
      stack.pop_back();
      for (int y : m.users[x])
        if (!after[y]) {
          after[y] = 1;
          stack.push_back(y);
        }
    }
    bool possible = true;
    for (int r : readers) possible &= !after[r];
    if (!possible) continue;
    for (int r : readers) {
      if (std::find(m.deps[u].begin(), m.deps[u].end(), r) != m.deps[u].end()) continue;
      m.deps[u].push_back(r);
      m.users[r].push_back(u);
    }
  }
}

// Whether `order` (units) runs every unit after its dependencies.
bool RespectsDeps(const Model& m, const std::vector<int>& order) {
  std::vector<int> pos(m.num_units);
  for (int i = 0; i < static_cast<int>(order.size()); ++i) pos[order[i]] = i;
  for (int u = 0; u < m.num_units; ++u)
    for (int d : m.deps[u])
      if (pos[d] > pos[u]) return false;
  return true;
}

// The peak live bytes of running the units in `order`.
int64_t Peak(const Model& m, const std::vector<int>& order) {
  const int t_end = static_cast<int>(order.size());
  std::vector<int> pos(m.num_units);
  for (int i = 0; i < t_end; ++i) pos[order[i]] = i;
  const int n = static_cast<int>(m.size.size());
  std::vector<int> last(n, -1);
  for (int u = 0; u < m.num_units; ++u)
    for (int r : m.reads[u]) last[r] = std::max(last[r], pos[u]);
  std::vector<int64_t> delta(t_end + 2, 0);
  for (int id = 0; id < n; ++id) {
    if (m.size[id] == 0) continue;
    int start = pos[m.unit_of[id]];
    int end = m.output[id] ? t_end : std::max(start, last[id]);
    delta[start] += m.size[id];
    delta[end + 1] -= m.size[id];
  }
  int64_t live = 0, peak = 0;
  for (int t = 0; t <= t_end; ++t) {
    live += delta[t];
    peak = std::max(peak, live);
  }
  return peak;
}

// Greedy list scheduling: among the ready units, the one whose stored results minus the values it
// frees is smallest; ties go to the earlier `rank`. With `lookahead`, a unit whose result feeds a
// unit that it alone makes ready is also scored as the pair (so a temporary consumed at once, like
// x*x before its reduction, is not put off as if it stayed). Empty if the units cannot all be
// scheduled (a cyclic group graph, i.e. a malformed fusion).
std::vector<int> Greedy(const Model& m, const std::vector<int>& rank, bool lookahead = false) {
  std::vector<int> pending(m.num_units);
  std::vector<int> ready;
  for (int u = 0; u < m.num_units; ++u) {
    pending[u] = static_cast<int>(m.deps[u].size());
    if (pending[u] == 0) ready.push_back(u);
  }
  std::vector<int> readers_left = m.num_readers;
  auto net = [&](int u) {
    int64_t bytes = 0;
    for (int d : m.defs[u]) {
      bytes += m.size[d];
      if (m.num_readers[d] == 0 && !m.output[d]) bytes -= m.size[d];  // freed at once
    }
    for (int r : m.reads[u])
      if (readers_left[r] == 1 && !m.output[r]) bytes -= m.size[r];
    return bytes;
  };
  // The pair score: u, then a user r that u's scheduling makes ready, reading u's results.
  auto pair_net = [&](int u, int64_t base) {
    int64_t best = base;
    for (int r : m.users[u]) {
      if (pending[r] != 1) continue;
      for (int x : m.reads[u]) --readers_left[x];
      int64_t b = 0;
      for (int d : m.defs[r]) b += m.size[d];
      for (int x : m.reads[r])
        if (readers_left[x] == 1 && !m.output[x]) b -= m.size[x];
      for (int x : m.reads[u]) ++readers_left[x];
      best = std::min(best, base + b);
    }
    return best;
  };
  std::vector<int> order;
  order.reserve(m.num_units);
  while (!ready.empty()) {
    size_t best = 0;
    int64_t best_net = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < ready.size(); ++i) {
      int64_t b = net(ready[i]);
      if (lookahead) b = pair_net(ready[i], b);
      if (b < best_net || (b == best_net && rank[ready[i]] < rank[ready[best]])) {
        best = i;
        best_net = b;
      }
    }
    int u = ready[best];
    ready[best] = ready.back();
    ready.pop_back();
    order.push_back(u);
    for (int r : m.reads[u]) --readers_left[r];
    for (int v : m.users[u])
      if (--pending[v] == 0) ready.push_back(v);
  }
  if (static_cast<int>(order.size()) != m.num_units) order.clear();
  return order;
}

// Depth-first post-order from the outputs (then from anything left, by rank), visiting the
// operands whose subgraphs store the most bytes first, so big temporaries are consumed soon after
// they are made. Iterative (graphs can be deep).
std::vector<int> DepthFirst(const Model& m, const ir::Graph& g, const std::vector<int>& rank) {
  // Bytes stored by a unit and (with repeats, as a cheap estimate) everything it depends on.
  std::vector<int64_t> cost(m.num_units, 0);
  std::vector<int> by_rank(m.num_units);
  for (int u = 0; u < m.num_units; ++u) by_rank[u] = u;
  std::sort(by_rank.begin(), by_rank.end(), [&](int a, int b) { return rank[a] < rank[b]; });
  // Units in a topological order: dependencies first. The input order (by first member) is one
  // when groups are contiguous; otherwise fall back to a Kahn pass.
  std::vector<int> topo = Greedy(m, rank);
  if (topo.empty()) return {};
  constexpr int64_t kCap = int64_t{1} << 55;
  for (int u : topo) {
    int64_t c = 0;
    for (int d : m.defs[u]) c += m.size[d];
    for (int d : m.deps[u]) c = std::min(kCap, c + cost[d]);
    cost[u] = c;
  }
  std::vector<std::vector<int>> sorted_deps = m.deps;
  for (auto& d : sorted_deps)
    std::sort(d.begin(), d.end(), [&](int a, int b) {
      return cost[a] != cost[b] ? cost[a] > cost[b] : rank[a] < rank[b];
    });
  std::vector<char> state(m.num_units, 0);  // 0 new, 1 on the stack, 2 emitted
  std::vector<int> order;
  order.reserve(m.num_units);
  auto visit = [&](int root) {
    if (state[root]) return;
    std::vector<std::pair<int, size_t>> stack = {{root, 0}};
    state[root] = 1;
    while (!stack.empty()) {
      auto& [u, i] = stack.back();
      if (i < sorted_deps[u].size()) {
        int d = sorted_deps[u][i++];
        if (state[d] == 0) {
          state[d] = 1;
          stack.push_back({d, 0});
        }
        continue;
      }
      state[u] = 2;
      order.push_back(u);
      stack.pop_back();
    }
  };
  for (const ir::Output& o : g.outputs()) visit(m.unit_of[o.node]);
  for (int u : by_rank) visit(u);
  return order;
}

std::vector<int> UnitsToNodes(const Model& m, const std::vector<int>& units) {
  std::vector<int> nodes;
  for (int u : units) nodes.insert(nodes.end(), m.members[u].begin(), m.members[u].end());
  return nodes;
}

}  // namespace

int64_t PeakLiveBytes(const ir::Graph& graph, const BackendTraits& traits) {
  Model m = BuildModel(graph, PlanExecution(graph, traits));
  std::vector<int> order(m.num_units);
  for (int u = 0; u < m.num_units; ++u) order[u] = u;  // units are numbered in input order
  return Peak(m, order);
}

std::vector<LiveInterval> LiveIntervals(const ir::Graph& graph, const BackendTraits& traits) {
  return LiveIntervals(graph, PlanExecution(graph, traits));
}

std::vector<LiveInterval> LiveIntervals(const ir::Graph& graph, const ExecutionPlan& plan) {
  Model m = BuildModel(graph, plan);
  const int n = graph.num_nodes();
  std::vector<int> step(m.num_units);  // a unit runs at its last member's id
  for (int u = 0; u < m.num_units; ++u) step[u] = m.members[u].back();
  std::vector<LiveInterval> out(n);
  for (int id = 0; id < n; ++id) {
    out[id].bytes = m.size[id];
    out[id].start = out[id].end = step[m.unit_of[id]];
  }
  for (int u = 0; u < m.num_units; ++u)
    for (int r : m.reads[u]) out[r].end = std::max(out[r].end, step[u]);
  for (int id = 0; id < n; ++id)
    if (m.output[id]) out[id].end = n;
  return out;
}

absl::StatusOr<ir::Graph> ReorderNodes(const ir::Graph& graph, const std::vector<int>& order) {
  const int n = graph.num_nodes();
  if (static_cast<int>(order.size()) != n)
    return absl::InvalidArgumentError(
        absl::StrCat("ReorderNodes: order has ", order.size(), " ids for ", n, " nodes"));
  GraphEditor e(graph);
  e.set_dead_code(GraphEditor::DeadCode::kKeep);
  e.set_order(order);
  absl::StatusOr<ir::Graph> out = std::move(e).Build();
  if (!out.ok()) return Annotate(out.status(), "ReorderNodes");
  return out;
}

std::vector<int> MemorySchedule(const ir::Graph& graph, ScheduleReport* report,
                                const BackendTraits& traits) {
  Model m = BuildModel(graph, PlanExecution(graph, traits));
  std::vector<int> input(m.num_units);
  for (int u = 0; u < m.num_units; ++u) input[u] = u;
  std::vector<int> identity(graph.num_nodes());
  for (int i = 0; i < graph.num_nodes(); ++i) identity[i] = i;
  if (!m.groups_contiguous || UnitsToNodes(m, input) != identity) {
    // A fusion group that is not contiguous: the kernels cannot be ordered as units.
    int64_t peak = Peak(m, input);
    if (report) *report = {peak, peak, "input"};
    return identity;
  }
  int64_t input_peak = Peak(m, input);
  std::vector<int> best = input;
  // An input order that runs an in-place output before a reader of its parameter (the only
  // dependencies the input order can break) loses to any candidate.
  int64_t best_peak = RespectsDeps(m, input) ? input_peak : std::numeric_limits<int64_t>::max();
  std::string chosen = "input";
  // Candidates from the current best order (its positions break ties), until none improves on it.
  for (int round = 0; round < 8; ++round) {
    std::vector<int> rank(m.num_units);
    for (int i = 0; i < m.num_units; ++i) rank[best[i]] = i;
    bool improved = false;
    std::vector<int> greedy = Greedy(m, rank);
    if (greedy.empty()) break;  // cyclic fusion groups: leave the order alone
    std::vector<int> dfs = DepthFirst(m, graph, rank);
    std::vector<int> pairs = Greedy(m, rank, /*lookahead=*/true);
    const std::pair<const std::vector<int>*, const char*> candidates[] = {
        {&greedy, "greedy"}, {&pairs, "greedy-pairs"}, {&dfs, "dfs"}};
    for (const auto& [cand, name] : candidates) {
      if (cand->size() != best.size()) continue;
      int64_t p = Peak(m, *cand);
      if (p < best_peak) {
        best_peak = p;
        best = *cand;
        chosen = name;
        improved = true;
      }
    }
    if (!improved) break;
  }
  if (report) *report = {input_peak, best_peak, chosen};
  return UnitsToNodes(m, best);
}

absl::StatusOr<bool> SchedulePass::Run(ir::Graph& graph) {
  std::vector<int> order = MemorySchedule(graph, &report_, traits_);
  bool identity = true;
  for (int i = 0; i < static_cast<int>(order.size()); ++i) identity &= order[i] == i;
  if (identity) return false;
  absl::StatusOr<ir::Graph> reordered = ReorderNodes(graph, order);
  if (!reordered.ok()) return reordered.status();
  graph = std::move(*reordered);
  return true;
}

std::vector<int> OverlapCollectivesOrder(const ir::Graph& graph, const BackendTraits& traits) {
  const int n = graph.num_nodes();
  std::vector<int> identity(n);
  for (int i = 0; i < n; ++i) identity[i] = i;
  Model m = BuildModel(graph, PlanExecution(graph, traits));
  const int num_units = m.num_units;
  std::vector<int> input(num_units);
  for (int u = 0; u < num_units; ++u) input[u] = u;
  if (!m.groups_contiguous || UnitsToNodes(m, input) != identity || !RespectsDeps(m, input))
    return identity;  // the units cannot be reordered as such, or the input breaks an order dep

  auto single = [&](int u, auto pred) {
    return m.members[u].size() == 1 && pred(graph.node(m.members[u][0]));
  };
  std::vector<char> async(num_units, 0), dependent(num_units, 0), chain(num_units, 0);
  bool any = false;
  for (int u = 0; u < num_units; ++u) {
    async[u] = single(u, [](const ir::Node& x) { return IsAsyncCollective(x); });
    any |= async[u];
  }
  if (!any) return identity;
  // Units that need an asynchronous collective's result (through any chain of dependencies):
  // their kernels wait, so they go after every unit that does not (a stable partition: no
  // independent unit depends on a dependent one, so the order stays valid).
  for (int u = 0; u < num_units; ++u)
    for (int d : m.deps[u]) dependent[u] |= async[d] || dependent[d];
  // Each independent collective starts as soon as its operands exist: it and the data movement
  // that assembles its operand (the bucket's reshapes and concatenation) are emitted right after
  // the last unit they depend on.
  for (int u = 0; u < num_units; ++u) {
    if (!async[u] || dependent[u]) continue;
    std::vector<int> stack = {u};
    chain[u] = 1;
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      for (int d : m.deps[x]) {
        if (chain[d] || !single(d, [](const ir::Node& y) {
              return y.opcode() == ir::Opcode::kReshape || y.opcode() == ir::Opcode::kConcatenate;
            }))
          continue;
        chain[d] = 1;
        stack.push_back(d);
      }
    }
  }
  std::vector<int> remaining(num_units, 0);
  for (int u = 0; u < num_units; ++u)
    if (chain[u]) remaining[u] = static_cast<int>(m.deps[u].size());
  std::vector<char> emitted(num_units, 0);
  std::vector<int> order;
  order.reserve(num_units);
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;  // by input position
  auto emit = [&](int u) {
    order.push_back(u);
    emitted[u] = 1;
    for (int v : m.users[u])
      if (chain[v] && --remaining[v] == 0) ready.push(v);
  };
  auto flush = [&] {
    while (!ready.empty()) {
      const int v = ready.top();
      ready.pop();
      emit(v);
    }
  };
  for (int u = 0; u < num_units; ++u)
    if (chain[u] && remaining[u] == 0) ready.push(u);
  flush();
  for (int u = 0; u < num_units; ++u) {
    if (dependent[u] || chain[u]) continue;
    emit(u);
    flush();
  }
  for (int u = 0; u < num_units; ++u)
    if (dependent[u]) emit(u);
  if (static_cast<int>(order.size()) != num_units) return identity;  // not reached
  return UnitsToNodes(m, order);
}

absl::StatusOr<bool> OverlapCollectivesPass::Run(ir::Graph& graph) {
  std::vector<int> order = OverlapCollectivesOrder(graph, traits_);
  bool identity = true;
  for (int i = 0; i < static_cast<int>(order.size()); ++i) identity &= order[i] == i;
  if (identity) return false;
  absl::StatusOr<ir::Graph> reordered = ReorderNodes(graph, order);
  if (!reordered.ok()) return reordered.status();
  graph = std::move(*reordered);
  return true;
}

}  // namespace kiln::compiler
