// Sharding annotations: how a value of a global (unpartitioned) program is laid out over the
// ranks of one mesh axis. A node carries it as the string attribute `sharding` (kShardingAttr);
// parameters get it from the model (which mesh axis splits which dimension), the sharding
// propagation pass writes it on the values it derives (compiler/passes/sharding_propagation.h),
// and the SPMD partitioner turns the annotated global program into the per-rank one
// (compiler/passes/spmd_partitioner.h).
//
//   %0 = parameter() {index=0, name="w1", sharding="[_,model]"} : f32[16,64]   // columns split
//   %1 = parameter() {index=1, name="qkv", sharding="[_,3*model]"} : f32[16,48]
//   %5 = dot_general(%2, %3) {..., sharding="[_,_] sum(model)"} : f32[8,16]
//
// Text: one entry per dimension, `_` (not split), `AXIS` or `K*AXIS`, then optionally a space
// and `sum(AXIS)` or `max(AXIS)`.
// - `AXIS` splits the dimension into equal contiguous blocks, rank r of the axis holding block r.
// - `K*AXIS` views a dimension of size n as K groups of n / K (e.g. the q | k | v thirds of a
//   fused projection) and splits each group over the axis: rank r holds slice r of every group,
//   side by side (so each rank gets whole heads of q, k and v). `1*AXIS` is `AXIS`.
// - `sum(AXIS)` / `max(AXIS)` (only the propagation pass writes these): every rank holds a
//   partial value of that shape, and the value is their sum / max over the axis; the
//   partitioner reduces it with an all_reduce.
// At most one dimension is split, and only one mesh axis appears (tensor parallelism over one
// axis; data parallelism is the train step's own all-reduce). Absent attribute: replicated.
#ifndef KILN_IR_SHARDING_H_
#define KILN_IR_SHARDING_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

inline constexpr char kShardingAttr[] = "sharding";

struct Sharding {
  // Per dimension: the mesh axis it is split over ("" = not split) and its group count K.
  struct Dim {
    std::string axis;
    int64_t groups = 1;
    bool operator==(const Dim& o) const { return axis == o.axis && groups == o.groups; }
  };
  std::vector<Dim> dims;
  std::string partial;       // "sum", "max" or "" (not partial)
  std::string partial_axis;  // the axis of `partial`

  static Sharding Replicated(int rank) { return Sharding{std::vector<Dim>(rank), "", ""}; }
  int rank() const { return static_cast<int>(dims.size()); }
  // The split dimension, or -1.
  int split_dim() const;
  bool replicated() const { return split_dim() < 0 && partial.empty(); }
  std::string ToString() const;
  bool operator==(const Sharding& o) const {
    return dims == o.dims && partial == o.partial && partial_axis == o.partial_axis;
  }
  bool operator!=(const Sharding& o) const { return !(*this == o); }
};

// Parses the text above; InvalidArgument naming the problem.
absl::StatusOr<Sharding> ParseSharding(std::string_view text);

// Checks `s` against a value of `type`: rank equal, at most one split dim, whose size is
// divisible by its group count, one axis. `axis_size` > 0 also checks that every group divides
// evenly over the axis.
absl::Status CheckSharding(const Sharding& s, const Type& type, int64_t axis_size = 0);

// The sharding attribute of `node` (replicated when absent); InvalidArgument when malformed.
absl::StatusOr<Sharding> ShardingOf(const Node& node);

}  // namespace kiln::ir

#endif  // KILN_IR_SHARDING_H_
