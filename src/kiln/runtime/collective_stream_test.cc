// The communication thread: operations run one at a time in start order, off the caller's thread,
// while the caller goes on; Wait returns each one's status; WaitAll reports the first error nobody
// waited for and leaves nothing in flight.
#include "kiln/runtime/collective_stream.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kiln::runtime {
namespace {

// Appends its id to a shared log; optionally blocks until released, or fails.
class LogOp : public CollectiveOp {
 public:
  LogOp(int id, std::vector<int>* log, std::mutex* mu) : id_(id), log_(log), mu_(mu) {
    name_ = "op " + std::to_string(id);
  }
  absl::Status Execute() override {
    thread_ = std::this_thread::get_id();
    if (gate_ != nullptr) {
      // Bounded: a test that never releases fails instead of hanging.
      std::unique_lock<std::mutex> lock(gate_mu_);
      if (!gate_cv_.wait_for(lock, std::chrono::seconds(10), [this] { return *gate_; }))
        return absl::DeadlineExceededError("never released");
    }
    std::lock_guard<std::mutex> lock(*mu_);
    log_->push_back(id_);
    return status_;
  }
  const std::string& name() const override { return name_; }

  void Release() {
    {
      std::lock_guard<std::mutex> lock(gate_mu_);
      *gate_ = true;
    }
    gate_cv_.notify_all();
  }

  int id_;
  std::vector<int>* log_;
  std::mutex* mu_;
  std::string name_;
  absl::Status status_;
  bool* gate_ = nullptr;
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  std::thread::id thread_;
};

TEST(CollectiveStream, RunsInStartOrderOffTheCallersThread) {
  std::vector<int> log;
  std::mutex mu;
  CollectiveStream stream;
  std::vector<std::unique_ptr<LogOp>> ops;
  for (int i = 0; i < 5; ++i) ops.push_back(std::make_unique<LogOp>(i, &log, &mu));
  for (int run = 0; run < 3; ++run) {  // reused across runs, as an executable's ops are
    for (auto& op : ops) stream.Start(op.get());
    EXPECT_TRUE(stream.Wait(ops[2].get()).ok());
    std::vector<std::string> names;
    EXPECT_TRUE(stream.WaitAll([&](const CollectiveOp& op) { names.push_back(op.name()); }).ok());
    EXPECT_EQ(names, (std::vector<std::string>{"op 0", "op 1", "op 2", "op 3", "op 4"}));
  }
  EXPECT_EQ(log, (std::vector<int>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(stream.ops_run(), 15);
  for (auto& op : ops) {
    EXPECT_NE(op->thread_, std::this_thread::get_id());
    EXPECT_LE(op->start_ns, op->begin_ns);
    EXPECT_LE(op->begin_ns, op->end_ns);
  }
}

TEST(CollectiveStream, TheCallerGoesOnWhileAnOpIsInFlight) {
  std::vector<int> log;
  std::mutex mu;
  CollectiveStream stream;
  bool released = false;
  LogOp slow(1, &log, &mu);
  slow.gate_ = &released;
  stream.Start(&slow);
  // Start returned although the op cannot finish until this thread releases it.
  slow.Release();
  EXPECT_TRUE(stream.Wait(&slow).ok());
  EXPECT_TRUE(stream.WaitAll().ok());
  EXPECT_EQ(log, std::vector<int>{1});
}

TEST(CollectiveStream, ErrorsReachTheirWaitOrWaitAll) {
  std::vector<int> log;
  std::mutex mu;
  CollectiveStream stream;
  LogOp a(0, &log, &mu), b(1, &log, &mu), c(2, &log, &mu);
  b.status_ = absl::DeadlineExceededError("b timed out");
  c.status_ = absl::UnavailableError("c failed");
  stream.Start(&a);
  stream.Start(&b);
  stream.Start(&c);
  EXPECT_EQ(stream.Wait(&b).code(), absl::StatusCode::kDeadlineExceeded);
  // b's error was returned by its Wait; c's, never waited for, comes out of WaitAll.
  absl::Status all = stream.WaitAll();
  EXPECT_EQ(all.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(all.message(), "c failed");
  // After WaitAll nothing is pending: a Wait for an op not started is OK at once.
  EXPECT_TRUE(stream.Wait(&c).ok());
  EXPECT_TRUE(stream.WaitAll().ok());
}

TEST(CollectiveStream, QuiesceWaitsForEveryOpButKeepsTheirStatuses) {
  std::vector<int> log;
  std::mutex mu;
  CollectiveStream stream;
  LogOp a(0, &log, &mu), b(1, &log, &mu);
  b.status_ = absl::InternalError("b");
  stream.Start(&a);
  stream.Start(&b);
  stream.Quiesce();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(log, (std::vector<int>{0, 1}));  // both ran before Quiesce returned
  }
  EXPECT_EQ(stream.Wait(&b).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(stream.WaitAll().ok());  // b's error was already returned
}

TEST(CollectiveStream, DestroyedWithNothingStartedOrAfterWork) {
  { CollectiveStream never_started; }
  std::vector<int> log;
  std::mutex mu;
  LogOp a(0, &log, &mu);
  {
    CollectiveStream s;
    s.Start(&a);
    EXPECT_TRUE(s.WaitAll().ok());
  }
  EXPECT_EQ(log, std::vector<int>{0});
}

}  // namespace
}  // namespace kiln::runtime
