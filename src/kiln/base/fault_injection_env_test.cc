#include "kiln/base/fault_injection_env.h"

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"
#include "kiln/base/status.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class FaultInjectionEnvTest : public ::testing::Test {
 protected:
  FaultInjectionEnvTest() : mem_(NewMemEnv()), env_(mem_.get()) {
    KILN_CHECK_OK(mem_->CreateDir("/r"));
  }
  // Writes `data` to `path`, optionally syncing the data, then closes it.
  void Write(const std::string& path, const std::string& data, bool sync) {
    KILN_CHECK_OK(WriteStringToFile(&env_, data, path, sync));
  }
  std::string Read(const std::string& path) {
    absl::StatusOr<std::string> s = ReadFileToString(mem_.get(), path);
    KILN_CHECK_OK(s.status());
    return *s;
  }
  std::vector<std::string> Children(const std::string& dir) {
    absl::StatusOr<std::vector<std::string>> c = mem_->GetChildren(dir);
    KILN_CHECK_OK(c.status());
    return *c;
  }

  std::unique_ptr<MemEnv> mem_;
  FaultInjectionEnv env_;
};

TEST_F(FaultInjectionEnvTest, FailNthFailsExactlyThatOperationOfThoseKinds) {
  env_.FailNth(FaultInjectionEnv::kAppend, 2);
  absl::StatusOr<std::unique_ptr<WritableFile>> f = env_.NewWritableFile("/r/f");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->Append("a").ok());
  EXPECT_TRUE((*f)->Sync().ok());  // not an append: not counted
  EXPECT_TRUE((*f)->Append("b").ok());
  absl::Status s = (*f)->Append("c");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::ErrnoToStatusCode(EIO));
  EXPECT_THAT(std::string(s.message()), HasSubstr("injected fault"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("/r/f"));
  EXPECT_TRUE((*f)->Append("d").ok());  // only once
  EXPECT_TRUE((*f)->Close().ok());
  EXPECT_EQ(Read("/r/f"), "abd");  // the failed append did nothing
  EXPECT_EQ(env_.injected_failures(), 1);
  EXPECT_EQ(env_.mutation_count(), 7);  // create, 4 appends, sync, close
}

TEST_F(FaultInjectionEnvTest, TempDirectoryIsTheTargetsAndCreateTempDirCanFail) {
  EXPECT_EQ(env_.GetTempDirectory(), mem_->GetTempDirectory());
  absl::StatusOr<std::string> d = CreateTempDir(&env_, "scratch-");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(*mem_->IsDirectory(*d));
  env_.FailNth(FaultInjectionEnv::kCreateDir, 0);
  EXPECT_FALSE(CreateTempDir(&env_, "scratch-").ok());
}

TEST_F(FaultInjectionEnvTest, FailNthOnRenameAndSync) {
  Write("/r/a", "x", true);
  env_.FailNth(FaultInjectionEnv::kRename | FaultInjectionEnv::kSyncDir, 0);
  EXPECT_FALSE(env_.RenameFile("/r/a", "/r/b").ok());
  EXPECT_TRUE(mem_->FileExists("/r/a"));
  EXPECT_FALSE(mem_->FileExists("/r/b"));
  EXPECT_TRUE(env_.SyncDir("/r").ok());
  EXPECT_TRUE(env_.RenameFile("/r/a", "/r/b").ok());
}

TEST_F(FaultInjectionEnvTest, FailAfterFailsEverythingFromThatPointOn) {
  env_.FailAfter(2);
  EXPECT_TRUE(env_.CreateDir("/r/d").ok());
  absl::StatusOr<std::unique_ptr<WritableFile>> f = env_.NewWritableFile("/r/d/f");
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE((*f)->Append("a").ok());
  EXPECT_FALSE((*f)->Close().ok());
  EXPECT_FALSE(env_.DeleteDir("/r/d").ok());
  EXPECT_FALSE(env_.SyncDir("/r").ok());
  EXPECT_TRUE(mem_->FileExists("/r/d"));  // the failed delete did nothing
  EXPECT_EQ(env_.injected_failures(), 4);
  // Reads still work.
  EXPECT_TRUE(env_.FileExists("/r/d/f"));
  env_.ClearFailures();
  EXPECT_TRUE((*f)->Append("b").ok());
}

