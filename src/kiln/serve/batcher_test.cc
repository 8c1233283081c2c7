#include "kiln/serve/batcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kiln::serve {
namespace {

BatchingConfig Config(int64_t max_batch, std::vector<int64_t> preferred, int64_t delay_us) {
  BatchingConfig c;
  c.max_batch_size = max_batch;
  c.preferred_batch_sizes = std::move(preferred);
  c.max_queue_delay_us = delay_us;
  return c;
}

std::vector<QueuedInfo> Queue(std::vector<int64_t> rows, int64_t enqueue_us = 0) {
  std::vector<QueuedInfo> q;
  for (int64_t r : rows) q.push_back({r, enqueue_us, -1});
  return q;
}

TEST(DecideBatchTest, WaitsForThePreferredSizeUntilTheOldestRequestsDelay) {
  const BatchingConfig c = Config(8, {4, 8}, 1000);
  BatchDecision d = DecideBatch(Queue({1, 1, 1}), 500, c, false);
  EXPECT_EQ(d.count, 0);
  EXPECT_EQ(d.wake_us, 1000);  // oldest (t=0) + delay
  d = DecideBatch(Queue({1, 1, 1}), 1000, c, false);
  EXPECT_EQ(d.count, 3);
  EXPECT_EQ(d.rows, 3);
}

TEST(DecideBatchTest, SendsALargestPreferredSizeAtOnce) {
  const BatchingConfig c = Config(8, {4, 8}, 1000);
  BatchDecision d = DecideBatch(Queue({2, 2, 2, 2, 2}), 0, c, false);
  EXPECT_EQ(d.count, 4);
  EXPECT_EQ(d.rows, 8);
}

TEST(DecideBatchTest, SendsTheLastPreferredPrefixBeforeTheDelay) {
  const BatchingConfig c = Config(8, {4, 8}, 1000);
  // 5 rows queued: the first 4 form a preferred batch; the fifth keeps waiting.
  BatchDecision d = DecideBatch(Queue({1, 1, 1, 1, 1}), 10, c, false);
  EXPECT_EQ(d.count, 4);
  EXPECT_EQ(d.rows, 4);
}

TEST(DecideBatchTest, SendsWhenTheNextRequestDoesNotFitOrTheBatchIsFull) {
  const BatchingConfig c = Config(6, {}, 1000);
  BatchDecision d = DecideBatch(Queue({3, 2, 3}), 0, c, false);
  EXPECT_EQ(d.count, 2);
  EXPECT_EQ(d.rows, 5);
  d = DecideBatch(Queue({3, 3}), 0, c, false);
  EXPECT_EQ(d.count, 2);
  EXPECT_EQ(d.rows, 6);
}

TEST(DecideBatchTest, ZeroDelaySendsAtOnceAndFlushIgnoresTheDelay) {
  EXPECT_EQ(DecideBatch(Queue({1}), 0, Config(8, {4}, 0), false).count, 1);
  EXPECT_EQ(DecideBatch(Queue({1, 1}), 0, Config(8, {4}, 5000), true).count, 2);
}

TEST(DecideBatchTest, TheDelayCountsFromTheOldestNotTheHead) {
  // A high-priority request at the head arrived later than the one behind it.
  std::vector<QueuedInfo> q = {{1, 700, -1}, {1, 100, -1}};
  BatchDecision d = DecideBatch(q, 600, Config(8, {4}, 1000), false);
  EXPECT_EQ(d.wake_us, 1100);
  EXPECT_EQ(DecideBatch(q, 1100, Config(8, {4}, 1000), false).count, 2);
}

TEST(DecideBatchTest, WakesForTheNearestTimeout) {
  std::vector<QueuedInfo> q = {{1, 0, 300}};
  EXPECT_EQ(DecideBatch(q, 0, Config(8, {4}, 1000), false).wake_us, 300);
}

// An event simulation with exact times and an always-free instance: random arrivals of 1-3 rows,
// the batcher's rule applied at every arrival and every wake-up. No request may wait longer than
// max_queue_delay, and every batch must be what the rules say: full, a preferred size, blocked
// by a request that does not fit, or sent because its oldest request's delay expired.
TEST(DecideBatchTest, SimulatedArrivalsNeverWaitLongerThanTheDelay) {
  const BatchingConfig c = Config(8, {4, 8}, 1000);
  std::mt19937 rng(7);
  std::vector<QueuedInfo> queue;
  int64_t now = 0, next_arrival = 0, wake = -1;
  int arrivals = 0, batches = 0, delayed_batches = 0;
  while (arrivals < 5000 || !queue.empty()) {
    const bool arrive = arrivals < 5000 && (wake < 0 || next_arrival <= wake);
    now = arrive ? next_arrival : wake;
    if (arrive) {
      queue.push_back({static_cast<int64_t>(rng() % 3) + 1, now, -1});
      ++arrivals;
      next_arrival = now + static_cast<int64_t>(rng() % 400);
    }
    for (;;) {
      BatchDecision d = DecideBatch(queue, now, c, /*flush=*/arrivals >= 5000 && !arrive);
      wake = d.wake_us;
      if (d.count == 0) break;
      int64_t oldest = queue[0].enqueue_us;
      for (int i = 0; i < d.count; ++i) {
        ASSERT_LE(now - queue[i].enqueue_us, c.max_queue_delay_us);
        oldest = std::min(oldest, queue[i].enqueue_us);
      }
      const bool delay_expired = now - oldest >= c.max_queue_delay_us;
      const bool more_would_not_fit =
          d.count < static_cast<int>(queue.size()) && d.rows + queue[d.count].rows > 8;
      const bool preferred = d.rows == 4 || d.rows == 8;
      EXPECT_TRUE(preferred || delay_expired || more_would_not_fit || arrivals >= 5000)
          << "a batch of " << d.rows << " rows at t=" << now;
      if (delay_expired && !preferred) ++delayed_batches;
      queue.erase(queue.begin(), queue.begin() + d.count);
      ++batches;
    }
  }
  EXPECT_GT(batches, 0);
  EXPECT_GT(delayed_batches, 0);  // the delay rule was exercised
}

// ---- The threaded batcher with a manual clock ----

struct Recorder {
  std::mutex mu;
  std::vector<std::vector<int64_t>> batches;  // the seq of each request per batch
  std::vector<uint64_t> done_order;
  std::vector<absl::Status> done_status;
  std::atomic<int> done{0};
};

std::unique_ptr<BatchRequest> MakeRequest(Recorder* rec, int64_t rows = 1, int64_t priority = 0,
                                          int64_t timeout_us = 0) {
  auto r = std::make_unique<BatchRequest>();
  r->rows = rows;
  r->priority = priority;
  r->timeout_us = timeout_us;
  r->done = [rec](absl::Status s, std::unique_ptr<BatchRequest> r) {
    std::lock_guard<std::mutex> lock(rec->mu);
    rec->done_order.push_back(r->seq);
    rec->done_status.push_back(s);
    rec->done++;
  };
  return r;
}

bool WaitFor(const std::function<bool()>& cond) {
  for (int i = 0; i < 5000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// True once the workers waiting on `clock` have called WaitUntil twice more: each has looked at
// the queue and the time as they are now (instead of sleeping and hoping it has).
bool LookedTwice(const ManualClock& clock) {
  const int64_t waits = clock.waits();
  return WaitFor([&] { return clock.waits() >= waits + 2; });
}

BatchRunner RecordingRunner(Recorder* rec) {
  return [rec](int, std::vector<BatchRequest*>& batch, int64_t) {
    std::lock_guard<std::mutex> lock(rec->mu);
    std::vector<int64_t> seqs;
    for (BatchRequest* r : batch) seqs.push_back(static_cast<int64_t>(r->seq));
    rec->batches.push_back(seqs);
    return absl::OkStatus();
  };
}

TEST(DynamicBatcherTest, HoldsABatchExactlyUntilTheDelayOfTheOldest) {
  ManualClock clock(0);
  Recorder rec;
  DynamicBatcher b(Config(8, {4}, 1000), RecordingRunner(&rec), &clock);
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec)).ok());
  clock.SetMicros(400);
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec)).ok());
  clock.SetMicros(999);
  ASSERT_TRUE(LookedTwice(clock));  // the worker saw t = 999 and kept waiting
  EXPECT_EQ(rec.done.load(), 0);
  clock.SetMicros(1000);
  ASSERT_TRUE(WaitFor([&] { return rec.done.load() == 2; }));
  ASSERT_EQ(rec.batches.size(), 1u);
  EXPECT_EQ(rec.batches[0].size(), 2u);
  // A preferred size goes at once, with no time passing.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(b.Enqueue(MakeRequest(&rec)).ok());
  ASSERT_TRUE(WaitFor([&] { return rec.done.load() == 6; }));
  EXPECT_EQ(rec.batches.size(), 2u);
  EXPECT_EQ(rec.batches[1].size(), 4u);
}

