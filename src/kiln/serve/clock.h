// The time source of the batcher: real (steady_clock) in the server, manual in tests, so a test
// can prove the batching rules at exact microseconds.
//
//   ManualClock clock(0);
//   DynamicBatcher b(config, runner, &clock);
//   b.Enqueue(...);           // at t = 0
//   clock.AdvanceMicros(500); // workers waiting for a deadline re-check the queue
//
// Servers take theirs through options (ServerOptions::clock, ServedModel::Load, the batcher),
// defaulting to RealClock::Get(): every server time read goes through one of these.
#ifndef KILN_SERVE_CLOCK_H_
#define KILN_SERVE_CLOCK_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace kiln::serve {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMicros() = 0;
  // Blocks on `cv` (with `lock` held by the caller) until `deadline_us` on this clock has passed
  // or `cv` is notified; spurious returns are allowed (callers re-check their condition).
  // deadline_us < 0: no deadline.
  virtual void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         int64_t deadline_us) = 0;
};

// std::chrono::steady_clock.
class RealClock : public Clock {
 public:
  int64_t NowMicros() override;
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 int64_t deadline_us) override;
  static RealClock* Get();
};

// Time moves only when a test says so. WaitUntil sleeps at most 200 us of real time per call, so
// waiters notice AdvanceMicros without being told.
class ManualClock : public Clock {
 public:
  explicit ManualClock(int64_t start_us = 0) : now_(start_us) {}
  int64_t NowMicros() override { return now_.load(); }
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 int64_t deadline_us) override;
  void AdvanceMicros(int64_t us) { now_ += us; }
  void SetMicros(int64_t us) { now_ = us; }
  // WaitUntil calls so far. A waiter that called WaitUntil twice after a change of the clock (or
  // of what it waits for) has looked at that change: a test waits for that instead of sleeping.
  int64_t waits() const { return waits_.load(); }

 private:
  std::atomic<int64_t> now_;
  std::atomic<int64_t> waits_{0};
};

}  // namespace kiln::serve

#endif  // KILN_SERVE_CLOCK_H_
