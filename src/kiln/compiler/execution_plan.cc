#include "kiln/compiler/execution_plan.h"

#include <algorithm>
#include <map>
#include <utility>

#include "kiln/base/memory.h"
#include "kiln/compiler/passes/fusion.h"
#include "kiln/ir/op_traits.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;

bool IsSource(const ir::Node& n) {
  return n.opcode() == Opcode::kParameter || n.opcode() == Opcode::kConstant;
}

// The fusion groups the graph's table declares that have members (in graph order), by id.
std::vector<std::pair<ir::FusionGroup, std::vector<int>>> FusionGroups(const ir::Graph& graph) {
  std::vector<std::pair<ir::FusionGroup, std::vector<int>>> out;
  if (graph.fusion_groups().empty()) return out;
  std::map<int64_t, std::vector<int>> members = graph.FusionMembersByGroup();
  for (const ir::FusionGroup& g : graph.fusion_groups()) {
    auto it = members.find(g.id);
    if (it != members.end()) out.push_back({g, std::move(it->second)});
  }
  return out;
}

ExecutionPlan::KernelKind KernelKindOf(ir::FusionKind kind) {
  switch (kind) {
    case ir::FusionKind::kMatmulEpilogue:
      return ExecutionPlan::KernelKind::kMatmulEpilogue;
    case ir::FusionKind::kConvEpilogue:
      return ExecutionPlan::KernelKind::kConvEpilogue;
    case ir::FusionKind::kLoop:
    case ir::FusionKind::kReduction:
      break;
  }
  return ExecutionPlan::KernelKind::kLoop;
}

bool Contiguous(const std::vector<int>& members) {
  for (size_t i = 1; i < members.size(); ++i)
    if (members[i] != members[i - 1] + 1) return false;
  return true;
}

// A group this plan runs as one kernel: contiguous in the graph's order (verified graphs are),
// made of what its kind runs, and accepted by the backend.
bool RunsFused(const ir::Graph& graph, const ir::FusionGroup& group,
               const std::vector<int>& members, const BackendTraits& traits) {
  if (!Contiguous(members)) return false;
  if (KernelKindOf(group.kind) == ExecutionPlan::KernelKind::kLoop) {
    for (int m : members)
      if (!IsLoopFusible(graph, graph.node(m)) && !IsLoopReduction(graph, graph.node(m)))
        return false;
  } else if (!ir::FusionGroupProblem(graph, group, members).empty()) {
    return false;
  }
  return !traits.can_fuse || traits.can_fuse(graph, group.kind, members);
}

// Where fused members read their operands: in registers (a member), through a broadcasting view
// (a broadcast_in_dim outside every group: a loop group absorbs any, an output fusion only its
// rank-1 bias), or from the operand's buffer. Fills operand_reads and reads of fused members.
void PlanFusedReads(const ir::Graph& graph, ExecutionPlan& plan) {
  using Kind = ExecutionPlan::KernelKind;
  for (const ExecutionPlan::Kernel& k : plan.groups) {
    for (int m : k.members) {
      for (int op : graph.node(m).operands()) {
        ExecutionPlan::Read read{op, -1, plan.group_of[op] == plan.group_of[m]};
        if (!read.inside) {
          const ir::Node& o = graph.node(op);
          bool absorb = k.kind == Kind::kLoop ? o.opcode() == Opcode::kBroadcastInDim
                        : k.kind == Kind::kMatmulEpilogue || k.kind == Kind::kConvEpilogue
                            ? op == k.epilogue.bias_broadcast
                            : false;
          if (absorb && plan.group_of[op] < 0) read = {o.operand(0), op, false};
          plan.reads[m].push_back(read.node);
        }
        plan.operand_reads[m].push_back(read);
      }
    }
  }
}

// What must run: graph outputs and whatever a running kernel reads, walking backwards. A group
// runs when any member is needed, and then reads all its members' inputs. Fills plan.needed and
// returns, per group, whether it runs.
std::vector<char> MarkNeeded(const ir::Graph& graph, ExecutionPlan& plan) {
  const std::vector<ExecutionPlan::Kernel>& fused = plan.groups;
  const int n = graph.num_nodes();
  for (const ir::Output& o : graph.outputs()) plan.needed[o.node] = 1;
  std::vector<char> runs(fused.size(), 0);
  for (int id = n - 1; id >= 0; --id) {
    int k = plan.group_of[id];
    if (k >= 0) {
      if (id != fused[k].members.back() || graph.node(id).type().shape.num_elements() == 0)
        continue;
      for (int m : fused[k].members) runs[k] |= plan.needed[m];
      if (!runs[k]) continue;
      for (int m : fused[k].members)
        for (int r : plan.reads[m]) plan.needed[r] = 1;
      continue;
    }
    if (!plan.needed[id]) continue;
    for (int r : plan.reads[id]) plan.needed[r] = 1;
  }
  return runs;
}

}  // namespace

