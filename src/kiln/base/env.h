// Env: how Kiln reaches files, the clock and randomness. Code that touches the disk (checkpoints,
// record shards, event files, the control plane's state) takes an Env* instead of calling POSIX,
// so tests run it against an in-memory file system (mem_env.h) or one that injects I/O errors and
// simulates power loss (fault_injection_env.h). Modelled on LevelDB's env.h.
//
//   Env* env = Env::Default();                                   // the real file system
//   KILN_RETURN_IF_ERROR(env->CreateDir("/ckpt/step_10.tmp"));
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f,
//                         env->NewWritableFile("/ckpt/step_10.tmp/a.bin"));
//   KILN_RETURN_IF_ERROR(f->Append(bytes));
//   KILN_RETURN_IF_ERROR(f->Sync());                             // data durable
//   KILN_RETURN_IF_ERROR(f->Close());
//   KILN_RETURN_IF_ERROR(env->SyncDir("/ckpt/step_10.tmp"));     // its directory entry durable
//   KILN_RETURN_IF_ERROR(env->RenameFile("/ckpt/step_10.tmp", "/ckpt/step_10"));  // atomic
//   KILN_RETURN_IF_ERROR(env->SyncDir("/ckpt"));                 // the rename durable
//
// Durability model (what the fault-injecting Env enforces, and what POSIX file systems promise):
// appended bytes survive a crash only after WritableFile::Sync; a creation, rename or deletion
// survives only after SyncDir on the directory that holds the entry (both directories for a
// rename across them). RenameFile is atomic: after a crash the entry is at its old or its new
// name, whole.
//
// Every fallible call returns absl::Status naming the path; OS errors keep their errno-derived
// code (NotFound, PermissionDenied, ResourceExhausted for a full disk, ...). Env implementations
// are thread-safe; a single file object is not (use it from one thread at a time), except
// RandomAccessFile::Read, which is.
#ifndef KILN_BASE_ENV_H_
#define KILN_BASE_ENV_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

// Reads a file front to back.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to n bytes. *result points at the bytes read (in `scratch`, which must hold n bytes,
  // or in the implementation's own memory). Returns fewer than n bytes only at end of file.
  virtual absl::Status Read(size_t n, std::string_view* result, char* scratch) = 0;
  // Skips n bytes (stopping at end of file).
  virtual absl::Status Skip(uint64_t n) = 0;
};

// Reads a file at arbitrary offsets. Read is thread-safe.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to n bytes at `offset`, with the same contract as SequentialFile::Read. Reading at
  // or past end of file gives an empty result and OK.
  virtual absl::Status Read(uint64_t offset, size_t n, std::string_view* result,
                            char* scratch) const = 0;
};

// Writes a file front to back. Destroying an unclosed file closes it, ignoring errors: call
// Close() to see them.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(std::string_view data) = 0;
  // Hands buffered bytes to the OS (visible to readers, not yet durable).
  virtual absl::Status Flush() = 0;
  // Flushes and makes the file's bytes durable (fdatasync).
  virtual absl::Status Sync() = 0;
  // Flushes and closes; every later call fails.
  virtual absl::Status Close() = 0;
};

// An exclusive lock taken by Env::LockFile; destroying it (in the process that took it) releases
// the lock.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

class Env {
 public:
  virtual ~Env() = default;

  // The POSIX file system and real clock. Lives for the whole process; never delete it.
  static Env* Default();

