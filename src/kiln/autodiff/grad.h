// Reverse-mode automatic differentiation as a graph-to-graph transformation.
//
//   // f(x, w) -> {"loss": f32[]}
//   KILN_ASSIGN_OR_RETURN(ir::Graph g, Grad(f, {"w"}));
//   // g(x, w) -> {"loss": f32[], "grad/w": f32[...]}
//
// The result has f's parameters (same names and indices), all of f's outputs (same names and
// order), then one output "grad/<name>" per entry of `wrt`, in order: d(loss)/d(param), with the
// parameter's type. `loss_output` names the output to differentiate (default: the first); it
// must be a floating scalar. The seed cotangent is 1 in the loss dtype; cotangents of a value
// used several times accumulate by add. Only nodes on a path from a `wrt` parameter to the loss
// are differentiated; a parameter the loss does not depend on gets zeros. The per-op rules are in
// vjp_rules.cc.
//
// Errors (InvalidArgument): f fails verification, the loss output is missing / not a floating
// scalar, a `wrt` name is not a floating parameter or is repeated, or an output "grad/<name>"
// already exists. Unimplemented: an op on the path has no VJP for the needed operand.
#ifndef KILN_AUTODIFF_GRAD_H_
#define KILN_AUTODIFF_GRAD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::autodiff {

absl::StatusOr<ir::Graph> Grad(const ir::Graph& f, const std::vector<std::string>& wrt,
                               const std::string& loss_output = "");

}  // namespace kiln::autodiff

#endif  // KILN_AUTODIFF_GRAD_H_
