#include "bench/roofline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/ir/parser.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/vision.h"

namespace kiln::bench {
namespace {

using ::testing::HasSubstr;

TEST(CountGraphCost, MlpMatchesTheHandCount) {
  nn::MlpOptions o;
  o.in_features = 1024;
  o.hidden = {1024, 1024, 1024};
  o.num_classes = 10;
  nn::MlpClassifier mlp(o);
  for (int64_t b : {1, 256}) {
    auto g = mlp.PredictGraph(b);
    ASSERT_TRUE(g.ok()) << g.status();
    auto c = CountGraphCost(*g, {"x"});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->flops, 2.0 * b * (1024 * 1024 * 3 + 1024 * 10)) << "batch " << b;
    EXPECT_EQ(c->contractions, 4);
    EXPECT_EQ(c->weight_bytes, 4 * (1024 * 1024 * 3 + 1024 * 10 + 1024 * 3 + 10));
    EXPECT_EQ(c->input_bytes, 4 * b * 1024);
    EXPECT_EQ(c->output_bytes, 4 * b * 10 + 4 * b);  // logits f32 and prediction s32
    EXPECT_EQ(c->largest_value_bytes, 4 * b * 1024);
    EXPECT_EQ(c->min_bytes(), c->weight_bytes + c->input_bytes + c->output_bytes);
    EXPECT_EQ(c->working_set_bytes(), c->min_bytes() + 2 * 4 * b * 1024);
  }
  // At batch 256: 1.616 GFLOP; 12.6 MB of weights.
  auto g = mlp.PredictGraph(256);
  EXPECT_NEAR(CountGraphCost(*g, {"x"})->flops / 1e9, 1.616, 5e-4);
}

TEST(CountGraphCost, CnnDigitsMatchesTheHandCount) {
  nn::ResNetOptions o;  // serve_compute.cc's cnn_digits
  o.in_channels = 1;
  o.height = 8;
  o.width = 8;
  o.num_classes = 10;
  o.widths = {16, 32};
  o.blocks_per_stage = 1;
  nn::ResNetCnn cnn(o);
  auto g = cnn.PredictGraph(4);
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CountGraphCost(*g, {"x"});
  ASSERT_TRUE(c.ok()) << c.status();
  // 2 x outputs x (in-channels x 3 x 3) per conv, padding 1: stem 1->16 at 8x8, two 16->16 at
  // 8x8, the 16->32 down conv at 8x8 (pooled after), two 32->32 at 4x4; head 32->10.
  const double per_image =
      2.0 * (16 * 64 * 9 + 2 * 16 * 64 * 144 + 32 * 64 * 144 + 2 * 32 * 16 * 288 + 32 * 10);
  EXPECT_EQ(c->flops, 4 * per_image);
  EXPECT_EQ(c->contractions, 7);
  EXPECT_EQ(c->input_bytes, 4 * 4 * 64);
  EXPECT_EQ(c->largest_value_bytes, 4 * 4 * 32 * 64);  // the down conv's output before pooling
}

TEST(CountGraphCost, BatchedDotAndGroupedConv) {
  auto g = ir::ParseGraph(R"(graph @g {
  %0 = parameter() {index=0, name="x"} : f32[4,8,16]
  %1 = parameter() {index=1, name="w"} : f32[4,16,32]
  %2 = dot_general(%0, %1) {lhs_batch=[0], lhs_contracting=[2], rhs_batch=[0], rhs_contracting=[1]} : f32[4,8,32]
  %3 = parameter() {index=2, name="img"} : f32[2,4,9,9]
  %4 = parameter() {index=3, name="f"} : f32[6,2,3,3]
  %5 = conv2d(%3, %4) {dilation=[1,1], groups=2, padding=[0,0,0,0], strides=[2,2]} : f32[2,6,4,4]
  return y=%2, z=%5
}
)");
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CountGraphCost(*g, {"x", "img"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->flops, 2.0 * 4 * 8 * 32 * 16 + 2.0 * (2 * 6 * 4 * 4) * (2 * 3 * 3));
  EXPECT_EQ(c->weight_bytes, 4 * (4 * 16 * 32 + 6 * 2 * 3 * 3));
  EXPECT_EQ(c->input_bytes, 4 * (4 * 8 * 16 + 2 * 4 * 9 * 9));
  EXPECT_EQ(c->output_bytes, 4 * (4 * 8 * 32 + 2 * 6 * 4 * 4));
  // With no inputs named, every parameter is a weight.
  EXPECT_EQ(CountGraphCost(*g, {})->weight_bytes, c->weight_bytes + c->input_bytes);
}

TEST(CountGraphCost, BadContractionsAreErrorsNamingTheNode) {
  ir::Graph g;
  const int x = g.AddNode(ir::Opcode::kParameter, {}, {DType::kF32, Shape{2, 3}},
                          {{"index", int64_t{0}}, {"name", std::string("x")}});
  const int w = g.AddNode(ir::Opcode::kParameter, {}, {DType::kF32, Shape{4, 5}},
                          {{"index", int64_t{1}}, {"name", std::string("w")}});
  ir::Graph missing = g;
  missing.AddOutput(
      "y", missing.AddNode(ir::Opcode::kDotGeneral, {x, w}, {DType::kF32, Shape{2, 5}}, {}));
  auto c = CountGraphCost(missing, {"x"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("%2 = dot_general"));
  EXPECT_THAT(c.status().message(), HasSubstr("lhs_contracting"));

  ir::Graph mismatch = g;  // 3 against 4
  mismatch.AddOutput("y",
                     mismatch.AddNode(ir::Opcode::kDotGeneral, {x, w}, {DType::kF32, Shape{2, 5}},
                                      {{"lhs_batch", std::vector<int64_t>{}},
                                       {"rhs_batch", std::vector<int64_t>{}},
                                       {"lhs_contracting", std::vector<int64_t>{1}},
                                       {"rhs_contracting", std::vector<int64_t>{0}}}));
  c = CountGraphCost(mismatch, {"x"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("contracted sizes differ: [2,3] x [4,5]"));

  ir::Graph flat = g;  // a conv2d whose filter is not OIHW
  flat.AddOutput("y",
                 flat.AddNode(ir::Opcode::kConv2d, {x, w}, {DType::kF32, Shape{1, 1, 1, 1}}, {}));
  c = CountGraphCost(flat, {"x"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("%2 = conv2d: expected an OIHW filter"));

  ir::Graph dangling = g;
  dangling.AddOutput("y", 7);
  c = CountGraphCost(dangling, {"x"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("output 'y' names node 7"));
}

// Every kernel runs exactly `iters` steps of acc = acc * a + b: the closed form
// a^k * start + b * (1 - a^k) / (1 - a) tells 1000 steps from 999.
TEST(FmaChains, EveryIsaComputesTheClosedForm) {
  for (FmaIsa isa : {FmaIsa::kAvx512, FmaIsa::kAvx2, FmaIsa::kScalar, FmaIsa::kAuto}) {
    for (int64_t k : {int64_t{1}, int64_t{7}, int64_t{1000}}) {
      const double a = 0.999, b = 0.001, ak = std::pow(a, static_cast<double>(k));
      const double want = ak * 0.25 + b * (1 - ak) / (1 - a);
      EXPECT_NEAR(FmaChains(isa, k, 0.25f, 0.999f, 0.001f), want, 2e-5)
          << FmaIsaName(isa) << " " << k;
    }
    const double one_less = std::pow(0.999, 999.0) * 0.25 + (1 - std::pow(0.999, 999.0));
    EXPECT_GT(std::fabs(FmaChains(isa, 1000, 0.25f, 0.999f, 0.001f) - one_less), 1e-4);
  }
}

TEST(FmaChains, FlopsPerIsa) {
  const FmaIsa best = BestFmaIsa();
  EXPECT_EQ(FmaChainsFlops(FmaIsa::kScalar, 10), 10.0 * 8 * 2);
  EXPECT_EQ(FmaChainsFlops(FmaIsa::kAuto, 10), FmaChainsFlops(best, 10));
  if (best == FmaIsa::kAvx512) {
    EXPECT_EQ(FmaChainsFlops(FmaIsa::kAvx512, 10), 10.0 * 16 * 16 * 2);
    EXPECT_EQ(FmaChainsFlops(FmaIsa::kAvx2, 10), 10.0 * 12 * 8 * 2);
  }
  if (best == FmaIsa::kScalar) {  // no AVX2: the wider asks fall back
    EXPECT_EQ(FmaChainsFlops(FmaIsa::kAvx512, 10), FmaChainsFlops(FmaIsa::kScalar, 10));
  }
  EXPECT_EQ(FmaIsaName(FmaIsa::kAvx512), "avx512f");
  EXPECT_EQ(FmaIsaName(FmaIsa::kAvx2), "avx2+fma");
}

TEST(StreamSum, SumsEveryElement) {
  for (int64_t n : {int64_t{16}, int64_t{48}, int64_t{128}, int64_t{4096 + 80}}) {
    std::vector<float> v(n);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += (v[i] = static_cast<float>(i % 7));
    EXPECT_EQ(StreamSum(v.data(), n), want) << n;
  }
}

TEST(Measure, PeakAndBandwidthArePositiveAndTheWideKernelIsFaster) {
  EXPECT_EQ(MeasureFmaPeak(1, FmaIsa::kAuto, 3, 0.001, 0).repetitions, 3);  // no budget: 3
  // The wide kernel gets 50 ms of repetitions, so a loaded machine cannot starve all of them.
  const FmaPeak wide = MeasureFmaPeak(1, FmaIsa::kAuto, 3, 0.005, 0.05);
  EXPECT_GT(wide.gflop_per_s, 0);
  EXPECT_EQ(wide.isa, BestFmaIsa());
  EXPECT_EQ(wide.threads, 1);
  EXPECT_GE(wide.repetitions, 3);
  if (wide.isa == FmaIsa::kAvx512) {
    // 16 lanes x fused multiply-add against 1 lane x (multiply, add): ~16x; 2x even under load.
    const FmaPeak scalar = MeasureFmaPeak(1, FmaIsa::kScalar, 3, 0.005, 0);
    EXPECT_EQ(scalar.isa, FmaIsa::kScalar);
    EXPECT_GT(wide.gflop_per_s, 2 * scalar.gflop_per_s);
  }
  const FmaPeak two = MeasureFmaPeak(2, FmaIsa::kAuto, 2, 0.005, 0.05);
  EXPECT_EQ(two.threads, 2);
  EXPECT_GE(two.repetitions, 2);  // and more within the 50 ms budget
  EXPECT_GT(two.gflop_per_s, 0);

  const ReadBandwidth bw = MeasureReadBandwidth(1 << 20, 2, 2, 0.005, 0);
  EXPECT_EQ(bw.bytes, 1 << 20);
  EXPECT_EQ(bw.threads, 2);
  EXPECT_GT(bw.gb_per_s, 0.1);
  EXPECT_EQ(MeasureReadBandwidth(1000, 1, 1, 0.001, 0).bytes, 64 << 10);  // at least 64 KiB
}

TEST(Roofline, FloorsAndVerdictsFromTheLeadsFigures) {
  GraphCost mlp256;  // 1.616 GFLOP, 12.6 MB of weights
  mlp256.flops = 2.0 * 256 * (1024 * 1024 * 3 + 1024 * 10);
  mlp256.weight_bytes = 4 * (1024 * 1024 * 3 + 1024 * 10 + 1024 * 3 + 10);
  mlp256.input_bytes = 4 * 256 * 1024;
  mlp256.output_bytes = 4 * 256 * 11;
  Roofline r = MakeRoofline(mlp256, 479, 150);
  EXPECT_TRUE(r.compute_bound);
  EXPECT_NEAR(r.compute_floor_us, mlp256.flops / 479e3, 1e-9);
  EXPECT_NEAR(r.memory_floor_us, mlp256.min_bytes() / 150e3, 1e-9);
  EXPECT_EQ(r.floor_us, r.compute_floor_us);
  EXPECT_NEAR(RoofShare(r, 3480), 0.969, 1e-3);
  EXPECT_EQ(Verdict(r, 3480, 4100),
            "compute-bound (1.616 GFLOP at 479 GFLOP/s): Kiln at 97% of the FMA peak, ORT at 82%; "
            "0.80x of ORT would need 103%: beyond the roof");

  GraphCost mlp1 = mlp256;
  mlp1.flops /= 256;
  mlp1.input_bytes = 4096;
  mlp1.output_bytes = 44;
  mlp1.largest_value_bytes = 4096;
  r = MakeRoofline(mlp1, 479, 150);
  EXPECT_FALSE(r.compute_bound);
  EXPECT_NEAR(r.floor_us, mlp1.min_bytes() / 150e3, 1e-9);
  EXPECT_THAT(Verdict(r, 100, 120),
              HasSubstr("memory-bound (12.64 MB at 150 GB/s over a 12.1 MiB working set): Kiln "
                        "at 84% of the read bandwidth, ORT at 70%; 0.80x of ORT would need 88%: "
                        "within the roof"));
  EXPECT_THAT(Verdict(r, 80, 120), HasSubstr("would need 88%: reached"));
  EXPECT_THAT(Verdict(r, 1000, 1200), HasSubstr("both under 20% of the roof"));
  EXPECT_EQ(Verdict(r, 100, 0),
            "memory-bound (12.64 MB at 150 GB/s over a 12.1 MiB working set): Kiln at 84% of the "
            "read bandwidth");
  EXPECT_THAT(Verdict(MakeRoofline(mlp1, 0, 0), 100, 120), HasSubstr("no floor"));
  GraphCost small;  // below 0.1 GFLOP in MFLOP
  small.flops = 1.7885e6;
  EXPECT_THAT(Verdict(MakeRoofline(small, 479, 150), 10, 20),
              HasSubstr("compute-bound (1.79 MFLOP at 479 GFLOP/s): Kiln at 37% of the FMA peak"));
}

}  // namespace
}  // namespace kiln::bench
