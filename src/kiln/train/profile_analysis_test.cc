#include "kiln/train/profile_analysis.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/memory.h"

namespace kiln::train {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

KernelStat Matmul(double seconds, int64_t calls, double flops, double bare_seconds) {
  return {.op = "dot_general (onednn matmul)",
          .shapes = "f32[512,768] x f32[768,3072] -> f32[512,3072]",
          .kind = KernelKind::kMatmul,
          .calls = calls,
          .seconds = seconds,
          .flops = flops,
          .bare_seconds = bare_seconds};
}

KernelStat Loop(double seconds, int64_t calls, double bytes) {
  return {.op = "fusion (loop: 4 ops, 2 in, 1 out)",
          .shapes = "f32[512,3072] -> f32[512,3072]",
          .kind = KernelKind::kMemory,
          .calls = calls,
          .seconds = seconds,
          .bytes = bytes};
}

// Shaped like GPT-2-small on 2 threads: 2 steps of 3.35 s, matmuls 2.43 s a step at 160 GFLOP/s
// where the bare primitive would take 60% of that, 538 loop kernels 0.52 s a step.
TEST(ClassifyProfileTest, MatmulDominated) {
  const double mm_flops = 160e9 * 2.43 / 219;  // per call
  std::vector<KernelStat> k = {Matmul(2 * 2.43, 2 * 219, mm_flops, 0.6 * 2.43 / 219),
                               Loop(2 * 0.52, 2 * 538, 0.52 / 538 * 8e9)};
  ProfileInputs in{.steps = 2,
                   .step_seconds = 2 * 3.35,
                   .input_seconds = 0.002,
                   .matmul_peak = 400e9,
                   .memcpy_bandwidth = 20e9};
  ProfileVerdict v = ClassifyProfile(k, in);
  EXPECT_EQ(v.bound, Bound::kMatmul);
  EXPECT_NEAR(v.matmul_share, 2.43 / 3.35, 1e-3);
  EXPECT_NEAR(v.memory_share, 0.52 / 3.35, 1e-3);
  EXPECT_NEAR(v.input_share + v.matmul_share + v.memory_share + v.overhead_share, 1.0, 1e-9);
  EXPECT_NEAR(v.matmul_rate, 160e9, 1e6);
  EXPECT_NEAR(v.matmul_bare_fraction, 0.6, 1e-9);
  EXPECT_NEAR(v.memory_rate, 8e9, 1e3);
  EXPECT_THAT(v.text, HasSubstr("verdict: matmul-bound: matmul/conv kernels are 73% of the step "
                                "at 160.0 GFLOP/s = 60% of the bare oneDNN rate for their shapes"));
  EXPECT_THAT(v.text, HasSubstr("other kernels 15.5%"));

  // A bare measurement slower than the step itself was disturbed: the step's time stands in.
  k[0].bare_seconds = 1.5 * 2.43 / 219;
  ProfileVerdict slowed = ClassifyProfile(k, in);
  EXPECT_EQ(slowed.bare_slowed, 1);
  EXPECT_NEAR(slowed.matmul_bare_fraction, 1.0, 1e-9);
  EXPECT_THAT(slowed.text, HasSubstr("= 100% of the bare oneDNN rate for their shapes (at least: "
                                     "1 of the bare measurements ran slower than the step"));
  EXPECT_THAT(FormatTopKernels(k, in, 8), HasSubstr("(bare slowed by other load)"));
  // A bare time a few percent above the step's (operands warm in cache there) is not a
  // disturbance: it counts at the step's time, unreported.
  k[0].bare_seconds = 1.05 * 2.43 / 219;
  ProfileVerdict warm = ClassifyProfile(k, in);
  EXPECT_EQ(warm.bare_slowed, 0);
  EXPECT_NEAR(warm.matmul_bare_fraction, 1.0, 1e-9);
  EXPECT_THAT(warm.text, Not(HasSubstr("ran slower than the step")));
  EXPECT_THAT(FormatTopKernels(k, in, 8), Not(HasSubstr("(bare slowed by other load)")));

  // Without a bare time per row, the square peak stands in: 160 / 400.
  k[0].bare_seconds = 0;
  EXPECT_NEAR(ClassifyProfile(k, in).matmul_bare_fraction, 0.4, 1e-9);
  std::string top = FormatTopKernels(k, in, 8);
  EXPECT_THAT(top,
              HasSubstr("2430.000 ms  72.5%  x219  dot_general (onednn matmul)  f32[512,768]"));
  EXPECT_THAT(top, HasSubstr("160.0 GFLOP/s = 40% of bare 400 (square)"));
  EXPECT_THAT(top, HasSubstr("8.00 GB/s = 40% of memcpy"));
  EXPECT_THAT(top, HasSubstr("largest matmul/conv kernels (per step):\n   2430.000 ms"));
  EXPECT_THAT(top, HasSubstr("\nlargest other kernels (per step):\n    520.000 ms"));
  // Each kind's largest first, `top` of each.
  k.push_back(Loop(2 * 0.6, 2, 1e6));
  top = FormatTopKernels(k, in, 1);
  EXPECT_THAT(top, HasSubstr("other kernels (per step):\n    600.000 ms"));
  EXPECT_THAT(top, ::testing::Not(HasSubstr("520.000 ms")));
}

TEST(ClassifyProfileTest, MemoryDominated) {
  std::vector<KernelStat> k = {Matmul(0.2, 10, 1e9, 0), Loop(0.7, 40, 0.7 / 40 * 4e9)};
  ProfileInputs in{.steps = 10, .step_seconds = 1.0, .memcpy_bandwidth = 16e9};
  ProfileVerdict v = ClassifyProfile(k, in);
  EXPECT_EQ(v.bound, Bound::kMemory);
  EXPECT_NEAR(v.memory_rate, 4e9, 1);
  EXPECT_EQ(v.matmul_bare_fraction, 0);  // neither bare times nor a peak
  EXPECT_THAT(v.text, HasSubstr("verdict: memory-bound kernels: non-matmul kernels are 70% of the "
                                "step at 4.0 GB/s = 25% of memcpy bandwidth (16.0 GB/s)"));
}

TEST(ClassifyProfileTest, OverheadDominated) {
  // 1000 kernels a step of 5 us each (tiny: dispatch, whatever their kind) plus 4 ms a step that
  // no kernel covers, against 1 ms of real matmul work.
  std::vector<KernelStat> k = {Matmul(0.001 * 4, 4, 1e6, 0), Loop(5e-6 * 4000, 4000, 1e3),
                               Matmul(5e-6 * 400, 400, 1e3, 0)};
  ProfileInputs in{.steps = 4, .step_seconds = 4 * 0.0105, .matmul_peak = 100e9};
  ProfileVerdict v = ClassifyProfile(k, in);
  EXPECT_EQ(v.bound, Bound::kOverhead);
  EXPECT_EQ(v.tiny_kernels, 1100);
  EXPECT_NEAR(v.matmul_share, 1.0 / 10.5, 1e-9);
  EXPECT_EQ(v.memory_share, 0);
  EXPECT_NEAR(v.overhead_share, 9.5 / 10.5, 1e-9);
  EXPECT_THAT(v.text,
              HasSubstr("verdict: overhead-bound: 90% of the step is dispatch: 1101 "
                        "kernels/step, 1100 of them under 20 us, and 4.00 ms/step outside"));
}

TEST(ClassifyProfileTest, InputWaitAtTheThresholdWins) {
  std::vector<KernelStat> k = {Matmul(0.7, 1, 1e9, 0)};
  ProfileInputs in{.steps = 1, .step_seconds = 1.0, .input_seconds = 0.3};
  EXPECT_EQ(ClassifyProfile(k, in).bound, Bound::kInput);
  in.input_seconds = 0.29;
  EXPECT_EQ(ClassifyProfile(k, in).bound, Bound::kMatmul);
  ProfileThresholds t;
  t.input_share = 0.2;
  ProfileVerdict v = ClassifyProfile(k, in, t);
  EXPECT_EQ(v.bound, Bound::kInput);
  EXPECT_THAT(v.text, HasSubstr("verdict: input-bound: 29% of step time waiting for data; raise "
                                "data.prefetch"));
  // The producer's time decides the advice: slower than the compute (0.71 s) or bursty.
  in.produce_seconds = 0.9;
  in.prefetch_depth = 4;
  v = ClassifyProfile(k, in, t);
  EXPECT_THAT(v.text, HasSubstr("which no prefetch depth hides: raise data.workers"));
  EXPECT_THAT(v.text, HasSubstr("input: 29.0% of step time waiting for data (290.000 ms/step); "
                                "the pipeline produces a batch in 900.000 ms on its thread, "
                                "prefetch queue 4 batches"));
  // Two workers finish a batch every 0.45 s, faster than the compute: bursts, not a slow pipeline.
  in.workers = 2;
  v = ClassifyProfile(k, in, t);
  EXPECT_THAT(v.text, HasSubstr("comes in bursts"));
  EXPECT_THAT(v.text, HasSubstr("900.000 ms on each of its 2 worker threads"));
  in.workers = 1;
  in.produce_seconds = 0.1;
  EXPECT_THAT(ClassifyProfile(k, in, t).text, HasSubstr("comes in bursts"));
  // Not input-bound: the share is still printed.
  in.input_seconds = 0.01;
  EXPECT_THAT(ClassifyProfile(k, in, t).text, HasSubstr("input: 1.0% of step time waiting"));
  EXPECT_EQ(BoundName(v.bound), "input-bound");
}

TEST(MemoryBreakdownTest, FormatsEveryPartInMiB) {
  constexpr int64_t kMiB = 1 << 20;
  MemoryBreakdown m{.parameters = 2 * 100 * kMiB,
                    .gradients = 100 * kMiB,
                    .optimizer_state = 400 * kMiB,
                    .arena = 300 * kMiB,
                    .constants = 25 * kMiB,
                    .evaluation = 50 * kMiB,
                    .checkpoint_staging = 150 * kMiB,
                    .peak_rss = 1325 * kMiB};
  EXPECT_EQ(m.other(), 200 * kMiB);  // every named part is out of "other"
  EXPECT_EQ(FormatMemoryBreakdown(m),
            "memory (MiB): parameters 200.0, gradients 100.0 (inside the arena), optimizer state "
            "400.0, arena 300.0, constants 25.0, evaluation 50.0, checkpoint staging 150.0, other "
            "200.0; peak RSS 1325.0");
  m.peak_rss = -1;
  EXPECT_THAT(FormatMemoryBreakdown(m), HasSubstr("peak RSS unknown"));
}

TEST(MemoryBreakdownTest, ParsesVmHwm) {
  EXPECT_EQ(ParseProcStatusBytes(
                "Name:\tkiln\nVmPeak:\t  900 kB\nVmHWM:\t  5120 kB\nVmRSS:\t 10 kB\n", "VmHWM"),
            5120 * 1024);
  EXPECT_EQ(ParseProcStatusBytes("Name:\tkiln\n", "VmHWM"), -1);
  EXPECT_EQ(ParseProcStatusBytes("VmHWM:\tlots\n", "VmHWM"), -1);
  const int64_t rss = PeakRssBytes();  // Linux: this process has touched at least a page
  EXPECT_GT(rss, 4096);
}

TEST(MemoryBreakdownTest, MemcpyBandwidthIsMeasuredOnce) {
  const double bw = MemcpyBandwidth();
  EXPECT_GT(bw, 1e8);
  EXPECT_EQ(MemcpyBandwidth(), bw);  // cached
}

}  // namespace
}  // namespace kiln::train
