#include "kiln/runtime/buffer_plan.h"

#include <algorithm>
#include <limits>
#include <map>

namespace kiln::runtime {
namespace {

int64_t AlignUp(int64_t n) {
  return (n + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
}
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

}  // namespace

BufferPlan PlanBuffers(const ir::Graph& graph) {
  const int n = graph.num_nodes();
  BufferPlan plan;
  plan.offsets.assign(n, -1);

  // Liveness: a value lives from its definition to its last user; graph outputs to the end. A value
  // nobody uses still needs storage at its own step. Operands and the result of one node overlap
  // in time (both live at that node), so a kernel never writes over an input it is reading.
  std::vector<int64_t> last_use(n);
  for (int i = 0; i < n; ++i) last_use[i] = i;
  for (const ir::Node& node : graph.nodes())
    for (int op : node.operands()) last_use[op] = std::max<int64_t>(last_use[op], node.id());
  for (const ir::Output& out : graph.outputs()) last_use[out.node] = n;

  std::vector<Interval> intervals;
  for (const ir::Node& node : graph.nodes()) {
    if (!NeedsArena(node)) continue;
    intervals.push_back(
        {node.id(), AlignUp(node.type().byte_size()), node.id(), last_use[node.id()]});
  }

  // Lower bound: the most aligned bytes live at any one step (events sorted by time).
  {
    std::map<int64_t, int64_t> delta;  // time -> change in live bytes
    for (const Interval& iv : intervals) {
      delta[iv.start] += iv.size;
      delta[iv.end + 1] -= iv.size;
    }
    int64_t live = 0;
    for (const auto& [t, d] : delta) {
      live += d;
      plan.lower_bound = std::max(plan.lower_bound, live);
    }
  }

  std::vector<int64_t> offset = BestFitDecreasing(intervals, &plan.arena_bytes);
  if (plan.arena_bytes > plan.lower_bound) {
    // Best-fit decreasing can fragment even on a chain (sizes 3,4,4,2,4 need 10 for a bound of
    // 8). A second, two-sided packing often closes the gap; the smaller arena wins.
    int64_t other_bytes = 0;
    std::vector<int64_t> other = TwoSidedFirstFit(intervals, plan.lower_bound, &other_bytes);
    if (other_bytes < plan.arena_bytes) {
      offset = std::move(other);
      plan.arena_bytes = other_bytes;
    }
  }
  for (size_t i = 0; i < intervals.size(); ++i) plan.offsets[intervals[i].node] = offset[i];
  return plan;
}

}  // namespace kiln::runtime
