// The per-op sharding rules shared by the sharding propagation pass and the SPMD partitioner:
// given a node and the shardings its operands have, which sharding its result gets, what each
// operand must be resharded to first, and how the partitioner computes it locally. One function
// decides all three, so the partitioner computes exactly what propagation annotated.
//
//   sharding::Plan p = sharding::PlanNode(node, operand_types, operand_shardings, hint, mesh);
//   // p.out: the result's sharding (may be partial: sum(AXIS) / max(AXIS));
//   // p.operands[i]: what operand i must be; p.lowering: how the local op is formed.
//
// A `hint` (a sharding a user of the node would like it to have) is taken when the operands
// leave the choice open (replicated operands of an elementwise op, a broadcast, an iota, a
// scatter_add's operand): that is how propagation runs backward. Every op the rules do not know
// is computed replicated on gathered operands (Lowering::kReplicated): slower, never wrong.
#ifndef KILN_COMPILER_PASSES_SHARDING_RULES_H_
#define KILN_COMPILER_PASSES_SHARDING_RULES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/ir/graph.h"
#include "kiln/ir/sharding.h"

namespace kiln::compiler::sharding {

// The mesh axis a program is partitioned over.
struct Mesh {
  std::string axis = "model";
  int64_t size = 1;
};

enum class Lowering {
  kLocal,              // the same op over local operands (shape attributes rescaled)
  kReplicated,         // every operand replicated, the op on global shapes
  kIotaOffset,         // iota split along its own dimension: local iota + the rank's offset
  kVocabGather,        // gather from a table split along the gathered axis: shift, mask, sum
  kScatterOffset,      // scatter_add into an operand split along its axis: shifted indices
  kSplitSoftmax,       // softmax / log_softmax along a split axis: max and sum all-reduced
  kSplitCrossEntropy,  // cross_entropy over split classes: max, sum and target all-reduced
};

struct Plan {
  ir::Sharding out;
  std::vector<ir::Sharding> operands;
  Lowering lowering = Lowering::kLocal;
};

// `operand_shardings` are never partial (the partitioner reduces partial values first).
// Parameters are not planned here (their sharding is their annotation).
Plan PlanNode(const ir::Node& n, const std::vector<ir::Type>& operand_types,
              const std::vector<ir::Sharding>& operand_shardings, const ir::Sharding* hint,
              const Mesh& mesh);

// A sharding that splits dimension `dim` of a rank-`rank` value into `groups` groups over the
// axis.
ir::Sharding Split(int rank, int dim, int64_t groups, const Mesh& mesh);
// True when `s` (not partial) can lay out a value of `type` over the mesh.
bool Fits(const ir::Sharding& s, const ir::Type& type, const Mesh& mesh);
// The per-rank type of a value of global type `type` laid out as `s`.
ir::Type LocalType(const ir::Type& type, const ir::Sharding& s, const Mesh& mesh);
// `s` without its partial reduction (what a partial value is once all-reduced).
ir::Sharding Resolved(const ir::Sharding& s);

}  // namespace kiln::compiler::sharding

#endif  // KILN_COMPILER_PASSES_SHARDING_RULES_H_
