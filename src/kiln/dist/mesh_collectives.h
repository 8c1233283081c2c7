// The collectives of a data x model mesh (docs/distributed.md "Tensor parallel"), over one
// communicator per mesh axis split from the world (Communicator::Split, MPI_Comm_split):
// runtime::Collectives with its data-parallel calls over this rank's data group (the D ranks of
// its model column: the train step's gradient all-reduce) and its Shard* calls over its
// model-parallel group (the M ranks of its data row: the SPMD partitioner's collectives). World
// rank r sits at data coordinate r / model and model coordinate r % model (train/mesh.h); each
// group is ordered by the other coordinate, so a group's rank is the rank's coordinate along that
// axis.
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<MeshCollectives> collectives,
//                         MeshCollectives::Create(*world, /*data=*/2, /*model=*/2));
//   exe->set_collectives(collectives.get());
//
// A group collective moves only its group's bytes (the reductions run in group rank order,
// communicator.h: deterministic, the same bits on every rank of a group), and a collective over
// one axis never waits for the ranks of another group. A group of one rank is the identity. The
// groups keep the world's timeout: a dead or hung peer is DeadlineExceeded within it, never a
// hang, and breaks that group (the job must then end).
#ifndef KILN_DIST_MESH_COLLECTIVES_H_
#define KILN_DIST_MESH_COLLECTIVES_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kiln/dist/communicator.h"
#include "kiln/runtime/executable.h"

namespace kiln::dist {

class MeshCollectives final : public runtime::Collectives {
 public:
  // Collective over `world` (two Splits; every world rank must call it): InvalidArgument unless
  // data, model >= 1 and world.size() == data * model. `world` is not kept.
  static absl::StatusOr<std::unique_ptr<MeshCollectives>> Create(Communicator& world, int data,
                                                                 int model);

  // Over the data-parallel ranks (same model coordinate).
  int size() const override { return data_->size(); }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override;
  absl::Status ReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                DType dtype) override;
  absl::Status AllGather(const void* send, void* recv, int64_t send_count, DType dtype) override;

  // Over the model-parallel ranks (same data coordinate).
  int num_shards() const override { return model_->size(); }
  absl::Status ShardAllGather(const void* send, void* recv, int64_t send_count,
                              DType dtype) override;
  absl::Status ShardReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                     DType dtype) override;
  absl::Status ShardAllReduce(void* data, int64_t count, DType dtype, bool max) override;

  // Either group broken (a timeout in it).
  bool broken() const override { return data_->broken() || model_->broken(); }

  // This rank's position in its model group (its model coordinate) and data group.
  int model_rank() const { return model_->rank(); }
  int data_rank() const { return data_->rank(); }
  Communicator& data_group() { return *data_; }
  Communicator& model_group() { return *model_; }

  // What this rank's collectives over each axis amounted to so far: calls; payload bytes (an
  // all-reduce's buffer, what an all-gather sends, what a reduce-scatter sends: group size times
  // what it receives); and the bytes this rank receives for them in a group of G ranks at the
  // bandwidth-optimal counts, which a ring and the OpenMPI communicator's rank-order exchange
  // move for all but small buffers: all-reduce 2 (G-1)/G of the buffer, all-gather (G-1) times
  // the send, reduce-scatter (G-1)/G of the send (docs/distributed.md "Bytes per step").
  struct AxisTraffic {
    int64_t calls = 0, payload_bytes = 0, received_bytes = 0;
  };
  struct Traffic {
    AxisTraffic data, model;
  };
  const Traffic& traffic() const { return traffic_; }

 private:
  MeshCollectives(std::unique_ptr<Communicator> data, std::unique_ptr<Communicator> model)
      : data_(std::move(data)), model_(std::move(model)) {}

  std::unique_ptr<Communicator> data_, model_;
  Traffic traffic_;
};

}  // namespace kiln::dist

#endif  // KILN_DIST_MESH_COLLECTIVES_H_
