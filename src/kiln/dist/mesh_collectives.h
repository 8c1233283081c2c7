// The collectives of a data x model mesh (docs/distributed.md "Tensor parallel") over one world
// Communicator: runtime::Collectives over the data-parallel ranks (the train step's gradient
// all-reduce) and runtime::ShardCollectives over the model-parallel ranks (the SPMD
// partitioner's collectives), rank r of the world at data coordinate r / model and model
// coordinate r % model (train/mesh.h).
//
//   MeshCollectives collectives(*world, /*data=*/2, /*model=*/2);
//   exe->set_collectives(&collectives);
//
// Each collective over a group is one all-gather over the whole world, after which every rank
// combines its group's buffers in group rank order (the order of communicator.h, so results are
// deterministic and equal on every rank of a group). That moves world-size times the bytes a
// communicator split per group would (MPI_Comm_split): correct, not lean; the meshes it serves
// (a few ranks on one host) are small. Every rank of the world must issue the same collectives
// in the same order, which ranks running one program do. A group of one rank is the identity
// and issues nothing.
#ifndef KILN_DIST_MESH_COLLECTIVES_H_
#define KILN_DIST_MESH_COLLECTIVES_H_

#include <cstdint>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/runtime/executable.h"
#include "kiln/runtime/shard_collectives.h"

namespace kiln::dist {

class MeshCollectives final : public runtime::Collectives, public runtime::ShardCollectives {
 public:
  // world.size() must be data * model (checked by the caller's mesh, train::ResolveMesh).
  MeshCollectives(Communicator& world, int data, int model);

  // Over the data-parallel ranks (same model coordinate).
  int size() const override { return static_cast<int>(data_group_.size()); }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override;

  // Over the model-parallel ranks (same data coordinate).
  int num_shards() const override { return static_cast<int>(model_group_.size()); }
  absl::Status ShardAllGather(const void* send, void* recv, int64_t send_count,
                              DType dtype) override;
  absl::Status ShardReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                     DType dtype) override;
  absl::Status ShardAllReduce(void* data, int64_t count, DType dtype, bool max) override;

  // Host-side helpers for the trainer: this rank's position in its model group.
  int model_rank() const { return model_index_; }

 private:
  // Every world rank's `count` elements at `send`, into scratch_ (world rank order).
  absl::Status GatherWorld(const void* send, int64_t count, DType dtype);

  Communicator& world_;
  std::vector<int> data_group_, model_group_;  // world ranks, in group rank order
  int model_index_ = 0;
  std::vector<uint8_t> scratch_;
};

}  // namespace kiln::dist

#endif  // KILN_DIST_MESH_COLLECTIVES_H_
