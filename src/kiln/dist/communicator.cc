#include "kiln/dist/communicator.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/dist/internal/reduce.h"

namespace kiln::dist {
namespace {

// absl::StrCat takes absl::string_view, which this absl does not convert from std::string_view.
absl::string_view AV(std::string_view v) { return absl::string_view(v.data(), v.size()); }

std::string Describe(std::string_view op, int64_t count, DType dtype) {
  return absl::StrCat(AV(op), " of ", count, " ", AV(DTypeName(dtype)));
}

absl::Status CheckBuffer(std::string_view op, const void* data, int64_t count, DType dtype,
                         std::string_view name) {
  if (count < 0)
    return absl::InvalidArgumentError(absl::StrCat(AV(op), ": negative element count ", count));
  if (count > 0 && data == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(op, count, dtype), ": ", AV(name), " buffer is null"));
  return absl::OkStatus();
}

absl::Status CheckReducible(std::string_view op, DType dtype, ReduceOp reduce) {
  if (internal::IsReducible(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(AV(op), " ", AV(ReduceOpName(reduce)), ": dtype ",
                                                 AV(DTypeName(dtype)),
                                                 " is not reducible (f32, bf16 or s32)"));
}

// True when [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool Overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

absl::Status CheckTensorCounts(std::string_view op, const Tensor& send, const Tensor& recv,
                               int64_t send_per_recv, int64_t recv_per_send) {
  if (send.dtype() != recv.dtype())
    return absl::InvalidArgumentError(
        absl::StrCat(AV(op), ": send is ", send.TypeString(), " but recv is ", recv.TypeString()));
  if (send.num_elements() * recv_per_send != recv.num_elements() * send_per_recv)
    return absl::InvalidArgumentError(absl::StrCat(
        AV(op), ": send ", send.TypeString(), " and recv ", recv.TypeString(),
        " do not match: expected recv elements = send elements",
        send_per_recv > 1 ? absl::StrCat(" / ", send_per_recv) : absl::StrCat(" * ", recv_per_send),
        " (communicator size)"));
  return absl::OkStatus();
}

}  // namespace

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

absl::Status CollectiveTimeout(std::string_view op, int64_t bytes, int rank, int size,
                               std::chrono::milliseconds timeout, std::string_view detail) {
  return absl::DeadlineExceededError(absl::StrCat(AV(op), " of ", bytes, " bytes on rank ", rank,
                                                  " of ", size, " did not complete within ",
                                                  timeout.count(), " ms", AV(detail)));
}

absl::Status Communicator::AllReduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  if (absl::Status s = CheckBuffer("AllReduce", data, count, dtype, "data"); !s.ok()) return s;
  if (absl::Status s = CheckReducible("AllReduce", dtype, op); !s.ok()) return s;
  if (size_ == 1 || count == 0) return absl::OkStatus();
  return DoAllReduce(data, count, dtype, op);
}

absl::Status Communicator::ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                         DType dtype, ReduceOp op) {
  if (absl::Status s = CheckBuffer("ReduceScatter", send, recv_count * size_, dtype, "send");
      !s.ok())
    return s;
  if (absl::Status s = CheckBuffer("ReduceScatter", recv, recv_count, dtype, "recv"); !s.ok())
    return s;
  if (absl::Status s = CheckReducible("ReduceScatter", dtype, op); !s.ok()) return s;
  const int64_t esize = DTypeSize(dtype);
  if (Overlap(send, recv_count * size_ * esize, recv, recv_count * esize))
    return absl::InvalidArgumentError(
        absl::StrCat(Describe("ReduceScatter", recv_count, dtype), ": send and recv overlap"));
  if (recv_count == 0) return absl::OkStatus();
  if (size_ == 1) {
    std::memcpy(recv, send, recv_count * esize);
    return absl::OkStatus();
  }
  return DoReduceScatter(send, recv, recv_count, dtype, op);
}

absl::Status Communicator::AllGather(const void* send, void* recv, int64_t send_count,
                                     DType dtype) {
  if (absl::Status s = CheckBuffer("AllGather", send, send_count, dtype, "send"); !s.ok()) return s;
  if (absl::Status s = CheckBuffer("AllGather", recv, send_count * size_, dtype, "recv"); !s.ok())
    return s;
  const int64_t esize = DTypeSize(dtype);
  if (Overlap(send, send_count * esize, recv, send_count * size_ * esize))
    return absl::InvalidArgumentError(
        absl::StrCat(Describe("AllGather", send_count, dtype), ": send and recv overlap"));
  if (send_count == 0) return absl::OkStatus();
  if (size_ == 1) {
    std::memcpy(recv, send, send_count * esize);
    return absl::OkStatus();
  }
  return DoAllGather(send, recv, send_count, dtype);
}

absl::Status Communicator::Broadcast(void* data, int64_t count, DType dtype, int root) {
  if (absl::Status s = CheckBuffer("Broadcast", data, count, dtype, "data"); !s.ok()) return s;
  if (root < 0 || root >= size_)
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " is not a rank of a group of ", size_));
  if (size_ == 1 || count == 0) return absl::OkStatus();
  return DoBroadcast(data, count, dtype, root);
}

absl::Status Communicator::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  return DoBarrier();
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Split(int color, int key) {
  return DoSplit(color, key);
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::DoSplit(int color, int key) {
  (void)color;
  (void)key;
  return absl::UnimplementedError("Split: this communicator cannot be split into groups");
}

absl::Status Communicator::AllReduce(Tensor& data, ReduceOp op) {
  return AllReduce(data.raw_data(), data.num_elements(), data.dtype(), op);
}

absl::Status Communicator::ReduceScatter(const Tensor& send, Tensor& recv, ReduceOp op) {
  KILN_RETURN_IF_ERROR(CheckTensorCounts("ReduceScatter", send, recv, size_, 1));
  return ReduceScatter(send.raw_data(), recv.raw_data(), recv.num_elements(), recv.dtype(), op);
}

absl::Status Communicator::AllGather(const Tensor& send, Tensor& recv) {
  KILN_RETURN_IF_ERROR(CheckTensorCounts("AllGather", send, recv, 1, size_));
  return AllGather(send.raw_data(), recv.raw_data(), send.num_elements(), send.dtype());
}

absl::Status Communicator::Broadcast(Tensor& data, int root) {
  return Broadcast(data.raw_data(), data.num_elements(), data.dtype(), root);
}

}  // namespace kiln::dist
