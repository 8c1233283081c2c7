#include "kiln/runtime/collective_stream.h"

#include <chrono>
#include <utility>

namespace kiln::runtime {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

CollectiveStream::~CollectiveStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CollectiveStream::Start(CollectiveOp* op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    op->state_ = CollectiveOp::State::kQueued;
    op->waited_ = false;
    op->status_ = absl::OkStatus();
    op->start_ns = NowNs();
    queue_.push_back(op);
    started_.push_back(op);
  }
  work_cv_.notify_one();
}

void CollectiveStream::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || head_ < queue_.size(); });
    if (head_ == queue_.size()) return;  // stopping, nothing queued
    CollectiveOp* op = queue_[head_++];
    if (head_ == queue_.size()) {  // keep the capacity: no allocation on later runs
      queue_.clear();
      head_ = 0;
    }
    op->state_ = CollectiveOp::State::kRunning;
    lock.unlock();
    const int64_t begin = NowNs();
    absl::Status status = op->Execute();
    const int64_t end = NowNs();
    lock.lock();
    op->begin_ns = begin;
    op->end_ns = end;
    op->status_ = std::move(status);
    op->state_ = CollectiveOp::State::kDone;
    ++ops_run_;
    done_cv_.notify_all();
  }
}

absl::Status CollectiveStream::Wait(CollectiveOp* op) {
  std::unique_lock<std::mutex> lock(mu_);
  if (op->state_ == CollectiveOp::State::kIdle) return absl::OkStatus();
  done_cv_.wait(lock, [op] { return op->state_ == CollectiveOp::State::kDone; });
  op->waited_ = true;
  return op->status_;
}

void CollectiveStream::Quiesce() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] {
    for (const CollectiveOp* op : started_)
      if (op->state_ != CollectiveOp::State::kDone) return false;
    return true;
  });
}

absl::Status CollectiveStream::WaitAll(const std::function<void(const CollectiveOp&)>& each) {
  Quiesce();
  std::vector<CollectiveOp*> ops;
  absl::Status first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (CollectiveOp* op : started_) {
      if (first.ok() && !op->waited_ && !op->status_.ok()) first = op->status_;
      op->state_ = CollectiveOp::State::kIdle;
    }
    if (each) ops = started_;  // profiling only: a copy, so `each` runs without the lock
    started_.clear();
  }
  for (const CollectiveOp* op : ops) each(*op);
  return first;
}

int64_t CollectiveStream::ops_run() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_run_;
}

}  // namespace kiln::runtime
