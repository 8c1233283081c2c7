// The SPMD partitioner: rewrites a global program whose values carry `sharding` attributes
// (written by ShardingPropagation, sharding_propagation.h) into the program every rank of the
// mesh axis runs on its own shards (local shapes). One program for all ranks: the rank enters
// only through the communicator at run time (the collectives, and a partition id derived from
// one: below).
//
//   KILN_ASSIGN_OR_RETURN(ir::Graph local, PartitionSpmd(global, {.mesh = {"model", 2}}));
//   // local's parameters have local shapes; ShardOf(full, sharding, mesh, rank) cuts a rank's
//   // input, Unshard(shards, sharding, mesh) puts results back together.
//
// What it rewrites, per node, with the rules of sharding_rules.h:
// - parameters get their local type (the annotation is dropped: the result is a per-rank
//   program, and running the pass on it again changes nothing);
// - an operand whose layout is not what the op needs is resharded: split -> replicated is an
//   all_gather (for a K-groups split: reshape to expose the groups, all_gather, reshape back),
//   replicated -> split a local gather of the rank's rows (no communication), split on another
//   dim both;
// - the op runs on local shapes (broadcast/reshape/iota shapes, slice and pad bounds rescaled);
//   a partial result (a dot_general contracting a split dim, a reduce over it, a vocab-parallel
//   gather) is completed by an all_reduce (sum, or max for reduce_max) right away;
// - vocab-parallel ops: gather from / scatter_add into a table split along the gathered axis
//   shift the indices by the rank's first row (gather masks the rows it does not hold, the
//   all_reduce sums the one row that does); softmax, log_softmax and cross_entropy over a split
//   class axis all-reduce the max and the sum of exponentials (and cross_entropy the target's
//   logit); an iota split along its own dimension adds the rank's offset;
// - ops without a rule run replicated on all-gathered operands;
// - outputs: one `in_place_of` a parameter has the parameter's layout; others are replicated
//   (all-gathered / all-reduced), or have the layout SpmdOptions::output_shardings names.
// The partition id (rank r on the axis) is reduce_scatter(iota(M)) = M * r divided by M: one
// 4·M-byte collective per run, emitted only when an offset is needed.
// Leaves alone: a graph without sharding attributes (returns false). Refuses graphs with fusion
// groups (it runs before fusion) and attributes that propagation would not have written.
// Cost: O(n) nodes added, one pass.
#ifndef KILN_COMPILER_PASSES_SPMD_PARTITIONER_H_
#define KILN_COMPILER_PASSES_SPMD_PARTITIONER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/compiler/pass.h"
#include "kiln/compiler/passes/sharding_rules.h"
#include "kiln/ir/sharding.h"
#include "kiln/tensor/tensor.h"

namespace kiln::compiler {

struct SpmdOptions {
  sharding::Mesh mesh;
  // Outputs (by name) to leave split rather than gather (e.g. gradients of split parameters).
  std::map<std::string, ir::Sharding> output_shardings;
};

class SpmdPartitioner : public Pass {
 public:
  explicit SpmdPartitioner(SpmdOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "spmd-partitioner"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;

 private:
  SpmdOptions options_;
};

// Sharding propagation, then the partitioner, then the verifier: the per-rank program of a
// global program with annotated parameters.
absl::StatusOr<ir::Graph> PartitionSpmd(const ir::Graph& global, const SpmdOptions& options);

// Sets the `sharding` attribute of every parameter of `graph` named in `shardings` (names the
// graph lacks are ignored, so one layout serves a model's loss, train and predict graphs).
// InvalidArgument when a sharding does not fit its parameter's type.
absl::Status AnnotateParameters(ir::Graph& graph,
                                const std::map<std::string, ir::Sharding>& shardings);

// The shard of `full` that rank `rank` of the mesh axis holds under `s` (a copy).
absl::StatusOr<Tensor> ShardOf(const Tensor& full, const ir::Sharding& s,
                               const sharding::Mesh& mesh, int rank);
// The full tensor from every rank's shard under `s` (rank order).
absl::StatusOr<Tensor> Unshard(const std::vector<Tensor>& shards, const ir::Sharding& s,
                               const sharding::Mesh& mesh);

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_SPMD_PARTITIONER_H_
