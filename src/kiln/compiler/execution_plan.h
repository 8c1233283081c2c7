// The execution plan: how a backend runs an optimized graph, worked out once. Which nodes run as
// one kernel (fusion groups and single nodes), where each kernel reads its operands from (a fused
// member reads a broadcast's operand through a view; a reshape is its operand's bytes), which
// values are stored, in the arena or in the caller's output tensors, and which need not run at
// all. The schedule pass (the peak it minimizes), rematerialization (kernel boundaries), buffer
// assignment (compiler/buffer_plan.h: liveness) and the backends (runtime/cpu: what to lower) all
// read it, so what the compiler predicts is what the executable allocates.
//
//   BackendTraits traits{.alias_reshapes = true, .outputs_outside_arena = true};
//   ExecutionPlan plan = PlanExecution(graph, traits);
//   for (const ExecutionPlan::Kernel& k : plan.kernels) ...   // in graph order
//   plan.in_arena[id];   // node id has a buffer in the arena
//
// Fusion groups are the graph's typed group table (ir/graph.h: each group's kind, its members the
// nodes whose `fusion` attribute names it); the kernel kind comes from the table, never from the
// members' opcodes. A group whose members are not contiguous in the graph's order (an unverified
// graph), that has members its kind does not run, or that `traits.can_fuse` refuses is planned
// node by node; the fusion pass asks the same traits, so on graphs it produced no group is ever
// refused. The plan borrows nothing: it holds node ids of
// the graph it was made from and is valid for that graph only.
#ifndef KILN_COMPILER_EXECUTION_PLAN_H_
#define KILN_COMPILER_EXECUTION_PLAN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::compiler {

// What a backend tells the compiler about how it runs a graph (the parts that change the plan).
struct BackendTraits {
  // Runs each fusion group (the `fusion` attribute) as one kernel. Off: every node is its own
  // kernel whatever the graph carries (the reference backend).
  bool fusion = true;
  // A reshape of a dense row-major value (same dtype, not a graph output) is its operand's bytes:
  // it gets no kernel and no buffer, and its readers read the operand's buffer.
  bool alias_reshapes = false;
  // Graph outputs computed by a kernel live in the caller's tensors, not in the arena.
  bool outputs_outside_arena = false;
  // Constant-valued one-node kernels run once, when the executable is made
  // (ExecutionPlan::hoisted), not per run.
  bool hoist_constants = false;
  // Whether the backend can run a fusion group of this kind (members in graph order) as one
  // kernel. Null: every group the fusion pass forms.
  std::function<bool(const ir::Graph&, ir::FusionKind, const std::vector<int>& members)> can_fuse;
  // Runs asynchronous collectives (IsAsyncCollective) asynchronously: started at their own step,
  // waited for right before the first kernel that reads the result (ExecutionPlan::done_step),
  // with the kernels between running while they are in flight. The buffer planner keeps their
  // operands and results where no kernel of that window writes, and the pipeline adds the
  // overlap-collectives pass (passes/schedule.h), which starts each one as early and waits as
  // late as the graph allows.
  bool async_collectives = false;
  // Whether the backend runs this node's bf16 form (a node reading bf16 operands) as it is, fast
  // enough to be worth it. The nodes it does not the float-normalization pass
  // (passes/float_normalization.h) computes in f32 between converts, keeping bf16 storage, and
  // bf16_note says why (for the line `kiln train` prints). Null: every bf16 node runs (and the
  // pass is not in the pipeline).
  std::function<bool(const ir::Node&)> supports_bf16;
  std::string bf16_note;  // "oneDNN has no bf16 matmul/convolution below avx512_core"
};

// The collectives a backend with BackendTraits::async_collectives runs asynchronously: the
// data-parallel gradient all_reduce (sum over the data ranks: no `axis`). The SPMD partitioner's
// collectives (an `axis`, reduction max, all_gather, reduce_scatter) are read at once and run
// synchronously.
bool IsAsyncCollective(const ir::Node& node);

// The compiler's default memory model: fusion groups as one kernel each, every value in the arena.
inline BackendTraits PlainTraits() { return {}; }

// The steps of an epilogue fusion group [head, (bias add), (activation), (residual add)]:
// result = residual + activation(head + bias), written to the last member's buffer. Worked out
// once (MatchEpilogue), carried on the plan's kernel, read by backends' can_fuse and lowering.
struct EpilogueSteps {
  int bias = -1;            // the rank-1 bias (the operand of bias_broadcast), or -1
  int bias_broadcast = -1;  // its broadcast_in_dim (read through a view), or -1
  int activation = -1;      // the activation member, or -1
  int residual = -1;        // the same-shaped residual operand, or -1
  // The residual is added before the activation (a convolution's act(head + bias + residual))
  // rather than after it (a matmul's residual + act(head + bias)).
  bool residual_first = false;
  int out = -1;  // the last member: its buffer receives the result
};
// The steps of `members` (graph order, members[0] the dot_general or conv2d head), or nullopt when
// they are not such a chain: the bias add (IsBiasBroadcast along EpilogueBiasAxis) comes first,
// then the activation (an op with the epilogue_activation trait) and the residual add in either
// order (residual_first when the residual comes first).
std::optional<EpilogueSteps> MatchEpilogue(const ir::Graph& graph, const std::vector<int>& members);

