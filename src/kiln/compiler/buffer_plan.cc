#include "kiln/compiler/buffer_plan.h"

#include <algorithm>
#include <limits>
#include <map>

#include "kiln/ir/op_traits.h"

namespace kiln::compiler {
namespace {

int64_t AlignDown(int64_t n) { return n / kBufferAlignment * kBufferAlignment; }

bool NeedsArena(const ir::Node& n) {
  return n.opcode() != ir::Opcode::kParameter && n.opcode() != ir::Opcode::kConstant;
}

struct Interval {
  int node;
  int64_t size;   // aligned bytes
  int64_t start;  // defining node id
  int64_t end;    // last use (inclusive); num_nodes for graph outputs
};

bool Overlaps(const Interval& a, const Interval& b) { return a.start <= b.end && b.start <= a.end; }

// Sorted [begin, end) byte ranges of the placed buffers whose lifetimes overlap `iv`.
std::vector<std::pair<int64_t, int64_t>> Busy(const std::vector<Interval>& intervals,
                                              const std::vector<int64_t>& offset,
                                              const Interval& iv) {
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (size_t p = 0; p < intervals.size(); ++p)
    if (offset[p] >= 0 && intervals[p].size > 0 && Overlaps(iv, intervals[p]))
      busy.push_back({offset[p], offset[p] + intervals[p].size});
  std::sort(busy.begin(), busy.end());
  return busy;
}

// Largest first (ties in definition order); each buffer goes at the bottom of the gap with the
// least waste among the placed buffers whose lifetimes overlap its own, else above all of them.
std::vector<int64_t> BestFitDecreasing(const std::vector<Interval>& intervals, int64_t* arena) {
  std::vector<int> order(intervals.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return intervals[a].size > intervals[b].size; });
  std::vector<int64_t> offset(intervals.size(), -1);
  *arena = 0;
  for (int idx : order) {
    const Interval& iv = intervals[idx];
    int64_t best = -1;
    int64_t best_waste = std::numeric_limits<int64_t>::max();
    int64_t cursor = 0;  // lowest free byte above every busy range scanned so far
    for (const auto& [b, e] : Busy(intervals, offset, iv)) {
      if (b > cursor && b - cursor >= iv.size && b - cursor - iv.size < best_waste) {
        best_waste = b - cursor - iv.size;
        best = cursor;
      }
      cursor = std::max(cursor, e);
    }
    if (best < 0) best = cursor;
    offset[idx] = best;
    *arena = std::max(*arena, best + iv.size);
  }
  return offset;
}

// In definition order, each buffer takes either the lowest offset that fits or the highest one
// that ends at or below `ceiling` (the lower bound), whichever lies farther from the buffers it
// conflicts with. On a chain this alternates sides and reaches the bound.
std::vector<int64_t> TwoSidedFirstFit(const std::vector<Interval>& intervals, int64_t ceiling,
                                      int64_t* arena) {
  std::vector<int64_t> offset(intervals.size(), -1);
  *arena = 0;
  for (size_t idx = 0; idx < intervals.size(); ++idx) {
    const Interval& iv = intervals[idx];
    std::vector<std::pair<int64_t, int64_t>> busy = Busy(intervals, offset, iv);
    // Free gaps [lo, hi) below the ceiling, plus the open space above everything.
    std::vector<std::pair<int64_t, int64_t>> gaps;
    int64_t cursor = 0;
    for (const auto& [b, e] : busy) {
      if (b > cursor) gaps.push_back({cursor, b});
      cursor = std::max(cursor, e);
    }
    if (cursor < ceiling) gaps.push_back({cursor, ceiling});
    int64_t low = -1, high = -1;
    for (const auto& [lo, hi] : gaps) {
      if (hi - lo < iv.size) continue;
      if (low < 0) low = lo;
      high = AlignDown(hi - iv.size);
    }
    // Distance from a candidate placement to the nearest conflicting buffer.
    auto clearance = [&](int64_t at) {
      int64_t d = std::numeric_limits<int64_t>::max();
      for (const auto& [b, e] : busy)
        d = std::min(d, b >= at + iv.size ? b - at - iv.size : at - e);
      return d;
    };
    int64_t chosen;
    if (low < 0)
      chosen = cursor;  // nothing fits below the ceiling: grow
    else
      chosen = high > low && clearance(high) > clearance(low) ? high : low;
    offset[idx] = chosen;
    *arena = std::max(*arena, chosen + iv.size);
  }
  return offset;
}

// The graph as the planner sees it: each node's step and the values its kernel reads, from the
// execution plan when there is one, else node order and operands.
struct PlanView {
  const ir::Graph& graph;
  const ExecutionPlan* schedule;
  int64_t step(int id) const { return schedule ? schedule->step[id] : id; }
  const std::vector<int>& reads(int id) const {
    return schedule ? schedule->reads[id] : graph.node(id).operands();
  }
};

// Inputs some member of `kernel` reads through a broadcasting view (not as one of its operands):
// their elements are read out of order, so no output may take them. A member operand the kernel
// does not read (nor computes) was replaced by a view of its own operands; a read with no matching
// operand, or more reads of a node than operands naming it, is such a view too.
std::vector<int> ViewedInputs(const PlanView& view, const std::vector<int>& kernel) {
  std::vector<int> viewed;
  for (int m : kernel) {
    const std::vector<int>& ops = view.graph.node(m).operands();
    const std::vector<int>& rs = view.reads(m);
    for (int o : ops) {
      bool member = std::find(kernel.begin(), kernel.end(), o) != kernel.end();
      if (!member && std::find(rs.begin(), rs.end(), o) == rs.end())
        for (int oo : view.graph.node(o).operands()) viewed.push_back(oo);
    }
    for (int r : rs)
      if (std::count(rs.begin(), rs.end(), r) > std::count(ops.begin(), ops.end(), r))
        viewed.push_back(r);
  }
  return viewed;
}

// In-place merges of one kernel (the nodes computed at step `s`): an output takes the buffer of an
// input that dies at this step, has its size and shape, and is read directly. `buffer[id]` is the
// node whose buffer `id` uses.
void MergeKernel(const PlanView& view, const std::vector<int>& kernel, int64_t s,
                 const std::vector<int64_t>& last_use, const std::vector<char>& in_arena,
                 std::vector<char>& taken, std::vector<int>& buffer, int* reuses) {
  const ir::Graph& graph = view.graph;
  const std::vector<int> viewed = ViewedInputs(view, kernel);
  // `in` must be read directly by the kernel (a member's operand, in its reads).
  auto reads_directly = [&](int in) {
    for (int m : kernel) {
      const std::vector<int>& ops = graph.node(m).operands();
      const std::vector<int>& rs = view.reads(m);
      if (std::find(ops.begin(), ops.end(), in) != ops.end() &&
          std::find(rs.begin(), rs.end(), in) != rs.end())
        return true;
    }
    return false;
  };
  auto can_take = [&](int out, int in) {
    const ir::Type& to = graph.node(out).type();
    const ir::Type& ti = graph.node(in).type();
    return in_arena[out] && in_arena[in] && !taken[in] && last_use[in] == s && to.byte_size() > 0 &&
           to.byte_size() == ti.byte_size() && to.shape == ti.shape &&
           std::find(kernel.begin(), kernel.end(), in) == kernel.end() &&
           std::find(viewed.begin(), viewed.end(), in) == viewed.end() && reads_directly(in);
  };
  auto take = [&](int out, int in) {
    buffer[out] = buffer[in];
    taken[in] = 1;
    ++*reuses;
  };
  if (kernel.size() == 1) {
    const ir::Node& v = graph.node(kernel[0]);
    for (int i : ir::InPlaceOperands(v.opcode())) {  // opcodes.def's in-place column
      if (i >= static_cast<int>(v.operands().size())) continue;
      if (can_take(v.id(), v.operand(i))) {
        take(v.id(), v.operand(i));
        break;
      }
    }
    return;
  }
  bool all_elementwise = true;
  for (int m : kernel)
    all_elementwise &= ir::OpcodeKind(graph.node(m).opcode()) == ir::OpKind::kElementwise ||
                       graph.node(m).opcode() == ir::Opcode::kReduceSum;  // a fused sink
  if (!all_elementwise) return;
  for (int out : kernel) {
    bool done = false;
    for (int m : kernel) {
      for (int in : graph.node(m).operands()) {
        if (can_take(out, in)) {
          take(out, in);
          done = true;
          break;
        }
      }
      if (done) break;
    }
  }
}

// In-place merges: buffer[id] is the node whose buffer `id` uses (itself unless it took a dying
// operand's). Steps run in order, so a merged chain's newest member is always its tail.
std::vector<int> InPlaceMerges(const PlanView& view, const std::vector<int64_t>& last_use,
                               const std::vector<char>& in_arena, int* reuses) {
  const int n = view.graph.num_nodes();
  std::vector<int> buffer(n);
  for (int i = 0; i < n; ++i) buffer[i] = i;
  std::vector<std::vector<int>> kernel_at(n);  // step -> the nodes its kernel computes
  for (const ir::Node& node : view.graph.nodes())
    if (NeedsArena(node) && view.step(node.id()) >= 0 && view.step(node.id()) < n)
      kernel_at[view.step(node.id())].push_back(node.id());
  std::vector<char> taken(n, 0);
  for (int s = 0; s < n; ++s)
    if (!kernel_at[s].empty())
      MergeKernel(view, kernel_at[s], s, last_use, in_arena, taken, buffer, reuses);
  return buffer;
}

// One interval per buffer (a merged chain is one buffer), in order of definition (by step: steps
// need not follow ids under an execution plan).
std::vector<Interval> BufferIntervals(const PlanView& view, const std::vector<int>& buffer,
                                      const std::vector<int64_t>& last_use,
                                      const std::vector<char>& in_arena) {
  std::vector<Interval> intervals;
  std::vector<int> interval_of(view.graph.num_nodes(), -1);
  for (const ir::Node& node : view.graph.nodes()) {
    int id = node.id();
    if (!in_arena[id]) continue;
    int b = buffer[id];
    if (b == id) {
      interval_of[id] = static_cast<int>(intervals.size());
      intervals.push_back({id, AlignUp(node.type().byte_size()), view.step(id), last_use[id]});
    } else {
      Interval& iv = intervals[interval_of[b]];
      iv.end = std::max(iv.end, last_use[id]);
      iv.start = std::min<int64_t>(iv.start, view.step(id));
    }
  }
  std::stable_sort(intervals.begin(), intervals.end(),
                   [](const Interval& a, const Interval& b) { return a.start < b.start; });
  return intervals;
}

// The most aligned bytes live at any one step (events sorted by time): no packing can beat it.
int64_t PeakLiveBytes(const std::vector<Interval>& intervals) {
  std::map<int64_t, int64_t> delta;  // time -> change in live bytes
  for (const Interval& iv : intervals) {
    delta[iv.start] += iv.size;
    delta[iv.end + 1] -= iv.size;
  }
  int64_t live = 0, peak = 0;
  for (const auto& [t, d] : delta) {
    live += d;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace

BufferPlan PlanBuffers(const ir::Graph& graph, const ExecutionPlan* schedule,
                       const BufferPlanOptions& options) {
  const int n = graph.num_nodes();
  const PlanView view{graph, schedule};
  BufferPlan plan;
  plan.offsets.assign(n, -1);

  // Liveness: a value lives from its kernel's step to its last reader's; graph outputs to the end.
  // A value nobody reads still needs storage at its own step. Operands and the result of one
  // kernel overlap in time (both live at that step), so a kernel never writes over an input it is
  // reading, except through the in-place merges.
  std::vector<int64_t> last_use(n);
  for (int i = 0; i < n; ++i) last_use[i] = view.step(i);
  for (const ir::Node& node : graph.nodes())
    for (int op : view.reads(node.id()))
      last_use[op] = std::max<int64_t>(last_use[op], view.step(node.id()));
  for (const ir::Output& out : graph.outputs()) last_use[out.node] = n;
  std::vector<char> in_arena(n, 0);
  for (const ir::Node& node : graph.nodes())
    in_arena[node.id()] = NeedsArena(node) && (!schedule || schedule->in_arena[node.id()]);

  // An asynchronous collective (ExecutionPlan::done_step) reads its operands and writes its
  // result on another thread from its step until its wait, right before the kernel at its done
  // step: no kernel before that step may write over them. Its result lives to its readers, after
  // the wait, already; each operand is kept live to the done step. An operand the collective is
  // the last reader of may still be taken by the collective itself in place (one buffer, then,
  // whose lifetime is the union); any other reader in the window could take it in place, so for
  // those operands the extension comes first.
  std::vector<std::pair<int, int64_t>> async_reads;  // (operand, done step)
  if (schedule != nullptr && !schedule->done_step.empty()) {
    for (const ir::Node& node : graph.nodes()) {
      const int done = schedule->done_step[node.id()];
      if (done < 0) continue;
      for (int op : view.reads(node.id())) {
        async_reads.push_back({op, done});
        if (last_use[op] > view.step(node.id()))
          last_use[op] = std::max<int64_t>(last_use[op], done);
      }
    }
  }
  std::vector<int> buffer(n);
  for (int i = 0; i < n; ++i) buffer[i] = i;
  if (options.in_place) buffer = InPlaceMerges(view, last_use, in_arena, &plan.in_place_reuses);
  for (const auto& [op, done] : async_reads) last_use[op] = std::max(last_use[op], done);

  const std::vector<Interval> intervals = BufferIntervals(view, buffer, last_use, in_arena);
  plan.lower_bound_bytes = PeakLiveBytes(intervals);
  std::vector<int64_t> offset = BestFitDecreasing(intervals, &plan.arena_bytes);
  if (plan.arena_bytes > plan.lower_bound_bytes) {
    // Best-fit decreasing can fragment even on a chain (sizes 3,4,4,2,4 need 10 for a bound of
    // 8). A second, two-sided packing often closes the gap; the smaller arena wins.
    int64_t other_bytes = 0;
    std::vector<int64_t> other = TwoSidedFirstFit(intervals, plan.lower_bound_bytes, &other_bytes);
    if (other_bytes < plan.arena_bytes) {
      offset = std::move(other);
      plan.arena_bytes = other_bytes;
    }
  }
  std::vector<int64_t> by_node(n, -1);
  for (size_t i = 0; i < intervals.size(); ++i) by_node[intervals[i].node] = offset[i];
  for (int id = 0; id < n; ++id)
    if (in_arena[id]) plan.offsets[id] = by_node[buffer[id]];
  return plan;
}

}  // namespace kiln::compiler
