#include "kiln/serve/batcher.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace kiln::serve {

namespace {
constexpr absl::string_view kQueueTimeoutPayload = "type.kiln.dev/kiln.serve.QueueTimeout";
}  // namespace

absl::Status QueueTimeoutError() {
  absl::Status s = absl::UnavailableError("request timeout expired in the queue");
  s.SetPayload(kQueueTimeoutPayload, absl::Cord());
  return s;
}

bool IsQueueTimeout(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable && s.GetPayload(kQueueTimeoutPayload);
}

absl::Status BatchingConfig::Validate() const {
  if (max_batch_size < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_size is ", max_batch_size, "; it must be at least 1"));
  for (int64_t p : preferred_batch_sizes) {
    if (p < 1 || p > max_batch_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preferred batch size ", p, " is outside [1, max_batch_size = ", max_batch_size, "]"));
    }
  }
  if (max_queue_delay_us < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("max_queue_delay_us is ", max_queue_delay_us, "; it must be >= 0"));
  if (max_queue_size < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("max_queue_size is ", max_queue_size, "; it must be >= 0 (0: unbounded)"));
  if (instances < 1 || instances > 256)
    return absl::InvalidArgumentError(
        absl::StrCat("instances is ", instances, "; it must be in [1, 256]"));
  if (default_timeout_us < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("default_timeout_us is ", default_timeout_us, "; it must be >= 0"));
  if (priority_levels < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("priority_levels is ", priority_levels, "; it must be at least 1"));
  if (default_priority_level < 1 || default_priority_level > priority_levels) {
    return absl::InvalidArgumentError(absl::StrCat("default_priority_level is ",
                                                   default_priority_level, "; it must be in [1, ",
                                                   priority_levels, "]"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> BatchingConfig::BatchSizes() const {
  std::vector<int64_t> sizes = preferred_batch_sizes;
  sizes.push_back(max_batch_size);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

BatchDecision DecideBatch(const std::vector<QueuedInfo>& queue, int64_t now_us,
                          const BatchingConfig& config, bool flush) {
  BatchDecision d;
  if (queue.empty()) return d;
  std::vector<int64_t> preferred = config.preferred_batch_sizes;
  std::sort(preferred.begin(), preferred.end());
  const int64_t largest_preferred = preferred.empty() ? 0 : preferred.back();

  int64_t oldest = std::numeric_limits<int64_t>::max();
  int64_t earliest_deadline = -1;
  for (const QueuedInfo& q : queue) {
    oldest = std::min(oldest, q.enqueue_us);
    if (q.deadline_us >= 0 && (earliest_deadline < 0 || q.deadline_us < earliest_deadline))
      earliest_deadline = q.deadline_us;
  }

  // Walk the head while the requests fit; remember the last prefix of a preferred size.
  int count = 0;
  int64_t rows = 0;
  int preferred_count = 0;
  int64_t preferred_rows = 0;
  bool next_does_not_fit = false;
  for (const QueuedInfo& q : queue) {
    if (rows + q.rows > config.max_batch_size) {
      next_does_not_fit = true;
      break;
    }
    ++count;
    rows += q.rows;
    if (std::binary_search(preferred.begin(), preferred.end(), rows)) {
      preferred_count = count;
      preferred_rows = rows;
    }
    if (rows == config.max_batch_size || rows == largest_preferred) break;
  }
  const bool delay_exceeded = now_us - oldest >= config.max_queue_delay_us;
  if (flush || delay_exceeded || rows == config.max_batch_size ||
      (largest_preferred > 0 && rows == largest_preferred) || next_does_not_fit) {
    d.count = count;
    d.rows = rows;
    return d;
  }
  if (preferred_count > 0) {
    d.count = preferred_count;
    d.rows = preferred_rows;
    return d;
  }
  d.wake_us = oldest + config.max_queue_delay_us;
  if (earliest_deadline >= 0) d.wake_us = std::min(d.wake_us, earliest_deadline);
  return d;
}

DynamicBatcher::DynamicBatcher(BatchingConfig config, BatchRunner runner, Clock* clock)
    : config_(std::move(config)),
      runner_(std::move(runner)),
      clock_(clock != nullptr ? clock : RealClock::Get()) {
  for (int i = 0; i < config_.instances; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

DynamicBatcher::~DynamicBatcher() { Stop(); }

absl::Status DynamicBatcher::Enqueue(std::unique_ptr<BatchRequest> request) {
  if (request->rows < 1 || request->rows > config_.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("a request of ", request->rows,
                                                   " rows; the model takes 1 to ",
                                                   config_.max_batch_size, " per request"));
  }
  if (request->priority < 0 || request->priority > config_.priority_levels) {
    return absl::InvalidArgumentError(absl::StrCat("priority ", request->priority,
                                                   " is outside [0, ", config_.priority_levels,
                                                   "] (0: the default level, 1: highest)"));
  }
  if (request->timeout_us < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("timeout ", request->timeout_us, " us is negative"));
  {
    MutexLock lock(mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    if (config_.max_queue_size > 0 &&
        static_cast<int64_t>(queue_.size()) >= config_.max_queue_size) {
      return absl::UnavailableError(
          absl::StrCat("exceeds maximum queue size (", config_.max_queue_size, " requests)"));
    }
    const int64_t now = clock_->NowMicros();
    int64_t timeout = config_.default_timeout_us;
    if (request->timeout_us > 0 && (timeout == 0 || request->timeout_us < timeout))
      timeout = request->timeout_us;
    Entry e;
    e.level = request->priority == 0 ? config_.default_priority_level : request->priority;
    e.seq = next_seq_++;
    e.deadline_us = timeout > 0 ? now + timeout : -1;
    request->enqueue_us = now;
    request->seq = e.seq;
    e.request = std::move(request);
    auto pos =
        std::upper_bound(queue_.begin(), queue_.end(), e, [](const Entry& a, const Entry& b) {
          return a.level != b.level ? a.level < b.level : a.seq < b.seq;
        });
    queue_.insert(pos, std::move(e));
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void DynamicBatcher::TakeExpired(int64_t now, std::vector<std::unique_ptr<BatchRequest>>* expired) {
  auto it = std::stable_partition(queue_.begin(), queue_.end(), [now](const Entry& e) {
    return e.deadline_us < 0 || e.deadline_us > now;
  });
  for (auto j = it; j != queue_.end(); ++j) expired->push_back(std::move(j->request));
  queue_.erase(it, queue_.end());
}

void DynamicBatcher::WorkerLoop(int instance) {
  std::vector<BatchRequest*> batch;
  for (;;) {
    std::vector<std::unique_ptr<BatchRequest>> taken;
    std::vector<std::unique_ptr<BatchRequest>> expired;
    int64_t rows = 0;
    bool exit = false;
    {
      UniqueLock lock(mu_);
      for (;;) {
        const int64_t now = clock_->NowMicros();
        TakeExpired(now, &expired);
        if (!expired.empty()) break;  // answer them first, outside the lock
        if (queue_.empty()) {
          if (stopping_) {
            exit = true;
            break;
          }
          clock_->WaitUntil(cv_, lock.get(), -1);
          continue;
        }
        std::vector<QueuedInfo> info;
        info.reserve(queue_.size());
        for (const Entry& e : queue_)
          info.push_back({e.request->rows, e.request->enqueue_us, e.deadline_us});
        BatchDecision d = DecideBatch(info, now, config_, stopping_ || flushing_);
        if (d.count > 0) {
          for (int i = 0; i < d.count; ++i) {
            queue_[i].request->dispatch_us = now;
            taken.push_back(std::move(queue_[i].request));
          }
          queue_.erase(queue_.begin(), queue_.begin() + d.count);
          rows = d.rows;
          break;
        }
        clock_->WaitUntil(cv_, lock.get(), d.wake_us);
      }
    }
    if (!taken.empty()) cv_.notify_all();  // the rest of the queue may be ready for another
    for (auto& r : expired) Finish(QueueTimeoutError(), std::move(r));
    if (exit) return;
    if (taken.empty()) continue;
    batch.clear();
    for (auto& r : taken) {
      r->batch_rows = rows;
      batch.push_back(r.get());
    }
    absl::Status s = runner_(instance, batch, rows);
    const int64_t done = clock_->NowMicros();
    for (auto& r : taken) {
      r->complete_us = done;
      Finish(s, std::move(r));
    }
  }
}

void DynamicBatcher::Finish(absl::Status status, std::unique_ptr<BatchRequest> request) {
  auto call = [](absl::Status st, std::unique_ptr<BatchRequest> r) {
    auto done = std::move(r->done);
    if (done) done(std::move(st), std::move(r));
  };
  if (!config_.preserve_ordering) {
    call(std::move(status), std::move(request));
    return;
  }
  MutexLock lock(release_mu_);
  const uint64_t seq = request->seq;
  finished_.emplace(seq, std::make_pair(std::move(status), std::move(request)));
  for (auto it = finished_.find(next_release_); it != finished_.end();
       it = finished_.find(next_release_)) {
    call(std::move(it->second.first), std::move(it->second.second));
    finished_.erase(it);
    ++next_release_;
  }
}

void DynamicBatcher::Flush() {
  {
    MutexLock lock(mu_);
    flushing_ = true;
  }
  cv_.notify_all();
}

void DynamicBatcher::Stop() {
  MutexLock stop_lock(stop_mu_);
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

int64_t DynamicBatcher::queue_depth() const {
  MutexLock lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

}  // namespace kiln::serve
