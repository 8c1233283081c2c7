#include "kiln/train/validate_first.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/fault_injection_env.h"
#include "kiln/base/mem_env.h"

namespace kiln::train {
namespace {

using ::testing::HasSubstr;

EvalResult Eval(double loss, double accuracy, int64_t examples) {
  return {.loss = loss, .accuracy = accuracy, .examples = examples};
}

TEST(JudgeValidationTest, PassesWhenTheLossFallsAndTheAccuracyIsAboveChance) {
  ValidationReport r =
      JudgeValidation(Eval(2.30, 0.1, 400), Eval(1.2, 0.7, 400), {2.31, 1.3}, 20, 10);
  EXPECT_TRUE(r.passed) << r.reason;
  EXPECT_DOUBLE_EQ(r.chance, 0.1);
  EXPECT_NEAR(r.at_chance_below, 0.1 + 2 * std::sqrt(0.1 * 0.9 / 400), 1e-12);
  EXPECT_THAT(r.reason, HasSubstr("training loss 2.3100 over the first 1 steps -> 1.3000 over the "
                                  "last 1; held-out loss 2.3000 before step 1 -> 1.2000 after "
                                  "step 20"));
}

TEST(JudgeValidationTest, RefusesALossThatDoesNotFallByOnePercent) {
  // Both 0.5% lower: within noise, refused. The training loss is averaged over the first and the
  // last fifth of the steps: 10 steps, 2 each.
  const std::vector<float> flat = {2.0, 2.02, 1.99, 2.01, 2.0, 2.0, 1.99, 2.0, 1.99, 1.995};
  ValidationReport r = JudgeValidation(Eval(2.0, 0.1, 400), Eval(1.99, 0.5, 400), flat, 10, 10);
  EXPECT_FALSE(r.passed);
  EXPECT_THAT(r.reason, HasSubstr("neither the training nor the held-out loss fell by at least 1% "
                                  "in 10 steps: training loss 2.0100 over the first 2 steps -> "
                                  "1.9925 over the last 2"));
  r = JudgeValidation(Eval(2.0, 0.1, 400), Eval(NAN, 0.5, 400), flat, 10, 10);
  EXPECT_FALSE(r.passed);
  EXPECT_THAT(r.reason, HasSubstr("not finite"));
  // The training loss falling is enough, even when the held-out loss went up (early noise).
  std::vector<float> falling = flat;
  falling[8] = falling[9] = 1.5;
  EXPECT_TRUE(JudgeValidation(Eval(2.0, 0.1, 400), Eval(2.1, 0.5, 400), falling, 10, 10).passed);
}

TEST(JudgeValidationTest, RefusesAnAccuracyAtChance) {
  // The loss fell (the model learned the label frequencies) but the accuracy is within two
  // standard errors of 1/C: 0.12 <= 0.1 + 2 * sqrt(0.09 / 400) = 0.13.
  ValidationReport r = JudgeValidation(Eval(2.3, 0.1, 400), Eval(2.0, 0.12, 400), {}, 20, 10);
  EXPECT_FALSE(r.passed);
  EXPECT_THAT(r.reason, HasSubstr("the held-out accuracy is at chance after 20 steps"));
  EXPECT_THAT(r.reason, HasSubstr("chance 1/10 = 0.1000, counted as chance up to 0.1300"));
  // Just above it: passes.
  EXPECT_TRUE(JudgeValidation(Eval(2.3, 0.1, 400), Eval(2.0, 0.135, 400), {}, 20, 10).passed);
}

TEST(JudgeValidationTest, LanguageModelsAreJudgedByTheLossAlone) {
  ValidationReport r = JudgeValidation(Eval(5.5, 0.0, 48), Eval(4.0, 0.001, 48), {}, 20, 0);
  EXPECT_TRUE(r.passed) << r.reason;
  EXPECT_EQ(r.chance, 0);
}

// The scratch folder is made through the run's Env: one that cannot create folders stops the
// check before any training, and nothing is left behind.
TEST(ValidateFirstTest, ScratchFolderGoesThroughTheRunsEnv) {
  std::unique_ptr<MemEnv> mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  env.FailAfter(0);
  TrainerOptions o;
  o.env = &env;
  absl::StatusOr<ValidationReport> r = ValidateFirst(TrainConfig(), 20, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("cannot create a scratch folder"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("/tmp/kiln-validate-first-"));
  EXPECT_FALSE(mem->FileExists("/tmp"));
}

}  // namespace
}  // namespace kiln::train
