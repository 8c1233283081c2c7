// Test helper shared by server_test.cc and grpc_server_test.cc (and their ASan builds): a gate
// that holds each repository job on the loader thread (ModelRepository::set_job_hook_for_testing)
// until released, so a load is as slow as a test wants.
//
//   JobGate gate;
//   repository->set_job_hook_for_testing([&](const std::string& n) { gate.Enter(n); });
//   std::thread t(...);                 // sends the load
//   JobGate::Guard guard{gate, t};      // released and joined even on a failed ASSERT
//   ASSERT_TRUE(gate.WaitEntered(1));
#ifndef KILN_SERVE_INTERNAL_JOB_GATE_H_
#define KILN_SERVE_INTERNAL_JOB_GATE_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::serve::testing {

class JobGate {
 public:
  void Enter(const std::string& name) {
    std::unique_lock<std::mutex> lock(mu_);
    entered_.push_back(name);
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }
  // Whether `n` jobs have started within 20 s.
  bool WaitEntered(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return entered_.size() >= n; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // Released and `t` joined when it goes out of scope, even on a failed ASSERT.
  struct Guard {
    JobGate& gate;
    std::thread& t;
    ~Guard() {
      gate.Release();
      if (t.joinable()) t.join();
    }
  };
  std::vector<std::string> entered() {
    std::lock_guard<std::mutex> lock(mu_);
    return entered_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> entered_;
  bool released_ = false;
};

}  // namespace kiln::serve::testing

#endif  // KILN_SERVE_INTERNAL_JOB_GATE_H_