TEST(DynamicBatcherTest, FlushSendsQueuedRequestsWithoutWaitingAndStillAccepts) {
  ManualClock clock(0);
  Recorder rec;
  DynamicBatcher b(Config(8, {8}, 1000000), RecordingRunner(&rec), &clock);
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec)).ok());
  ASSERT_TRUE(LookedTwice(clock));  // the worker saw the request and kept waiting
  EXPECT_EQ(rec.done.load(), 0);
  b.Flush();
  ASSERT_TRUE(WaitFor([&] { return rec.done.load() == 1; }));
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec)).ok());
  ASSERT_TRUE(WaitFor([&] { return rec.done.load() == 2; }));
}

TEST(DynamicBatcherTest, TimedOutRequestsAreAnsweredUnavailable) {
  ManualClock clock(0);
  Recorder rec;
  DynamicBatcher b(Config(8, {4}, 10000), RecordingRunner(&rec), &clock);
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec, 1, 0, /*timeout_us=*/300)).ok());
  clock.SetMicros(300);
  ASSERT_TRUE(WaitFor([&] { return rec.done.load() == 1; }));
  EXPECT_TRUE(rec.batches.empty());
  EXPECT_EQ(rec.done_status[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(rec.done_status[0].message().find("timeout"), std::string::npos);
  // Told apart from a full queue by its type, not its message.
  EXPECT_TRUE(IsQueueTimeout(rec.done_status[0]));
  EXPECT_FALSE(IsQueueTimeout(absl::UnavailableError("request timeout")));
}

TEST(DynamicBatcherTest, AFullQueueRejectsAndBadRequestsAreInvalid) {
  ManualClock clock(0);
  Recorder rec;
  BatchingConfig c = Config(8, {8}, 1000000);
  c.max_queue_size = 2;
  DynamicBatcher b(c, RecordingRunner(&rec), &clock);
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec)).ok());
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec)).ok());
  absl::Status s = b.Enqueue(MakeRequest(&rec));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("maximum queue size"), std::string::npos);
  EXPECT_EQ(b.queue_depth(), 2);
  EXPECT_EQ(b.Enqueue(MakeRequest(&rec, 9)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Enqueue(MakeRequest(&rec, 1, 2)).code(), absl::StatusCode::kInvalidArgument);
  b.Stop();  // drains: the two queued requests run
  EXPECT_EQ(rec.done.load(), 2);
  EXPECT_EQ(b.Enqueue(MakeRequest(&rec)).code(), absl::StatusCode::kUnavailable);
}

