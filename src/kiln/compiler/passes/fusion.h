// Fusion ("fusion"): output fusion of matmul epilogues, then loop fusion. Groups chains of cheap
// elementwise ops of one shape into fusion groups that a backend runs as ONE kernel making a single
// pass over memory, and orders the graph so each group's members are contiguous.
//
//                                             fusion 0 kind=loop
//   %3 = mul(%g, %lr)                         %3 = mul(%g, %lr) {fusion=0}
//   %4 = sub(%w, %3)                    ->    %4 = sub(%w, %3) {fusion=0}
//   %5 = dot_general(%4, %x) {...}            %5 = dot_general(%4, %x) {...}
//
// Output fusion (first): a dot_general (f32 or bf16) followed by any of, in this order, an add of
// a rank-1 bias broadcast along the last dim, an activation (relu gelu tanh sigmoid silu) and an
// add of a same-shaped residual, each the only user of the step before, becomes one group whose
// first member is the dot_general: a backend runs it as one matmul with post-ops (oneDNN bias,
// eltwise and binary post-ops). A conv2d takes a bias along its channels (dim 1) and an
// activation the same way (no residual). A bare dot_general or conv2d stays unmarked.
//
// Loop fusion: every node whose op is one of the cheap elementwise ops (add sub mul div max min
// neg abs relu sqrt rsqrt sign compare select convert logical_and logical_or logical_not) on f32,
// bf16 and bool values gets an integer attribute `fusion` naming its group (0, 1, ... in order),
// and the graph's fusion group table (ir/graph.h) records each group's kind: matmul_epilogue or
// conv_epilogue for output fusions, loop, or reduction for a loop group with a reduce_sum sink.
// IR text shows the table as `fusion <id> kind=<kind>` lines before the nodes.
// A node joins the groups of its operands that have its shape; groups merge through it. A group
// member used outside the group (or as a graph output) is one of the group's outputs: fusion does
// not duplicate work (multi-output fusion instead of recomputing a producer), so no expensive
// producer is ever computed twice. The one exception is a generator: a chain of at most 4
// loop-fusible ops that reads only broadcast_in_dim views of smaller tensors (a one-hot
// compare(broadcast(iota), broadcast(labels)), a mask). Each group that reads one gets its own
// copy, recomputed in registers, instead of one group storing it and the others reloading a
// tensor of its size. broadcast_in_dim nodes are left unmarked: a backend reads
// their operand through a broadcasting view inside the kernel and materializes the broadcast only
// for consumers outside fusion groups. Even a single node forms a group: the fused loop has no
// per-op library dispatch.
//
// The backend decides (FusionOptions::can_fuse): a group it cannot run as one kernel is never
// formed, so no backend has to undo one.
//
// What it leaves alone: transcendental ops (exp, log, tanh, erf, gelu, sigmoid, silu, sin, cos,
// pow), which the cpu backend runs faster through oneDNN's vectorized eltwise; integer and f16/f64
// arithmetic; reductions, data movement, contractions and composites. A merge that would make the
// group graph cyclic (an outside node that both consumes from and feeds the group) is refused, as
// is one that would exceed `max_group_size` members.
//
// Reductions: a reduce_sum (f32 or bf16, at most 4096 outputs) whose operand is a loop group member
// joins that group as a sink: the kernel accumulates it (in f64 per thread, combined in thread
// order, so the result is deterministic for a given thread count) while the values are in
// registers, and the reduced tensor is stored only if something else reads it. Nothing in the
// group reads the reduction's result.
//
// Order: the result is a topological order of the groups (each group placed where its last
// member was, as far as dependencies allow), members of a group contiguous and in source order.
// Run it last before scheduling-sensitive consumers (lowering): a later rewrite that breaks a group
// dissolves it (GraphEditor). Idempotent: existing `fusion` attributes and the table are
// recomputed, and a graph that already carries exactly these groups in this order is reported
// unchanged.
// Cost: O(n * m) where m is the number of merges (a cycle check walks the graph per merge).
#ifndef KILN_COMPILER_PASSES_FUSION_H_
#define KILN_COMPILER_PASSES_FUSION_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/compiler/pass.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

// The attribute a fusion group member carries (ir/graph.h: the group's id in the graph's table).
using ir::kFusionAttr;

// The most outputs a reduction fused into a loop group may have (the kernel keeps one
// accumulator per output and thread).
inline constexpr int64_t kMaxFusedReductionOutputs = 4096;

struct FusionOptions {
  int max_group_size = 64;
  // Let a reduce_sum of a loop group member join the group (a sink accumulated in the kernel).
  bool fuse_reductions = true;
  // Output fusion: dot_general followed by a bias add, an activation and a residual add.
  bool fuse_matmul_epilogues = true;
  // The backend's answer to "can you run this group (its kind, members in graph order) as one
  // kernel?" (BackendTraits::can_fuse, compiler/execution_plan.h). An output fusion it refuses is
  // not formed (its members stay free for loop fusion); a loop group it refuses is dissolved.
  // Null: every group.
  std::function<bool(const ir::Graph&, ir::FusionKind, const std::vector<int>&)> can_fuse;
};

// True for the ops (and types) FusionPass puts into loop fusion groups.
bool IsLoopFusible(const ir::Graph& graph, const ir::Node& n);
// True for broadcast_in_dim(b) of a rank-1 `b` (same dtype) along dim `axis` only: a bias an
// output fusion's head reads directly.
bool IsBiasBroadcast(const ir::Graph& graph, int id, int64_t axis);
// The dim an output fusion's bias runs along: channels (1) for conv2d, the last for dot_general.
int64_t EpilogueBiasAxis(const ir::Node& head);
// True for a reduce_sum (f32 or bf16, at most kMaxFusedReductionOutputs outputs) that may join the
// loop group of its operand.
bool IsLoopReduction(const ir::Graph& graph, const ir::Node& n);

class FusionPass : public Pass {
 public:
  explicit FusionPass(FusionOptions options = {}) : options_(std::move(options)) {}
  std::string name() const override { return "fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;

 private:
  FusionOptions options_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_FUSION_H_
