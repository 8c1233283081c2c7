// Buffer assignment: every node that needs arena storage gets an offset in one arena.
//
//   BufferPlan plan = PlanBuffers(graph);              // one kernel per node, in id order
//   BufferPlan plan = PlanBuffers(graph, &execution_plan);  // as a backend runs it
//   plan.offsets[id];          // byte offset of node id's buffer (-1: not in the arena)
//   plan.arena_bytes;          // the arena's size
//   plan.lower_bound_bytes;    // no packing of these lifetimes can use less
//
// Liveness: a value lives from the step of its kernel to the step of its last reader (graph
// outputs to the end); operands and result of one kernel overlap in time, so a kernel never writes
// over an input it is reading, with one deliberate exception, in-place reuse:
//
// In-place reuse (BufferPlanOptions::in_place, on by default). A result takes the buffer of an
// operand that dies at its kernel (no later reader, not a graph output) when both have the same
// number of elements and bytes and the kernel is known to be safe with out == in, i.e. it reads
// element i of that operand only to write element i of the result:
// - one-node kernels, by opcode (operand indices that may be overwritten; the `in-place` column of
//   ir/opcodes.def, read through ir::InPlaceOperands):
//     every unary op (abs exp gelu ... tanh) and logical_not: 0
//     binary ops with a oneDNN algorithm (add sub mul div): 0 (oneDNN binary documents in-place
//     for src0 only); the other binary ops (max min pow) and logical_and logical_or: 0 or 1
//     softmax and log_softmax: 0 (every kernel reads a whole row before it writes any of it;
//     oneDNN softmax documents in-place) -- the LM head's logits and their softmax share one
//     [tokens x vocab] buffer
//     scatter_add: 0 (it adds the updates into its operand's elements; in place it touches only
//     the rows hit) -- a tied embedding's gather gradient scatters into the LM head's dW
//   Never: dot_general, convolutions, transposes, broadcasts, reductions, convert (oneDNN reorder),
//   select (the reference kernel memcpy's each element), data movement, the other composites:
//   they read other elements than the one they write, or make no promise about out == in.
// - multi-node kernels (an ExecutionPlan's fused groups: several nodes at one step, the cpu
//   backend's fused loops)
//   whose members are all elementwise ops: the fused loop stores a block's outputs only after
//   every input read of that block, so an output may take any input it reads directly (not
//   through a broadcasting view) that dies at the kernel.
// The two values then form one buffer whose lifetime is the union of theirs; a chain of in-place
// ops is one buffer. Each dying operand is taken by at most one result.
//
// Asynchronous collectives (ExecutionPlan::done_step, BackendTraits::async_collectives): the
// operands of one stay live until its wait (the step of its first reader), so no kernel that runs
// while it is in flight is given their bytes; its result is live from its start to its last
// reader anyway.
//
// Packing: the buffers (after in-place merging) are packed best-fit, largest first, so two buffers
// share bytes only when their lifetimes do not overlap. Best-fit-decreasing alone can miss the
// lower bound (sizes 3,4,4,2,4 on a chain pack into 10 units, bound 8), so a second packing in
// definition order, placing each buffer on the side away from its live neighbours, is also tried
// and the smaller arena kept; on chains it reaches the bound.
//
// Lower bound: the most bytes (each buffer rounded up to kBufferAlignment) live at any one step,
// with in-place pairs counted once: every packing of these lifetimes needs at least that much, so
// arena_bytes / lower_bound_bytes measures the packing's waste (the rest is the schedule's doing,
// compiler/passes/schedule.h). Cost: O(n^2) in the node count.
#ifndef KILN_COMPILER_BUFFER_PLAN_H_
#define KILN_COMPILER_BUFFER_PLAN_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/base/memory.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

struct BufferPlan {
  std::vector<int64_t> offsets;   // per node id; -1 for parameters and constants (not in arena)
  int64_t arena_bytes = 0;        // total arena size
  int64_t lower_bound_bytes = 0;  // max over steps of the bytes simultaneously live (see above)
  int in_place_reuses = 0;        // results that took a dying operand's buffer
  // (node, source) pairs: `node` has no buffer of its own and reads as `source`'s buffer (e.g. a
  // reshape, which is the same bytes); bound by the executable on every run. Set by backends.
  using Aliases = std::vector<std::pair<int, int>>;
  Aliases aliases;
  // Per node: a graph output kept out of the arena (ExecutionPlan::outside_arena; set by
  // backends). The executable computes it straight into the caller's output tensor, or, when that
  // tensor overlaps an input or another output, into a staging buffer of its own allocated then.
  std::vector<char> outside_arena;
  // Values computed once when the executable is made, each into a buffer of its own outside the
  // arena (ExecutionPlan::hoisted; set by backends, in graph order).
  std::vector<int> hoisted;
  // Per graph output: computed straight into its in_place_of parameter's buffer when the caller
  // passes the same tensor for both (ExecutionPlan::in_place_outputs; set by backends).
  std::vector<char> in_place_outputs;
};

struct BufferPlanOptions {
  // Let results take the buffers of dying operands (the rules above).
  bool in_place = true;
};

// `schedule`: how the backend runs the graph (compiler/execution_plan.h): liveness is taken from
// its steps and reads (and done_step, when filled), and only what it keeps in the arena gets a
// buffer. It need only fill `step`, `reads` and `in_arena`. Null: one kernel per node in id order,
// every node that is not a parameter or constant in the arena.
BufferPlan PlanBuffers(const ir::Graph& graph, const ExecutionPlan* schedule = nullptr,
                       const BufferPlanOptions& options = {});

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_BUFFER_PLAN_H_
