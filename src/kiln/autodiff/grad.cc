#include "kiln/autodiff/grad.h"

#include <optional>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kiln/autodiff/graph_copy.h"
#include "kiln/autodiff/internal/vjp_helpers.h"
#include "kiln/autodiff/vjp_rules.h"
#include "kiln/base/status.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/op_traits.h"
#include "kiln/ir/verifier.h"

namespace kiln::autodiff {
namespace {

std::string OpName(const ir::Node& n) { return std::string(ir::OpcodeName(n.opcode())); }

absl::StatusOr<int> FindLoss(const ir::Graph& f, const std::string& loss_output) {
  if (f.outputs().empty()) return absl::InvalidArgumentError("grad: the graph has no outputs");
  int index = 0;
  if (!loss_output.empty()) {
    index = f.FindOutput(loss_output);
    if (index < 0) {
      return absl::InvalidArgumentError("grad: no output named '" + loss_output + "'");
    }
  }
  const ir::Output& out = f.outputs()[index];
  const ir::Type& t = f.node(out.node).type();
  if (t.shape.rank() != 0 || !IsFloating(t.dtype) || IsStorageOnly(t.dtype)) {
    return absl::InvalidArgumentError("grad: the loss output '" + out.name +
                                      "' must be a floating scalar, got " + t.ToString());
  }
  return out.node;
}

absl::StatusOr<std::vector<int>> FindWrt(const ir::Graph& f, const std::vector<std::string>& wrt) {
  std::vector<int> ids;
  std::set<std::string> seen;
  for (const std::string& name : wrt) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError("grad: parameter '" + name + "' listed twice in wrt");
    }
    int id = f.FindParameter(name);
    if (id < 0) return absl::InvalidArgumentError("grad: no parameter named '" + name + "'");
    const ir::Type& t = f.node(id).type();
    if (!IsFloating(t.dtype) || IsStorageOnly(t.dtype)) {
      return absl::InvalidArgumentError("grad: parameter '" + name + "' is not floating point (" +
                                        t.ToString() + ")");
    }
    if (f.FindOutput("grad/" + name) >= 0) {
      return absl::InvalidArgumentError("grad: the graph already has an output named 'grad/" +
                                        name + "'");
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

absl::StatusOr<ir::Graph> Grad(const ir::Graph& f, const std::vector<std::string>& wrt,
                               const std::string& loss_output) {
  KILN_RETURN_IF_ERROR(Annotate(ir::Verify(f), "grad: input graph"));
  KILN_ASSIGN_OR_RETURN(const int loss, FindLoss(f, loss_output));
  KILN_ASSIGN_OR_RETURN(const std::vector<int> wrt_ids, FindWrt(f, wrt));

  // active = reachable from a wrt parameter and reaching the loss, through floating values.
  const int n = f.num_nodes();
  std::vector<bool> from_wrt(n, false), to_loss(n, false);
  for (int id : wrt_ids) from_wrt[id] = true;
  for (const ir::Node& node : f.nodes()) {
    if (!IsFloating(node.type().dtype)) continue;
    for (int o : node.operands()) from_wrt[node.id()] = from_wrt[node.id()] || from_wrt[o];
  }
  to_loss[loss] = true;
  for (int id = loss; id >= 0; --id) {
    if (!to_loss[id]) continue;
    for (int o : f.node(id).operands()) to_loss[o] = true;
  }
  std::vector<bool> active(n);
  for (int id = 0; id < n; ++id) active[id] = from_wrt[id] && to_loss[id];

  ir::Builder b(f.name());
  KILN_ASSIGN_OR_RETURN(ValueMap fwd, CopyGraph(f, b));
  CopyOutputs(f, fwd, b);

  std::vector<std::optional<ir::Value>> cot(n);
  if (active[loss]) cot[loss] = b.Scalar(1.0, f.node(loss).type().dtype);
  std::vector<ir::Value> operands;
  std::vector<bool> wanted;
  for (int id = loss; id >= 0; --id) {
    if (!active[id] || !cot[id].has_value()) continue;
    const ir::Node& node = f.node(id);
    if (node.opcode() == ir::Opcode::kParameter) continue;
    operands.clear();
    wanted.clear();
    bool any = false;
    for (int o : node.operands()) {
      operands.push_back(fwd[o]);
      wanted.push_back(active[o] && IsFloating(f.node(o).type().dtype));
      any = any || wanted.back();
    }
    if (!any) continue;
    // int8 ops round their inputs: a zero gradient through them would be silently wrong.
    if (ir::OpTraits(node.opcode()).family == ir::KernelFamily::kQuantized) {
      return absl::InvalidArgumentError(
          absl::StrCat("grad: %", id, " (", OpName(node),
                       ") is not differentiable: int8 ops are for inference (train in f32, "
                       "then `kiln quantize`)"));
    }
    if (!IsDifferentiable(node.opcode())) continue;
    absl::StatusOr<Cotangents> cts = Vjp({node, operands, fwd[id], *cot[id], wanted});
    if (!cts.ok()) {
      return Annotate(cts.status(), absl::StrCat("grad: %", id, " (", OpName(node), ")"));
    }
    if (!b.status().ok()) {
      return Annotate(b.status(), absl::StrCat("grad: VJP of %", id, " (", OpName(node), ")"));
    }
    for (size_t i = 0; i < operands.size(); ++i) {
      if (!(*cts)[i].has_value()) continue;
      const int o = node.operand(static_cast<int>(i));
      const ir::Value& c = *(*cts)[i];
      if (c.type() != f.node(o).type()) {
        return absl::InternalError(absl::StrCat("grad: the VJP of %", id, " (", OpName(node),
                                                ") gave operand ", i, " a cotangent of type ",
                                                c.type().ToString(), ", expected ",
                                                f.node(o).type().ToString()));
      }
      cot[o] = cot[o].has_value() ? ir::Add(*cot[o], c) : c;
    }
  }

  for (size_t i = 0; i < wrt.size(); ++i) {
    const int id = wrt_ids[i];
    ir::Value g = cot[id].has_value() ? *cot[id] : internal::Zeros(&b, f.node(id).type());
    b.Output("grad/" + wrt[i], g);
  }
  absl::StatusOr<ir::Graph> out = b.Build();
  if (!out.ok()) return Annotate(out.status(), "grad: building the gradient graph");
  return out;
}

}  // namespace kiln::autodiff
