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
// RunDirectory is the folder as a whole: every file of a run (config.yaml, run.json, checkpoints/,
// metrics.jsonl, events, trace.json) by name, reached through an Env so that trainer tests run it
// against MemEnv and FaultInjectionEnv:
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<RunDirectory> run, RunDirectory::Open(env, outdir));
//   KILN_RETURN_IF_ERROR(run->Lock());                       // training only
//   KILN_RETURN_IF_ERROR(run->WriteConfig(ConfigToYaml(c)));
//   KILN_RETURN_IF_ERROR(run->WriteRunJson(info));            // via run.json.tmp and a rename
//
// The lock is Env::LockFile on OUTDIR/.lock (flock(2) on the real file system), which holds the
// holder's pid as text. The kernel drops the lock when the holder exits in any way (SIGKILL and
// crashes included), and no child of the holder shares it (not even a fork() that does not exec,
// env.h), so a lock left behind by a dead process is free at once; the file itself stays (its pid
// is then stale and harmless).
#ifndef KILN_TRAIN_RUN_DIR_H_
#define KILN_TRAIN_RUN_DIR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "nlohmann/json.hpp"

namespace kiln::train {

inline constexpr char kRunLockName[] = ".lock";

class RunDirLock {
 public:
  // Creates `dir` if needed and takes the lock without waiting. FailedPrecondition naming the
  // holder's pid when another process (or another RunDirLock in this one) holds it.
  // Null env: Env::Default().
  static absl::StatusOr<std::unique_ptr<RunDirLock>> Acquire(const std::string& dir,
                                                             Env* env = nullptr);
  ~RunDirLock() = default;  // releases the lock

  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  RunDirLock(std::unique_ptr<FileLock> lock, std::string path)
      : lock_(std::move(lock)), path_(std::move(path)) {}
  std::unique_ptr<FileLock> lock_;
  std::string path_;
};

// What an output directory already holds from an earlier `kiln train`.
struct PreviousRun {
  bool exists = false;         // any of the files a run writes (run.json, checkpoints/step_*, ...)
  std::string run_id;          // from run.json, else from the newest checkpoint; "" if none
  std::vector<int64_t> steps;  // committed checkpoints (checkpoints/step_N), ascending
  std::vector<std::string> entries;  // the run's own entries in OUTDIR (config.yaml, ...), sorted
};
absl::StatusOr<PreviousRun> InspectRunDir(const std::string& dir, Env* env = nullptr);

// Moves the entries a run writes (config.yaml, run.json, metrics.jsonl, events.out.tfevents.*,
// checkpoints/, trace.json) into a new OUTDIR/replaced-<UTC yyyymmdd-hhmmss>[-k]/ and returns
// that path. Anything else in OUTDIR stays where it is; nothing is deleted.
absl::StatusOr<std::string> MoveRunAside(const std::string& dir, Env* env = nullptr);

// The error for a fresh start (`--no-resume`) on a folder that holds the earlier run `prev`:
// FailedPrecondition saying what is there and the three ways on (resume, another folder,
// --replace).
absl::Status FreshStartRefusal(const std::string& dir, const PreviousRun& prev);

// 16 lowercase hex digits, random (std::random_device mixed with the clock and the pid).
std::string NewRunId();

// The "run_id" of OUTDIR/run.json; "" when there is no run.json or it has no run_id (a run written
// before run ids existed).
std::string ReadRunJsonId(const std::string& dir, Env* env = nullptr);
// OUTDIR/run.json as an object (empty when it is missing or unreadable).
nlohmann::json ReadRunJson(const std::string& dir, Env* env = nullptr);

// One run's output directory and the names of its files. Borrows `env`, which must outlive it.
class RunDirectory {
 public:
  // No I/O: `dir` need not exist yet (Lock and the writers create it). Null env: Env::Default().
  RunDirectory(std::string dir, Env* env = nullptr);

  // Creates the folder if needed and takes its lock (RunDirLock) for this object's lifetime.
  absl::Status Lock();

  const std::string& path() const { return dir_; }
  Env* env() const { return env_; }
  std::string config_path() const { return JoinPath(dir_, "config.yaml"); }
  std::string run_json_path() const { return JoinPath(dir_, "run.json"); }
  std::string checkpoints_path() const { return JoinPath(dir_, "checkpoints"); }
  std::string metrics_path() const { return JoinPath(dir_, "metrics.jsonl"); }
  std::string trace_path() const { return JoinPath(dir_, "trace.json"); }

  absl::StatusOr<PreviousRun> Inspect() const { return InspectRunDir(dir_, env_); }
  absl::StatusOr<std::string> MoveRunAside() const { return train::MoveRunAside(dir_, env_); }
  std::string ReadRunId() const { return ReadRunJsonId(dir_, env_); }

  // Each writes NAME.tmp, syncs it and renames it over NAME: a reader sees the old file or the
  // new one, whole.
  absl::Status WriteConfig(const std::string& yaml) const;
  absl::Status WriteRunJson(const nlohmann::json& info) const;

 private:
  absl::Status WriteAtomic(const std::string& path, const std::string& text) const;

  std::string dir_;
  Env* env_;
  std::unique_ptr<RunDirLock> lock_;
};

}  // namespace kiln::train

#endif  // KILN_TRAIN_RUN_DIR_H_
