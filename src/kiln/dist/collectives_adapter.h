// runtime::Collectives (and ShardCollectives) over a Communicator: what a compiled graph's
// collective ops run through in a multi-process (or multi-thread) job, and the reduce-scatter
// and all-gather of ZeRO-1 (nn::ShardedCollectives, TrainStepOptions::shard_state). The
// runtime and nn sit above dist in the layer order and do not know Communicator; this adapter,
// in dist, connects them.
//
//   std::unique_ptr<Communicator> comm = ...;             // MpiCommunicator, thread communicator
//   CommunicatorCollectives collectives(*comm);
//   TrainStepOptions o{.data_parallel = comm->size(), .collectives = &collectives};
#ifndef KILN_DIST_COLLECTIVES_ADAPTER_H_
#define KILN_DIST_COLLECTIVES_ADAPTER_H_

#include "kiln/dist/communicator.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/executable.h"
#include "kiln/runtime/shard_collectives.h"

namespace kiln::dist {

class CommunicatorCollectives final : public nn::ShardedCollectives,
                                      public runtime::ShardCollectives {
 public:
  explicit CommunicatorCollectives(Communicator& comm) : comm_(comm) {}  // borrowed
  int size() const override { return comm_.size(); }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    return comm_.AllReduce(data, count, dtype, ReduceOp::kSum);
  }
  absl::Status ReduceScatterSum(const float* send, float* recv, int64_t recv_count) override {
    return comm_.ReduceScatter(send, recv, recv_count, DType::kF32, ReduceOp::kSum);
  }
  absl::Status AllGather(const float* send, float* recv, int64_t send_count) override {
    return comm_.AllGather(send, recv, send_count, DType::kF32);
  }
  // The SPMD partitioner's collectives (runtime/shard_collectives.h), over the same ranks: a
  // job that is all tensor parallel. A data x model mesh uses MeshCollectives (mesh_collectives.h).
  int num_shards() const override { return comm_.size(); }
  absl::Status ShardAllGather(const void* send, void* recv, int64_t send_count,
                              DType dtype) override {
    return comm_.AllGather(send, recv, send_count, dtype);
  }
  absl::Status ShardReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                     DType dtype) override {
    return comm_.ReduceScatter(send, recv, recv_count, dtype, ReduceOp::kSum);
  }
  absl::Status ShardAllReduce(void* data, int64_t count, DType dtype, bool max) override {
    return comm_.AllReduce(data, count, dtype, max ? ReduceOp::kMax : ReduceOp::kSum);
  }

 private:
  Communicator& comm_;
};

}  // namespace kiln::dist

#endif  // KILN_DIST_COLLECTIVES_ADAPTER_H_
