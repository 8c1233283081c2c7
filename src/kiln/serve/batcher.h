// A dynamic batcher with Triton's semantics (../../../docs/serving.md, "Batching"): requests wait
// in one queue per model, ordered by priority level then arrival; a batch is sent as soon as the
// requests at the head reach the largest preferred size (or the max batch size, or the next one
// does not fit), or a preferred size when one can be formed, or whatever is queued once
// `max_queue_delay_us` has passed since the OLDEST queued request arrived. So no request waits
// longer than max_queue_delay_us for batching; it can wait longer only while every instance is
// busy. Requests past their timeout are answered Unavailable ("request timeout expired") without
// running; a full queue refuses new ones (Unavailable, "exceeds maximum queue size").
//
//   BatchingConfig c;  c.max_batch_size = 8;  c.preferred_batch_sizes = {4, 8};
//   c.max_queue_delay_us = 2000;
//   DynamicBatcher b(c, [&](int instance, std::vector<BatchRequest*>& batch, int64_t rows) {
//     ...run `rows` rows, set each request's outputs...;  return absl::OkStatus();
//   });
//   auto r = std::make_unique<BatchRequest>();  r->rows = 1;  r->done = ...;
//   absl::Status s = b.Enqueue(std::move(r));     // Unavailable: queue full or stopping
//   b.Stop();                                      // runs what is queued, then joins the workers
//
// Each instance is one worker thread; workers form batches themselves (no scheduler thread).
// With preserve_ordering, `done` callbacks are made in the order requests were accepted.
#ifndef KILN_SERVE_BATCHER_H_
#define KILN_SERVE_BATCHER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "kiln/base/mutex.h"
#include "kiln/serve/clock.h"
#include "kiln/tensor/tensor.h"

namespace kiln::serve {

struct BatchingConfig {
  int64_t max_batch_size = 8;                  // rows per batch, at least 1
  std::vector<int64_t> preferred_batch_sizes;  // each in [1, max_batch_size]; sorted on use
  int64_t max_queue_delay_us = 0;              // 0: send what is queued at once
  int64_t max_queue_size = 0;                  // queued requests; 0: unbounded
  int instances = 1;                           // worker threads
  int64_t default_timeout_us = 0;              // 0: none; a request may only lower it
  int64_t priority_levels = 1;                 // a request's priority is 1 (highest) .. this
  int64_t default_priority_level = 1;          // for requests with priority 0 (unset)
  bool preserve_ordering = true;               // responses in the order requests were accepted

  // InvalidArgument naming the field for an inconsistent config.
  absl::Status Validate() const;
  // The preferred sizes sorted, plus max_batch_size: the batch sizes a model compiles.
  std::vector<int64_t> BatchSizes() const;
};

struct BatchRequest {
  // Set by the caller.
  int64_t rows = 1;        // examples in this request (its inputs' leading dimension)
  int64_t priority = 0;    // 0: default level; else 1..priority_levels
  int64_t timeout_us = 0;  // 0: the config's default
  std::vector<Tensor> inputs;
  // Called exactly once for an accepted request: OK with `outputs` set by the runner, or the
  // runner's error, or Unavailable for a timeout. Never called when Enqueue fails.
  std::function<void(absl::Status, std::unique_ptr<BatchRequest>)> done;

  // Set by the runner.
  std::vector<Tensor> outputs;
  // Set by the batcher (its clock's microseconds).
  int64_t enqueue_us = 0;
  int64_t dispatch_us = 0;  // a worker took it into a batch
  int64_t complete_us = 0;  // the runner returned
  int64_t batch_rows = 0;   // rows in the batch it ran in
  uint64_t seq = 0;         // acceptance order
};

// The status of a request whose timeout expired in the queue: Unavailable ("request timeout
// expired in the queue"; gRPC UNAVAILABLE, HTTP 503), marked by a payload so that callers tell a
// timeout from a full queue by its type, not by its message text.
absl::Status QueueTimeoutError();
bool IsQueueTimeout(const absl::Status& s);

// Runs one batch of requests with `rows` rows in all on worker `instance`.
using BatchRunner =
    std::function<absl::Status(int instance, std::vector<BatchRequest*>& batch, int64_t rows)>;

// The batching rule alone (the workers call it; tests call it with exact times). `queue` is in
// dispatch order (priority, then arrival). Returns how many requests at the head to send now
// (count > 0) or else when to look again (wake_us; -1: only when something changes).
struct BatchDecision {
  int count = 0;
  int64_t rows = 0;
  int64_t wake_us = -1;
};
struct QueuedInfo {
  int64_t rows;
  int64_t enqueue_us;
  int64_t deadline_us;  // -1: none
};
BatchDecision DecideBatch(const std::vector<QueuedInfo>& queue, int64_t now_us,
                          const BatchingConfig& config, bool flush);

class DynamicBatcher {
 public:
  // `config` must Validate(). `clock` (null: the real clock) must outlive the batcher.
  DynamicBatcher(BatchingConfig config, BatchRunner runner, Clock* clock = nullptr);
  ~DynamicBatcher();  // Stop()

  // Queues `request` (rows in [1, max_batch_size], priority in [0, priority_levels] and timeout
  // >= 0 are the caller's to check: InvalidArgument otherwise). Unavailable when the queue is
  // full or the batcher is stopping.
  absl::Status Enqueue(std::unique_ptr<BatchRequest> request);

  // From now on batches go out without waiting for max_queue_delay (a server draining);
  // requests are still accepted.
  void Flush();
  // Stops accepting, runs every queued request (no more waiting for batches), joins the workers.
  void Stop();

  int64_t queue_depth() const;
  const BatchingConfig& config() const { return config_; }

 private:
  struct Entry {
    int64_t level;
    uint64_t seq;
    int64_t deadline_us;
    std::unique_ptr<BatchRequest> request;
  };
  void WorkerLoop(int instance);
  // Removes expired entries into `expired`.
  void TakeExpired(int64_t now, std::vector<std::unique_ptr<BatchRequest>>* expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(absl::Status status, std::unique_ptr<BatchRequest> request);

  const BatchingConfig config_;
  const BatchRunner runner_;
  Clock* const clock_;

  mutable Mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> queue_ ABSL_GUARDED_BY(mu_);  // sorted by (level, seq)
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;

  Mutex release_mu_;
  uint64_t next_release_ ABSL_GUARDED_BY(release_mu_) = 0;
  std::map<uint64_t, std::pair<absl::Status, std::unique_ptr<BatchRequest>>> finished_
      ABSL_GUARDED_BY(release_mu_);

  Mutex stop_mu_;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(stop_mu_);
};

}  // namespace kiln::serve

#endif  // KILN_SERVE_BATCHER_H_
