// Memory-minimizing scheduling ("schedule"): reorders the nodes (the order an executable runs its
// kernels in) so that fewer bytes are live at the worst moment, which is what the buffer planner
// (compiler/buffer_plan.h) has to fit into the arena.
//
//   %2 = exp(%x) : f32[1024]          # big, read last             %3 = reduce_sum(%x) : f32[]
//   %3 = reduce_sum(%x) : f32[]                              ->    %4 = mul(%3, %3) : f32[]
//   %4 = mul(%3, %3) : f32[]                                       %2 = exp(%x) : f32[1024]
//   %5 = add(%2, %b) : f32[1024]                                   %5 = add(%2, %b) : f32[1024]
//
// Memory model: the buffer planner's liveness before in-place reuse, read off the execution plan
// (compiler/execution_plan.h) of the backend's traits, so the peak minimized here is the lower
// bound of the arena the executable allocates. Every value the plan keeps in the arena owns a
// buffer of its byte size rounded up to 64, live from the step of its kernel to the step of its
// last reader (graph outputs in the arena to the end). Nothing else is counted: sources, values
// nothing needs, reshapes the backend aliases, graph outputs it computes into the caller's
// tensors, fused intermediates and the broadcasts fused members read through views. Fusion groups
// (the `fusion` attribute, passes/fusion.h) are one kernel at one step, and the pass keeps every
// fusion group contiguous and in member order, so it can run after the fusion pass. A graph whose
// groups are not contiguous is left as it is.
//
// Candidates: the input order; a greedy list schedule (among the ready kernels, the one that
// allocates the least net of what it frees; ties to the earlier input position, so it is
// deterministic); and a depth-first post-order from the outputs that visits the costliest operand
// subgraphs first. The order with the smallest peak wins; the input order is kept unless another
// is strictly better, so the pass never makes the peak worse. The greedy schedule is re-run from
// the winner until it stops improving, so a second Run changes nothing (idempotent).
// What it leaves alone: node contents, parameters (names and indices), outputs (names and order).
// Cost: O(n * r) per candidate where r is the number of ready kernels (at most n).
#ifndef KILN_COMPILER_PASSES_SCHEDULE_H_
#define KILN_COMPILER_PASSES_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/compiler/pass.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

// The most bytes live at once when `graph` runs in id order, under the model above.
int64_t PeakLiveBytes(const ir::Graph& graph, const BackendTraits& traits = PlainTraits());

// Per node, under the model above, for `graph` run in id order: the bytes it keeps stored (0 for
// sources, broadcast views and fused intermediates), the step its kernel runs at (a fusion group
// runs at its last member's id) and the step of its last reader (num_nodes() for graph outputs;
// `start` when nothing reads it).
struct LiveInterval {
  int64_t bytes = 0;
  int start = 0;
  int end = 0;
};
std::vector<LiveInterval> LiveIntervals(const ir::Graph& graph,
                                        const BackendTraits& traits = PlainTraits());
// The same, from a plan already made for `graph` (PlanExecution).
std::vector<LiveInterval> LiveIntervals(const ir::Graph& graph, const ExecutionPlan& plan);

// `graph` with its nodes in `order` (every id once, operands before users), renumbered; same
// parameters and outputs. InvalidArgument when `order` is not such a permutation.
absl::StatusOr<ir::Graph> ReorderNodes(const ir::Graph& graph, const std::vector<int>& order);

// What the last Run found: the peak of the input order and of the chosen one, and which
// candidate won ("input", "greedy", "dfs").
struct ScheduleReport {
  int64_t input_peak_bytes = 0;
  int64_t peak_bytes = 0;
  std::string chosen = "input";
};

class SchedulePass : public Pass {
 public:
  explicit SchedulePass(BackendTraits traits = PlainTraits()) : traits_(std::move(traits)) {}
  std::string name() const override { return "schedule"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;
  const ScheduleReport& last_report() const { return report_; }

 private:
  BackendTraits traits_;
  ScheduleReport report_;
};

// Overlap of asynchronous collectives with compute ("overlap-collectives", in the pipeline after
// "schedule" when BackendTraits::async_collectives): reorders the kernels so that each
// asynchronous collective (IsAsyncCollective: the data-parallel gradient all-reduce of a bucket)
// starts right after the last kernel its operand needs (with the reshapes and concatenation that
// assemble a bucket), and every kernel that needs some collective's result, directly or through
// others (the optimizer update, the global norm), runs after every kernel that does not (the rest
// of the backward pass), in the memory schedule's order otherwise. So a bucket's all-reduce is in
// flight while the rest of the backward pass runs, and each wait (before the first reader, see
// ExecutionPlan::done_step) comes as late as the graph allows.
//
//   %9 = dot_general(...)  # dW of the last layer          %9 = dot_general(...)
//   %10 = all_reduce(%9)                                    %10 = all_reduce(%9)   # starts now
//   %11 = mul(%10, %half)  # reads it: waits         ->     %12 = dot_general(...) # dW, earlier
//   layer %12 = dot_general(...) # dW of an earlier layer         %13 = all_reduce(%12) %13 =
//   all_reduce(%12)                                   %11 = mul(%10, %half)  # waits for %10
//
// The order is the only change (no node changes; the collectives keep their relative order when
// their operands' producers do), so results are bit-identical to the memory schedule's. Fusion
// groups stay contiguous; a graph whose groups are not, or that has no asynchronous collective,
// is left as it is. The memory cost: a bucket's buffers live from its start to the update, and
// the updates wait for the whole backward pass. Idempotent. Cost: O(n log n) plus the plan.
std::vector<int> OverlapCollectivesOrder(const ir::Graph& graph,
                                         const BackendTraits& traits = PlainTraits());

class OverlapCollectivesPass : public Pass {
 public:
  explicit OverlapCollectivesPass(BackendTraits traits = PlainTraits())
      : traits_(std::move(traits)) {}
  std::string name() const override { return "overlap-collectives"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;

 private:
  BackendTraits traits_;
};

// The order SchedulePass would choose (node ids of `graph`), and its report.
std::vector<int> MemorySchedule(const ir::Graph& graph, ScheduleReport* report = nullptr,
                                const BackendTraits& traits = PlainTraits());

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_SCHEDULE_H_
