// Buffer assignment: every node that needs arena storage gets an offset in one arena. Liveness
// intervals come from the node order (a value lives from its definition to its last use; graph
// outputs live to the end); intervals are packed best-fit, largest first, so two values share
// bytes only when their lifetimes do not overlap. Best-fit-decreasing alone can miss the lower
// bound (sizes 3,4,4,2,4 on a chain pack into 10 units, bound 8), so a second packing in
// definition order, placing each buffer on the side away from its live neighbours, is also tried
// and the smaller arena kept; on chains it reaches the bound. Cost: O(n^2) in the node count.
#ifndef KILN_RUNTIME_BUFFER_PLAN_H_
#define KILN_RUNTIME_BUFFER_PLAN_H_

#include <cstdint>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::runtime {

inline constexpr int64_t kBufferAlignment = 64;

struct BufferPlan {
  std::vector<int64_t> offsets;  // per node id; -1 for parameters and constants (not in arena)
  int64_t arena_bytes = 0;       // total arena size
  int64_t lower_bound = 0;       // max over time of the bytes simultaneously live
};

BufferPlan PlanBuffers(const ir::Graph& graph);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_BUFFER_PLAN_H_
