// Checks a Graph's invariants: operands precede users (SSA order), every node's type equals the
// type InferType gives it, attributes are present and well-formed, parameter indices are 0..n-1
// and unique, parameter and output names are unique, outputs refer to existing nodes.
#ifndef KILN_IR_VERIFIER_H_
#define KILN_IR_VERIFIER_H_

#include "absl/status/status.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

absl::Status Verify(const Graph& graph);

}  // namespace kiln::ir

#endif  // KILN_IR_VERIFIER_H_