std::optional<EpilogueSteps> MatchEpilogue(const ir::Graph& graph,
                                           const std::vector<int>& members) {
  if (members.empty()) return std::nullopt;
  const ir::Node& head = graph.node(members[0]);
  const int64_t axis = EpilogueBiasAxis(head);
  EpilogueSteps ep;
  ep.out = members.back();
  int prev = head.id();
  for (size_t i = 1; i < members.size(); ++i) {
    const ir::Node& m = graph.node(members[i]);
    const bool binary = m.operands().size() == 2;
    if (binary && m.operand(0) != prev && m.operand(1) != prev) return std::nullopt;
    const int other = binary ? (m.operand(0) == prev ? m.operand(1) : m.operand(0)) : -1;
    if (m.opcode() == Opcode::kAdd && ep.bias < 0 && ep.activation < 0 && ep.residual < 0 &&
        IsBiasBroadcast(graph, other, axis)) {
      ep.bias_broadcast = other;
      ep.bias = graph.node(other).operand(0);
    } else if (m.opcode() == Opcode::kAdd && ep.residual < 0) {
      ep.residual = other;
    } else if (ep.activation < 0 && m.operands().size() == 1 && m.operand(0) == prev &&
               ir::OpTraits(m.opcode()).epilogue_activation()) {
      ep.activation = m.id();
      ep.residual_first = ep.residual >= 0;
    } else {
      return std::nullopt;
    }
    prev = m.id();
  }
  return ep;
}

namespace {

// Whether kernel `k` of `plan` may write a result over `param` while it reads it: it reads
// element i of param only to write element i (see ExecutionPlan::in_place_outputs).
bool KernelOverwritesSafely(const ir::Graph& graph, const ExecutionPlan& plan, int k, int param) {
  const ExecutionPlan::Kernel& kernel = plan.kernels[k];
  if (kernel.kind == ExecutionPlan::KernelKind::kNode) {
    const ir::Node& node = graph.node(kernel.members[0]);
    const std::vector<int> allowed = ir::InPlaceOperands(node.opcode());
    for (int i = 0; i < static_cast<int>(node.operands().size()); ++i)
      if (plan.alias_of[node.operand(i)] == param &&
          (std::find(allowed.begin(), allowed.end(), i) == allowed.end() ||
           graph.node(node.operand(i)).type().shape.num_elements() !=
               node.type().shape.num_elements()))
        return false;
    return true;
  }
  if (kernel.kind != ExecutionPlan::KernelKind::kLoop) return false;
  for (int m : kernel.members) {
    const ir::Opcode op = graph.node(m).opcode();
    if (ir::OpcodeKind(op) != ir::OpKind::kElementwise && op != Opcode::kReduceSum) return false;
    for (const ExecutionPlan::Read& r : plan.operand_reads[m])
      if (!r.inside && plan.alias_of[r.node] == param &&
          (r.broadcast >= 0 || graph.node(r.node).type().shape.num_elements() !=
                                   graph.node(m).type().shape.num_elements()))
        return false;
  }
  return true;
}

// ExecutionPlan::in_place_outputs.
std::vector<char> PlanInPlaceOutputs(const ir::Graph& graph, const ExecutionPlan& plan) {
  const std::vector<ir::Output>& outputs = graph.outputs();
  std::vector<char> in_place(outputs.size(), 0);
  const int n = graph.num_nodes();
  std::vector<int> uses(n, 0);          // per node: how many outputs it is
  std::vector<char> output_root(n, 0);  // per node: some output's value lives in its buffer
  std::vector<int> last_read(n, -1);    // per node: the step of the last kernel reading it
  for (const ir::Output& o : outputs) {
    ++uses[o.node];
    output_root[plan.alias_of[o.node]] = 1;
  }
  for (int r = 0; r < n; ++r)
    if (plan.kernel_of[r] >= 0)
      for (int b : plan.reads[r]) {
        // An asynchronous collective reads its operand until its wait.
        const int until = plan.done_step[r] >= 0 ? plan.done_step[r] : plan.step[r];
        last_read[b] = std::max(last_read[b], until);
      }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const ir::Output& o = outputs[i];
    const int param = o.in_place_of >= 0 ? graph.ParameterWithIndex(o.in_place_of) : -1;
    const int k = o.node < n ? plan.kernel_of[o.node] : -1;
    if (param < 0 || k < 0 || !plan.outside_arena[o.node] || uses[o.node] != 1 ||
        output_root[param])
      continue;
    // Every reader runs at or before the output's kernel (step identifies a kernel, so a reader
    // at that step is the kernel itself, checked next).
    in_place[i] =
        last_read[param] <= plan.step[o.node] && KernelOverwritesSafely(graph, plan, k, param);
  }
  return in_place;
}

