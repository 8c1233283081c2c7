// A program exported at batch size B, rewritten for batch size N: the batched runtime inputs'
// leading dimension becomes N, each `shape` attribute (broadcast_in_dim, reshape, ...) and each
// slice `limit` whose leading entry is B on a value of leading dimension B becomes N, and every
// type is inferred again. The result is verified; a program whose batch dimension is baked in
// elsewhere (a constant of leading dimension B, a reshape folding the batch into another
// dimension) fails here with shape inference's message, or is caught by ServedModel's warm-up
// check, which compares the rewritten program's outputs with the original's on the same rows.
//
//   KILN_ASSIGN_OR_RETURN(ir::Graph g8, Rebatch(artifact.program, {"x"}, 2, 8));
#ifndef KILN_SERVE_REBATCH_H_
#define KILN_SERVE_REBATCH_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::serve {

absl::StatusOr<ir::Graph> Rebatch(const ir::Graph& program,
                                  const std::set<std::string>& batched_inputs, int64_t from,
                                  int64_t to);

}  // namespace kiln::serve

#endif  // KILN_SERVE_REBATCH_H_
