#include "kiln/dist/mpi/mpi_communicator.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
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
    int provided = 0;
    if (initialized) {  // the program initialised MPI itself and finalises it
      MPI_Query_thread(&provided);
    } else {
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        status = absl::UnavailableError("MPI_Init_thread failed");
        return;
      }
      std::atexit(FinalizeAtExit);
    }
    // A step's collectives run on its executable's communication thread (one at a time, and the
    // main thread's only while that one is idle: runtime/collective_stream.h), which needs
    // MPI_THREAD_SERIALIZED at least.
    if (provided < MPI_THREAD_SERIALIZED)
      status = absl::FailedPreconditionError(
          absl::StrCat("MPI provides thread level ", provided, ", below MPI_THREAD_SERIALIZED (",
                       MPI_THREAD_SERIALIZED, "): Kiln calls MPI from a communication thread"));
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

// Polls `requests` until all complete or `deadline` passes. Testing drives the progress of
// nonblocking operations, so the loop spins; after 2 ms it yields between tests (a peer is late:
// give it the core when ranks outnumber cores).
WaitResult Poll(int n, MPI_Request* requests, Clock::time_point deadline, int* rc) {
  const auto yield_after = Clock::now() + std::chrono::milliseconds(2);
  for (int spins = 0;; ++spins) {
    int done = 0;
    *rc = MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE);
    if (*rc != MPI_SUCCESS) return WaitResult::kError;
    if (done) return WaitResult::kDone;
    if ((spins & 15) == 0) {
      const auto now = Clock::now();
      if (now >= deadline) return WaitResult::kTimedOut;
      if (now >= yield_after) sched_yield();
    }
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
  std::vector<MPI_Request> requests;
  std::vector<uint8_t> slices;  // kRankOrder: the peers' slices this rank reduces

  absl::Status CheckUsable(MpiCommunicator& self, const char* op) {
    if (!self.broken_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(op, " on rank ", self.rank(),
                     ": the communicator is broken by an earlier collective timeout"));
  }

  // Starts one nonblocking collective (start(&request) returns an MPI error code) and waits for
  // it until the communicator's timeout.
  template <typename Start>
  absl::Status Run(MpiCommunicator& self, const char* op, int64_t bytes, Start start) {
    KILN_RETURN_IF_ERROR(CheckUsable(self, op));
    const auto deadline = Clock::now() + self.timeout();
    requests.assign(1, MPI_REQUEST_NULL);
    KILN_RETURN_IF_ERROR(Check(self, op, bytes, start(&requests[0])));
    return Wait(self, op, bytes, deadline);
  }

  // Internal for an MPI error code.
  absl::Status Check(MpiCommunicator& self, const char* op, int64_t bytes, int rc) {
    if (rc == MPI_SUCCESS) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat(op, " of ", bytes, " bytes on rank ", self.rank(), ": ", MpiErrorString(rc)));
  }

  // Waits for `requests`; breaks the communicator at the deadline.
  absl::Status Wait(MpiCommunicator& self, const char* op, int64_t bytes,
                    Clock::time_point deadline) {
    return WaitOn(self, op, bytes, requests.data(), static_cast<int>(requests.size()), deadline);
  }
  absl::Status WaitOn(MpiCommunicator& self, const char* op, int64_t bytes, MPI_Request* reqs,
                      int n, Clock::time_point deadline);

  // The rank-order reduction (MpiReduction::kRankOrder). Slice s of a buffer is its `len[s]`
  // elements from `start[s]`. ReduceSlices: rank me receives slice me of every peer's `send` and
  // writes their rank-order reduction to `out` (which may be send's own slice me).
  absl::Status ReduceSlices(MpiCommunicator& self, const char* op, int64_t bytes, const void* send,
                            const std::vector<int64_t>& start, const std::vector<int64_t>& len,
                            DType dtype, ReduceOp reduce, void* out, Clock::time_point deadline);
  // The rank-order AllReduce, pipelined: slices travel in segments of kSegmentBytes; as soon as
  // segment j of this rank's slice has arrived from every peer it is reduced in place and sent
  // back to every peer, while later segments are still in flight.
  absl::Status AllReduceSegmented(MpiCommunicator& self, int64_t bytes, void* data,
                                  const std::vector<int64_t>& lo, DType dtype, ReduceOp reduce,
                                  Clock::time_point deadline);
};