TEST_F(FaultInjectionEnvTest, CrashDropsUnsyncedAppends) {
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  {
    auto f = *env_.NewWritableFile("/r/f");
    ASSERT_TRUE(f->Append("abc").ok());
    ASSERT_TRUE(f->Sync().ok());
    ASSERT_TRUE(f->Append("def").ok());
    ASSERT_TRUE(f->Close().ok());
  }
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  EXPECT_EQ(Read("/r/f"), "abcdef");
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_EQ(Read("/r/f"), "abc");
}

TEST_F(FaultInjectionEnvTest, CrashDropsUnsyncedAppendsToAnExistingFile) {
  Write("/r/log", "durable;", /*sync=*/true);
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  {
    auto f = *env_.NewAppendableFile("/r/log");
    ASSERT_TRUE(f->Append("synced;").ok());
    ASSERT_TRUE(f->Sync().ok());
    ASSERT_TRUE(f->Append("lost").ok());
  }
  EXPECT_EQ(Read("/r/log"), "durable;synced;lost");
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_EQ(Read("/r/log"), "durable;synced;");
}

TEST_F(FaultInjectionEnvTest, ExclusiveCreateCountsAsCreateAndIsUndoneByACrash) {
  Write("/r/kept", "durable", /*sync=*/true);
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  EXPECT_EQ(env_.NewExclusiveFile("/r/kept").status().code(), absl::StatusCode::kAlreadyExists);
  env_.FailNth(FaultInjectionEnv::kCreateFile, 0);
  EXPECT_FALSE(env_.NewExclusiveFile("/r/new").ok());
  EXPECT_FALSE(env_.FileExists("/r/new"));
  {
    auto f = env_.NewExclusiveFile("/r/new");
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE((*f)->Append("data").ok());
    ASSERT_TRUE((*f)->Sync().ok());
  }
  EXPECT_EQ(Read("/r/new"), "data");
  ASSERT_TRUE(env_.SimulateCrash().ok());  // its directory entry was never synced
  EXPECT_FALSE(env_.FileExists("/r/new"));
  EXPECT_EQ(Read("/r/kept"), "durable");
}

TEST_F(FaultInjectionEnvTest, CrashRemovesFilesWhoseDirectoryEntryWasNotSynced) {
  Write("/r/unsynced_entry", "data", /*sync=*/true);
  Write("/r/synced_entry", "data", /*sync=*/true);
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  Write("/r/late", "data", /*sync=*/true);
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_THAT(Children("/r"), ElementsAre("synced_entry", "unsynced_entry"));
  EXPECT_EQ(Read("/r/synced_entry"), "data");
}

TEST_F(FaultInjectionEnvTest, SyncedEntryWithUnsyncedDataComesBackEmpty) {
  Write("/r/f", "data", /*sync=*/false);
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_EQ(Read("/r/f"), "");
}

TEST_F(FaultInjectionEnvTest, UnsyncedRenameIsUndoneAndReplacedFileRestored) {
  Write("/r/a", "new", true);
  Write("/r/b", "old", true);
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.RenameFile("/r/a", "/r/b").ok());
  EXPECT_EQ(Read("/r/b"), "new");
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_EQ(Read("/r/a"), "new");
  EXPECT_EQ(Read("/r/b"), "old");
}

TEST_F(FaultInjectionEnvTest, SyncedRenameSurvives) {
  Write("/r/a", "new", true);
  Write("/r/b", "old", true);
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.RenameFile("/r/a", "/r/b").ok());
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_THAT(Children("/r"), ElementsAre("b"));
  EXPECT_EQ(Read("/r/b"), "new");
}

