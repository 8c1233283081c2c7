// One conformance suite run against Env::Default() (in a temporary directory) and MemEnv, so the
// in-memory Env that other tests rely on behaves like the real file system.
#include "kiln/base/env.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"
#include "kiln/base/status.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

enum class Kind { kPosix, kMem };

// In a forked child: waits until `fd` reads end-of-file (the test closed the pipe's other end) or
// 10 s pass, then exits. Runs nothing of the test and never execs.
[[noreturn]] void WaitForEofAndExit(int fd) {
  pollfd p = {fd, POLLIN, 0};
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    if (::poll(&p, 1, 100) > 0) break;
  }
  _exit(0);
}

// Reads `n` bytes from `fd`, waiting at most 10 s for them; false if they did not come.
bool ReadWithin10s(int fd, void* out, size_t n) {
  pollfd p = {fd, POLLIN, 0};
  return ::poll(&p, 1, 10000) == 1 && ::read(fd, out, n) == static_cast<ssize_t>(n);
}

// Waits up to `seconds` for the child `pid` to exit and returns its wait status; after that it is
// SIGKILLed, reaped, and the result is -1.
int ReapWithin(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

// Children a test started: SIGKILLed and reaped at the end of the scope unless already reaped.
struct Children {
  ~Children() {
    for (pid_t pid : pids) {
      if (pid > 0 && ::waitpid(pid, nullptr, WNOHANG) == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  }
  std::vector<pid_t> pids;
};

class EnvTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::kPosix) {
      env_ = Env::Default();
      static int counter = 0;
      root_ = ::testing::TempDir() + "/kiln_env_test_" + std::to_string(::getpid()) + "_" +
              std::to_string(counter++);
      if (env_->FileExists(root_)) KILN_CHECK_OK(env_->DeleteDir(root_));
    } else {
      mem_ = NewMemEnv();
      env_ = mem_.get();
      root_ = "/tmp/kiln_env_test";
    }
    KILN_CHECK_OK(env_->CreateDir(root_));
  }
  void TearDown() override {
    if (GetParam() == Kind::kPosix && env_->FileExists(root_)) (void)env_->DeleteDir(root_);
  }
  std::string P(const std::string& rel) const { return JoinPath(root_, rel); }
  void Write(const std::string& rel, const std::string& data) {
    KILN_CHECK_OK(WriteStringToFile(env_, data, P(rel), /*sync=*/true));
  }
  std::string Read(const std::string& rel) {
    absl::StatusOr<std::string> s = ReadFileToString(env_, P(rel));
    KILN_CHECK_OK(s.status());
    return *s;
  }

  Env* env_ = nullptr;
  std::unique_ptr<MemEnv> mem_;
  std::string root_;
};

TEST_P(EnvTest, WriteAppendFlushSyncCloseAndReadBack) {
  absl::StatusOr<std::unique_ptr<WritableFile>> f = env_->NewWritableFile(P("a.txt"));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("hello ").ok());
  ASSERT_TRUE((*f)->Flush().ok());
  // A large append bypasses the write buffer; order must be kept.
  const std::string big(200000, 'x');
  ASSERT_TRUE((*f)->Append(big).ok());
  ASSERT_TRUE((*f)->Append("world").ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ((*f)->Append("more").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Read("a.txt"), "hello " + big + "world");
  absl::StatusOr<uint64_t> size = env_->GetFileSize(P("a.txt"));
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 6 + big.size() + 5);
}

TEST_P(EnvTest, NewWritableFileTruncates) {
  Write("a", "long contents");
  Write("a", "short");
  EXPECT_EQ(Read("a"), "short");
}

