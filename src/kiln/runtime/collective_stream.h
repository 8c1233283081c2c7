// Asynchronous collectives: one communication thread per executable that runs collective
// operations one at a time, in the order the step's thread started them (XLA's async collective
// start / done pairs). A backend lowers an asynchronous collective to a start thunk, which hands
// its CollectiveOp to the run's stream (RunContext::stream) and returns at once, and a wait thunk
// placed before the first kernel that reads the result (ExecutionPlan::done_step), so the kernels
// in between (the rest of the backward pass) run while the collective is in flight.
//
//   class MyOp : public CollectiveOp { absl::Status Execute() override {...} ... };
//   stream.Start(&op);            // the start thunk: queued, runs on the stream's thread
//   ... other kernels ...
//   absl::Status s = stream.Wait(&op);   // the wait thunk: blocks until op ran; its status
//   absl::Status first_error = stream.WaitAll();   // end of every run: nothing left in flight
//
// Ordering: every rank runs the same thunk list, so every rank starts the same collectives in
// the same order, and the one thread runs them in that order: each communicator sees one
// collective at a time, from one thread at a time (the stream's, or the step's thread while the
// stream is idle: Quiesce). A collective that runs synchronously on the step's thread (the SPMD
// partitioner's, or any caller of the communicator between runs) must first Quiesce, so it never
// overtakes or overlaps one in flight; Executable::RunInto ends with WaitAll, so between runs the
// stream is always idle and the communicator is the caller's again.
//
// Failure: an operation's status is returned by its Wait (and by WaitAll when nobody waited for
// it); a peer that is gone surfaces through the communicator's own timeout (DeadlineExceeded),
// so no Wait blocks longer than the collectives it waits for. Nothing is allocated per run once
// the first run has sized the queue; the thread starts on the first Start.
#ifndef KILN_RUNTIME_COLLECTIVE_STREAM_H_
#define KILN_RUNTIME_COLLECTIVE_STREAM_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace kiln::runtime {

// One asynchronous collective. Execute runs on the stream's thread and may touch only what the
// start thunk handed it (buffers the compiler keeps alive until the wait).
class CollectiveOp {
 public:
  virtual ~CollectiveOp() = default;
  virtual absl::Status Execute() = 0;
  // For profiles: "all_reduce %12 f32[120576]".
  virtual const std::string& name() const = 0;

  // Steady-clock nanoseconds of its last run: started (handed to the stream), began and ended on
  // the stream's thread. Valid after its Wait.
  int64_t start_ns = 0, begin_ns = 0, end_ns = 0;

 private:
  friend class CollectiveStream;
  enum class State { kIdle, kQueued, kRunning, kDone };
  State state_ = State::kIdle;
  bool waited_ = false;
  absl::Status status_;
};

class CollectiveStream {
 public:
  CollectiveStream() = default;
  ~CollectiveStream();  // finishes what is queued, then joins the thread
  CollectiveStream(const CollectiveStream&) = delete;
  CollectiveStream& operator=(const CollectiveStream&) = delete;

  // Queues `op` (borrowed until WaitAll returns) behind every op started before it. An op must be
  // waited for (Wait or WaitAll) before it is started again.
  void Start(CollectiveOp* op);
  // Blocks until `op` has run and returns its status; OK at once for an op not started since the
  // last WaitAll.
  absl::Status Wait(CollectiveOp* op);
  // Blocks until every started op has run (their statuses are kept for Wait / WaitAll): a
  // collective about to run on the calling thread is then ordered after them.
  void Quiesce();
  // Blocks until every started op has run and forgets them: the first error (in start order) of
  // those no Wait returned, or OK. `each`, when set, is called for every op started since the
  // last WaitAll, in start order, after it ran (profiles).
  absl::Status WaitAll(const std::function<void(const CollectiveOp&)>& each = nullptr);

  // Ops run so far (a test's view of the thread's work).
  int64_t ops_run() const;

 private:
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<CollectiveOp*> queue_;  // ops not yet run, from head_
  size_t head_ = 0;
  std::vector<CollectiveOp*> started_;  // since the last WaitAll, in start order
  int64_t ops_run_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_COLLECTIVE_STREAM_H_
