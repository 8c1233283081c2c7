// FaultInjectionEnv: wraps another Env to test crash safety, in the spirit of LevelDB's
// fault_injection_test. It can
//   - fail chosen mutating operations with an I/O error (EIO), once (FailNth) or from some point
//     on, as a process that died would (FailAfter); and
//   - simulate power loss (SimulateCrash): bytes appended since a file's last Sync are dropped,
//     and creations, renames and deletions not made durable by SyncDir on their directory are
//     undone, newest first.
//
//   std::unique_ptr<MemEnv> mem = NewMemEnv();
//   FaultInjectionEnv env(mem.get());
//   env.FailAfter(7);                       // the 8th mutating call and all later ones fail
//   absl::Status s = SaveSomething(&env);   // fails part-way, as if the process died there
//   KILN_CHECK_OK(env.SimulateCrash());     // the disk as a reboot would find it
//   ... reopen through &env and check that the previous state is intact ...
//
// The durability model is the one env.h states. A directory rename moves what is inside it: a
// file created in a renamed directory whose own entry was synced stays in that directory when
// the rename is undone. Content is restored from the last synced state: a deleted or replaced
// file comes back with the bytes it had at its last Sync (all of them if it was not written
// through this Env). Reads are never failed and see unsynced data, as an OS page cache would.
//
// Thread-safe; every call through it is serialized. The target must outlive it.
#ifndef KILN_BASE_FAULT_INJECTION_ENV_H_
#define KILN_BASE_FAULT_INJECTION_ENV_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kiln/base/env.h"

namespace kiln {

class FaultInjectionEnv final : public Env {
 public:
  // Kinds of mutating operation, for FailNth masks.
  enum Op : uint32_t {
    kCreateFile = 1u << 0,  // NewWritableFile, NewAppendableFile, NewExclusiveFile
    kAppend = 1u << 1,
    kFlush = 1u << 2,
    kSync = 1u << 3,
    kClose = 1u << 4,
    kDeleteFile = 1u << 5,
    kCreateDir = 1u << 6,
    kDeleteDir = 1u << 7,
    kRename = 1u << 8,
    kSyncDir = 1u << 9,
    kAllMutations = (1u << 10) - 1,
  };

  explicit FaultInjectionEnv(Env* target);
  ~FaultInjectionEnv() override;

  // The n-th (0-based, counted from this call) operation whose kind is in `ops` fails once and
  // does nothing. Replaces an earlier FailNth.
  void FailNth(uint32_t ops, int64_t n);
  // Mutating operations number n, n + 1, ... (0-based, counted from this call) all fail and do
  // nothing. FailAfter(0) fails everything from now on.
  void FailAfter(int64_t n);
  void ClearFailures();
  // Mutating operations attempted through this Env, and how many were failed on purpose.
  int64_t mutation_count() const;
  int64_t injected_failures() const;

  // Power loss, as described above. Every WritableFile from this Env must have been destroyed
  // (FailedPrecondition otherwise). Clears the failure settings; afterwards everything on the
  // target is considered durable.
  //
  // `keep_oldest` lets the oldest that many undurable namespace changes survive anyway, as when
  // a journaling file system happened to commit them (in order) before the power went: sweeping
  // it from 0 to pending_changes() covers every prefix of the changes reaching the disk.
  absl::Status SimulateCrash(size_t keep_oldest = 0);
  // Namespace changes (creations, renames, deletions) not yet made durable by SyncDir.
  size_t pending_changes() const;
  // Forgets unsynced state: everything written so far counts as durable.
  void MarkAllDurable();

  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  // Counts as kCreateFile. Bytes already in the file count as synced.
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
  // Counts as kCreateFile; AlreadyExists (from the target) if something is at `path`.
  absl::StatusOr<std::unique_ptr<WritableFile>> NewExclusiveFile(const std::string& path) override;
  bool FileExists(const std::string& path) override;
  absl::StatusOr<bool> IsDirectory(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override;
  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::Status DeleteDir(const std::string& dir) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  std::string GetTempDirectory() override;
  uint64_t NowMicros() override;
  void SleepForMicros(int64_t micros) override;
  uint64_t RandomU64() override;

  // Internal, shared with the file wrapper.
  struct FileState {
    uint64_t size = 0;    // bytes appended
    uint64_t synced = 0;  // bytes durable
  };

 private:
  friend class FaultWritableFile;

  // What a deleted or replaced entry held, to put it back.
  struct Snapshot {
    bool is_dir = false;
    std::string file_bytes;                    // is_dir == false
    std::vector<std::string> dirs;             // relative to the entry, parents first
    std::map<std::string, std::string> files;  // relative path -> bytes
  };
  // The paths of an earlier pending change before a rename moved the entries they name.
  struct Rebased {
    uint64_t id;
    std::string path, from;
    std::set<std::string> unsynced_dirs;
  };
  // A namespace change not yet durable.
  struct Pending {
    enum Kind { kCreatedFile, kCreatedDir, kDeletedFile, kDeletedDir, kRenamed };
    Kind kind = kCreatedFile;
    std::string path;  // the entry (for kRenamed: the destination)
    std::string from;  // kRenamed: the source
    bool has_replaced = false;
    Snapshot replaced;                    // kDeleted*: what was deleted; kRenamed: what `to` held
    std::set<std::string> unsynced_dirs;  // durable once all of these are synced
    uint64_t id = 0;
    std::vector<Rebased> rebased;  // kRenamed: earlier changes it moved, to move them back
  };

  absl::Status CheckFault(Op op, const std::string& path);
  absl::StatusOr<Snapshot> TakeSnapshotLocked(const std::string& path);
  absl::Status RestoreSnapshotLocked(const std::string& path, const Snapshot& snap);
  absl::Status UndoLocked(size_t index);
  static Pending NewPending(Pending::Kind kind, std::string path, std::set<std::string> dirs);
  void AddPendingLocked(Pending op);
  uint64_t SyncedBytesLocked(const std::string& path, uint64_t actual) const;
  enum class OpenMode { kTruncate, kAppend, kExclusive };
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path,
                                                             OpenMode mode);

  Env* const target_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<FileState>> files_;  // files written through this Env
  std::vector<Pending> pending_;
  uint64_t next_id_ = 1;
  int64_t open_files_ = 0;
  int64_t mutations_ = 0;
  int64_t injected_ = 0;
  int64_t fail_after_ = -1;  // fail once mutations_since_fail_after_ reaches this
  int64_t mutations_since_fail_after_ = 0;
  uint32_t nth_mask_ = 0;
  int64_t nth_ = -1;
  int64_t nth_seen_ = 0;
};

}  // namespace kiln

#endif  // KILN_BASE_FAULT_INJECTION_ENV_H_
