// std::mutex with Clang's thread-safety annotations, so that members can say which mutex guards
// them (ABSL_GUARDED_BY) and `clang++ -Wthread-safety` (the thread_safety_lint test) proves every
// access holds it. libstdc++'s std::mutex and std::lock_guard carry no annotations; these are the
// same objects with them. UniqueLock hands its std::unique_lock to a std::condition_variable (or a
// serve::Clock), whose waits unlock and relock it before returning.
//
//   class Counter {
//    public:
//     void Add() {
//       MutexLock lock(mu_);
//       ++n_;
//     }
//     void WaitForOne() {
//       UniqueLock lock(mu_);
//       cv_.wait(lock.get(), [this] { mu_.AssertHeld(); return n_ > 0; });
//     }
//
//    private:
//     Mutex mu_;
//     std::condition_variable cv_;
//     int n_ ABSL_GUARDED_BY(mu_) = 0;
//   };
#ifndef KILN_BASE_MUTEX_H_
#define KILN_BASE_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace kiln {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.unlock(); }
  // Tells the analysis the caller holds this (inside a condition variable's predicate, which
  // runs with the lock held where the analysis cannot see it).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // The std::mutex itself, for UniqueLock.
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// std::lock_guard<std::mutex>, annotated.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS
      : mu_(mu) {
    mu_.Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// std::unique_lock<std::mutex>, annotated, held from construction to destruction; get() is for
// condition-variable waits (which return with it held again).
class ABSL_SCOPED_LOCKABLE UniqueLock {
 public:
  explicit UniqueLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS
      : lock_(mu.native()) {}
  ~UniqueLock() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS {}
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  std::unique_lock<std::mutex>& get() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace kiln

#endif  // KILN_BASE_MUTEX_H_
