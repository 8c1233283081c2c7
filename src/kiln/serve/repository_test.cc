// The model repository's folder walk and config.yaml reads go through Env: checked here against
// an in-memory one (no model needs to load for these).
#include "kiln/serve/repository.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"

namespace kiln::serve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class RepositoryEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(env_->CreateDir("/repo/beta/2").ok());
    ASSERT_TRUE(env_->CreateDir("/repo/alpha").ok());
    ASSERT_TRUE(env_->CreateDir("/repo/.hidden").ok());
    ASSERT_TRUE(WriteStringToFile(env_.get(), "not a model", "/repo/notes.txt").ok());
  }
  ModelRepository Make(const std::string& root) {
    return ModelRepository(root, ModelConfig(), /*backend=*/nullptr, &registry_, env_.get());
  }

  std::unique_ptr<MemEnv> env_ = NewMemEnv();
  ServerMetrics metrics_;
  ModelRegistry registry_{&metrics_};
};

TEST_F(RepositoryEnvTest, ModelNamesAreTheVisibleFoldersSorted) {
  ModelRepository repo = Make("/repo");
  absl::StatusOr<std::vector<std::string>> names = repo.ModelNames();
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("alpha", "beta"));
}

TEST_F(RepositoryEnvTest, RootThatIsNoFolderIsNotFound) {
  EXPECT_EQ(Make("/nowhere").ModelNames().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Make("/repo/notes.txt").ModelNames().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RepositoryEnvTest, LoadReadsConfigAndVersionFoldersThroughEnv) {
  ModelRepository repo = Make("/repo");
  EXPECT_EQ(repo.Load("gamma").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(repo.Load("notes.txt").code(), absl::StatusCode::kNotFound);
  // A folder without version folders: the model's problem, not "no such model".
  absl::Status s = repo.Load("alpha");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("found: none"));
  // config.yaml comes from the Env: a bad one is InvalidArgument naming it.
  ASSERT_TRUE(WriteStringToFile(env_.get(), "version_policy: [", "/repo/beta/config.yaml").ok());
  s = repo.Load("beta");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("/repo/beta/config.yaml"));
}

}  // namespace
}  // namespace kiln::serve