using Kind = ExecutionPlan::KernelKind;

// The fusion groups the backend runs as one kernel, in graph order (plan.groups), and where each
// member runs (group_of, step).
void PlanGroups(const ir::Graph& graph, const BackendTraits& traits, ExecutionPlan& plan) {
  std::vector<ExecutionPlan::Kernel>& fused = plan.groups;
  if (traits.fusion) {
    for (auto& [group, members] : FusionGroups(graph)) {
      plan.groups_contiguous &= Contiguous(members);
      if (!RunsFused(graph, group, members, traits)) continue;
      ExecutionPlan::Kernel k{KernelKindOf(group.kind), std::move(members), group.id};
      if (k.kind == Kind::kMatmulEpilogue || k.kind == Kind::kConvEpilogue) {
        std::optional<EpilogueSteps> ep = MatchEpilogue(graph, k.members);
        if (!ep) continue;  // not a chain a backend runs as post-ops: node by node
        k.epilogue = *ep;
      }
      fused.push_back(std::move(k));
    }
  }
  std::sort(fused.begin(), fused.end(),
            [](const auto& a, const auto& b) { return a.members[0] < b.members[0]; });
  for (size_t k = 0; k < fused.size(); ++k)
    for (int m : fused[k].members) {
      plan.group_of[m] = static_cast<int>(k);
      plan.step[m] = fused[k].members.back();
    }
}

// Aliases: a dense reshape is the same bytes as its operand (outputs keep their own buffer).
// Reads then name the value that owns the bytes.
void PlanAliases(const ir::Graph& graph, const BackendTraits& traits,
                 const std::vector<char>& is_output, ExecutionPlan& plan) {
  for (const ir::Node& node : graph.nodes()) {
    int id = node.id();
    plan.alias_of[id] = id;
    if (traits.alias_reshapes && node.opcode() == Opcode::kReshape && plan.group_of[id] < 0 &&
        !is_output[id] && graph.node(node.operand(0)).type().dtype == node.type().dtype)
      plan.alias_of[id] = plan.alias_of[node.operand(0)];
  }
  for (std::vector<int>& rs : plan.reads)
    for (int& r : rs) r = plan.alias_of[r];
}

// Kernels in graph order: each running group at its first member, each needed non-empty node
// that is not a source or an alias on its own.
void PlanKernels(const ir::Graph& graph, const std::vector<char>& runs, ExecutionPlan& plan) {
  const std::vector<ExecutionPlan::Kernel>& fused = plan.groups;
  std::vector<int> kernel_of_group(fused.size(), -1);
  for (const ir::Node& node : graph.nodes()) {
    int id = node.id();
    int k = plan.group_of[id];
    if (k >= 0) {
      if (!runs[k]) continue;
      if (kernel_of_group[k] < 0) {
        kernel_of_group[k] = static_cast<int>(plan.kernels.size());
        plan.kernels.push_back(fused[k]);
      }
      plan.kernel_of[id] = kernel_of_group[k];
      continue;
    }
    if (!plan.needed[id] || IsSource(node) || plan.alias_of[id] != id ||
        node.type().shape.num_elements() == 0)
      continue;
    plan.kernel_of[id] = static_cast<int>(plan.kernels.size());
    plan.kernels.push_back({Kind::kNode, {id}});
  }
  for (int id = 0; id < graph.num_nodes(); ++id)
    if (plan.kernel_of[id] < 0) plan.reads[id].clear();  // reads of what never runs extend nothing
}

