#include "kiln/dist/mpi/mpi_communicator.h"

#include <mpi.h>
#include <sched.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/dist/internal/reduce.h"

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Set when any communicator of this process timed out: MPI_Finalize at exit is skipped then.
std::atomic<bool> g_any_broken{false};

void FinalizeAtExit() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized && !g_any_broken.load()) MPI_Finalize();
}

absl::Status InitOnce() {
  static std::once_flag once;
  static absl::Status status;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // the program initialised MPI itself and finalises it
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      status = absl::UnavailableError("MPI_Init_thread failed");
      return;
    }
    std::atexit(FinalizeAtExit);
  });
  return status;
}

std::string MpiErrorString(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return absl::StrCat("MPI error ", rc);
  return std::string(text, len);
}

enum class WaitResult { kDone, kTimedOut, kError };

// Polls `request` until it completes or `deadline` passes. MPI_Test drives the progress of
// nonblocking collectives, so the loop spins; after a short spin it yields between tests so that
// oversubscribed ranks (more ranks than cores) do not starve each other.
WaitResult Poll(MPI_Request* request, Clock::time_point deadline, int* rc) {
  for (int spins = 0;; ++spins) {
    int done = 0;
    *rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (*rc != MPI_SUCCESS) return WaitResult::kError;
    if (done) return WaitResult::kDone;
    if ((spins & 63) == 0 && Clock::now() >= deadline) return WaitResult::kTimedOut;
    if (spins > 256) sched_yield();
  }
}

MPI_Datatype ReduceType(DType dtype) { return dtype == DType::kS32 ? MPI_INT : MPI_FLOAT; }

MPI_Op MpiOp(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

// AllGather and Broadcast move elements as unsigned integers of the dtype's width.
MPI_Datatype MoveType(DType dtype) {
  switch (DTypeSize(dtype)) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    default:
      return MPI_UINT64_T;
  }
}

absl::Status CheckCount(const char* op, int64_t count) {
  if (count <= INT_MAX) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": ", count, " elements in one call; the MPI communicator takes at most 2^31 - 1"));
}

}  // namespace

struct MpiCommunicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  // Starts one nonblocking collective (start(&request) returns an MPI error code) and waits for
  // it until the communicator's timeout.
  template <typename Start>
  absl::Status Run(MpiCommunicator& self, const char* op, int64_t bytes, Start start) {
    if (self.broken_)
      return absl::FailedPreconditionError(
          absl::StrCat(op, " on rank ", self.rank(),
                       ": the communicator is broken by an earlier collective timeout"));
    const auto deadline = Clock::now() + self.timeout();
    MPI_Request request;
    const int rc = start(&request);
    if (rc != MPI_SUCCESS)
      return absl::InternalError(absl::StrCat(op, " of ", bytes, " bytes on rank ", self.rank(),
                                              ": ", MpiErrorString(rc)));
    return Wait(self, &request, op, bytes, deadline);
  }
  // Waits for one collective of this communicator; breaks it at the deadline.
  absl::Status Wait(MpiCommunicator& self, MPI_Request* request, const char* op, int64_t bytes,
                    Clock::time_point deadline);
};

