// Running the collectives a partitioned (SPMD) program has over its mesh axis (the
// model-parallel ranks): all_gather, reduce_scatter and all_reduce (sum or max) with an `axis`
// attribute (compiler/passes/spmd_partitioner.h inserts them), through the Shard* calls of the
// run's runtime::Collectives (executable.h). The cpu and reference backends' collective thunks
// call RunShardCollective.
//
//   RunShardCollective(node, operand_type, in, out, scratch, ctx);   // ctx.status on failure
#ifndef KILN_RUNTIME_SHARD_COLLECTIVES_H_
#define KILN_RUNTIME_SHARD_COLLECTIVES_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/executable.h"
#include "kiln/tensor/dtype.h"

namespace kiln::runtime {

// `c` for a collective over `replicas` ranks of the mesh axis, or an error naming `what` (no
// collectives, or another number of ranks).
inline absl::StatusOr<Collectives*> ShardCollectivesFor(Collectives* c, int64_t replicas,
                                                        const std::string& what) {
  const int size = c == nullptr ? 1 : c->num_shards();
  if (size != replicas)
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": runs over ", replicas, " ranks, but the run's shard collectives have ", size,
        " (set them with Executable::set_collectives)"));
  return c;
}

// An all_reduce the partitioner inserted (attribute `axis`: it reduces over that mesh axis, not
// over the data-parallel ranks of runtime::Collectives) or one with reduction "max".
inline bool IsShardAllReduce(const ir::Node& n) {
  return n.opcode() == ir::Opcode::kAllReduce &&
         (n.has_attr("axis") || n.attr_str("reduction") != "sum");
}

// Moves between a value's row-major layout and the rank-major layout the communicator gathers
// and scatters: an all_gather along `dimension` (x of `outer` x `dim` x `inner` elements locally,
// replicas r) receives [r][outer][dim*inner] and writes [outer][r*dim*inner]; reduce_scatter
// goes the other way before reducing. `elem` is the element size in bytes.
inline void RankMajorToRowMajor(const uint8_t* from, uint8_t* to, int64_t replicas, int64_t outer,
                                int64_t chunk_bytes) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < replicas; ++r)
      std::memcpy(to + (o * replicas + r) * chunk_bytes, from + (r * outer + o) * chunk_bytes,
                  static_cast<size_t>(chunk_bytes));
}
inline void RowMajorToRankMajor(const uint8_t* from, uint8_t* to, int64_t replicas, int64_t outer,
                                int64_t chunk_bytes) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < replicas; ++r)
      std::memcpy(to + (r * outer + o) * chunk_bytes, from + (o * replicas + r) * chunk_bytes,
                  static_cast<size_t>(chunk_bytes));
}

// Runs one all_gather / reduce_scatter / all_reduce (max) node `n` whose operand's bytes are at
// `in` and result's at `out`, with `scratch` of at least the larger of the two byte sizes (used
// when the collective's dimension is not the outermost). Sets `ctx.status` on failure.
inline void RunShardCollective(const ir::Node& n, const ir::Type& in_type, const void* in,
                               void* out, uint8_t* scratch, RunContext& ctx) {
  const std::string what = std::string(ir::OpcodeName(n.opcode())) + " %" + std::to_string(n.id());
  const DType dt = n.type().dtype;
  const int64_t elem = DTypeSize(dt);
  if (n.opcode() == ir::Opcode::kAllReduce) {  // over the axis: the copy, then in place
    if (in != out) std::memcpy(out, in, static_cast<size_t>(n.type().byte_size()));
    Collectives* s = ctx.collectives;
    if (s == nullptr || s->num_shards() <= 1) return;
    absl::Status st =
        s->ShardAllReduce(out, n.type().shape.num_elements(), dt, n.attr_str("reduction") == "max");
    if (!st.ok()) ctx.status = absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
    return;
  }
  const int64_t replicas = n.attr_int("replicas");
  const int dim = static_cast<int>(n.attr_int("dimension"));
  absl::StatusOr<Collectives*> s = ShardCollectivesFor(ctx.collectives, replicas, what);
  if (!s.ok()) {
    ctx.status = s.status();
    return;
  }
  int64_t outer = 1;
  for (int d = 0; d < dim; ++d) outer *= in_type.shape.dim(d);
  absl::Status st;
  if (n.opcode() == ir::Opcode::kAllGather) {
    const int64_t count = in_type.shape.num_elements();
    const int64_t chunk = outer == 0 ? 0 : count / outer * elem;
    if (outer <= 1) {
      st = (*s)->ShardAllGather(in, out, count, dt);
    } else {
      st = (*s)->ShardAllGather(in, scratch, count, dt);
      if (st.ok()) RankMajorToRowMajor(scratch, static_cast<uint8_t*>(out), replicas, outer, chunk);
    }
  } else {  // reduce_scatter (sum)
    const int64_t count = n.type().shape.num_elements();
    const int64_t chunk = outer == 0 ? 0 : count / outer * elem;
    if (outer <= 1) {
      st = (*s)->ShardReduceScatterSum(in, out, count, dt);
    } else {
      RowMajorToRankMajor(static_cast<const uint8_t*>(in), scratch, replicas, outer, chunk);
      st = (*s)->ShardReduceScatterSum(scratch, out, count, dt);
    }
  }
  if (!st.ok()) ctx.status = absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
}

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_SHARD_COLLECTIVES_H_
