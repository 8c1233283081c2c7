// Env::Default(): the POSIX implementation.
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"

namespace kiln {
namespace {

// "<what> <path>: <strerror>" with the errno-derived code.
absl::Status PosixError(int err, const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixSequentialFile() override { ::close(fd_); }

  absl::Status Read(size_t n, std::string_view* result, char* scratch) override {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::read(fd_, scratch + got, n - got);
      if (r < 0) {
        if (errno == EINTR) continue;
        return PosixError(errno, "cannot read", path_);
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    *result = std::string_view(scratch, got);
    return absl::OkStatus();
  }

  absl::Status Skip(uint64_t n) override {
    if (::lseek(fd_, static_cast<off_t>(n), SEEK_CUR) < 0) {
      return PosixError(errno, "cannot seek in", path_);
    }
    return absl::OkStatus();
  }

 private:
  int fd_;
  std::string path_;
};

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  absl::Status Read(uint64_t offset, size_t n, std::string_view* result,
                    char* scratch) const override {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd_, scratch + got, std::min<size_t>(n - got, size_t{1} << 30),
                          static_cast<off_t>(offset + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        return PosixError(errno, absl::StrCat("cannot read at offset ", offset + got, " of"),
                          path_);
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    *result = std::string_view(scratch, got);
    return absl::OkStatus();
  }

 private:
  int fd_;
  std::string path_;
};

// Buffers small appends; large ones go straight to write(2).
class PosixWritableFile final : public WritableFile {
 public:
  static constexpr size_t kBufferSize = 64 * 1024;

  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {
    buffer_.reserve(kBufferSize);
  }
  ~PosixWritableFile() override {
    if (fd_ >= 0) (void)Close();
  }

  absl::Status Append(std::string_view data) override {
    KILN_RETURN_IF_ERROR(CheckOpen());
    if (buffer_.size() + data.size() <= kBufferSize) {
      buffer_.append(data.data(), data.size());
      return absl::OkStatus();
    }
    KILN_RETURN_IF_ERROR(FlushBuffer());
    if (data.size() < kBufferSize) {
      buffer_.append(data.data(), data.size());
      return absl::OkStatus();
    }
    return WriteRaw(data.data(), data.size());
  }

  absl::Status Flush() override {
    KILN_RETURN_IF_ERROR(CheckOpen());
    return FlushBuffer();
  }

  absl::Status Sync() override {
    KILN_RETURN_IF_ERROR(CheckOpen());
    KILN_RETURN_IF_ERROR(FlushBuffer());
    if (::fdatasync(fd_) != 0) return PosixError(errno, "cannot fsync", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    KILN_RETURN_IF_ERROR(CheckOpen());
    absl::Status s = FlushBuffer();
    if (::close(fd_) != 0 && s.ok()) s = PosixError(errno, "cannot close", path_);
    fd_ = -1;
    return s;
  }

 private:
  absl::Status CheckOpen() const {
    if (fd_ < 0) return absl::FailedPreconditionError("file already closed: " + path_);
    return absl::OkStatus();
  }

  absl::Status FlushBuffer() {
    absl::Status s = WriteRaw(buffer_.data(), buffer_.size());
    buffer_.clear();
    return s;
  }

  absl::Status WriteRaw(const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        return PosixError(errno, "cannot write", path_);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }

  int fd_;
  std::string path_;
  std::string buffer_;
};

absl::Status DeleteTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return PosixError(errno, "cannot stat", path);
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0) return PosixError(errno, "cannot delete", path);
    return absl::OkStatus();
  }
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return PosixError(errno, "cannot open directory", path);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  ::closedir(d);
  for (const std::string& name : names) KILN_RETURN_IF_ERROR(DeleteTree(JoinPath(path, name)));
  if (::rmdir(path.c_str()) != 0) return PosixError(errno, "cannot delete directory", path);
  return absl::OkStatus();
}

// Env::LockFile (the run lock of train/run_dir.h) is flock(2) on a descriptor of its own, and no
// child process ever shares it.
//
// A flock lock belongs to the open file description, not to the process or the descriptor: it
// ends when the holder calls LOCK_UN or when the last descriptor of that description is closed.
// fork() copies the descriptor table, so a child made by fork() holds a second reference to the
// description and with it the lock, until it closes that descriptor or exits; O_CLOEXEC closes it
// only at an exec, so a child that goes on running our code (the DICOM decoder's child,
// data/import/dicom/internal/isolated.h, or any fork() that does not exec) would keep the lock
// alive after its parent released it or was SIGKILLed. OFD locks (F_OFD_SETLK) belong to the
// description too, so they have the same problem. Process-associated fcntl(F_SETLK) locks are not
// inherited by fork(), but a process loses one when it closes *any* descriptor of the file (the
// pid write in train/run_dir.cc does exactly that), and they do not exclude a second holder in the
// same process.
//
// So: flock, released in two ways that no child can defeat.
//  - Release by the holder (the FileLock destroyed) is LOCK_UN, then close. LOCK_UN ends the lock
//    of the description itself, whatever other references to it exist, so it is free at once
//    even while a child of any kind (fork, vfork, a raw clone) still has a copy of the descriptor.
//  - When the holder dies instead (SIGKILL, a crash), nothing of ours runs, and the lock ends with
//    the description's last reference. So a pthread_atfork child handler closes every lock
//    descriptor in the child right after fork(): closing a duplicate drops only the child's
//    reference, the parent's lock is untouched. The one window left is between fork() and that
//    handler, before the child first runs: a holder killed in it holds the lock until the child
//    is scheduled (microseconds), not until the child exits.
// A FileLock copied into a child does nothing when destroyed there (it checks its owner's pid): a
// LOCK_UN there would release the parent's lock, and a close could hit an unrelated descriptor
// that reused the number. The table of lock descriptors is guarded by a mutex that the prepare
// handler takes, so a fork() never sees a descriptor that is opened or locked but not yet listed.
// Children made by posix_spawn, popen, system() or vfork() run no atfork handler, but they exec
// at once (or _exit), and O_CLOEXEC closes the descriptor there.
pthread_mutex_t g_lock_fds_mu = PTHREAD_MUTEX_INITIALIZER;

std::vector<int>& LockFds() {
  static auto* fds = new std::vector<int>();
  return *fds;
}

void LockFdsBeforeFork() { pthread_mutex_lock(&g_lock_fds_mu); }
void LockFdsAfterForkInParent() { pthread_mutex_unlock(&g_lock_fds_mu); }
void LockFdsAfterForkInChild() {
  for (int fd : LockFds()) ::close(fd);
  LockFds().clear();
  // The copy of the mutex is locked by the prepare handler of a thread that does not exist here.
  pthread_mutex_init(&g_lock_fds_mu, nullptr);
}

class LockFdsGuard {
 public:
  LockFdsGuard() {
    static std::once_flag registered;
    std::call_once(registered, [] {
      pthread_atfork(LockFdsBeforeFork, LockFdsAfterForkInParent, LockFdsAfterForkInChild);
    });
    pthread_mutex_lock(&g_lock_fds_mu);
  }
  ~LockFdsGuard() { pthread_mutex_unlock(&g_lock_fds_mu); }
  LockFdsGuard(const LockFdsGuard&) = delete;
  LockFdsGuard& operator=(const LockFdsGuard&) = delete;
};

// Released when destroyed in its own process, or when that process exits in any way.
class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd), owner_(::getpid()) {}
  ~PosixFileLock() override {
    // A child's copy: fork()'s handler closed fd_ there; a raw clone's copy ends with the child.
    if (::getpid() != owner_) return;
    LockFdsGuard guard;
    std::vector<int>& fds = LockFds();
    fds.erase(std::remove(fds.begin(), fds.end(), fd_), fds.end());
    ::flock(fd_, LOCK_UN);  // free now, even while a child still has a copy of fd_
    ::close(fd_);
  }

 private:
  int fd_;
  pid_t owner_;
};

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    // Open, lock and list the descriptor under the table's mutex, so that no fork() in between
    // hands the child a locked descriptor it does not know to close.
    LockFdsGuard guard;
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError(errno, "cannot open the lock", path);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) return absl::UnavailableError("lock " + path + " is held");
      return PosixError(err, "cannot lock", path);
    }
    LockFds().push_back(fd);
    return std::unique_ptr<FileLock>(new PosixFileLock(fd));
  }

  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError(errno, "cannot open", path);
    return std::make_unique<PosixSequentialFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError(errno, "cannot open", path);
    return std::make_unique<PosixRandomAccessFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError(errno, "cannot create", path);
    return std::make_unique<PosixWritableFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError(errno, "cannot open for appending", path);
    return std::make_unique<PosixWritableFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewExclusiveFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError(errno, "cannot create", path);
    return std::make_unique<PosixWritableFile>(fd, path);
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  absl::StatusOr<bool> IsDirectory(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError(errno, "cannot stat", path);
    return S_ISDIR(st.st_mode);
  }

  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError(errno, "cannot list directory", dir);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError(errno, "cannot stat", path);
    return static_cast<uint64_t>(st.st_size);
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError(errno, "cannot delete", path);
    return absl::OkStatus();
  }

  absl::Status CreateDir(const std::string& dir) override {
    const std::string clean = CleanPath(dir);
    // Create each missing prefix in turn.
    size_t pos = clean[0] == '/' ? 1 : 0;
    for (;;) {
      const size_t slash = clean.find('/', pos);
      const std::string prefix = slash == std::string::npos ? clean : clean.substr(0, slash);
      if (::mkdir(prefix.c_str(), 0755) != 0) {
        const int err = errno;
        struct stat st;
        if (err != EEXIST || ::stat(prefix.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
          return PosixError(err == EEXIST ? ENOTDIR : err, "cannot create directory", prefix);
        }
      }
      if (slash == std::string::npos) break;
      pos = slash + 1;
    }
    return absl::OkStatus();
  }

  absl::Status DeleteDir(const std::string& dir) override {
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0) return PosixError(errno, "cannot delete directory", dir);
    if (!S_ISDIR(st.st_mode)) return PosixError(ENOTDIR, "cannot delete directory", dir);
    return DeleteTree(dir);
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError(errno, "cannot rename " + from + " to", to);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const std::string d = dir.empty() ? "." : dir;
    int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PosixError(errno, "cannot open directory", d);
    absl::Status s;
    if (::fsync(fd) != 0) s = PosixError(errno, "cannot fsync directory", d);
    ::close(fd);
    return s;
  }

  std::string GetTempDirectory() override {
    const char* tmpdir = std::getenv("TMPDIR");  // NOLINT: the OS boundary is here
    if (tmpdir != nullptr && tmpdir[0] == '/') return CleanPath(tmpdir);
    return "/tmp";
  }

  uint64_t NowMicros() override {
    struct timeval tv;
    ::gettimeofday(&tv, nullptr);
    return static_cast<uint64_t>(tv.tv_sec) * 1000000u + static_cast<uint64_t>(tv.tv_usec);
  }

  void SleepForMicros(int64_t micros) override {
    if (micros > 0) std::this_thread::sleep_for(std::chrono::microseconds(micros));
  }

  uint64_t RandomU64() override {
    std::lock_guard<std::mutex> lock(rng_mu_);
    return rng_();
  }

 private:
  std::mutex rng_mu_;
  std::mt19937_64 rng_{
      std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32) ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
};

}  // namespace

Env* Env::Default() {
  static Env* const kDefault = new PosixEnv();
  return kDefault;
}

}  // namespace kiln
