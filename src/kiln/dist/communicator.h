// The Communicator seam: the collectives that data- and tensor-parallel training run between the
// ranks of a slice (all-reduce, reduce-scatter, all-gather, broadcast, barrier), independent of
// how the ranks talk. Two implementations: in-process threads (thread_communicator.h, for unit
// tests and single-host tests of code built on the seam) and OpenMPI (mpi/mpi_communicator.h).
//
//   std::vector<std::unique_ptr<Communicator>> comms = MakeThreadCommunicators(2);
//   // on the thread of rank r:
//   Tensor grad = ...;                                     // f32, bf16 or s32
//   KILN_RETURN_IF_ERROR(comms[r]->AllReduce(grad, ReduceOp::kMean));   // in place
//
// Every call is collective: all ranks of the group call the same ops, in the same order, with the
// same element counts, dtypes, reductions and roots. Every call returns absl::Status:
//   - InvalidArgument for bad arguments (a null buffer, a negative count, a dtype a reduction does
//     not support, a root out of range, overlapping send and receive buffers, tensor sizes that do
//     not match), naming the op and what is wrong. Such a call returns at once without joining, so
//     its peers wait until their timeout. Where an implementation can see the peers' arguments
//     (the thread communicator), a mismatch between ranks fails the call on every rank with
//     InvalidArgument naming the ranks and the values.
//   - DeadlineExceeded when the collective has not completed within timeout() (default 60 s,
//     set_timeout changes it) of the call, naming the op, the bytes and the rank. A dead, hung or
//     unreachable peer never hangs the caller: OpenMPI itself never notices a cut link. After a
//     timeout the group is broken (a collective may still be in flight and the ranks no longer
//     agree on what was reduced): every later call returns FailedPrecondition, and the process
//     should end the job (MpiCommunicator::Abort) and restart from a checkpoint.
//
// Element types: reductions (AllReduce, ReduceScatter) take f32, bf16 and s32. bf16 is
// accumulated in f32 and rounded to bf16 once, at the end (round to nearest even). s32 sums wrap
// around (two's complement). Mean is the sum divided by size() once, at the end (f32 division;
// s32 truncates toward zero). Max of values that include NaN is unspecified. AllGather and
// Broadcast only move bytes, so they take any dtype.
//
// Determinism: the same inputs give bit-identical results run to run, and every rank receives the
// same bits. Reductions run in rank order, element by element: acc = x[0]; acc = acc + x[1]; ...;
// acc = acc + x[size-1] (then / size for mean), whatever the timing of the ranks. The thread
// communicator reads every rank's buffer in that order; the OpenMPI communicator (by default,
// MpiReduction::kRankOrder) has each rank receive its slice from every peer and reduce it in that
// order, so both give the same bits for any size. MpiReduction::kMpi hands the reduction to
// OpenMPI, whose algorithm is fixed for a given job (size, count, dtype, MCA settings): runs repeat
// exactly, and with 2 ranks (x[0] + x[1], IEEE addition commutes) the bits equal rank order's.
//
// A size-1 communicator is the identity and costs a few comparisons (no copy for in-place ops).
// A Communicator is used by one thread at a time.
//
// Groups (MPI_Comm_split): Split(color, key) is a collective over this communicator that returns
// a new communicator over the ranks that passed the same color, ordered by key (ties by rank()).
// A data x model mesh splits its world into one communicator per mesh axis (mesh_collectives.h):
//
//   // on world rank r of a {data: D, model: M} mesh, at coordinates (r / M, r % M):
//   KILN_ASSIGN_OR_RETURN(auto row, world->Split(/*color=*/r / M, /*key=*/r % M));  // M ranks
//   KILN_ASSIGN_OR_RETURN(auto col, world->Split(/*color=*/r % M, /*key=*/r / M));  // D ranks
//
// The new communicator has this one's timeout (and is broken by its own timeouts alone) and
// may outlive it. Colors must be >= 0: a negative color fails the call on every rank with
// InvalidArgument naming the rank (the colors are exchanged first, within the timeout, so a dead
// peer is DeadlineExceeded here too).
#ifndef KILN_DIST_COMMUNICATOR_H_
#define KILN_DIST_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/tensor.h"

namespace kiln::dist {

enum class ReduceOp { kSum, kMean, kMax };
std::string_view ReduceOpName(ReduceOp op);  // "sum", "mean", "max"

inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{60000};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // How long one collective may take, measured from the call, before it returns DeadlineExceeded.
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  // Raw buffers: `count` elements of `dtype` at `data`.

  // data[i] = reduce over ranks of data[i], in place.
  absl::Status AllReduce(void* data, int64_t count, DType dtype, ReduceOp op);
  // recv[i] = reduce over ranks of send[rank() * recv_count + i]: `send` holds size() * recv_count
  // elements, `recv` recv_count; they must not overlap.
  absl::Status ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                             ReduceOp op);
  // recv[r * send_count + i] = send of rank r [i]: `recv` holds size() * send_count elements and
  // must not overlap `send`.
  absl::Status AllGather(const void* send, void* recv, int64_t send_count, DType dtype);
  // data = data of rank `root`, in place.
  absl::Status Broadcast(void* data, int64_t count, DType dtype, int root);
  // Returns once every rank has called it.
  absl::Status Barrier();
  // A communicator over the ranks that pass the same `color` (>= 0), in order of `key`, then of
  // rank() (see the header comment). Collective over this communicator, also at size 1.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key);

  // Tensors: the same ops on a tensor's storage (any shape; element counts must agree).
  absl::Status AllReduce(Tensor& data, ReduceOp op);
  // `send` has size() times `recv`'s elements and the same dtype; rank r receives the r-th slice
  // of the flattened tensor.
  absl::Status ReduceScatter(const Tensor& send, Tensor& recv, ReduceOp op);
  // `recv` has size() times `send`'s elements and the same dtype.
  absl::Status AllGather(const Tensor& send, Tensor& recv);
  absl::Status Broadcast(Tensor& data, int root);

  // Whether the group is broken (see the header comment: a collective timed out, so every later
  // call fails): then the job should end, Abort, and restart from a checkpoint.
  virtual bool broken() const = 0;
  // Ends the job at once, so that no peer waits on this rank: OpenMPI aborts every rank with
  // exit status `code` (MPI_Abort: it does not return); in-process ranks, being threads of one
  // process, break the group instead (every peer's pending and later collectives fail at once)
  // and return.
  virtual void Abort(int code) = 0;

 protected:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}

  // Called with validated arguments, size() > 1 and count > 0 (Barrier: size() > 1).
  virtual absl::Status DoAllReduce(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual absl::Status DoReduceScatter(const void* send, void* recv, int64_t recv_count,
                                       DType dtype, ReduceOp op) = 0;
  virtual absl::Status DoAllGather(const void* send, void* recv, int64_t send_count,
                                   DType dtype) = 0;
  virtual absl::Status DoBroadcast(void* data, int64_t count, DType dtype, int root) = 0;
  virtual absl::Status DoBarrier() = 0;
  // Called at any size. The default is Unimplemented, naming the implementation's lack.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int key);

 private:
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_ = kDefaultCollectiveTimeout;
};

// The DeadlineExceeded status every implementation returns: "AllReduce of 4096 bytes on rank 1
// of 2 did not complete within 1000 ms<detail>".
absl::Status CollectiveTimeout(std::string_view op, int64_t bytes, int rank, int size,
                               std::chrono::milliseconds timeout, std::string_view detail);

}  // namespace kiln::dist

#endif  // KILN_DIST_COMMUNICATOR_H_
