// An Env held entirely in memory, for hermetic tests: a private directory tree (only "/" and
// the relative root "" exist at first), a manual clock and a seeded random source.
//
//   std::unique_ptr<MemEnv> env = NewMemEnv();
//   KILN_CHECK_OK(env->CreateDir("/ckpt"));
//   KILN_CHECK_OK(WriteStringToFile(env.get(), "hi", "/ckpt/a.txt"));
//   env->AdvanceMicros(5'000'000);                 // time moves only when told (or on Sleep)
//
// It follows POSIX semantics where Kiln depends on them: a file's directory must exist, renames
// of directories move their whole subtree and refuse a non-empty target, open files keep their
// data after deletion, and errors carry the codes Env::Default() gives (NotFound,
// AlreadyExists, FailedPrecondition, ...). Everything is durable at once: pair it with
// FaultInjectionEnv to model crashes.
#ifndef KILN_BASE_MEM_ENV_H_
#define KILN_BASE_MEM_ENV_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kiln/base/env.h"

namespace kiln {

class MemEnv final : public Env {
 public:
  // The clock starts at `start_micros` (default: 2024-01-01T00:00:00Z); RandomU64 is seeded by
  // `seed`.
  explicit MemEnv(uint64_t start_micros = 1704067200ull * 1000000ull, uint64_t seed = 1);
  ~MemEnv() override;

  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
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
  uint64_t NowMicros() override;
  // Advances the clock by `micros` and returns at once.
  void SleepForMicros(int64_t micros) override;
  uint64_t RandomU64() override;

  void AdvanceMicros(uint64_t micros);
  void SetNowMicros(uint64_t micros);
  // Total bytes held in files (for tests that check cleanup).
  uint64_t TotalFileBytes();

  struct FileData;  // shared by the namespace and open files

 private:
  bool IsDirLocked(const std::string& p) const;
  absl::Status CheckParentLocked(const std::string& p, const std::string& what) const;
  bool HasChildrenLocked(const std::string& dir) const;
  enum class OpenMode { kTruncate, kAppend, kExclusive };
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path,
                                                             OpenMode mode);

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<FileData>> files_;  // clean path -> data
  std::set<std::string> dirs_;                              // clean paths, not "/" or "."
  uint64_t now_micros_;
  std::mt19937_64 rng_;
};

std::unique_ptr<MemEnv> NewMemEnv();

}  // namespace kiln

#endif  // KILN_BASE_MEM_ENV_H_
