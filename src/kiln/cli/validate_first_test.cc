// `kiln train --validate-first N` end to end on the digits MLP: a learning rate of 0 (and its
// cosine floor, which must not exceed it) is refused with exit 3 and nothing in the output folder;
// the example config passes and the real run goes on from a fresh state.
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/cli/internal/test_util.h"

namespace kiln::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

std::string Example(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/examples/" + name;
}

std::string FreshDir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/validate_first_" + name;
  fs::remove_all(d);
  return d;
}

TEST(ValidateFirst, ALearningRateOfZeroIsRefusedWithExit3) {
  const std::string run = FreshDir("lr0");
  KilnResult r = Kiln({"train", Example("mlp_digits.yaml"), "--validate-first", "20", "--set",
                       "optimizer.lr=0", "--set", "schedule.min_lr=0", "--output-dir", run});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("kiln train: --validate-first 20 refused the run: neither the "
                               "training nor the held-out loss fell by at least 1% in 20 steps"));
  EXPECT_THAT(r.err, HasSubstr("Nothing was written to " + run));
  EXPECT_FALSE(fs::exists(run));
  EXPECT_THAT(r.out, Not(HasSubstr("done:")));
}

TEST(ValidateFirst, AConfigThatLearnsPassesAndTheRunStartsFresh) {
  const std::string run = FreshDir("ok");
  KilnResult r =
      Kiln({"train", Example("mlp_digits.yaml"), "--validate-first", "20", "--set", "steps=30",
            "--set", "eval_every=0", "--set", "checkpoint_every=0", "--output-dir", run});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("validate-first: passed in "));
  EXPECT_THAT(r.out, HasSubstr("starting the run"));
  // The real run began at step 1 (not at the scratch run's step 20) and finished.
  EXPECT_THAT(r.out, HasSubstr("steps 1..30"));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step_30/manifest.json"));
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step_20"));
  fs::remove_all(run);
}

TEST(ValidateFirst, RefusesTooFewStepsAsAUsageError) {
  KilnResult r = Kiln({"train", Example("mlp_digits.yaml"), "--validate-first", "1"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 3);
}

}  // namespace
}  // namespace kiln::cli