TEST_P(EnvTest, NewAppendableFileAppendsOrCreates) {
  Write("log", "first ");
  absl::StatusOr<std::unique_ptr<WritableFile>> f = env_->NewAppendableFile(P("log"));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("second").ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(Read("log"), "first second");
  f = env_->NewAppendableFile(P("fresh"));
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append("x").ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(Read("fresh"), "x");
  EXPECT_EQ(env_->NewAppendableFile(P("no/dir/f")).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(EnvTest, NewExclusiveFileCreatesOnlyWhatIsNotThere) {
  absl::StatusOr<std::unique_ptr<WritableFile>> f = env_->NewExclusiveFile(P("once"));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("first").ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(Read("once"), "first");
  // Neither an existing file (kept as it was) nor a directory can be created again.
  f = env_->NewExclusiveFile(P("once"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(f.status().message(), HasSubstr("once"));
  EXPECT_EQ(Read("once"), "first");
  ASSERT_TRUE(env_->CreateDir(P("d")).ok());
  EXPECT_EQ(env_->NewExclusiveFile(P("d")).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(env_->NewExclusiveFile(P("no/dir/f")).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(EnvTest, NewExclusiveFileHasOneWinnerAmongRacingCreators) {
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::atomic<int> won{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      absl::StatusOr<std::unique_ptr<WritableFile>> f = env_->NewExclusiveFile(P("race"));
      if (f.ok()) {
        ++won;
      } else {
        EXPECT_EQ(f.status().code(), absl::StatusCode::kAlreadyExists);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
}

TEST_P(EnvTest, SequentialAndRandomAccessReads) {
  Write("f", "0123456789");
  absl::StatusOr<std::unique_ptr<SequentialFile>> s = env_->NewSequentialFile(P("f"));
  ASSERT_TRUE(s.ok());
  char scratch[16];
  std::string_view got;
  ASSERT_TRUE((*s)->Read(3, &got, scratch).ok());
  EXPECT_EQ(got, "012");
  ASSERT_TRUE((*s)->Skip(2).ok());
  ASSERT_TRUE((*s)->Read(16, &got, scratch).ok());
  EXPECT_EQ(got, "56789");
  ASSERT_TRUE((*s)->Read(16, &got, scratch).ok());
  EXPECT_TRUE(got.empty());

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(P("f"));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*r)->Read(4, 3, &got, scratch).ok());
  EXPECT_EQ(got, "456");
  ASSERT_TRUE((*r)->Read(8, 10, &got, scratch).ok());
  EXPECT_EQ(got, "89");
  ASSERT_TRUE((*r)->Read(100, 10, &got, scratch).ok());
  EXPECT_TRUE(got.empty());
}

TEST_P(EnvTest, MissingFilesAreNotFoundAndNameThePath) {
  absl::StatusOr<std::string> s = ReadFileToString(env_, P("nope"));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(P("nope")));
  EXPECT_EQ(env_->NewRandomAccessFile(P("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->GetFileSize(P("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->DeleteFile(P("nope")).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->DeleteDir(P("nope")).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->IsDirectory(P("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->GetChildren(P("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->RenameFile(P("nope"), P("x")).code(), absl::StatusCode::kNotFound);
  // A file's directory must exist.
  absl::StatusOr<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(P("no/dir/f"));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("no/dir/f"));
  EXPECT_FALSE(env_->FileExists(P("nope")));
}

TEST_P(EnvTest, CreateDirIsRecursiveAndIdempotent) {
  ASSERT_TRUE(env_->CreateDir(P("a/b/c")).ok());
  ASSERT_TRUE(env_->CreateDir(P("a/b/c")).ok());
  ASSERT_TRUE(env_->CreateDir(P("a/b/c/")).ok());
  EXPECT_TRUE(env_->FileExists(P("a/b")));
  EXPECT_TRUE(*env_->IsDirectory(P("a/b/c")));
  Write("a/file", "x");
  EXPECT_FALSE(*env_->IsDirectory(P("a/file")));
  // A file in the way is an error, not a silent success.
  EXPECT_FALSE(env_->CreateDir(P("a/file")).ok());
  EXPECT_FALSE(env_->CreateDir(P("a/file/sub")).ok());
}

TEST_P(EnvTest, GetChildrenListsNamesSorted) {
  ASSERT_TRUE(env_->CreateDir(P("d/sub")).ok());
  Write("d/b", "1");
  Write("d/a", "2");
  Write("d/sub/deep", "3");
  absl::StatusOr<std::vector<std::string>> c = env_->GetChildren(P("d"));
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(*c, ElementsAre("a", "b", "sub"));
  EXPECT_THAT(*env_->GetChildren(P("d/sub")), ElementsAre("deep"));
  ASSERT_TRUE(env_->CreateDir(P("empty")).ok());
  EXPECT_THAT(*env_->GetChildren(P("empty")), IsEmpty());
}

TEST_P(EnvTest, DeleteFileAndDeleteDirRecursively) {
  ASSERT_TRUE(env_->CreateDir(P("d/x/y")).ok());
  Write("d/x/y/f", "1");
  Write("d/g", "2");
  Write("keep", "3");
  ASSERT_TRUE(env_->DeleteFile(P("d/g")).ok());
  EXPECT_FALSE(env_->FileExists(P("d/g")));
  EXPECT_FALSE(env_->DeleteFile(P("d/x")).ok());  // a directory
  EXPECT_FALSE(env_->DeleteDir(P("keep")).ok());  // a file
  ASSERT_TRUE(env_->DeleteDir(P("d")).ok());
  EXPECT_FALSE(env_->FileExists(P("d")));
  EXPECT_FALSE(env_->FileExists(P("d/x/y/f")));
  EXPECT_THAT(*env_->GetChildren(root_), ElementsAre("keep"));
}

TEST_P(EnvTest, RenameFileReplacesAndRenameDirMovesSubtree) {
  Write("a", "new");
  Write("b", "old");
  ASSERT_TRUE(env_->RenameFile(P("a"), P("b")).ok());
  EXPECT_FALSE(env_->FileExists(P("a")));
  EXPECT_EQ(Read("b"), "new");

  ASSERT_TRUE(env_->CreateDir(P("tmp/sub")).ok());
  Write("tmp/f", "1");
  Write("tmp/sub/g", "2");
  ASSERT_TRUE(env_->RenameFile(P("tmp"), P("final")).ok());
  EXPECT_FALSE(env_->FileExists(P("tmp")));
  EXPECT_EQ(Read("final/f"), "1");
  EXPECT_EQ(Read("final/sub/g"), "2");
  EXPECT_THAT(*env_->GetChildren(root_), ElementsAre("b", "final"));

  // Onto an empty directory: allowed. Onto a non-empty one: refused, nothing moves.
  ASSERT_TRUE(env_->CreateDir(P("empty")).ok());
  ASSERT_TRUE(env_->CreateDir(P("other")).ok());
  Write("other/z", "z");
  ASSERT_TRUE(env_->RenameFile(P("other"), P("empty")).ok());
  EXPECT_EQ(Read("empty/z"), "z");
  absl::Status s = env_->RenameFile(P("final"), P("empty"));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(Read("final/f"), "1");
  EXPECT_EQ(Read("empty/z"), "z");
  // A file onto a directory, and a directory into itself, are refused.
  EXPECT_FALSE(env_->RenameFile(P("b"), P("final")).ok());
  EXPECT_FALSE(env_->RenameFile(P("final"), P("final/sub/inner")).ok());
  EXPECT_EQ(Read("b"), "new");
}

TEST_P(EnvTest, SyncDir) {
  ASSERT_TRUE(env_->SyncDir(root_).ok());
  EXPECT_EQ(env_->SyncDir(P("missing")).code(), absl::StatusCode::kNotFound);
}

TEST_P(EnvTest, OpenFilesSurviveDeletion) {
  Write("f", "data");
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(P("f"));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(env_->DeleteFile(P("f")).ok());
  char scratch[8];
  std::string_view got;
  ASSERT_TRUE((*r)->Read(0, 4, &got, scratch).ok());
  EXPECT_EQ(got, "data");
}

TEST_P(EnvTest, ClockAndRandomness) {
  const uint64_t t0 = env_->NowMicros();
  EXPECT_GT(t0, 1600000000ull * 1000000ull);  // after 2020
  env_->SleepForMicros(2000);
  EXPECT_GE(env_->NowMicros(), t0 + 2000);
  EXPECT_NE(env_->RandomU64(), env_->RandomU64());
}

TEST_P(EnvTest, CreateTempDirMakesFreshFoldersUnderTheTempDirectory) {
  const std::string tmp = env_->GetTempDirectory();
  ASSERT_FALSE(tmp.empty());
  EXPECT_EQ(tmp[0], '/');
  absl::StatusOr<std::string> a = CreateTempDir(env_, "kiln-env-test-");
  absl::StatusOr<std::string> b = CreateTempDir(env_, "kiln-env-test-");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*a, *b);
  EXPECT_EQ(Dirname(*a), tmp);
  EXPECT_EQ(Basename(*a).rfind("kiln-env-test-", 0), 0u);
  EXPECT_EQ(Basename(*a).size(), std::string("kiln-env-test-").size() + 16);
  EXPECT_TRUE(*env_->IsDirectory(*a));
  EXPECT_TRUE(env_->GetChildren(*a)->empty());
  EXPECT_TRUE(env_->DeleteDir(*a).ok());
  EXPECT_TRUE(env_->DeleteDir(*b).ok());
}

TEST_P(EnvTest, ConcurrentWritersToDifferentFiles) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 20; ++i) {
        KILN_CHECK_OK(WriteStringToFile(env_, std::string(100 + i, 'a' + t),
                                        P("t" + std::to_string(t) + "_" + std::to_string(i))));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(env_->GetChildren(root_)->size(), 80u);
  EXPECT_EQ(Read("t2_19"), std::string(119, 'c'));
}

TEST_P(EnvTest, LockFileIsExclusiveUntilReleasedAndKeepsTheBytes) {
  const std::string lock = P(".lock");
  absl::StatusOr<std::unique_ptr<FileLock>> a = env_->LockFile(lock);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(env_->FileExists(lock));
  KILN_CHECK_OK(WriteStringToFile(env_, "123\n", lock));
  absl::StatusOr<std::unique_ptr<FileLock>> b = env_->LockFile(lock);
  EXPECT_TRUE(absl::IsUnavailable(b.status())) << b.status();
  a->reset();
  b = env_->LockFile(lock);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Read(".lock"), "123\n");
  EXPECT_FALSE(env_->LockFile(P("no/such/dir/.lock")).ok());
}

// A child made by fork() that does not exec and is still running (the DICOM decoder's child, a
// supervisor's child before its exec) holds no share of its parent's lock: once the parent lets
// go, the lock is free.
TEST_P(EnvTest, LockIsFreeOnceReleasedWhileAForkedChildStillRuns) {
  const std::string lock = P(".lock");
  absl::StatusOr<std::unique_ptr<FileLock>> a = env_->LockFile(lock);
  ASSERT_TRUE(a.ok()) << a.status();
  int hold[2], ready[2];
  ASSERT_EQ(::pipe(hold), 0);
  ASSERT_EQ(::pipe(ready), 0);
  Children children;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(hold[1]);
    (void)!::write(ready[1], "r", 1);  // fork() has returned here: its handlers have run
    WaitForEofAndExit(hold[0]);
  }
  children.pids.push_back(child);
  ::close(hold[0]);
  char c = 0;
  ASSERT_TRUE(ReadWithin10s(ready[0], &c, 1));
  a->reset();
  absl::StatusOr<std::unique_ptr<FileLock>> b = env_->LockFile(lock);
  EXPECT_EQ(::waitpid(child, nullptr, WNOHANG), 0) << "the forked child should still be running";
  EXPECT_TRUE(b.ok()) << b.status() << " (the forked child kept the lock)";
  ::close(hold[1]);
  const int status = ReapWithin(child, 10);
  EXPECT_TRUE(status != -1 && WIFEXITED(status)) << status;
  ::close(ready[0]);
  ::close(ready[1]);
}

INSTANTIATE_TEST_SUITE_P(AllEnvs, EnvTest, ::testing::Values(Kind::kPosix, Kind::kMem),
                         [](const auto& info) {
                           return info.param == Kind::kPosix ? "Posix" : "Mem";
                         });

std::string PosixTempDir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/kiln_env_test_" + name + "_" + std::to_string(::getpid());
  if (Env::Default()->FileExists(dir)) KILN_CHECK_OK(Env::Default()->DeleteDir(dir));
  KILN_CHECK_OK(Env::Default()->CreateDir(dir));
  return dir;
}

// What train_sigkill_test's restarts do, with a holder that has a forked child: the holder takes
// the lock, forks a child that goes on running without exec, and is SIGKILLed and reaped; the
// next process must get the lock at once, while that child still runs.
TEST(PosixLockTest, LockOfAKilledHolderIsFreeWhileItsForkedChildStillRuns) {
  const std::string dir = PosixTempDir("killed_holder");
  const std::string lock = JoinPath(dir, ".lock");
  // The holder's orphaned child becomes ours, so that we can reap it by its pid.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int hold[2], report[2];
  ASSERT_EQ(::pipe(hold), 0);
  ASSERT_EQ(::pipe(report), 0);
  Children children;
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    ::close(report[0]);
    ::close(hold[1]);
    absl::StatusOr<std::unique_ptr<FileLock>> l = Env::Default()->LockFile(lock);
    const pid_t grandchild = l.ok() ? ::fork() : -1;
    if (grandchild <= 0) {
      // The grandchild (after fork() returned, so its handlers have run) reports its pid; a
      // holder that could not lock or fork reports -1.
      const pid_t me = grandchild == 0 ? ::getpid() : -1;
      (void)!::write(report[1], &me, sizeof(me));
    }
    ::close(report[1]);
    WaitForEofAndExit(hold[0]);  // the grandchild until the test lets go, the holder until killed
  }
  children.pids.push_back(holder);
  ::close(hold[0]);
  ::close(report[1]);
  pid_t grandchild = -1;
  ASSERT_TRUE(ReadWithin10s(report[0], &grandchild, sizeof(grandchild)));
  ::close(report[0]);
  ASSERT_GT(grandchild, 0) << "the holder could not take the lock or fork";
  children.pids.push_back(grandchild);
  EXPECT_TRUE(absl::IsUnavailable(Env::Default()->LockFile(lock).status()));

  ::kill(holder, SIGKILL);
  const int killed = ReapWithin(holder, 10);
  EXPECT_TRUE(killed != -1 && WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL) << killed;
  absl::StatusOr<std::unique_ptr<FileLock>> next = Env::Default()->LockFile(lock);
  EXPECT_EQ(::waitpid(grandchild, nullptr, WNOHANG), 0)
      << "the holder's forked child should still be running";
  EXPECT_TRUE(next.ok()) << next.status() << " (the holder's forked child kept the lock)";

  ::close(hold[1]);
  const int status = ReapWithin(grandchild, 10);
  EXPECT_TRUE(status != -1 && WIFEXITED(status)) << status;
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  (void)Env::Default()->DeleteDir(dir);
}

// A child that ran no fork handler (a raw clone, as some libraries make) still has the lock's
// descriptor; the holder's release unlocks the description itself, so the lock is free anyway.
TEST(PosixLockTest, LockIsFreeOnceReleasedWhileAChildWithoutForkHandlersRuns) {
  const std::string dir = PosixTempDir("raw_clone");
  const std::string lock = JoinPath(dir, ".lock");
  absl::StatusOr<std::unique_ptr<FileLock>> a = Env::Default()->LockFile(lock);
  ASSERT_TRUE(a.ok()) << a.status();
  int hold[2];
  ASSERT_EQ(::pipe(hold), 0);
  Children children;
  // fork() without glibc's wrapper: a new process, and no pthread_atfork handler runs.
  const pid_t child = static_cast<pid_t>(::syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0));
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(hold[1]);
    WaitForEofAndExit(hold[0]);
  }
  children.pids.push_back(child);
  ::close(hold[0]);
  a->reset();
  absl::StatusOr<std::unique_ptr<FileLock>> b = Env::Default()->LockFile(lock);
  EXPECT_EQ(::waitpid(child, nullptr, WNOHANG), 0) << "the child should still be running";
  EXPECT_TRUE(b.ok()) << b.status() << " (the child kept the lock)";
  ::close(hold[1]);
  const int status = ReapWithin(child, 10);
  EXPECT_TRUE(status != -1 && WIFEXITED(status)) << status;
  (void)Env::Default()->DeleteDir(dir);
}

// Destroying the copy of a FileLock in a forked child neither releases the parent's lock nor
// closes a descriptor of the child's that reused the lock's number.
TEST(PosixLockTest, AForkedChildCannotReleaseItsParentsLock) {
  const std::string dir = PosixTempDir("child_release");
  const std::string lock = JoinPath(dir, ".lock");
  absl::StatusOr<std::unique_ptr<FileLock>> a = Env::Default()->LockFile(lock);
  ASSERT_TRUE(a.ok()) << a.status();
  Children children;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int other = ::open("/dev/null", O_RDONLY);  // likely the lock's old number
    a->reset();
    const bool other_open = ::fcntl(other, F_GETFD) != -1;
    const bool still_held = absl::IsUnavailable(Env::Default()->LockFile(lock).status());
    _exit(other_open && still_held ? 0 : 1);
  }
  children.pids.push_back(child);
  const int status = ReapWithin(child, 10);
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(absl::IsUnavailable(Env::Default()->LockFile(lock).status()))
      << "the parent lost its lock";
  a->reset();
  EXPECT_TRUE(Env::Default()->LockFile(lock).ok());
  (void)Env::Default()->DeleteDir(dir);
}