// Hoisted: constant-valued one-node kernels, computed once (ExecutionPlan::hoisted).
void PlanHoisted(const ir::Graph& graph, const BackendTraits& traits,
                 const std::vector<char>& is_output, ExecutionPlan& plan) {
  plan.hoisted.assign(graph.num_nodes(), 0);
  for (const ExecutionPlan::Kernel& k : plan.kernels) {
    if (!traits.hoist_constants || k.kind != Kind::kNode) continue;
    const ir::Node& node = graph.node(k.members[0]);
    const ir::KernelFamily family = ir::OpTraits(node.opcode()).family;
    if (is_output[node.id()] || family == ir::KernelFamily::kRandom ||
        family == ir::KernelFamily::kCollective || node.type().byte_size() > kMaxHoistedBytes)
      continue;
    bool constant = true;
    for (int op : node.operands()) {
      const int root = plan.alias_of[op];
      constant &= graph.node(root).opcode() == Opcode::kConstant || plan.hoisted[root];
    }
    plan.hoisted[node.id()] = constant;
  }
}

// Storage: needed values a kernel computes; graph outputs in the caller's tensors when the
// backend says so.
void PlanStorage(const ir::Graph& graph, const BackendTraits& traits,
                 const std::vector<char>& is_output, ExecutionPlan& plan) {
  for (const ir::Node& node : graph.nodes()) {
    int id = node.id();
    if (IsSource(node) || !plan.needed[id] || plan.alias_of[id] != id || plan.hoisted[id]) continue;
    if (traits.outputs_outside_arena && is_output[id] && node.type().byte_size() > 0)
      plan.outside_arena[id] = 1;
    else
      plan.in_arena[id] = 1;
  }
}

// Asynchronous collectives: each is waited for before the first kernel that reads it.
void PlanCollectiveWaits(const ir::Graph& graph, const BackendTraits& traits,
                         const std::vector<char>& is_output, ExecutionPlan& plan) {
  const int n = graph.num_nodes();
  plan.done_step.assign(n, -1);
  if (!traits.async_collectives) return;
  for (const ExecutionPlan::Kernel& k : plan.kernels) {
    const int id = k.members.back();
    if (k.kind == Kind::kNode && IsAsyncCollective(graph.node(id)) && !plan.hoisted[id])
      plan.done_step[id] = is_output[id] ? n : -2;  // -2: the first reader, found below
  }
  for (const ExecutionPlan::Kernel& k : plan.kernels)  // in graph order: the first reader
    for (int m : k.members)
      for (int b : plan.reads[m])
        if (plan.done_step[b] == -2 || (plan.done_step[b] > plan.step[m] && b != m))
          plan.done_step[b] = plan.step[m];
  for (int id = 0; id < n; ++id)
    if (plan.done_step[id] == -2) plan.done_step[id] = n;  // read by nothing that runs
}

}  // namespace

int64_t ArenaBytes(const ir::Type& type) { return AlignUp(type.byte_size()); }

ExecutionPlan PlanExecution(const ir::Graph& graph, const BackendTraits& traits) {
  const int n = graph.num_nodes();
  ExecutionPlan plan;
  plan.kernel_of.assign(n, -1);
  plan.group_of.assign(n, -1);
  plan.step.resize(n);
  plan.reads.resize(n);
  plan.operand_reads.resize(n);
  plan.alias_of.resize(n);
  plan.needed.assign(n, 0);
  plan.in_arena.assign(n, 0);
  plan.outside_arena.assign(n, 0);
  for (int i = 0; i < n; ++i) plan.step[i] = i;

  PlanGroups(graph, traits, plan);
  PlanFusedReads(graph, plan);
  for (const ir::Node& node : graph.nodes())
    if (plan.group_of[node.id()] < 0) plan.reads[node.id()] = node.operands();
  std::vector<char> is_output(n, 0);
  for (const ir::Output& o : graph.outputs()) is_output[o.node] = 1;
  PlanAliases(graph, traits, is_output, plan);
  const std::vector<char> runs = MarkNeeded(graph, plan);
  PlanKernels(graph, runs, plan);
  PlanHoisted(graph, traits, is_output, plan);
  PlanStorage(graph, traits, is_output, plan);
  PlanCollectiveWaits(graph, traits, is_output, plan);
  plan.in_place_outputs = PlanInPlaceOutputs(graph, plan);
  return plan;
}

bool IsAsyncCollective(const ir::Node& node) {
  return node.opcode() == Opcode::kAllReduce && !node.has_attr("axis") &&
         (!node.has_attr("reduction") || node.attr_str("reduction") == "sum");
}

}  // namespace kiln::compiler