absl::Status MpiCommunicator::Handle::Wait(MpiCommunicator& self, MPI_Request* request,
                                           const char* op, int64_t bytes,
                                           Clock::time_point deadline) {
  int rc = MPI_SUCCESS;
  switch (Poll(request, deadline, &rc)) {
    case WaitResult::kDone:
      return absl::OkStatus();
    case WaitResult::kError:
      return absl::InternalError(absl::StrCat(op, " of ", bytes, " bytes on rank ", self.rank(),
                                              ": ", MpiErrorString(rc)));
    case WaitResult::kTimedOut:
      break;
  }
  self.broken_ = true;
  g_any_broken.store(true);
  absl::Status s = CollectiveTimeout(op, bytes, self.rank(), self.size(), self.timeout(),
                                     ": a peer is dead, hung or unreachable; the communicator is "
                                     "broken (MpiCommunicator::Abort ends the job)");
  KILN_LOG(WARNING) << s.message();
  return s;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    std::chrono::milliseconds timeout) {
  KILN_RETURN_IF_ERROR(InitOnce());
  auto handle = std::make_unique<Handle>();
  MPI_Request request;
  int rc = MPI_Comm_idup(MPI_COMM_WORLD, &handle->comm, &request);
  if (rc != MPI_SUCCESS) return absl::InternalError("MPI_Comm_idup: " + MpiErrorString(rc));
  switch (Poll(&request, Clock::now() + timeout, &rc)) {
    case WaitResult::kDone:
      break;
    case WaitResult::kError:
      return absl::InternalError("MPI_Comm_idup: " + MpiErrorString(rc));
    case WaitResult::kTimedOut:
      g_any_broken.store(true);
      return absl::DeadlineExceededError(absl::StrCat(
          "MpiCommunicator::Create: not every rank joined within ", timeout.count(), " ms"));
  }
  MPI_Comm_set_errhandler(handle->comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(handle->comm, &rank);
  MPI_Comm_size(handle->comm, &size);
  std::unique_ptr<MpiCommunicator> comm(new MpiCommunicator(rank, size, std::move(handle)));
  comm->set_timeout(timeout);
  return comm;
}

MpiCommunicator::MpiCommunicator(int rank, int size, std::unique_ptr<Handle> handle)
    : Communicator(rank, size), handle_(std::move(handle)) {}

MpiCommunicator::~MpiCommunicator() {
  // A broken communicator still has a collective in flight: freeing it could wait forever.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!broken_ && !finalized && handle_->comm != MPI_COMM_NULL) MPI_Comm_free(&handle_->comm);
}

void MpiCommunicator::Abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

absl::Status MpiCommunicator::DoAllReduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  KILN_RETURN_IF_ERROR(CheckCount("AllReduce", count));
  const int64_t bytes = count * DTypeSize(dtype);
  void* buffer = data;
  if (dtype == DType::kBF16) {
    if (staging_.size() < static_cast<size_t>(count)) staging_.resize(count);
    internal::Bf16ToF32(static_cast<const uint16_t*>(data), staging_.data(), count);
    buffer = staging_.data();
  }
  KILN_RETURN_IF_ERROR(handle_->Run(*this, "AllReduce", bytes, [&](MPI_Request* request) {
    return MPI_Iallreduce(MPI_IN_PLACE, buffer, static_cast<int>(count), ReduceType(dtype),
                          MpiOp(op), handle_->comm, request);
  }));
  const DType reduced = dtype == DType::kS32 ? DType::kS32 : DType::kF32;
  if (op == ReduceOp::kMean) internal::DivideInPlace(buffer, count, reduced, size());
  if (dtype == DType::kBF16)
    internal::F32ToBf16(staging_.data(), static_cast<uint16_t*>(data), count);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::DoReduceScatter(const void* send, void* recv, int64_t recv_count,
                                              DType dtype, ReduceOp op) {
  const int64_t send_count = recv_count * size();
  KILN_RETURN_IF_ERROR(CheckCount("ReduceScatter", send_count));
  const int64_t bytes = send_count * DTypeSize(dtype);
  const void* in = send;
  void* out = recv;
  if (dtype == DType::kBF16) {
    const size_t need = static_cast<size_t>(send_count + recv_count);
    if (staging_.size() < need) staging_.resize(need);
    internal::Bf16ToF32(static_cast<const uint16_t*>(send), staging_.data(), send_count);
    in = staging_.data();
    out = staging_.data() + send_count;
  }
  KILN_RETURN_IF_ERROR(handle_->Run(*this, "ReduceScatter", bytes, [&](MPI_Request* request) {
    return MPI_Ireduce_scatter_block(in, out, static_cast<int>(recv_count), ReduceType(dtype),
                                     MpiOp(op), handle_->comm, request);
  }));
  const DType reduced = dtype == DType::kS32 ? DType::kS32 : DType::kF32;
  if (op == ReduceOp::kMean) internal::DivideInPlace(out, recv_count, reduced, size());
  if (dtype == DType::kBF16)
    internal::F32ToBf16(static_cast<const float*>(out), static_cast<uint16_t*>(recv), recv_count);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::DoAllGather(const void* send, void* recv, int64_t send_count,
                                          DType dtype) {
  KILN_RETURN_IF_ERROR(CheckCount("AllGather", send_count * size()));
  const int64_t bytes = send_count * size() * DTypeSize(dtype);
  const MPI_Datatype type = MoveType(dtype);
  KILN_RETURN_IF_ERROR(handle_->Run(*this, "AllGather", bytes, [&](MPI_Request* request) {
    return MPI_Iallgather(send, static_cast<int>(send_count), type, recv,
                          static_cast<int>(send_count), type, handle_->comm, request);
  }));
  return absl::OkStatus();
}

absl::Status MpiCommunicator::DoBroadcast(void* data, int64_t count, DType dtype, int root) {
  KILN_RETURN_IF_ERROR(CheckCount("Broadcast", count));
  const int64_t bytes = count * DTypeSize(dtype);
  KILN_RETURN_IF_ERROR(handle_->Run(*this, "Broadcast", bytes, [&](MPI_Request* request) {
    return MPI_Ibcast(data, static_cast<int>(count), MoveType(dtype), root, handle_->comm, request);
  }));
  return absl::OkStatus();
}

absl::Status MpiCommunicator::DoBarrier() {
  KILN_RETURN_IF_ERROR(handle_->Run(*this, "Barrier", 0, [&](MPI_Request* request) {
    return MPI_Ibarrier(handle_->comm, request);
  }));
  return absl::OkStatus();
}

}  // namespace kiln::dist
