// The run directory (`output_dir`) as something one run owns: an exclusive lock so two trainers
// never share it, a run id so nothing of another run is ever restored, evaluated or retained
// against this one, and moving an older run aside (never deleting it) when a fresh start is
// asked to replace it (docs/train.md "One folder, one run").
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<RunDirLock> lock, RunDirLock::Acquire(outdir));
//   KILN_ASSIGN_OR_RETURN(PreviousRun prev, InspectRunDir(outdir));
//   if (prev.exists && fresh_start) {
//     KILN_ASSIGN_OR_RETURN(std::string aside, MoveRunAside(outdir));   // OUTDIR/replaced-<ts>/
//   }
//   std::string id = prev.run_id.empty() ? NewRunId() : prev.run_id;
//
// The lock is flock(2) on OUTDIR/.lock, which holds the holder's pid as text. The kernel drops the
// lock when the holder exits in any way (SIGKILL and crashes included), so a lock left behind by a
// dead process is free at once; the file itself stays (its pid is then stale and harmless).
#ifndef KILN_TRAIN_RUN_DIR_H_
#define KILN_TRAIN_RUN_DIR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln::train {

inline constexpr char kRunLockName[] = ".lock";

class RunDirLock {
 public:
  // Creates `dir` if needed and takes the lock without waiting. FailedPrecondition naming the
  // holder's pid when another process (or another RunDirLock in this one) holds it.
  static absl::StatusOr<std::unique_ptr<RunDirLock>> Acquire(const std::string& dir);
  ~RunDirLock();  // releases the lock

  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  RunDirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
};

// What an output directory already holds from an earlier `kiln train`.
struct PreviousRun {
  bool exists = false;         // any of the files a run writes (run.json, checkpoints/step_*, ...)
  std::string run_id;          // from run.json, else from the newest checkpoint; "" if none
  std::vector<int64_t> steps;  // committed checkpoints (checkpoints/step_N), ascending
  std::vector<std::string> entries;  // the run's own entries in OUTDIR (config.yaml, ...), sorted
};
absl::StatusOr<PreviousRun> InspectRunDir(const std::string& dir);

// Moves the entries a run writes (config.yaml, run.json, metrics.jsonl, events.out.tfevents.*,
// checkpoints/, trace.json) into a new OUTDIR/replaced-<UTC yyyymmdd-hhmmss>[-k]/ and returns
// that path. Anything else in OUTDIR stays where it is; nothing is deleted.
absl::StatusOr<std::string> MoveRunAside(const std::string& dir);

// The error for a fresh start (`--no-resume`) on a folder that holds the earlier run `prev`:
// FailedPrecondition saying what is there and the three ways on (resume, another folder,
// --replace).
absl::Status FreshStartRefusal(const std::string& dir, const PreviousRun& prev);

// 16 lowercase hex digits, random (std::random_device mixed with the clock and the pid).
std::string NewRunId();

// The "run_id" of OUTDIR/run.json; "" when there is no run.json or it has no run_id (a run written
// before run ids existed).
std::string ReadRunJsonId(const std::string& dir);

}  // namespace kiln::train

#endif  // KILN_TRAIN_RUN_DIR_H_