TEST_F(FaultInjectionEnvTest, CrossDirectoryRenameNeedsBothDirectoriesSynced) {
  ASSERT_TRUE(env_.CreateDir("/r/x").ok());
  ASSERT_TRUE(env_.CreateDir("/r/y").ok());
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  Write("/r/x/f", "1", true);
  ASSERT_TRUE(env_.SyncDir("/r/x").ok());
  ASSERT_TRUE(env_.RenameFile("/r/x/f", "/r/y/f").ok());
  ASSERT_TRUE(env_.SyncDir("/r/y").ok());
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_THAT(Children("/r/x"), ElementsAre("f"));
  EXPECT_THAT(Children("/r/y"), IsEmpty());
}

// The checkpoint commit protocol: write into a temporary directory, sync files and directory,
// rename, sync the parent.
TEST_F(FaultInjectionEnvTest, DirectoryCommitProtocol) {
  auto write_tmp = [&] {
    KILN_CHECK_OK(env_.CreateDir("/r/step_1.tmp"));
    Write("/r/step_1.tmp/shard", "tensor bytes", true);
    Write("/r/step_1.tmp/manifest", "manifest", true);
    KILN_CHECK_OK(env_.SyncDir("/r/step_1.tmp"));
    KILN_CHECK_OK(env_.RenameFile("/r/step_1.tmp", "/r/step_1"));
  };
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  // Without the final parent sync, neither the temporary directory's creation nor the rename
  // is durable: nothing is left.
  write_tmp();
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_THAT(Children("/r"), IsEmpty());
  // With it, the whole directory is there under its final name.
  write_tmp();
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_THAT(Children("/r"), ElementsAre("step_1"));
  EXPECT_THAT(Children("/r/step_1"), ElementsAre("manifest", "shard"));
  EXPECT_EQ(Read("/r/step_1/shard"), "tensor bytes");
}

TEST_F(FaultInjectionEnvTest, TmpDirSyncedInParentButRenameNotSynced) {
  ASSERT_TRUE(env_.CreateDir("/r/step_1.tmp").ok());
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  Write("/r/step_1.tmp/shard", "bytes", true);
  ASSERT_TRUE(env_.SyncDir("/r/step_1.tmp").ok());
  Write("/r/step_1.tmp/manifest", "m", true);  // entry never synced
  ASSERT_TRUE(env_.RenameFile("/r/step_1.tmp", "/r/step_1").ok());
  ASSERT_TRUE(env_.SimulateCrash().ok());
  // The rename is undone; the synced shard stays in the directory, the manifest is gone.
  EXPECT_THAT(Children("/r"), ElementsAre("step_1.tmp"));
  EXPECT_THAT(Children("/r/step_1.tmp"), ElementsAre("shard"));
}

// Replacing a directory through a side name: both renames undone restore the original layout.
TEST_F(FaultInjectionEnvTest, ReplaceThroughSideNameIsUndoneInOrder) {
  ASSERT_TRUE(env_.CreateDir("/r/step").ok());
  Write("/r/step/f", "old", true);
  ASSERT_TRUE(env_.SyncDir("/r/step").ok());
  ASSERT_TRUE(env_.CreateDir("/r/tmp").ok());
  Write("/r/tmp/f", "new", true);
  ASSERT_TRUE(env_.SyncDir("/r/tmp").ok());
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.RenameFile("/r/step", "/r/step.old").ok());
  ASSERT_TRUE(env_.RenameFile("/r/tmp", "/r/step").ok());
  EXPECT_EQ(Read("/r/step/f"), "new");
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_THAT(Children("/r"), ElementsAre("step", "tmp"));
  EXPECT_EQ(Read("/r/step/f"), "old");
  EXPECT_EQ(Read("/r/tmp/f"), "new");
}

TEST_F(FaultInjectionEnvTest, CrashKeepingAPrefixOfTheUnsyncedChanges) {
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.CreateDir("/r/a").ok());
  ASSERT_TRUE(env_.CreateDir("/r/b").ok());
  ASSERT_TRUE(env_.RenameFile("/r/a", "/r/c").ok());
  EXPECT_EQ(env_.pending_changes(), 3u);
  ASSERT_TRUE(env_.SimulateCrash(/*keep_oldest=*/2).ok());
  EXPECT_THAT(Children("/r"), ElementsAre("a", "b"));
  EXPECT_EQ(env_.pending_changes(), 0u);
}