TEST(MemEnvTest, ManualClockAndSeededRandomness) {
  MemEnv a(1000, 42), b(1000, 42);
  EXPECT_EQ(a.NowMicros(), 1000u);
  a.SleepForMicros(500);
  EXPECT_EQ(a.NowMicros(), 1500u);
  a.AdvanceMicros(10);
  EXPECT_EQ(a.NowMicros(), 1510u);
  a.SetNowMicros(7);
  EXPECT_EQ(a.NowMicros(), 7u);
  EXPECT_EQ(a.RandomU64(), b.RandomU64());
}

TEST(MemEnvTest, TempDirectoryIsTmp) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  EXPECT_EQ(env->GetTempDirectory(), "/tmp");
  absl::StatusOr<std::string> d = CreateTempDir(env.get(), "x");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(Dirname(*d), "/tmp");  // created with its parent
}

TEST(PosixEnvTest, TempDirectoryFollowsAbsoluteTmpdir) {
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("TMPDIR", "/var//tmp/", 1);
  EXPECT_EQ(Env::Default()->GetTempDirectory(), "/var/tmp");
  ::setenv("TMPDIR", "relative", 1);
  EXPECT_EQ(Env::Default()->GetTempDirectory(), "/tmp");
  if (old != nullptr) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
}

TEST(MemEnvTest, RelativePathsAndTotalBytes) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  KILN_CHECK_OK(env->CreateDir("rel/dir"));
  KILN_CHECK_OK(WriteStringToFile(env.get(), "abc", "rel/dir/f"));
  KILN_CHECK_OK(WriteStringToFile(env.get(), "de", "top"));
  KILN_CHECK_OK(env->CreateDir("/abs"));
  EXPECT_THAT(*env->GetChildren(""), ElementsAre("rel", "top"));
  EXPECT_THAT(*env->GetChildren("/"), ElementsAre("abs"));
  EXPECT_THAT(*env->GetChildren("./rel//dir/"), ElementsAre("f"));
  EXPECT_EQ(env->TotalFileBytes(), 5u);
}

TEST(PathTest, JoinDirnameBasenameClean) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(JoinPath("a", "/b"), "/b");
  EXPECT_EQ(Dirname("/a/b"), "/a");
  EXPECT_EQ(Dirname("/a/b/"), "/a");
  EXPECT_EQ(Dirname("/a"), "/");
  EXPECT_EQ(Dirname("a"), "");
  EXPECT_EQ(Basename("/a/b"), "b");
  EXPECT_EQ(Basename("/a/b//"), "b");
  EXPECT_EQ(Basename("b"), "b");
  EXPECT_EQ(CleanPath("//a//./b/"), "/a/b");
  EXPECT_EQ(CleanPath("./a"), "a");
  EXPECT_EQ(CleanPath("/"), "/");
  EXPECT_EQ(CleanPath("."), ".");
}

}  // namespace
}  // namespace kiln