struct ExecutionPlan {
  enum class KernelKind {
    kNode,            // one node
    kLoop,            // a loop or reduction fusion group (elementwise members, reduce_sum sinks)
    kMatmulEpilogue,  // dot_general + bias / activation / residual as one matmul with post-ops
    kConvEpilogue,    // conv2d + bias / activation as one convolution with post-ops
  };
  struct Kernel {
    KernelKind kind = KernelKind::kNode;
    std::vector<int> members;   // node ids in graph order; the kernel runs at members.back()
    int64_t fusion_group = -1;  // the group's id in the graph's table; -1 for kNode
    EpilogueSteps epilogue;     // kMatmulEpilogue / kConvEpilogue: its steps
  };
  // Where a fused member reads one operand from.
  struct Read {
    // The value read: the operand, or a broadcast's operand read through a view. Not resolved
    // through aliases (its type is the shape of the view; `reads` holds the buffers).
    int node = -1;
    int broadcast = -1;   // the broadcast_in_dim read through a view, or -1
    bool inside = false;  // the operand is a member of the same kernel (in registers)
  };

  // Every kernel that runs, in graph order. Sources (parameters, constants), aliased reshapes,
  // broadcasts that every reader absorbs, values nothing needs and empty values have none.
  std::vector<Kernel> kernels;
  // The fusion groups that run fused (accepted: contiguous, allowed, can_fuse), in graph order,
  // including those nothing needs (they do not run, but the schedule keeps them contiguous).
  std::vector<Kernel> groups;
  // Per node:
  std::vector<int> kernel_of;  // index into kernels, or -1 (no kernel computes it)
  std::vector<int> group_of;   // index into groups, or -1
  std::vector<int> step;       // the id of the node its kernel runs at (its own id without one)
  // The buffers its kernel reads for it from outside the kernel (alias roots, through broadcast
  // views); empty for nodes that do not run.
  std::vector<std::vector<int>> reads;
  // Fused members only: one Read per operand, in operand order.
  std::vector<std::vector<Read>> operand_reads;
  std::vector<int> alias_of;        // the node whose buffer holds its value (itself unless aliased)
  std::vector<char> needed;         // computed and stored: read by a running kernel, or an output
  std::vector<char> in_arena;       // has a buffer of its own in the arena
  std::vector<char> outside_arena;  // a graph output computed into the caller's tensor
  // With traits.hoist_constants: computed once when the executable is made, into a buffer of
  // its own, never per run: a one-node kernel (not random, not a graph output) whose operands are
  // all constants or hoisted values -- an iota, a causal mask compare(iota, iota), a broadcast
  // position table. Such values are constants the folder leaves unmaterialized in the IR (too big
  // to print). Only values of at most kMaxHoistedBytes: a bigger one (the zeros a [50257, 768]
  // embedding gradient is scattered into) would hold its memory for the executable's life, where
  // computing it per run costs a pass over memory and shares the arena.
  std::vector<char> hoisted;

  // Per graph output (outputs() order): it has an in_place_of parameter (ir::Output) and is
  // computed straight into that parameter's buffer when the caller passes one tensor for both.
  // That holds when the output is computed into the caller's tensor (outside_arena) by a kernel,
  // is no other output's value, no graph output is the parameter itself, every other kernel
  // that reads the parameter runs before that kernel, and that kernel reads the parameter only
  // where writing element i after reading element i is safe: a loop kernel of elementwise
  // members (and reduce_sum sinks) reading it directly, not through a broadcast view, or a single
  // node whose opcode may overwrite those operands (ir::InPlaceOperands). Otherwise the
  // executable computes the output elsewhere and copies it over the input at the end of the run.
  std::vector<char> in_place_outputs;

  // Per node, with traits.async_collectives: for an asynchronous collective that runs, the step
  // of the first kernel reading its value (its wait goes right before that kernel), or
  // num_nodes() when only the end of the run reads it (a graph output); -1 for every other node.
  // Its operands' buffers and its result's stay untouched by every kernel before that step.
  std::vector<int> done_step;

  // False when some fusion group of the graph is not contiguous (planned node by node): a graph
  // rewritten after the fusion pass, which the schedule pass leaves as it is.
  bool groups_contiguous = true;

  bool fused(int node) const { return group_of[node] >= 0; }
};

// The largest value ExecutionPlan::hoisted takes (16 MiB: a 2048 x 2048 s32 mask, say).
inline constexpr int64_t kMaxHoistedBytes = int64_t{16} << 20;

ExecutionPlan PlanExecution(const ir::Graph& graph, const BackendTraits& traits);

// The bytes a value occupies in the arena (rounded up to the arena's 64-byte alignment).
int64_t ArenaBytes(const ir::Type& type);

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_EXECUTION_PLAN_H_
