// Layout assignment for the cpu backend: which values keep oneDNN's channel-blocked layout in
// their buffers between kernels: nChw16c at avx512 and above, nChw8c at avx2 and sse41 (the block
// of oneDNN's direct kernels there: ChannelBlock). oneDNN's direct convolution and its pooling run
// on it; with every buffer row-major, each of them reorders its input in and its result out, a
// pass over memory per reorder (about 40% of a small CNN's time at batch 1, 10% at batch 256).
// XLA's layout assignment does the same job: each value gets one layout that its producer writes
// and all its readers take.
//
// A value is held blocked when
//   - it is an f32 [N, C, H, W] with C a multiple of the block (so the blocked layout has no
//     padding and as many bytes as row-major), stored in the arena by a kernel (not a graph input
//     or output, not hoisted), and no reshape aliases its buffer;
//   - its producer computes in the blocked layout: a forward convolution that picks it for a
//     row-major input (ConvWritesBlocked), a pooling oneDNN runs on it (PoolRunsBlocked), or an
//     elementwise loop whose blocked-capable values are all blocked (below);
//   - every kernel reading it takes the blocked layout: a forward convolution (its input, and the
//     residual its epilogue adds), pooling (its input), a reduce_sum over H and W (reduce.cc's
//     BlockedSpatialSum), or an elementwise loop (which may end in such a sum: fused_loop.cc
//     reads it through the blocked index space).
// An elementwise loop group whose members all have one shape and read their operands either
// whole, or as a broadcast scalar, computes element i from elements i of its operands in any
// layout; its same-shape inputs and stored results are therefore blocked all together or not at
// all. The rules are applied until nothing changes (every step only un-blocks, so it ends).
#include <vector>

#include "kiln/base/cpu_isa.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using ir::Opcode;
using Kind = compiler::ExecutionPlan::KernelKind;

bool BlockableType(const ir::Type& t) {
  return t.dtype == DType::kF32 && t.shape.rank() == 4 && t.shape.dim(1) % ChannelBlock() == 0 &&
         t.shape.num_elements() > 0;
}

}  // namespace

int64_t ChannelBlock() { return ActiveCpuIsa() >= CpuIsa::kAvx512 ? 16 : 8; }

dnnl::memory::format_tag BlockedTag() {
  return ChannelBlock() == 16 ? dnnl::memory::format_tag::nChw16c
                              : dnnl::memory::format_tag::nChw8c;
}

bool IsSpatialSum(const ir::Node& n, const ir::Graph& g) {
  if (n.opcode() != Opcode::kReduceSum || n.type().dtype != DType::kF32) return false;
  const ir::Type& in = g.node(n.operand(0)).type();
  const auto& dims = n.attr_ints("dimensions");
  return BlockableType(in) && dims.size() == 2 && std::min(dims[0], dims[1]) == 2 &&
         std::max(dims[0], dims[1]) == 3;
}

namespace {

// The values an elementwise loop kernel reads whole and stores, when its result is
// layout-agnostic (every member elementwise over one shape; operands read whole at that shape, or
// broadcast from a single element); nullopt otherwise.
std::optional<std::vector<int>> AgnosticLoopValues(const compiler::ExecutionPlan::Kernel& k,
                                                   const compiler::ExecutionPlan& plan,
                                                   const ir::Graph& g) {
  if (k.kind != Kind::kLoop) return std::nullopt;
  const ir::Node* shaped = &g.node(k.members.back());  // the index space (a sink may come last)
  for (int m : k.members)
    if (g.node(m).opcode() != Opcode::kReduceSum) {
      shaped = &g.node(m);
      break;
    }
  const Shape& shape = shaped->type().shape;
  std::vector<int> values;
  for (int m : k.members) {
    const ir::Node& node = g.node(m);
    if (node.opcode() == Opcode::kReduceSum) {
      // A sink summing a member over H and W: fused_loop.cc accumulates it through the blocked
      // index space's view when the group is blocked. Its [N, C] result is row-major either way.
      if (!IsSpatialSum(node, g) || g.node(node.operand(0)).type().shape != shape ||
          plan.operand_reads[m].empty() || !plan.operand_reads[m][0].inside)
        return std::nullopt;
      continue;
    }
    if (ir::OpcodeKind(node.opcode()) != ir::OpKind::kElementwise || node.type().shape != shape)
      return std::nullopt;
    for (const compiler::ExecutionPlan::Read& r : plan.operand_reads[m]) {
      if (r.inside) continue;
      const ir::Type& t = g.node(r.node).type();
      if (r.broadcast >= 0) {
        if (t.shape.num_elements() != 1) return std::nullopt;
        continue;
      }
      if (t.shape != shape) return std::nullopt;
      values.push_back(r.node);
    }
    if (plan.needed[m]) values.push_back(m);
  }
  return values;
}

}  // namespace