absl::Status MpiCommunicator::Handle::WaitOn(MpiCommunicator& self, const char* op, int64_t bytes,
                                             MPI_Request* reqs, int n, Clock::time_point deadline) {
  int rc = MPI_SUCCESS;
  switch (Poll(n, reqs, deadline, &rc)) {
    case WaitResult::kDone:
      return absl::OkStatus();
    case WaitResult::kError:
      return Check(self, op, bytes, rc);
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

absl::Status MpiCommunicator::Handle::ReduceSlices(MpiCommunicator& self, const char* op,
                                                   int64_t bytes, const void* send,
                                                   const std::vector<int64_t>& start,
                                                   const std::vector<int64_t>& len, DType dtype,
                                                   ReduceOp reduce, void* out,
                                                   Clock::time_point deadline) {
  const int n = self.size(), me = self.rank();
  const int64_t esize = DTypeSize(dtype);
  const int64_t mine = len[me];
  if (static_cast<int64_t>(slices.size()) < (n - 1) * mine * esize)
    slices.resize((n - 1) * mine * esize);
  const MPI_Datatype type = MoveType(dtype);
  const auto* base = static_cast<const uint8_t*>(send);
  std::vector<const void*> inputs(n);
  requests.clear();
  for (int k = 1; k < n; ++k) {  // peers in the order me+1, me+2, ...: spreads the load
    const int s = (me + k) % n;
    uint8_t* slot = slices.data() + (k - 1) * mine * esize;
    inputs[s] = slot;
    requests.push_back(MPI_REQUEST_NULL);
    KILN_RETURN_IF_ERROR(
        Check(self, op, bytes,
              MPI_Irecv(slot, static_cast<int>(mine), type, s, 1, comm, &requests.back())));
  }
  for (int k = 1; k < n; ++k) {
    const int s = (me + k) % n;
    requests.push_back(MPI_REQUEST_NULL);
    KILN_RETURN_IF_ERROR(Check(self, op, bytes,
                               MPI_Isend(base + start[s] * esize, static_cast<int>(len[s]), type, s,
                                         1, comm, &requests.back())));
  }
  KILN_RETURN_IF_ERROR(Wait(self, op, bytes, deadline));
  inputs[me] = base + start[me] * esize;
  internal::ReduceRankOrder(inputs.data(), n, 0, mine, dtype, reduce, out);
  return absl::OkStatus();
}

// Segment size of the pipelined all-reduce: large enough that per-message costs vanish, small
// enough that a 64 MiB buffer makes 8+ segments per slice to overlap.
constexpr int64_t kSegmentBytes = 4 << 20;
// Below this many bytes received per rank, AllReduce exchanges whole buffers in one step (one
// latency instead of two). Only for small buffers: at 1 MiB on 2 ranks, whole buffers ran at
// 0.64-0.75 of MPI_Allreduce, the sliced, pipelined exchange at 0.81-0.88.
constexpr int64_t kWholeExchangeBytes = 64 << 10;

absl::Status MpiCommunicator::Handle::AllReduceSegmented(MpiCommunicator& self, int64_t bytes,
                                                         void* data, const std::vector<int64_t>& lo,
                                                         DType dtype, ReduceOp reduce,
                                                         Clock::time_point deadline) {
  const char* op = "AllReduce";
  const int n = self.size(), me = self.rank();
  const int64_t esize = DTypeSize(dtype);
  const int64_t seg = std::max<int64_t>(1, kSegmentBytes / esize);
  const MPI_Datatype type = MoveType(dtype);
  auto* base = static_cast<uint8_t*>(data);
  auto segments = [&](int s) { return (lo[s + 1] - lo[s] + seg - 1) / seg; };
  auto seg_len = [&](int s, int64_t j) { return std::min(seg, lo[s + 1] - lo[s] - j * seg); };
  auto at = [&](int s, int64_t j) { return base + (lo[s] + j * seg) * esize; };
  const int64_t mine = lo[me + 1] - lo[me], my_segments = segments(me);
  if (static_cast<int64_t>(slices.size()) < (n - 1) * mine * esize)
    slices.resize((n - 1) * mine * esize);
  // Requests: [receives of segment j from peer k: j * (n-1) + k-1] [phase-1 sends] [phase-2].
  requests.clear();
  for (int64_t j = 0; j < my_segments; ++j)
    for (int k = 1; k < n; ++k) {
      requests.push_back(MPI_REQUEST_NULL);
      uint8_t* slot = slices.data() + ((k - 1) * mine + j * seg) * esize;
      KILN_RETURN_IF_ERROR(Check(self, op, bytes,
                                 MPI_Irecv(slot, static_cast<int>(seg_len(me, j)), type,
                                           (me + k) % n, 1, comm, &requests.back())));
    }
  const size_t sends_at = requests.size();
  for (int k = 1; k < n; ++k) {
    const int s = (me + k) % n;
    for (int64_t j = 0; j < segments(s); ++j) {
      requests.push_back(MPI_REQUEST_NULL);
      KILN_RETURN_IF_ERROR(Check(self, op, bytes,
                                 MPI_Isend(at(s, j), static_cast<int>(seg_len(s, j)), type, s, 1,
                                           comm, &requests.back())));
    }
  }
  const size_t reduced_at = requests.size();
  requests.resize(reduced_at + my_segments * (n - 1), MPI_REQUEST_NULL);
  std::vector<const void*> inputs(n);
  for (int64_t j = 0; j < my_segments; ++j) {
    KILN_RETURN_IF_ERROR(WaitOn(self, op, bytes, requests.data() + j * (n - 1), n - 1, deadline));
    for (int k = 1; k < n; ++k)
      inputs[(me + k) % n] = slices.data() + ((k - 1) * mine + j * seg) * esize;
    inputs[me] = at(me, j);
    internal::ReduceRankOrder(inputs.data(), n, 0, seg_len(me, j), dtype, reduce, at(me, j));
    for (int k = 1; k < n; ++k)
      KILN_RETURN_IF_ERROR(
          Check(self, op, bytes,
                MPI_Isend(at(me, j), static_cast<int>(seg_len(me, j)), type, (me + k) % n, 2, comm,
                          &requests[reduced_at + j * (n - 1) + k - 1])));
  }
  // The peers' reduced segments land where this rank's phase-1 sends read from: receive them
  // once those sends are complete.
  KILN_RETURN_IF_ERROR(WaitOn(self, op, bytes, requests.data() + sends_at,
                              static_cast<int>(reduced_at - sends_at), deadline));
  for (int k = 1; k < n; ++k) {
    const int s = (me + k) % n;
    for (int64_t j = 0; j < segments(s); ++j) {
      requests.push_back(MPI_REQUEST_NULL);
      KILN_RETURN_IF_ERROR(Check(self, op, bytes,
                                 MPI_Irecv(at(s, j), static_cast<int>(seg_len(s, j)), type, s, 2,
                                           comm, &requests.back())));
    }
  }
  return WaitOn(self, op, bytes, requests.data() + reduced_at,
                static_cast<int>(requests.size() - reduced_at), deadline);
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    std::chrono::milliseconds timeout, MpiReduction reduction) {
  KILN_RETURN_IF_ERROR(InitOnce());
  auto handle = std::make_unique<Handle>();
  MPI_Request request;
  int rc = MPI_Comm_idup(MPI_COMM_WORLD, &handle->comm, &request);
  if (rc != MPI_SUCCESS) return absl::InternalError("MPI_Comm_idup: " + MpiErrorString(rc));
  switch (Poll(1, &request, Clock::now() + timeout, &rc)) {
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
  comm->reduction_ = reduction;
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

bool MpiCommunicator::broken() const { return broken_ || g_any_broken.load(); }

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::DoSplit(int color, int key) {
  const int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(size()));
  KILN_RETURN_IF_ERROR(handle_->Run(*this, "Split", 8 * size(), [&](MPI_Request* request) {
    return MPI_Iallgather(mine, 2, MPI_INT32_T, all.data(), 2, MPI_INT32_T, handle_->comm, request);
  }));
  for (int r = 0; r < size(); ++r) {
    if (all[2 * r] < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("Split: rank ", r, " passed color ", all[2 * r], "; colors must be >= 0"));
  }
  auto handle = std::make_unique<Handle>();
  const int rc = MPI_Comm_split(handle_->comm, color, key, &handle->comm);
  if (rc != MPI_SUCCESS)
    return absl::InternalError(
        absl::StrCat("MPI_Comm_split on rank ", rank(), ": ", MpiErrorString(rc)));
  MPI_Comm_set_errhandler(handle->comm, MPI_ERRORS_RETURN);
  int new_rank = 0, new_size = 1;
  MPI_Comm_rank(handle->comm, &new_rank);
  MPI_Comm_size(handle->comm, &new_size);
  std::unique_ptr<MpiCommunicator> comm(new MpiCommunicator(new_rank, new_size, std::move(handle)));
  comm->set_timeout(timeout());
  comm->reduction_ = reduction_;
  return comm;
}

void MpiCommunicator::Abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

absl::Status MpiCommunicator::DoAllReduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  KILN_RETURN_IF_ERROR(CheckCount("AllReduce", count));
  const int64_t bytes = count * DTypeSize(dtype);
  if (reduction_ == MpiReduction::kRankOrder) {
    KILN_RETURN_IF_ERROR(handle_->CheckUsable(*this, "AllReduce"));
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    std::vector<int64_t> lo(size() + 1);
    for (int s = 0; s <= size(); ++s) lo[s] = count * s / size();
    // Small buffers: one exchange of whole buffers, each rank reducing all of it in rank order
    // (one message latency instead of two; every rank computes the same sums in the same order).
    if (bytes * (size() - 1) <= kWholeExchangeBytes) {
      const std::vector<int64_t> start(size(), 0), len(size(), count);
      return handle_->ReduceSlices(*this, "AllReduce", bytes, data, start, len, dtype, op, data,
                                   deadline);
    }
    return handle_->AllReduceSegmented(*this, bytes, data, lo, dtype, op, deadline);
  }
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
  if (reduction_ == MpiReduction::kRankOrder) {
    KILN_RETURN_IF_ERROR(handle_->CheckUsable(*this, "ReduceScatter"));
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    std::vector<int64_t> start(size()), len(size(), recv_count);
    for (int s = 0; s < size(); ++s) start[s] = recv_count * s;
    return handle_->ReduceSlices(*this, "ReduceScatter", bytes, send, start, len, dtype, op, recv,
                                 deadline);
  }
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
