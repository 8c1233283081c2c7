// The int8 pass (quantize_int8.h): IR text in, printed IR out; the sites it finds, the
// calibration program, per-channel weight quantization by hand.
#include "kiln/compiler/passes/quantize_int8.h"

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"

namespace kiln::compiler {
namespace {

using testing::ExpectRewrite;
using testing::ExpectUnchanged;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(QuantizeInt8Pass, RewritesAWeightMatmulAndKeepsTheRest) {
  // w [K=2, N=2]: channel 0 = (1, 0.25), channel 1 = (-2, -0.5); activation scale 0.5. w is read
  // only by the matmul, so it goes; b stays and x keeps its place; the int8 weight and the scales
  // (0.5 * channel scale) are new parameters after them; the bias add and relu are unchanged.
  const std::map<std::string, Tensor> weights = {
      {"w", Tensor::FromVector<float>({2, 2}, {1.f, -2.f, 0.25f, -0.5f})},
      {"b", Tensor::FromVector<float>({2}, {1.f, 2.f})}};
  QuantizeInt8Pass pass(weights, {0.5f});
  ExpectRewrite(pass, R"(
    graph @g {
      %w = parameter() {index=0, name="w"} : f32[2,2]
      %b = parameter() {index=1, name="b"} : f32[2]
      %x = parameter() {index=2, name="x"} : f32[3,2]
      %d = dot_general(%x, %w) {lhs_batch=[], rhs_batch=[], lhs_contracting=[1], rhs_contracting=[0]} : f32[3,2]
      %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[3,2]}
      %y = add(%d, %bb)
      %r = relu(%y)
      return y=%r
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="b"} : f32[2]
      %1 = parameter() {index=1, name="x"} : f32[3,2]
      %2 = parameter() {index=2, name="w.int8"} : s8[2,2]
      %3 = parameter() {index=3, name="w.scale"} : f32[2]
      %4 = quantize(%1) {scale=0.5}
      %5 = quantized_dot(%4, %2, %3)
      %6 = broadcast_in_dim(%0) {broadcast_dimensions=[1], shape=[3,2]}
      %7 = add(%5, %6)
      %8 = relu(%7)
      return y=%8
    })");
  const Int8Program& q = pass.result();
  ASSERT_EQ(q.layers.size(), 1u);
  EXPECT_EQ(q.layers[0].weight_scales, (std::vector<float>{1.f / 127, 2.f / 127}));
  EXPECT_EQ(q.weights.count("w"), 0u);
  EXPECT_EQ(q.weights.count("b"), 1u);
  EXPECT_EQ(std::vector<int8_t>(q.weights.at("w.int8").data<int8_t>(),
                                q.weights.at("w.int8").data<int8_t>() + 4),
            (std::vector<int8_t>{127, -127, 32, -32}));
  EXPECT_EQ(q.weights.at("w.scale").data<float>()[1], 0.5f * (2.f / 127));
}

TEST(QuantizeInt8Pass, LeavesActivationProductsAndNonWeightsAlone) {
  // x . y^T of two activations, and a matmul whose right operand is not a weight: no site.
  const std::map<std::string, Tensor> weights = {{"b", Tensor::FromVector<float>({2}, {1.f, 2.f})}};
  QuantizeInt8Pass pass(weights, {});
  ExpectUnchanged(pass, R"(
    graph @g {
      %b = parameter() {index=0, name="b"} : f32[2]
      %x = parameter() {index=1, name="x"} : f32[3,2]
      %w = parameter() {index=2, name="w"} : f32[2,2]
      %d = dot_general(%x, %w) {lhs_batch=[], rhs_batch=[], lhs_contracting=[1], rhs_contracting=[0]} : f32[3,2]
      %e = dot_general(%x, %x) {lhs_batch=[], rhs_batch=[], lhs_contracting=[1], rhs_contracting=[1]} : f32[3,3]
      return d=%d, e=%e
    })");
}

TEST(QuantizeInt8Pass, OneScalePerSiteOrAnError) {
  const std::map<std::string, Tensor> weights = {
      {"w", Tensor::FromVector<float>({2, 2}, {1.f, -2.f, 0.5f, 1.f})}};
  QuantizeInt8Pass pass(weights, {0.5f, 0.25f});
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(R"(
    graph @g {
      %w = parameter() {index=0, name="w"} : f32[2,2]
      %x = parameter() {index=1, name="x"} : f32[3,2]
      %d = dot_general(%x, %w) {lhs_batch=[], rhs_batch=[], lhs_contracting=[1], rhs_contracting=[0]} : f32[3,2]
      return d=%d
    })");
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string before = ir::PrintGraph(*g);
  absl::StatusOr<bool> r = pass.Run(*g);
  EXPECT_THAT(r.status().message(), HasSubstr("one activation scale per site"));
  EXPECT_EQ(ir::PrintGraph(*g), before);  // left unchanged on error
}

