#include "kiln/dist/mesh_collectives.h"

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"

namespace kiln::dist {
namespace {

// One collective of `payload` bytes in a group of `g`: the receiver gets `factor` (G-1)/G of it
// (all-reduce 2, reduce-scatter 1; all-gather G: (G-1) sends).
void Count(MeshCollectives::AxisTraffic& t, int g, int64_t payload, int64_t factor) {
  ++t.calls;
  t.payload_bytes += payload;
  t.received_bytes += payload * factor * (g - 1) / g;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MeshCollectives>> MeshCollectives::Create(Communicator& world,
                                                                         int data, int model) {
  if (data < 1 || model < 1 || static_cast<int64_t>(data) * model != world.size())
    return absl::InvalidArgumentError(
        absl::StrCat("MeshCollectives: a {data: ", data, ", model: ", model, "} mesh needs ",
                     static_cast<int64_t>(data) * model, " ranks, the world has ", world.size()));
  const int r = world.rank();
  const int d = r / model, m = r % model;
  // The model group first, then the data group, on every rank (Split is collective).
  absl::StatusOr<std::unique_ptr<Communicator>> row = world.Split(/*color=*/d, /*key=*/m);
  if (!row.ok())
    return Annotate(row.status(), "splitting the world into model groups (one per data row)");
  absl::StatusOr<std::unique_ptr<Communicator>> column = world.Split(/*color=*/m, /*key=*/d);
  if (!column.ok())
    return Annotate(column.status(), "splitting the world into data groups (one per model column)");
  if ((*row)->size() != model || (*row)->rank() != m || (*column)->size() != data ||
      (*column)->rank() != d)
    return absl::InternalError(absl::StrCat("MeshCollectives: world rank ", r, " got model group ",
                                            (*row)->rank(), "/", (*row)->size(), " and data group ",
                                            (*column)->rank(), "/", (*column)->size()));
  return std::unique_ptr<MeshCollectives>(new MeshCollectives(*std::move(column), *std::move(row)));
}

absl::Status MeshCollectives::AllReduceSum(void* data, int64_t count, DType dtype) {
  Count(traffic_.data, data_->size(), count * DTypeSize(dtype), 2);
  return data_->AllReduce(data, count, dtype, ReduceOp::kSum);
}

absl::Status MeshCollectives::ReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                               DType dtype) {
  Count(traffic_.data, data_->size(), recv_count * data_->size() * DTypeSize(dtype), 1);
  return data_->ReduceScatter(send, recv, recv_count, dtype, ReduceOp::kSum);
}

absl::Status MeshCollectives::AllGather(const void* send, void* recv, int64_t send_count,
                                        DType dtype) {
  Count(traffic_.data, data_->size(), send_count * DTypeSize(dtype), data_->size());
  return data_->AllGather(send, recv, send_count, dtype);
}

absl::Status MeshCollectives::ShardAllReduce(void* data, int64_t count, DType dtype, bool max) {
  Count(traffic_.model, model_->size(), count * DTypeSize(dtype), 2);
  return model_->AllReduce(data, count, dtype, max ? ReduceOp::kMax : ReduceOp::kSum);
}

absl::Status MeshCollectives::ShardAllGather(const void* send, void* recv, int64_t send_count,
                                             DType dtype) {
  Count(traffic_.model, model_->size(), send_count * DTypeSize(dtype), model_->size());
  return model_->AllGather(send, recv, send_count, dtype);
}

absl::Status MeshCollectives::ShardReduceScatterSum(const void* send, void* recv,
                                                    int64_t recv_count, DType dtype) {
  Count(traffic_.model, model_->size(), recv_count * model_->size() * DTypeSize(dtype), 1);
  return model_->ReduceScatter(send, recv, recv_count, dtype, ReduceOp::kSum);
}

}  // namespace kiln::dist