TEST(DynamicBatcherTest, PriorityRunsFirstAndResponsesKeepRequestOrder) {
  ManualClock clock(0);
  Recorder rec;
  std::atomic<bool> release{false};
  BatchingConfig c = Config(1, {}, 0);
  c.priority_levels = 2;
  c.default_priority_level = 2;
  BatchRunner runner = [&](int i, std::vector<BatchRequest*>& batch, int64_t rows) {
    if (batch[0]->seq == 0)
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return RecordingRunner(&rec)(i, batch, rows);
  };
  DynamicBatcher b(c, runner, &clock);
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec)).ok());  // seq 0: blocks the only instance
  ASSERT_TRUE(WaitFor([&] { return b.queue_depth() == 0; }));
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec, 1, 0)).ok());  // seq 1, default level 2
  ASSERT_TRUE(b.Enqueue(MakeRequest(&rec, 1, 1)).ok());  // seq 2, level 1
  release = true;
  ASSERT_TRUE(WaitFor([&] { return rec.done.load() == 3; }));
  ASSERT_EQ(rec.batches.size(), 3u);
  EXPECT_EQ(rec.batches[1][0], 2);  // the high-priority request ran first
  EXPECT_EQ(rec.batches[2][0], 1);
  EXPECT_EQ(rec.done_order, (std::vector<uint64_t>{0, 1, 2}));  // answered in request order
}

// The real clock under load from two threads: every request is dispatched within
// max_queue_delay of its arrival plus scheduling slack (generous: the machine is shared), and
// every batch obeys max_batch_size.
TEST(DynamicBatcherTest, RealClockWaitsAreBoundedByTheDelay) {
  const int64_t delay = 2000, slack = 30000;
  std::mutex mu;
  std::vector<int64_t> waits, sizes;
  BatchRunner runner = [&](int, std::vector<BatchRequest*>& batch, int64_t rows) {
    std::lock_guard<std::mutex> lock(mu);
    for (BatchRequest* r : batch) waits.push_back(r->dispatch_us - r->enqueue_us);
    sizes.push_back(rows);
    return absl::OkStatus();
  };
  BatchingConfig c = Config(8, {4, 8}, delay);
  c.instances = 2;
  std::atomic<int> done{0};
  {
    DynamicBatcher b(c, runner);
    auto producer = [&](int seed) {
      std::mt19937 rng(seed);
      for (int i = 0; i < 150; ++i) {
        auto r = std::make_unique<BatchRequest>();
        r->rows = rng() % 2 + 1;
        r->done = [&](absl::Status, std::unique_ptr<BatchRequest>) { done++; };
        ASSERT_TRUE(b.Enqueue(std::move(r)).ok());
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1500));
      }
    };
    std::thread t1(producer, 1), t2(producer, 2);
    t1.join();
    t2.join();
    ASSERT_TRUE(WaitFor([&] { return done.load() == 300; }));
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(waits.size(), 300u);
  for (int64_t w : waits) EXPECT_LE(w, delay + slack);
  for (int64_t s : sizes) EXPECT_LE(s, 8);
  EXPECT_LT(sizes.size(), 300u);  // requests were batched
}

}  // namespace
}  // namespace kiln::serve