std::vector<char> AssignBlockedLayouts(const compiler::ExecutionPlan& plan,
                                       const LowerContext& lc) {
  const ir::Graph& g = lc.graph;
  const int n = g.num_nodes();
  std::vector<char> blocked(n, 0);
  if (lc.options.prefer_loops) return blocked;

  std::vector<char> aliased(n, 0), is_output(n, 0);
  for (int id = 0; id < n; ++id)
    if (plan.alias_of[id] != id) aliased[id] = aliased[plan.alias_of[id]] = 1;
  for (const ir::Output& o : g.outputs()) is_output[o.node] = 1;

  // Candidates (the values a blocked-capable producer writes) and readers (every value a kernel
  // reads from outside it, and whether it reads it blocked), in one pass over the kernels.
  auto storable = [&](int v) {
    return BlockableType(g.node(v).type()) && plan.needed[v] && plan.in_arena[v] &&
           !plan.outside_arena[v] && !plan.hoisted[v] && !aliased[v] && !is_output[v];
  };
  struct Read {
    int value;
    bool takes_blocked;
  };
  std::vector<Read> reads;
  auto add_read = [&](int operand, bool takes) {
    const int root = plan.alias_of[operand];
    // Read through a reshape: the bytes are reinterpreted, so the root stays row-major.
    reads.push_back({root, takes && root == operand});
  };
  std::vector<std::vector<int>> groups;  // agnostic loop kernels' values
  for (const compiler::ExecutionPlan::Kernel& k : plan.kernels) {
    const ir::Node& last = g.node(k.members.back());
    // A hoisted kernel reads only constants and hoisted values, which are never blocked; it takes
    // nothing blocked and writes nothing blocked.
    const bool hoisted = plan.hoisted[last.id()];
    if (k.kind == Kind::kNode) {
      const Opcode op = last.opcode();
      const bool pool = !hoisted && (op == Opcode::kMaxPool2d || op == Opcode::kAvgPool2d) &&
                        PoolRunsBlocked(last, lc);
      if (!hoisted && storable(last.id()) && (pool || ConvWritesBlocked(last, lc)))
        blocked[last.id()] = 1;
      for (int i = 0; i < static_cast<int>(last.operands().size()); ++i) {
        bool takes = false;
        if (i == 0 && op == Opcode::kConv2d) takes = last.type().dtype == DType::kF32;
        if (i == 0 && pool) takes = true;
        if (op == Opcode::kReduceSum) takes = IsSpatialSum(last, g);
        add_read(last.operand(i), takes && !hoisted);
      }
      continue;
    }
    std::optional<std::vector<int>> agnostic;
    if (!hoisted && k.kind == Kind::kLoop) agnostic = AgnosticLoopValues(k, plan, g);
    if (agnostic) {
      for (int v : *agnostic)
        if (std::find(k.members.begin(), k.members.end(), v) != k.members.end() && storable(v))
          blocked[v] = 1;
      groups.push_back(*agnostic);
    }
    if (!hoisted && k.kind == Kind::kConvEpilogue) {
      const int out = k.epilogue.out >= 0 ? k.epilogue.out : last.id();
      if (storable(out) && ConvWritesBlocked(g.node(k.members[0]), lc)) blocked[out] = 1;
    }
    for (int m : k.members) {
      const ir::Node& node = g.node(m);
      for (int i = 0; i < static_cast<int>(node.operands().size()); ++i) {
        const int op = node.operand(i);
        if (std::find(k.members.begin(), k.members.end(), op) != k.members.end()) continue;
        bool takes = agnostic.has_value();
        // A convolution epilogue reads its input and its residual in any layout (the residual is
        // reordered into the destination's, a no-op when both are blocked).
        if (!hoisted && k.kind == Kind::kConvEpilogue &&
            ((m == k.members[0] && i == 0) || (m != k.members[0] && op == k.epilogue.residual)))
          takes = true;
        if (k.kind == Kind::kLoop && !plan.operand_reads[m].empty()) {
          // A fused member may read a broadcast's operand through a view instead.
          const compiler::ExecutionPlan::Read& r = plan.operand_reads[m][i];
          if (r.broadcast >= 0) {
            add_read(r.node, false);
            continue;
          }
        }
        add_read(op, takes);
      }
    }
  }

  for (bool changed = true; changed;) {
    changed = false;
    for (const Read& r : reads)
      if (!r.takes_blocked && blocked[r.value]) {
        blocked[r.value] = 0;
        changed = true;
      }
    for (const std::vector<int>& values : groups) {
      bool all = true;
      for (int v : values) all = all && blocked[v];
      if (all) continue;
      for (int v : values)
        if (blocked[v]) {
          blocked[v] = 0;
          changed = true;
        }
    }
  }
  return blocked;
}

}  // namespace kiln::runtime::cpu
