#include "kiln/serve/clock.h"

namespace kiln::serve {

int64_t RealClock::NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void RealClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          int64_t deadline_us) {
  if (deadline_us < 0) {
    cv.wait(lock);
    return;
  }
  const int64_t wait = deadline_us - NowMicros();
  if (wait <= 0) return;
  cv.wait_for(lock, std::chrono::microseconds(wait));
}

RealClock* RealClock::Get() {
  static RealClock* clock = new RealClock();
  return clock;
}

void ManualClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                            int64_t deadline_us) {
  waits_++;
  if (deadline_us >= 0 && deadline_us <= NowMicros()) return;
  cv.wait_for(lock, std::chrono::microseconds(200));
}

}  // namespace kiln::serve
