#include "kiln/train/run_dir.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("kiln_run_dir_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  return p.string();
}

void Write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// Issue 13 case 3: a second trainer on one folder is refused, naming the holder's pid.
TEST(RunDirLockTest, SecondHolderIsRefusedNamingThePid) {
  const std::string dir = TempDir("lock");
  auto first = RunDirLock::Acquire(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = RunDirLock::Acquire(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr("in use by another kiln train (process " + std::to_string(getpid())));
  EXPECT_THAT(second.status().message(), HasSubstr("--output-dir"));
  first->reset();
  EXPECT_TRUE(RunDirLock::Acquire(dir).ok());  // released with its holder
  fs::remove_all(dir);
}

TEST(RunDirLockTest, ALockOfAKilledProcessIsFreeAtOnce) {
  const std::string dir = TempDir("killed");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    auto lock = RunDirLock::Acquire(dir);
    char c = lock.ok() ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  auto refused = RunDirLock::Acquire(dir);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("process " + std::to_string(child)));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(RunDirLock::Acquire(dir).ok());
  close(ready[0]);
  close(ready[1]);
  fs::remove_all(dir);
}

// Between a holder's lock and its pid write, .lock still names the previous holder: a refusal
// then must not tell the user to kill a process that has exited.
TEST(RunDirLockTest, AStalePidIsNotNamedAsTheHolder) {
  const std::string dir = TempDir("stale");
  fs::create_directories(dir);
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  ASSERT_GT(gone, 0);
  int status = 0;
  ASSERT_EQ(waitpid(gone, &status, 0), gone);
  const std::string path = (fs::path(dir) / kRunLockName).string();
  Write(path, std::to_string(gone) + "\n");
  auto held = Env::Default()->LockFile(path);  // a holder that has not written its pid yet
  ASSERT_TRUE(held.ok()) << held.status();
  auto refused = RunDirLock::Acquire(dir);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("another process holds " + path));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the pid there, " + std::to_string(gone) + ", runs on no process"));
  EXPECT_THAT(refused.status().message(), Not(HasSubstr("kill " + std::to_string(gone))));
  fs::remove_all(dir);
}

// Issue 13 case 2: a fresh start on an older run moves that run aside and deletes nothing.
TEST(RunDirTest, InspectAndMoveAsideKeepEverything) {
  const fs::path dir = TempDir("aside");
  PreviousRun none = *InspectRunDir(dir.string());
  EXPECT_FALSE(none.exists);
  Write(dir / "config.yaml", "steps: 10\n");
  Write(dir / "run.json", "{\"run_id\": \"0123456789abcdef\"}\n");
  Write(dir / "metrics.jsonl", "{\"step\":1}\n");
  Write(dir / "events.out.tfevents.1.host", "x");
  Write(dir / "checkpoints/step_5/manifest.json", "{}");
  Write(dir / "checkpoints/step_10/manifest.json", "{}");
  Write(dir / "my_notes.txt", "the user's own file");
  PreviousRun prev = *InspectRunDir(dir.string());
  EXPECT_TRUE(prev.exists);
  EXPECT_EQ(prev.run_id, "0123456789abcdef");
  EXPECT_THAT(prev.steps, ElementsAre(5, 10));
  EXPECT_EQ(ReadRunJsonId(dir.string()), "0123456789abcdef");

  absl::Status refusal = FreshStartRefusal(dir.string(), prev);
  EXPECT_THAT(refusal.message(),
              HasSubstr("already holds run 0123456789abcdef with checkpoints step_5..step_10"));
  EXPECT_THAT(refusal.message(), HasSubstr("add --replace"));

  absl::StatusOr<std::string> aside = MoveRunAside(dir.string());
  ASSERT_TRUE(aside.ok()) << aside.status();
  EXPECT_THAT(*aside, HasSubstr((dir / "replaced-").string()));
  for (const char* f : {"config.yaml", "run.json", "metrics.jsonl", "events.out.tfevents.1.host",
                        "checkpoints/step_5/manifest.json", "checkpoints/step_10/manifest.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(*aside) / f)) << f;
    EXPECT_FALSE(fs::exists(dir / f)) << f;
  }
  EXPECT_TRUE(fs::exists(dir / "my_notes.txt"));  // not the run's: left alone
  EXPECT_FALSE(InspectRunDir(dir.string())->exists);
  // A second replacement in the same second gets its own folder.
  Write(dir / "run.json", "{}");
  absl::StatusOr<std::string> again = MoveRunAside(dir.string());
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, *aside);
  fs::remove_all(dir);
}

TEST(RunDirTest, RunIdsAreSixteenHexDigitsAndDiffer) {
  std::string a = NewRunId(), b = NewRunId();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace kiln::train
