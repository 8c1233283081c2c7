// The collectives a partitioned (SPMD) program needs beyond the all-reduce sum of
// runtime::Collectives: all_gather, reduce_scatter and all_reduce with reduction "max"
// (compiler/passes/spmd_partitioner.h inserts them). A Collectives implementation that can run
// them also derives from ShardCollectives (dist::CommunicatorCollectives does); the cpu and
// reference backends' collective thunks find it with dynamic_cast, so executables of programs
// without these ops never need it.
//
//   class MyCollectives : public runtime::Collectives, public runtime::ShardCollectives {...};
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

class ShardCollectives {
 public:
  virtual ~ShardCollectives() = default;
  // recv[r * send_count + i] = send of rank r [i] (rank order; any dtype).
  virtual absl::Status AllGather(const void* send, void* recv, int64_t send_count, DType dtype) = 0;
  // recv[i] = sum over the ranks of their send[rank * recv_count + i] (f32, bf16, s32).
  virtual absl::Status ReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                        DType dtype) = 0;
  // data[i] = max over the ranks of data[i], in place (f32, bf16, s32).
  virtual absl::Status AllReduceMax(void* data, int64_t count, DType dtype) = 0;
};

// The ShardCollectives behind `c` for a collective over `replicas` ranks, or an error naming
// `what` (no collectives, another number of ranks, or collectives that cannot run it).
inline absl::StatusOr<ShardCollectives*> ShardCollectivesFor(Collectives* c, int64_t replicas,
                                                             const std::string& what) {
  const int size = c == nullptr ? 1 : c->size();
  if (size != replicas)
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": runs over ", replicas, " ranks, but the run's collectives have ",
                     size, " (set them with Executable::set_collectives)"));
  auto* s = dynamic_cast<ShardCollectives*>(c);
  if (s == nullptr)
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the run's collectives do not implement ShardCollectives"));
  return s;
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
  if (n.opcode() == ir::Opcode::kAllReduce) {  // reduction max: the copy, then in place
    if (in != out) std::memcpy(out, in, static_cast<size_t>(n.type().byte_size()));
    if (ctx.collectives == nullptr || ctx.collectives->size() <= 1) return;
    auto* s = dynamic_cast<ShardCollectives*>(ctx.collectives);
    absl::Status st = s == nullptr ? absl::FailedPreconditionError(
                                         "the run's collectives do not implement ShardCollectives")
                                   : s->AllReduceMax(out, n.type().shape.num_elements(), dt);
    if (!st.ok()) ctx.status = absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
    return;
  }
  const int64_t replicas = n.attr_int("replicas");
  const int dim = static_cast<int>(n.attr_int("dimension"));
  absl::StatusOr<ShardCollectives*> s = ShardCollectivesFor(ctx.collectives, replicas, what);
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
      st = (*s)->AllGather(in, out, count, dt);
    } else {
      st = (*s)->AllGather(in, scratch, count, dt);
      if (st.ok()) RankMajorToRowMajor(scratch, static_cast<uint8_t*>(out), replicas, outer, chunk);
    }
  } else {  // reduce_scatter (sum)
    const int64_t count = n.type().shape.num_elements();
    const int64_t chunk = outer == 0 ? 0 : count / outer * elem;
    if (outer <= 1) {
      st = (*s)->ReduceScatterSum(in, out, count, dt);
    } else {
      RowMajorToRankMajor(static_cast<const uint8_t*>(in), scratch, replicas, outer, chunk);
      st = (*s)->ReduceScatterSum(scratch, out, count, dt);
    }
  }
  if (!st.ok()) ctx.status = absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
}

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_SHARD_COLLECTIVES_H_
