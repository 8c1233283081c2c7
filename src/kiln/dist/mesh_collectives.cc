#include "kiln/dist/mesh_collectives.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/dist/internal/reduce.h"

namespace kiln::dist {

MeshCollectives::MeshCollectives(Communicator& world, int data, int model) : world_(world) {
  const int r = world.rank();
  const int d = r / model, m = r % model;
  for (int k = 0; k < data; ++k) data_group_.push_back(k * model + m);
  for (int k = 0; k < model; ++k) model_group_.push_back(d * model + k);
  model_index_ = m;
}

absl::Status MeshCollectives::GatherWorld(const void* send, int64_t count, DType dtype) {
  const size_t bytes = static_cast<size_t>(count * DTypeSize(dtype));
  if (scratch_.size() < bytes * static_cast<size_t>(world_.size()))
    scratch_.resize(bytes * static_cast<size_t>(world_.size()));
  return world_.AllGather(send, scratch_.data(), count, dtype);
}

absl::Status MeshCollectives::AllReduceSum(void* data, int64_t count, DType dtype) {
  if (data_group_.size() <= 1 || count == 0) return absl::OkStatus();
  if (!internal::IsReducible(dtype))
    return absl::InvalidArgumentError("MeshCollectives: cannot reduce " +
                                      std::string(DTypeName(dtype)));
  KILN_RETURN_IF_ERROR(GatherWorld(data, count, dtype));
  const int64_t bytes = count * DTypeSize(dtype);
  std::vector<const void*> inputs;
  for (int w : data_group_) inputs.push_back(scratch_.data() + w * bytes);
  internal::ReduceRankOrder(inputs.data(), static_cast<int>(inputs.size()), 0, count, dtype,
                            ReduceOp::kSum, data);
  return absl::OkStatus();
}

absl::Status MeshCollectives::ShardAllReduce(void* data, int64_t count, DType dtype, bool max) {
  if (model_group_.size() <= 1 || count == 0) return absl::OkStatus();
  if (!internal::IsReducible(dtype))
    return absl::InvalidArgumentError("MeshCollectives: cannot reduce " +
                                      std::string(DTypeName(dtype)));
  KILN_RETURN_IF_ERROR(GatherWorld(data, count, dtype));
  const int64_t bytes = count * DTypeSize(dtype);
  std::vector<const void*> inputs;
  for (int w : model_group_) inputs.push_back(scratch_.data() + w * bytes);
  internal::ReduceRankOrder(inputs.data(), static_cast<int>(inputs.size()), 0, count, dtype,
                            max ? ReduceOp::kMax : ReduceOp::kSum, data);
  return absl::OkStatus();
}

absl::Status MeshCollectives::ShardAllGather(const void* send, void* recv, int64_t send_count,
                                             DType dtype) {
  const int64_t bytes = send_count * DTypeSize(dtype);
  if (model_group_.size() <= 1) {
    if (bytes > 0) std::memcpy(recv, send, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  if (send_count == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(GatherWorld(send, send_count, dtype));
  for (size_t k = 0; k < model_group_.size(); ++k)
    std::memcpy(static_cast<uint8_t*>(recv) + k * bytes, scratch_.data() + model_group_[k] * bytes,
                static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status MeshCollectives::ShardReduceScatterSum(const void* send, void* recv,
                                                    int64_t recv_count, DType dtype) {
  const int64_t n = static_cast<int64_t>(model_group_.size());
  const int64_t bytes = recv_count * DTypeSize(dtype);
  if (n <= 1) {
    if (bytes > 0) std::memcpy(recv, send, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  if (recv_count == 0) return absl::OkStatus();
  if (!internal::IsReducible(dtype))
    return absl::InvalidArgumentError("MeshCollectives: cannot reduce " +
                                      std::string(DTypeName(dtype)));
  KILN_RETURN_IF_ERROR(GatherWorld(send, recv_count * n, dtype));
  std::vector<const void*> inputs;
  for (int w : model_group_) inputs.push_back(scratch_.data() + w * n * bytes);
  internal::ReduceRankOrder(inputs.data(), static_cast<int>(n), model_index_ * recv_count,
                            recv_count, dtype, ReduceOp::kSum, recv);
  return absl::OkStatus();
}

}  // namespace kiln::dist
