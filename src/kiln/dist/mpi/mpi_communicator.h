// The OpenMPI implementation of the Communicator seam: one rank per process, rank and size from
// MPI (mpirun, or srun --mpi=pmix).
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> comm, MpiCommunicator::Create());
//   KILN_RETURN_IF_ERROR(comm->AllReduce(grad, ReduceOp::kMean));
//
// Run as: mpirun --allow-run-as-root --bind-to none -np 2
//           -x GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824 prog
//
// MPI is initialised once per process, by the first Create (MPI_Init_thread, MPI_THREAD_SERIALIZED:
// a communicator is used by one thread at a time), and finalised at exit unless a collective timed
// out (MPI_Finalize could wait forever on the collective still in flight; mpirun then ends the
// job). Each communicator owns a duplicate of MPI_COMM_WORLD (or, from Split, an MPI_Comm_split
// of its parent's) with MPI_ERRORS_RETURN, so MPI errors come back as Internal statuses instead of
// aborting the process.
//
// Timeouts: every collective is made of nonblocking MPI calls (MPI_Isend/MPI_Irecv for the
// rank-order reductions, else MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather,
// MPI_Ibcast, MPI_Ibarrier) polled with MPI_Testall against the deadline (testing also drives
// their progress; after 2 ms of spinning the poll yields the CPU between tests, so that
// oversubscribed ranks share cores). At the deadline the call returns DeadlineExceeded and the
// communicator is broken: MPI cannot cancel a collective, so its buffers may still be read or
// written if MPI makes progress later; call Abort to end the job.
//
// Types: see MpiReduction. With kMpi, f32 and s32 reduce natively (MPI_FLOAT, MPI_INT) and bf16 is
// staged through an f32 buffer owned by the communicator (grown, never shrunk: no allocation per
// call once warm), reduced in f32 and rounded once. Mean is an MPI sum divided by size() locally.
// AllGather and Broadcast move elements as unsigned integers of the dtype's width. Element counts
// are limited to 2^31 - 1 per call (MPI's int counts). Wire order and determinism: see
// communicator.h.
//
// Large messages: OpenMPI's reductions (kMpi) allocate a temporary the size of the message on each
// call; above 32 MiB glibc serves it with mmap and every call page-faults it in (0.3 GB/s instead
// of 5 GB/s on 2 ranks here). Run the ranks with the GLIBC_TUNABLES above (mpirun -x passes it).
#ifndef KILN_DIST_MPI_MPI_COMMUNICATOR_H_
#define KILN_DIST_MPI_MPI_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/dist/communicator.h"

namespace kiln::dist {

// How AllReduce and ReduceScatter reduce.
enum class MpiReduction {
  // Kiln's own exchange over nonblocking point-to-point messages (MPI_Isend / MPI_Irecv): each
  // rank receives its 1/size() slice of the buffer from every peer into memory the communicator
  // owns, reduces the slices in rank order, x[0] + x[1] + ... (the thread communicator's order:
  // results are bit-identical to it for any size), and, for AllReduce, sends its reduced slice to
  // every peer. bf16 travels as bf16 and is reduced in f32. Each rank sends 2 (size-1)/size of the
  // buffer, as a ring does, in size-1 direct messages per phase: meant for the few ranks of a
  // host or a small slice. No per-call allocation once warm, so no malloc cliff either.
  kRankOrder,
  // OpenMPI's own algorithms: MPI_Iallreduce / MPI_Ireduce_scatter_block (bf16 staged through
  // f32). Fixed for a given job, but not rank order for more than 2 ranks.
  kMpi,
};

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over every rank of the job (a duplicate of MPI_COMM_WORLD). Initialises MPI
  // when this process has not yet. The duplication is itself collective and bounded by `timeout`.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(
      std::chrono::milliseconds timeout = kDefaultCollectiveTimeout,
      MpiReduction reduction = MpiReduction::kRankOrder);
  ~MpiCommunicator() override;

  // True after a collective of this communicator timed out (every later call on it returns
  // FailedPrecondition), or one of any other communicator of this process (one split from it):
  // either way the job must end (Abort).
  bool broken() const override;
  // Ends the whole job (MPI_Abort on MPI_COMM_WORLD with `code`): what a rank does after a
  // DeadlineExceeded, so that no peer waits for it.
  [[noreturn]] void Abort(int code) override;

 protected:
  absl::Status DoAllReduce(void* data, int64_t count, DType dtype, ReduceOp op) override;
  absl::Status DoReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                               ReduceOp op) override;
  absl::Status DoAllGather(const void* send, void* recv, int64_t send_count, DType dtype) override;
  absl::Status DoBroadcast(void* data, int64_t count, DType dtype, int root) override;
  absl::Status DoBarrier() override;
  // The colors and keys are exchanged first (MPI_Iallgather, bounded by the timeout, so that a
  // dead peer is DeadlineExceeded and a negative color InvalidArgument on every rank), then
  // MPI_Comm_split, which has no nonblocking form, runs among ranks known to be at the call.
  absl::StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int key) override;

 private:
  struct Handle;  // the MPI_Comm, kept out of this header
  MpiCommunicator(int rank, int size, std::unique_ptr<Handle> handle);

  MpiReduction reduction_ = MpiReduction::kRankOrder;
  bool broken_ = false;
  std::unique_ptr<Handle> handle_;
  std::vector<float> staging_;  // bf16 reductions: send (and for ReduceScatter, recv) in f32
};

}  // namespace kiln::dist

#endif  // KILN_DIST_MPI_MPI_COMMUNICATOR_H_
