#include "kiln/runtime/cpu/machine.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/cpu_isa.h"

namespace kiln::runtime {
namespace {

using ::testing::HasSubstr;

TEST(MachineTest, NamesTheIsaOneDnnRuns) {
  std::string isa = OneDnnIsaName();
  EXPECT_FALSE(isa.empty());
  EXPECT_EQ(isa.find(' '), std::string::npos);
  // oneDNN's bf16 kernels start at avx512_core: Kiln's avx512 level.
  EXPECT_EQ(OneDnnHasBf16(), ActiveCpuIsa() >= CpuIsa::kAvx512) << CpuIsaDescription();
}

// Both rates where oneDNN has bf16 kernels; elsewhere the f32 rate and a bf16 "computes in f32",
// never an exception (run under KILN_CPU_ISA=avx2 and sse41 by CTest's isa reruns).
TEST(MachineTest, MeasuresBothRates) {
  absl::StatusOr<MatmulRates> r = MeasureMatmulRates(128, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->n, 128);
  EXPECT_GT(r->f32, 1e8);  // any CPU that runs the tests does 0.1 GFLOP/s
  if (OneDnnHasBf16()) {
    EXPECT_FALSE(r->bf16_computes_in_f32) << r->bf16_note;
    EXPECT_GT(r->bf16, 1e8);
  } else {
    EXPECT_TRUE(r->bf16_computes_in_f32);
    EXPECT_EQ(r->bf16, 0);
    EXPECT_THAT(r->bf16_note, HasSubstr("below avx512_core"));
  }
}

TEST(MachineTest, ABf16MatmulWithoutKernelsIsAStatus) {
  absl::StatusOr<double> s = BareMatmulSeconds(DType::kBF16, 64, 1);
  if (OneDnnHasBf16()) {
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_GT(*s, 0);
    return;
  }
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("oneDNN bf16 matmul 64x64x64"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("oneDNN ISA " + OneDnnIsaName()));
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

TEST(MachineTest, WarnsThatBf16ComputesInF32WithoutKernels) {
  std::string w = Bf16SlowerWarning(
      {.f32 = 60e9, .bf16 = 0, .n = 1024, .bf16_computes_in_f32 = true, .bf16_note = kOneDnnNoBf16},
      "mixed_bf16");
  EXPECT_THAT(w, HasSubstr("precision mixed_bf16"));
  EXPECT_THAT(w, HasSubstr("oneDNN has no bf16 matmul/convolution below avx512_core"));
  EXPECT_THAT(w, HasSubstr("compute in f32 here"));
  EXPECT_THAT(w, HasSubstr("f32 matmul 60 GFLOP/s"));
  EXPECT_THAT(w, HasSubstr("set precision: f32"));
}

}  // namespace
}  // namespace kiln::runtime
