// Sharding propagation: from the `sharding` annotations of a program's parameters (ir/sharding.h:
// which mesh axis splits which dimension), derives a sharding for every value and writes it as
// the value's `sharding` attribute, for the SPMD partitioner (spmd_partitioner.h) to act on.
//
//   %0 = parameter() {index=0, name="x"} : f32[8,16]
//   %1 = parameter() {index=1, name="w1", sharding="[_,model]"} : f32[16,64]
//   %2 = dot_general(%0, %1) {...} : f32[8,64]           -> sharding="[_,model]"
//   %3 = relu(%2) : f32[8,64]                            -> sharding="[_,model]"
//   %4 = parameter() {index=2, name="w2", sharding="[model,_]"} : f32[64,16]
//   %5 = dot_general(%3, %4) {...} : f32[8,16]           -> sharding="[_,_] sum(model)"
//
// What it rewrites: the `sharding` attribute of every non-parameter node (set where the value is
// split or partial, removed where it is replicated). Parameters keep their annotation.
// How: forward sweeps apply the per-op rules (sharding_rules.h: elementwise, broadcast_in_dim,
// reshape, transpose, dot_general, reductions, slice, pad, concatenate, gather, scatter_add,
// softmax, cross_entropy, norms, attention) to the operands' shardings; a backward sweep then
// hints the sharding an op wanted for a replicated operand to that operand when the operand can
// be produced split at no cost (an elementwise op, broadcast, iota or scatter_add: e.g. the
// one-hot of a cross-entropy gradient over split logits), and the forward sweep runs again,
// until no hint changes (at most once per node). A graph output that replaces a parameter
// (in_place_of) hints the parameter's sharding. Where operands conflict (split on different
// dims) the rule keeps one and the partitioner reshards the other; an op without a rule is
// computed replicated. Leaves alone: the graph's structure; a graph with no annotated
// parameter is unchanged.
// Cost: O(n) per sweep, a few sweeps.
#ifndef KILN_COMPILER_PASSES_SHARDING_PROPAGATION_H_
#define KILN_COMPILER_PASSES_SHARDING_PROPAGATION_H_

#include <map>
#include <string>

#include "kiln/compiler/pass.h"
#include "kiln/compiler/passes/sharding_rules.h"
#include "kiln/ir/sharding.h"

namespace kiln::compiler {

class ShardingPropagation : public Pass {
 public:
  // Annotations must name `mesh.axis` (InvalidArgument otherwise, naming the parameter), and
  // every split dimension must divide over mesh.size ranks.
  // With `parameter_shardings` the pass first annotates the parameters they name
  // (AnnotateParameters, spmd_partitioner.h: what compiler::Compile does with
  // CompileOptions::program.shardings); names the graph lacks are ignored.
  explicit ShardingPropagation(sharding::Mesh mesh,
                               std::map<std::string, ir::Sharding> parameter_shardings = {})
      : mesh_(std::move(mesh)), parameter_shardings_(std::move(parameter_shardings)) {}
  std::string name() const override { return "sharding-propagation"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;

 private:
  absl::StatusOr<bool> Propagate(ir::Graph& graph);

  sharding::Mesh mesh_;
  std::map<std::string, ir::Sharding> parameter_shardings_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_SHARDING_PROPAGATION_H_
