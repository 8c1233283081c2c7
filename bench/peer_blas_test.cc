#include "bench/peer_blas.h"

#include "gtest/gtest.h"

namespace kiln::bench {
namespace {

constexpr char kSapphireRapids[] =
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    "flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 fma avx avx2 avx512f avx512dq avx512cd avx512bw "
    "avx512vl avx512_bf16 avx512_fp16 amx_tile amx_bf16\n\nprocessor\t: 1\nmodel name\t: other\n";
constexpr char kSkylake[] =
    "model name\t: Intel(R) Xeon(R) Gold 6148\nflags\t: sse4_2 fma avx avx2 avx512f avx512dq "
    "avx512cd avx512bw avx512vl\n";
constexpr char kHaswell[] =
    "model name\t: Intel(R) Core(TM) i7-4770\nflags\t: sse4_2 avx avx2 fma\n";
constexpr char kOld[] = "model name\t: Intel(R) Core(TM)2 Duo\nflags\t: sse sse2 ssse3\n";

TEST(PeerBlasTest, ParsesTheFirstProcessor) {
  CpuInfo cpu = ParseCpuInfo(kSapphireRapids);
  EXPECT_EQ(cpu.model, "Intel(R) Xeon(R) Platinum 8480+");
  EXPECT_TRUE(cpu.Has("avx512_fp16"));
  EXPECT_TRUE(cpu.Has("amx_bf16"));
  EXPECT_FALSE(cpu.Has("avx512"));
  EXPECT_EQ(SimdFlags(cpu),
            "amx_bf16 amx_tile avx avx2 avx512_bf16 avx512_fp16 avx512bw avx512cd avx512dq "
            "avx512f avx512vl fma sse4_1 sse4_2");
}

TEST(PeerBlasTest, CappedCpuShowsOnlyTheFlagsOfItsLevel) {
  const CpuInfo spr = ParseCpuInfo(kSapphireRapids);
  EXPECT_EQ(BestOpenBlasCore(CapCpuInfo(spr, "avx512_bf16")), "Cooperlake");
  EXPECT_FALSE(CapCpuInfo(spr, "avx512_bf16").Has("amx_tile"));
  EXPECT_EQ(BestOpenBlasCore(CapCpuInfo(spr, "avx512")), "SkylakeX");
  const CpuInfo avx2 = CapCpuInfo(spr, "avx2");
  EXPECT_EQ(BestOpenBlasCore(avx2), "Haswell");
  EXPECT_TRUE(avx2.Has("fma"));
  EXPECT_FALSE(avx2.Has("avx512f"));
  const CpuInfo v2 = CapCpuInfo(spr, "sse41");
  EXPECT_EQ(BestOpenBlasCore(v2), "");
  EXPECT_TRUE(v2.Has("sse4_2"));
  EXPECT_FALSE(v2.Has("avx"));
  EXPECT_EQ(CapCpuInfo(spr, "native").flags, spr.flags);
}

TEST(PeerBlasTest, NewestCoreTheCpuRuns) {
  EXPECT_EQ(BestOpenBlasCore(ParseCpuInfo(kSapphireRapids)), "Cooperlake");
  EXPECT_EQ(BestOpenBlasCore(ParseCpuInfo(kSkylake)), "SkylakeX");
  EXPECT_EQ(BestOpenBlasCore(ParseCpuInfo(kHaswell)), "Haswell");
  EXPECT_EQ(BestOpenBlasCore(ParseCpuInfo(kOld)), "");
  EXPECT_EQ(BestOpenBlasCore(ParseCpuInfo("")), "");
}

TEST(PeerBlasTest, GenericFallbackIsDetectedOnlyWhereSomethingBetterRuns) {
  CpuInfo spr = ParseCpuInfo(kSapphireRapids);
  EXPECT_TRUE(IsGenericOpenBlasCore("Prescott", spr));  // OpenBLAS 0.3.21 on an avx512_fp16 Xeon
  EXPECT_TRUE(IsGenericOpenBlasCore("Nehalem", spr));
  EXPECT_TRUE(IsGenericOpenBlasCore("Sandybridge", spr));
  EXPECT_TRUE(IsGenericOpenBlasCore("SomethingNew", spr));  // unknown: do not trust it
  EXPECT_FALSE(IsGenericOpenBlasCore("SkylakeX", spr));
  EXPECT_FALSE(IsGenericOpenBlasCore("Cooperlake", spr));
  EXPECT_FALSE(IsGenericOpenBlasCore("Zen", spr));
  EXPECT_FALSE(IsGenericOpenBlasCore("Prescott", ParseCpuInfo(kOld)));  // nothing better to run
  EXPECT_EQ(OpenBlasCoreLevel("Haswell"), 2);
  EXPECT_EQ(OpenBlasCoreLevel("Cooperlake"), 4);
  EXPECT_EQ(OpenBlasCoreLevel("bogus"), -1);
}

}  // namespace
}  // namespace kiln::bench