TEST_F(FaultInjectionEnvTest, FileSyncedInsideRenamedDirectoryMovesWithIt) {
  ASSERT_TRUE(env_.CreateDir("/r/a").ok());
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.RenameFile("/r/a", "/r/b").ok());
  Write("/r/b/f", "1", true);
  ASSERT_TRUE(env_.SyncDir("/r/b").ok());  // f's entry is durable, the rename is not
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_THAT(Children("/r"), ElementsAre("a"));
  EXPECT_THAT(Children("/r/a"), ElementsAre("f"));
}

TEST_F(FaultInjectionEnvTest, UnsyncedDeletionsComeBack) {
  ASSERT_TRUE(env_.CreateDir("/r/d/sub").ok());
  Write("/r/d/sub/f", "deep", true);
  Write("/r/d/g", "shallow", true);
  Write("/r/h", "file", true);
  ASSERT_TRUE(env_.SyncDir("/r/d/sub").ok());
  ASSERT_TRUE(env_.SyncDir("/r/d").ok());
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.DeleteDir("/r/d").ok());
  ASSERT_TRUE(env_.DeleteFile("/r/h").ok());
  EXPECT_THAT(Children("/r"), IsEmpty());
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_THAT(Children("/r"), ElementsAre("d", "h"));
  EXPECT_EQ(Read("/r/d/sub/f"), "deep");
  EXPECT_EQ(Read("/r/d/g"), "shallow");
  EXPECT_EQ(Read("/r/h"), "file");
  // Synced deletions stay deleted.
  ASSERT_TRUE(env_.DeleteDir("/r/d").ok());
  ASSERT_TRUE(env_.SyncDir("/r").ok());
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_THAT(Children("/r"), ElementsAre("h"));
}

TEST_F(FaultInjectionEnvTest, CrashWithOpenFileIsRefused) {
  auto f = *env_.NewWritableFile("/r/f");
  EXPECT_EQ(env_.SimulateCrash().code(), absl::StatusCode::kFailedPrecondition);
  f.reset();
  EXPECT_TRUE(env_.SimulateCrash().ok());
}

TEST_F(FaultInjectionEnvTest, CrashClearsFailuresAndMarkAllDurableKeepsEverything) {
  env_.FailAfter(0);
  EXPECT_FALSE(env_.CreateDir("/r/x").ok());
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_TRUE(env_.CreateDir("/r/x").ok());
  Write("/r/x/f", "unsynced", false);
  env_.MarkAllDurable();
  ASSERT_TRUE(env_.SimulateCrash().ok());
  EXPECT_EQ(Read("/r/x/f"), "unsynced");
}

TEST(FaultInjectionEnvPosixTest, CommitProtocolOnTheRealFileSystem) {
  Env* posix = Env::Default();
  const std::string root =
      ::testing::TempDir() + "/kiln_fault_env_test_" + std::to_string(::getpid());
  if (posix->FileExists(root)) KILN_CHECK_OK(posix->DeleteDir(root));
  KILN_CHECK_OK(posix->CreateDir(root));
  FaultInjectionEnv env(posix);
  KILN_CHECK_OK(env.CreateDir(root + "/tmp"));
  KILN_CHECK_OK(WriteStringToFile(&env, "synced", root + "/tmp/a", true));
  KILN_CHECK_OK(env.SyncDir(root + "/tmp"));
  KILN_CHECK_OK(env.SyncDir(root));
  KILN_CHECK_OK(WriteStringToFile(&env, "lost", root + "/tmp/b", false));
  KILN_CHECK_OK(env.RenameFile(root + "/tmp", root + "/final"));
  ASSERT_TRUE(env.SimulateCrash().ok());
  EXPECT_THAT(*posix->GetChildren(root), ElementsAre("tmp"));
  EXPECT_THAT(*posix->GetChildren(root + "/tmp"), ElementsAre("a"));
  EXPECT_EQ(*ReadFileToString(posix, root + "/tmp/a"), "synced");
  KILN_CHECK_OK(posix->DeleteDir(root));
}

}  // namespace
}  // namespace kiln
