#include "kiln/runtime/cpu/machine.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::runtime {
namespace {

using ::testing::HasSubstr;

TEST(MachineTest, NamesTheIsaOneDnnRuns) {
  std::string isa = OneDnnIsaName();
  EXPECT_FALSE(isa.empty());
  EXPECT_EQ(isa.find(' '), std::string::npos);
}

TEST(MachineTest, MeasuresBothRates) {
  MatmulRates r = MeasureMatmulRates(128, 2);
  EXPECT_EQ(r.n, 128);
  EXPECT_GT(r.f32, 1e8);  // any CPU that runs the tests does 0.1 GFLOP/s
  EXPECT_GT(r.bf16, 1e8);
}

TEST(MachineTest, WarnsOnlyWhenBf16IsSlower) {
  EXPECT_EQ(Bf16SlowerWarning({.f32 = 2e11, .bf16 = 4e11, .n = 1024}, "mixed_bf16"), "");
  EXPECT_EQ(Bf16SlowerWarning({.f32 = 2e11, .bf16 = 2e11, .n = 1024}, "mixed_bf16"), "");
  std::string w = Bf16SlowerWarning({.f32 = 223e9, .bf16 = 142e9, .n = 1024}, "mixed_bf16");
  EXPECT_THAT(w, HasSubstr("precision mixed_bf16"));
  EXPECT_THAT(w, HasSubstr("142 GFLOP/s, below f32's 223 GFLOP/s"));
  EXPECT_THAT(w, HasSubstr("set precision: f32"));
  EXPECT_THAT(w, HasSubstr(OneDnnIsaName()));
}

}  // namespace
}  // namespace kiln::runtime
