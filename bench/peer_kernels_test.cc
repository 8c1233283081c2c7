#include "bench/peer_kernels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kiln::bench {
namespace {

using ::testing::HasSubstr;

// Excerpts of what perf and objdump printed for ONNX Runtime 1.30's MLP at batch 1 on the AVX-512
// machine: its thread pool spinning on a pause, and its SGEMM's broadcast-FMA loop with prefetches.
constexpr char kReport[] = R"(# Overhead  Shared Object        Symbol
# ........  ...................  ..................
#
    28.37%  libonnxruntime.so.1       [.] 0x00000000018156d2
     6.30%  libonnxruntime.so.1       [.] 0x000000000176d7a0
     6.17%  libonnxruntime.so.1       [.] 0x000000000176d77a
     3.43%  libonnxruntime.so.1       [.] 0x000000000176d773
     2.00%  node                      [.] 0x0000000000abcdef
     1.00%  libonnxruntime.so.1       [.] 0x0000000000423bc6
)";

constexpr char kSpin[] = R"(
Disassembly of section .text:

00000000018156c0 <OrtSessionOptionsAppendExecutionProvider_CPU@@VERS_1.30.0+0xd07e60>:
 18156cc:	ret
 18156cd:	nopl   (%rax)
 18156d0:	pause
 18156d2:	pop    %rbx
 18156d3:	pop    %rbp
)";

constexpr char kGemm[] = R"(
 176d767:	vbroadcastss (%rdi),%zmm3
 176d76d:	vfmadd231ps (%rsi),%zmm3,%zmm4
 176d773:	vfmadd231ps (%rsi,%r12,1),%zmm3,%zmm5
 176d77a:	prefetcht0 0x140(%rsi)
 176d781:	prefetcht0 0x140(%rsi,%r12,1)
 176d78a:	vbroadcastss 0x4(%rdi),%zmm3
 176d791:	vfmadd231ps 0x40(%rsi),%zmm3,%zmm4
 176d798:	vfmadd231ps 0x40(%rsi,%r12,1),%zmm3,%zmm5
 176d7a0:	sub    $0xffffffffffffff80,%rsi
)";

TEST(PeerKernels, ParsesPerfReportForTheLibraryOnly) {
  auto share = ParsePerfReport(kReport, "libonnxruntime.so");
  ASSERT_EQ(share.size(), 5u);
  EXPECT_DOUBLE_EQ(share[0x18156d2], 28.37);
  EXPECT_DOUBLE_EQ(share[0x176d773], 3.43);
  EXPECT_EQ(share.count(0xabcdef), 0u);  // node's own code
  EXPECT_TRUE(ParsePerfReport("", "libonnxruntime.so").empty());
}

TEST(PeerKernels, RangesGroupNearbySamplesEvenWithinSixteenBytes) {
  // 0x176d773 and 0x176d77a are 7 bytes apart: one range (an unsigned gap that wrapped once split
  // every such pair into a range of its own and the cap then dropped the hot loop).
  auto ranges = SampleRanges(ParsePerfReport(kReport, "libonnxruntime.so"));
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0], std::make_pair(uint64_t{0x423bc6}, uint64_t{0x423bd6}));
  EXPECT_EQ(ranges[1], std::make_pair(uint64_t{0x176d773}, uint64_t{0x176d7b0}));
  EXPECT_EQ(ranges[2], std::make_pair(uint64_t{0x18156d2}, uint64_t{0x18156e2}));
  // Capped: the ranges with the most samples stay, in address order.
  auto two = SampleRanges(ParsePerfReport(kReport, "libonnxruntime.so"), 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].first, 0x176d773u);
  EXPECT_EQ(two[1].first, 0x18156d2u);
}

TEST(PeerKernels, ParsesObjdump) {
  auto insn = ParseObjdump(std::string(kSpin) + kGemm);
  EXPECT_EQ(insn.size(), 14u);  // not the header lines
  EXPECT_EQ(insn[0x18156d0], "pause");
  EXPECT_EQ(insn[0x176d773], "vfmadd231ps (%rsi,%r12,1),%zmm3,%zmm5");
}

TEST(PeerKernels, SkidIsCountedAsTheInstructionBefore) {
  auto share = ParsePerfReport(kReport, "libonnxruntime.so");
  auto insn = ParseObjdump(std::string(kSpin) + kGemm);
  nlohmann::json j = ClassifySamples(share, insn, "/x/libonnxruntime.so.1");
  ASSERT_FALSE(j.contains("error")) << j.dump();
  const double known = 28.37 + 6.30 + 6.17 + 3.43;  // 0x423bc6 was not disassembled
  EXPECT_NEAR(j["share_of_those_classified"].get<double>(), known / (known + 1.0), 1e-9);
  // The pop after the pause is spin; the sub and the prefetch after an FMA are the FMA's.
  EXPECT_NEAR(j["pause_share"].get<double>(), 28.37 / known, 1e-9);
  EXPECT_NEAR(j["zmm_share"].get<double>(), (6.30 + 6.17 + 3.43) / known, 1e-9);
  EXPECT_NEAR(j["fma_shares"]["zmm"].get<double>(), (6.30 + 6.17 + 3.43) / known, 1e-9);
  EXPECT_EQ(j["other_share"].get<double>(), 0);
  EXPECT_EQ(j["top"][0]["insn"], "vfmadd231ps zmm");
  EXPECT_EQ(j["path"], "its FMAs are 512-bit (zmm): AVX-512 kernels");
  EXPECT_THAT(j["summary"].get<std::string>(),
              HasSubstr("in libonnxruntime.so.1; of the 98% of those disassembled: 36% zmm"));
}

TEST(PeerKernels, Avx2AndScalarVerdicts) {
  std::map<uint64_t, double> share = {{0x10, 50}, {0x20, 50}};
  nlohmann::json j = ClassifySamples(
      share, {{0x10, "vfmadd231ps %ymm1,%ymm2,%ymm3"}, {0x20, "vmovups %ymm0,(%rax)"}}, "lib");
  EXPECT_EQ(j["path"], "its FMAs are 256-bit (ymm): AVX2 kernels, not AVX-512");
  j = ClassifySamples(share, {{0x10, "mov %rax,%rbx"}, {0x20, "add $1,%rax"}}, "lib");
  EXPECT_THAT(j["path"].get<std::string>(), HasSubstr("no FMA instruction was sampled"));
  EXPECT_THAT(j["path"].get<std::string>(), HasSubstr("not vector code (per-call work)"));
  j = ClassifySamples(share, {}, "lib");
  EXPECT_THAT(j["error"].get<std::string>(), HasSubstr("could not disassemble"));
}

}  // namespace
}  // namespace kiln::bench
