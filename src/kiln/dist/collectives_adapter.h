// runtime::Collectives over one Communicator: what a compiled graph's collective ops and a train
// step (the gradient all-reduce, ZeRO-1's reduce-scatter and all-gather, the SPMD partitioner's
// collectives) run through in a multi-process (or multi-thread) job, every call over the same
// ranks. The runtime and nn sit above dist in the layer order and do not know Communicator; this
// adapter, in dist, connects them. A data x model mesh uses MeshCollectives (mesh_collectives.h).
//
//   std::unique_ptr<Communicator> comm = ...;             // MpiCommunicator, thread communicator
//   CommunicatorCollectives collectives(*comm);
//   TrainStepOptions o{.data_parallel = comm->size(), .collectives = &collectives};
#ifndef KILN_DIST_COLLECTIVES_ADAPTER_H_
#define KILN_DIST_COLLECTIVES_ADAPTER_H_

#include "kiln/dist/communicator.h"
#include "kiln/runtime/executable.h"

namespace kiln::dist {

class CommunicatorCollectives final : public runtime::Collectives {
 public:
  explicit CommunicatorCollectives(Communicator& comm) : comm_(comm) {}  // borrowed
  int size() const override { return comm_.size(); }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    return comm_.AllReduce(data, count, dtype, ReduceOp::kSum);
  }
  absl::Status ReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                DType dtype) override {
    return comm_.ReduceScatter(send, recv, recv_count, dtype, ReduceOp::kSum);
  }
  absl::Status AllGather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    return comm_.AllGather(send, recv, send_count, dtype);
  }
  // The SPMD partitioner's collectives, over the same ranks: a job that is all tensor parallel.
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
  bool broken() const override { return comm_.broken(); }

 private:
  Communicator& comm_;
};

}  // namespace kiln::dist

#endif  // KILN_DIST_COLLECTIVES_ADAPTER_H_