// y = relu(x . w + b), and z = x . v^T with v stored [N, K].
ir::Graph SmallGraph() {
  ir::Builder b("small");
  ir::Value w = b.Parameter("w", DType::kF32, {4, 3});
  ir::Value bias = b.Parameter("b", DType::kF32, {3});
  ir::Value v = b.Parameter("v", DType::kF32, {2, 4});
  ir::Value x = b.Parameter("x", DType::kF32, {2, 4});
  b.Output("y", ir::Relu(ir::MatMul(x, w) + bias));
  b.Output("z", ir::DotGeneral(x, v, {{}, {}, {1}, {1}}));
  absl::StatusOr<ir::Graph> g = b.Build();
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

TEST(Int8Rewrite, FindsWeightMatmulsAndRewritesThem) {
  ir::Graph g = SmallGraph();
  std::vector<Int8Site> sites = FindInt8Sites(g, {"w", "b", "v"});
  ASSERT_EQ(sites.size(), 2u);
  EXPECT_EQ(sites[0].weight, "w");
  EXPECT_FALSE(sites[0].transposed);
  EXPECT_EQ(sites[1].weight, "v");
  EXPECT_TRUE(sites[1].transposed);
  // Not weights: nothing to quantize.
  EXPECT_TRUE(FindInt8Sites(g, {}).empty());

  std::map<std::string, Tensor> weights = {
      {"w", Tensor::FromVector<float>({4, 3}, std::vector<float>(12, 0.5f))},
      {"b", Tensor::FromVector<float>({3}, {1, 2, 3})},
      {"v", Tensor::FromVector<float>({2, 4}, {1, 2, 3, 4, -1, -2, -3, -8})}};
  absl::StatusOr<Int8Program> q = RewriteInt8(g, weights, sites, {0.25f, 0.5f});
  ASSERT_TRUE(q.ok()) << q.status();
  const std::string text = ir::PrintGraph(q->program);
  // The f32 weights are gone; the bias stays; x keeps its place; the int8 weights and scales are
  // new parameters after it.
  EXPECT_THAT(text, Not(HasSubstr("name=\"w\"")));
  EXPECT_THAT(text, Not(HasSubstr("name=\"v\"")));
  EXPECT_THAT(text, HasSubstr("parameter() {index=0, name=\"b\"} : f32[3]"));
  EXPECT_THAT(text, HasSubstr("parameter() {index=1, name=\"x\"} : f32[2,4]"));
  EXPECT_THAT(text, HasSubstr("parameter() {index=2, name=\"w.int8\"} : s8[4,3]"));
  EXPECT_THAT(text, HasSubstr("parameter() {index=3, name=\"w.scale\"} : f32[3]"));
  EXPECT_THAT(text, HasSubstr("parameter() {index=4, name=\"v.int8\"} : s8[4,2]"));
  EXPECT_THAT(text, HasSubstr("quantize(%1) {scale=0.25} : s8[2,4]"));
  EXPECT_THAT(text, HasSubstr("quantized_dot("));
  EXPECT_THAT(text, Not(HasSubstr("dot_general")));
  EXPECT_THAT(text, HasSubstr("relu("));
  // Output scale = activation scale * weight channel scale (0.5 / 127).
  const Tensor& ws = q->weights.at("w.scale");
  EXPECT_EQ(ws.data<float>()[0], 0.25f * (0.5f / 127.0f));
  // v [2, 4] contracted on dim 1 is stored transposed, [K, N].
  const Tensor& vq = q->weights.at("v.int8");
  EXPECT_EQ(vq.shape(), (Shape{4, 2}));
  EXPECT_EQ(vq.data<int8_t>()[0], 32);    // v[0][0] = 1 of channel max 4: 127 / 4 = 31.75 -> 32
  EXPECT_EQ(vq.data<int8_t>()[7], -127);  // v[1][3] = -8, the channel's max
  EXPECT_EQ(q->weights.count("w"), 0u);
  EXPECT_EQ(q->weights.count("b"), 1u);
  ASSERT_EQ(q->layers.size(), 2u);
  EXPECT_EQ(q->layers[1].scale_param, "v.scale");
}

TEST(Int8Rewrite, PerChannelSymmetricWeights) {
  Int8Site site;
  site.weight = "w";
  // [K=2, N=2]: channel 0 = (1, 0.25), channel 1 = (-0.5, 2).
  Tensor w = Tensor::FromVector<float>({2, 2}, {1.f, -0.5f, 0.25f, 2.f});
  absl::StatusOr<QuantizedWeight> q = QuantizeWeight(w, site);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->scales, (std::vector<float>{1.f / 127, 2.f / 127}));
  // 0.25 * 127 = 31.75 -> 32; -0.5 / (2 / 127) = -31.75 -> -32.
  EXPECT_EQ(std::vector<int8_t>(q->q.data<int8_t>(), q->q.data<int8_t>() + 4),
            (std::vector<int8_t>{127, -32, 32, 127}));
  EXPECT_LE(q->max_abs_error, 1.0 / 127 / 2 + 1e-7);
  // All-zero channels get scale 1 (and zeros); non-finite weights are an error naming them.
  Tensor z(DType::kF32, Shape{2, 2});
  absl::StatusOr<QuantizedWeight> qz = QuantizeWeight(z, site);
  ASSERT_TRUE(qz.ok());
  EXPECT_EQ(qz->scales, (std::vector<float>{1.f, 1.f}));
  z.data<float>()[3] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(QuantizeWeight(z, site).status().message(), HasSubstr("weight 'w'"));
}

TEST(Int8Rewrite, CalibrationProgramExposesActivations) {
  ir::Graph g = SmallGraph();
  std::vector<Int8Site> sites = FindInt8Sites(g, {"w", "b", "v"});
  absl::StatusOr<ir::Graph> c = CalibrationProgram(g, sites);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->outputs().size(), 4u);
  EXPECT_EQ(c->outputs()[2].name, CalibrationOutput(0));
  EXPECT_EQ(c->node(c->outputs()[2].node).attr_str("name"), "x");
}

}  // namespace
}  // namespace kiln::compiler