  virtual absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) = 0;
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) = 0;
  // Creates `path`, or truncates it if it exists. Its directory must exist.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Opens `path` for appending at its end, creating it if missing. Its directory must exist.
  // The default is Unimplemented; the Envs in base/ all implement it.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path);
  // Creates `path`, which must not exist: AlreadyExists if a file or directory is there. The
  // check and the creation are one atomic step (O_CREAT | O_EXCL): of two racing creators,
  // exactly one succeeds. Its directory must exist. The default is Unimplemented; the Envs in
  // base/ all implement it.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewExclusiveFile(const std::string& path);

  // True if a file or directory exists at `path`.
  virtual bool FileExists(const std::string& path) = 0;
  // NotFound if nothing is at `path`.
  virtual absl::StatusOr<bool> IsDirectory(const std::string& path) = 0;
  // Names (not paths) of the entries in `dir`, sorted, without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  virtual absl::StatusOr<uint64_t> GetFileSize(const std::string& path) = 0;

  // Removes a file (not a directory).
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Creates `dir` and any missing parents (mkdir -p). OK if it already is a directory.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // Removes `dir` and everything under it (rm -r). NotFound if it does not exist.
  virtual absl::Status DeleteDir(const std::string& dir) = 0;
  // Atomically renames a file or directory. Replaces an existing file at `to` (a file), or an
  // empty directory at `to` (a directory); a non-empty directory at `to` is FailedPrecondition.
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  // Makes the entries of `dir` (creations, renames, deletions) durable (fsync of the directory).
  virtual absl::Status SyncDir(const std::string& dir) = 0;

  // Creates `path` if missing and takes an exclusive lock on it without waiting. Unavailable
  // when another holder has it: another process or another FileLock of this Env in this process.
  // Locking neither reads nor writes the file's bytes.
  //
  // The lock belongs to the FileLock's process alone. It ends when the FileLock is destroyed or
  // that process exits in any way (SIGKILL included), and no child process ever holds it: not one
  // that execs, and not one made by fork() that goes on running this program (a forked child
  // neither keeps the lock alive after its parent let go nor releases it by destroying its copy
  // of the FileLock). The POSIX Env uses flock(2) on a close-on-exec descriptor, unlocked
  // (LOCK_UN) on release and closed in every forked child by a pthread_atfork handler; the one
  // window left is a holder killed between a fork() and its child's first moment, and it lasts
  // until the child runs (env_posix.cc has the details, and why not OFD or fcntl locks). The
  // default keeps an in-process table of held paths (what MemEnv and FaultInjectionEnv use); a
  // forked child gets a copy of that table, so there too it can neither hold nor release its
  // parent's lock.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path);

  // Where scratch folders go: on POSIX $TMPDIR when it is an absolute path, else "/tmp" (the
  // default, which MemEnv uses; FaultInjectionEnv asks its target). It need not exist yet.
  virtual std::string GetTempDirectory();

  // Wall-clock time, microseconds since the Unix epoch.
  virtual uint64_t NowMicros() = 0;
  virtual void SleepForMicros(int64_t micros) = 0;
  // 64 random bits (nonces for temporary names; not for cryptography).
  virtual uint64_t RandomU64() = 0;
};

// Whole-file helpers over any Env.
absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path);
// Writes `data` to `path` (truncating), Sync()s it if `sync`, and closes it.
absl::Status WriteStringToFile(Env* env, std::string_view data, const std::string& path,
                               bool sync = false);

// Creates a fresh folder GetTempDirectory()/<prefix><16 hex digits> (and its parents) and
// returns its path. The digits come from RandomU64, so two callers never share one.
absl::StatusOr<std::string> CreateTempDir(Env* env, const std::string& prefix);

// Path helpers (pure string operations, '/' separated).
// "a" + "b" -> "a/b"; "a/" + "b" -> "a/b"; "" + "b" -> "b"; "a" + "/b" -> "/b".
std::string JoinPath(const std::string& a, const std::string& b);
// "/a/b" -> "/a"; "/a" -> "/"; "a" -> ""; trailing slashes ignored.
std::string Dirname(const std::string& path);
// "/a/b" -> "b"; trailing slashes ignored.
std::string Basename(const std::string& path);
// Collapses repeated '/', removes "." components and a trailing '/' (not ".." resolution).
std::string CleanPath(const std::string& path);

}  // namespace kiln

#endif  // KILN_BASE_ENV_H_
