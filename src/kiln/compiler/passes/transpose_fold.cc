#include "kiln/compiler/passes/transpose_fold.h"

#include <algorithm>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/compiler/graph_editor.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;

// Folds transpose `t` into one side of a dot: rewrites that side's batch and contracting dims in
// place, or returns false when the result layout would change.
bool FoldSide(const ir::Node& t, std::vector<int64_t>& batch, std::vector<int64_t>& contracting) {
  const std::vector<int64_t>& perm = t.attr_ints("permutation");
  int rank = static_cast<int>(perm.size());
  std::vector<bool> is_free(rank, true);
  for (int64_t d : batch) is_free[d] = false;
  for (int64_t d : contracting) is_free[d] = false;
  int64_t last = -1;
  for (int d = 0; d < rank; ++d) {
    if (!is_free[d]) continue;
    if (perm[d] <= last) return false;
    last = perm[d];
  }
  for (int64_t& d : batch) d = perm[d];
  for (int64_t& d : contracting) d = perm[d];
  return true;
}

}  // namespace

absl::StatusOr<bool> TransposeFoldPass::Run(ir::Graph& graph) {
  const int ns = graph.num_nodes();
  // Per source node: its number of uses (outputs count), and whether every use is a dot_general
  // operand.
  std::vector<int> uses(ns, 0);
  std::vector<char> only_dots(ns, 1);
  for (const ir::Output& o : graph.outputs()) {
    ++uses[o.node];
    only_dots[o.node] = 0;
  }
  for (const ir::Node& n : graph.nodes()) {
    for (int o : n.operands()) {
      ++uses[o];
      if (n.opcode() != Opcode::kDotGeneral) only_dots[o] = 0;
    }
  }

  GraphEditor e(graph);
  for (const ir::Node& n : graph.nodes()) {
    e.set_position(n.id());
    if (n.opcode() == Opcode::kDotGeneral) {
      // ---- operand side ----
      std::vector<int64_t> batch[2] = {n.attr_ints("lhs_batch"), n.attr_ints("rhs_batch")};
      std::vector<int64_t> contracting[2] = {n.attr_ints("lhs_contracting"),
                                             n.attr_ints("rhs_contracting")};
      int operands[2] = {e.operand(n.id(), 0), e.operand(n.id(), 1)};
      bool folded = false;
      for (int side = 0; side < 2; ++side) {
        int t = operands[side];
        if (t >= ns || e.node(t).opcode() != Opcode::kTranspose || !only_dots[t]) continue;
        if (!FoldSide(e.node(t), batch[side], contracting[side])) continue;
        operands[side] = e.operand(t, 0);
        folded = true;
      }
      if (!folded) continue;
      ir::AttrMap attrs = n.attrs();
      attrs["lhs_batch"] = batch[0];
      attrs["rhs_batch"] = batch[1];
      attrs["lhs_contracting"] = contracting[0];
      attrs["rhs_contracting"] = contracting[1];
      KILN_ASSIGN_OR_RETURN(int dot, e.Add(Opcode::kDotGeneral, {operands[0], operands[1]}, attrs));
      KILN_RETURN_IF_ERROR(e.Replace(n.id(), dot));
    } else if (n.opcode() == Opcode::kTranspose) {
      // ---- result side ----
      if (uses[n.operand(0)] != 1) continue;
      int d = e.operand(n.id(), 0);
      const ir::Node& dot = e.node(d);
      if (dot.opcode() != Opcode::kDotGeneral) continue;
      const std::vector<int64_t>& lb = dot.attr_ints("lhs_batch");
      const std::vector<int64_t>& rb = dot.attr_ints("rhs_batch");
      const std::vector<int64_t>& lc = dot.attr_ints("lhs_contracting");
      const std::vector<int64_t>& rc = dot.attr_ints("rhs_contracting");
      int64_t nb = static_cast<int64_t>(lb.size());
      int64_t nl = e.type(e.operand(d, 0)).shape.rank() - nb - static_cast<int64_t>(lc.size());
      int64_t nr = e.type(e.operand(d, 1)).shape.rank() - nb - static_cast<int64_t>(rc.size());
      if (nl == 0 || nr == 0) continue;  // the permutation below would be the identity
      std::vector<int64_t> swap;
      for (int64_t i = 0; i < nb; ++i) swap.push_back(i);
      for (int64_t i = 0; i < nr; ++i) swap.push_back(nb + nl + i);
      for (int64_t i = 0; i < nl; ++i) swap.push_back(nb + i);
      if (n.attr_ints("permutation") != swap) continue;
      ir::AttrMap attrs = dot.attrs();
      attrs["lhs_batch"] = rb;
      attrs["rhs_batch"] = lb;
      attrs["lhs_contracting"] = rc;
      attrs["rhs_contracting"] = lc;
      KILN_ASSIGN_OR_RETURN(int swapped,
                            e.Add(Opcode::kDotGeneral, {e.operand(d, 1), e.operand(d, 0)}, attrs));
      KILN_RETURN_IF_ERROR(e.Replace(n.id(), swapped));
    }
  }
  if (!e.changed()) return false;
  KILN_ASSIGN_OR_RETURN(graph, std::move(e).Build());
  return true;
}

}  // namespace kiln::compiler
