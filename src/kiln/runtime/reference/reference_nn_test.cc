// Reference backend: dot_general, conv2d and its gradients, pooling and the composite ops.
// Expected values are hand-computed, from torch 1.13 (noted), or from a naive formula written
// independently here; gradients are checked exactly through the adjoint identity
// <op(x), g> = <x, grad_op(g)>, which holds for every linear op.
#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "kiln/runtime/reference/reference_test_util.h"

namespace kiln::runtime {
namespace {

using namespace kiln::ir;  // NOLINT
using testing::ExpectValues;
using testing::F32;
using testing::F64;
using testing::Make;
using testing::RunRef;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Deterministic pseudo-random values in [-1, 1).
std::vector<double> Values(int64_t n, uint32_t seed) {
  std::vector<double> v(n);
  uint64_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<double>(s >> 11) / 9007199254740992.0 * 2 - 1;
  }
  return v;
}

double Dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) s += a.GetDouble(i) * b.GetDouble(i);
  return s;
}

// ---------------------------------------------------------------------------------------------
// dot_general

TEST(ReferenceDotTest, MatMul) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 3});
  Value w = b.Parameter("w", DType::kF32, {3, 2});
  b.Output("y", MatMul(x, w));
  auto out = RunRef(b, {F32({2, 3}, {1, 2, 3, 4, 5, 6}), F32({3, 2}, {7, 8, 9, 10, 11, 12})});
  ASSERT_EQ(out.size(), 1u);
  ExpectValues(out[0], {58, 64, 139, 154});
}

TEST(ReferenceDotTest, IntegerDot) {
  Builder b;
  Value x = b.Parameter("x", DType::kS32, {1, 2});
  Value w = b.Parameter("w", DType::kS32, {2, 1});
  b.Output("y", MatMul(x, w));
  auto out = RunRef(b, {Make(DType::kS32, {1, 2}, {3, -4}), Make(DType::kS32, {2, 1}, {5, 6})});
  ASSERT_EQ(out.size(), 1u);
  ExpectValues(out[0], {-9});
}

TEST(ReferenceDotTest, GeneralDimsMatchNaiveLoop) {
  // lhs [K=3, B=2, M=4], rhs [B=2, K=3, N=5]: batch lhs 1 / rhs 0, contracting lhs 0 / rhs 1.
  Builder b;
  Value l = b.Parameter("l", DType::kF64, {3, 2, 4});
  Value r = b.Parameter("r", DType::kF64, {2, 3, 5});
  b.Output("y", DotGeneral(l, r, DotDims{{1}, {0}, {0}, {1}}));
  std::vector<double> lv = Values(24, 1), rv = Values(30, 2);
  auto out = RunRef(b, {F64({3, 2, 4}, lv), F64({2, 3, 5}, rv)});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].shape(), (Shape{2, 4, 5}));
  for (int bb = 0; bb < 2; ++bb)
    for (int m = 0; m < 4; ++m)
      for (int nn = 0; nn < 5; ++nn) {
        double want = 0;
        for (int k = 0; k < 3; ++k) want += lv[(k * 2 + bb) * 4 + m] * rv[(bb * 3 + k) * 5 + nn];
        EXPECT_NEAR(out[0].GetDouble((bb * 4 + m) * 5 + nn), want, 1e-14);
      }
}

// ---------------------------------------------------------------------------------------------
// conv2d

TEST(ReferenceConvTest, HandComputed) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {1, 1, 3, 3});
  Value f = b.Parameter("f", DType::kF32, {1, 1, 2, 2});
  b.Output("valid", Conv2d(x, f));
  Conv2dOptions padded;
  padded.padding = {1, 0, 0, 0};
  padded.strides = {2, 1};
  b.Output("padded", Conv2d(x, f, padded));
  auto out =
      RunRef(b, {F32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}), F32({1, 1, 2, 2}, {1, 1, 1, 1})});
  ASSERT_EQ(out.size(), 2u);
  ExpectValues(out[0], {12, 16, 24, 28});
  // Padded rows are -1..2, stride 2: windows at rows (-1, 0) and (1, 2).
  EXPECT_EQ(out[1].shape(), (Shape{1, 1, 2, 2}));
  ExpectValues(out[1], {3, 5, 24, 28});
}

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, groups;
  Conv2dOptions opts;
};

// torch.nn.functional.conv2d written out directly from its definition, over an explicitly
// zero-padded copy of the input.
std::vector<double> NaiveConv(const ConvCase& k, const std::vector<double>& x,
                              const std::vector<double>& f, int64_t oh, int64_t ow) {
  const auto& p = k.opts.padding;
  int64_t ph = k.h + p[0] + p[1], pw = k.w + p[2] + p[3];
  std::vector<double> padded(k.n * k.c * ph * pw, 0.0);
  for (int64_t b = 0; b < k.n; ++b)
    for (int64_t c = 0; c < k.c; ++c)
      for (int64_t i = 0; i < k.h; ++i)
        for (int64_t j = 0; j < k.w; ++j)
          padded[((b * k.c + c) * ph + i + p[0]) * pw + j + p[2]] =
              x[((b * k.c + c) * k.h + i) * k.w + j];
  int64_t cg = k.c / k.groups, og = k.o / k.groups;
  std::vector<double> out(k.n * k.o * oh * ow, 0.0);
  for (int64_t b = 0; b < k.n; ++b)
    for (int64_t g = 0; g < k.groups; ++g)
      for (int64_t oc = g * og; oc < (g + 1) * og; ++oc)
        for (int64_t y = 0; y < oh; ++y)
          for (int64_t xx = 0; xx < ow; ++xx) {
            double s = 0;
            for (int64_t ci = 0; ci < cg; ++ci)
              for (int64_t a = 0; a < k.kh; ++a)
                for (int64_t bb = 0; bb < k.kw; ++bb) {
                  int64_t iy = y * k.opts.strides[0] + a * k.opts.dilation[0];
                  int64_t ix = xx * k.opts.strides[1] + bb * k.opts.dilation[1];
                  s += padded[((b * k.c + g * cg + ci) * ph + iy) * pw + ix] *
                       f[((oc * cg + ci) * k.kh + a) * k.kw + bb];
                }
            out[((b * k.o + oc) * oh + y) * ow + xx] = s;
          }
  return out;
}

std::vector<ConvCase> ConvCases() {
  std::vector<ConvCase> cases;
  ConvCase a{2, 4, 7, 6, 6, 3, 2, 2, {}};
  a.opts.strides = {2, 1};
  a.opts.dilation = {1, 2};
  a.opts.padding = {1, 0, 2, 1};
  a.opts.groups = 2;
  cases.push_back(a);
  ConvCase depthwise{1, 3, 5, 5, 3, 3, 3, 3, {}};
  depthwise.opts.dilation = {2, 2};
  depthwise.opts.padding = {2, 2, 2, 2};
  depthwise.opts.groups = 3;
  cases.push_back(depthwise);
  ConvCase pointwise{1, 2, 5, 4, 4, 1, 1, 1, {}};
  pointwise.opts.strides = {2, 3};
  cases.push_back(pointwise);
  return cases;
}

TEST(ReferenceConvTest, MatchesNaiveFormulaAndGradientsAreAdjoint) {
  int which = 0;
  for (const ConvCase& k : ConvCases()) {
    SCOPED_TRACE("case " + std::to_string(which++));
    Shape xs{k.n, k.c, k.h, k.w}, fs{k.o, k.c / k.groups, k.kh, k.kw};
    Builder b;
    Value x = b.Parameter("x", DType::kF64, xs);
    Value f = b.Parameter("f", DType::kF64, fs);
    Value y = Conv2d(x, f, k.opts);
    Shape ys = y.shape();
    Value g = b.Parameter("g", DType::kF64, ys);
    b.Output("y", y);
    b.Output("dx", Conv2dBackwardInput(g, f, xs, k.opts));
    b.Output("df", Conv2dBackwardFilter(x, g, fs, k.opts));
    std::vector<double> xv = Values(xs.num_elements(), 3), fv = Values(fs.num_elements(), 4);
    Tensor xt = F64(xs, xv), ft = F64(fs, fv), gt = F64(ys, Values(ys.num_elements(), 5));
    auto out = RunRef(b, {xt, ft, gt});
    ASSERT_EQ(out.size(), 3u);
    ExpectValues(out[0], NaiveConv(k, xv, fv, ys.dim(2), ys.dim(3)), 1e-13);
    double lhs = Dot(out[0], gt);
    EXPECT_NEAR(Dot(xt, out[1]), lhs, 1e-11);
    EXPECT_NEAR(Dot(ft, out[2]), lhs, 1e-11);
  }
}

TEST(ReferenceConvTest, BackwardInputHandComputed) {
  // 1x1 2x2 filter over a 3x3 input: each input pixel collects the filter taps that read it.
  Builder b;
  Value g = b.Parameter("g", DType::kF32, {1, 1, 2, 2});
  Value f = b.Parameter("f", DType::kF32, {1, 1, 2, 2});
  b.Output("dx", Conv2dBackwardInput(g, f, Shape{1, 1, 3, 3}, {}));
  auto out = RunRef(b, {F32({1, 1, 2, 2}, {1, 0, 0, 0}), F32({1, 1, 2, 2}, {1, 2, 3, 4})});
  ASSERT_EQ(out.size(), 1u);
  ExpectValues(out[0], {1, 2, 0, 3, 4, 0, 0, 0, 0});
}

// ---------------------------------------------------------------------------------------------
// Pooling

TEST(ReferencePoolTest, AvgAndMaxWithPadding) {
  // torch.nn.functional.avg_pool2d / max_pool2d(kernel 3, stride 2, padding 1) on arange(16).
  Pool2dOptions o;
  o.window = {3, 3};
  o.strides = {2, 2};
  o.padding = {1, 1, 1, 1};
  Pool2dOptions include = o;
  include.count_include_pad = true;
  Builder b;
  Value x = b.Parameter("x", DType::kF64, {1, 1, 4, 4});
  b.Output("avg_include", AvgPool2d(x, include));
  b.Output("avg_exclude", AvgPool2d(x, o));
  b.Output("max_neg", MaxPool2d(-x, o));  // padding never wins, even over negatives
  std::vector<double> in(16);
  for (int i = 0; i < 16; ++i) in[i] = i;
  auto out = RunRef(b, {F64({1, 1, 4, 4}, in)});
  ASSERT_EQ(out.size(), 3u);
  ExpectValues(out[0], {10.0 / 9, 24.0 / 9, 51.0 / 9, 10}, 1e-15);
  ExpectValues(out[1], {2.5, 4, 8.5, 10});
  ExpectValues(out[2], {0, -1, -4, -5});
}

TEST(ReferencePoolTest, AsymmetricPadding) {
  // x = [[1,2,3],[4,5,6]], window 2x2, stride 1, padding top 1, right 1 (output 2x3).
  Pool2dOptions o;
  o.window = {2, 2};
  o.strides = {1, 1};
  o.padding = {1, 0, 0, 1};
  Pool2dOptions include = o;
  include.count_include_pad = true;
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {1, 1, 2, 3});
  b.Output("include", AvgPool2d(x, include));
  b.Output("exclude", AvgPool2d(x, o));
  b.Output("max", MaxPool2d(x, o));
  auto out = RunRef(b, {F32({1, 1, 2, 3}, {1, 2, 3, 4, 5, 6})});
  ASSERT_EQ(out.size(), 3u);
  ExpectValues(out[0], {0.75, 1.25, 0.75, 3, 4, 2.25});
  ExpectValues(out[1], {1.5, 2.5, 3, 3, 4, 4.5});
  ExpectValues(out[2], {2, 3, 3, 5, 6, 6});
}

TEST(ReferencePoolTest, MaxPoolNanPropagates) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {1, 1, 2, 2});
  b.Output("y", MaxPool2d(x));
  auto out = RunRef(b, {F32({1, 1, 2, 2}, {1, kNaN, 3, 4})});
  ASSERT_EQ(out.size(), 1u);
  ExpectValues(out[0], {kNaN});
}

TEST(ReferencePoolTest, MaxPoolGradGoesToFirstMax) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {1, 1, 2, 4});
  Value g = b.Parameter("g", DType::kF32, {1, 1, 1, 2});
  b.Output("dx", MaxPool2dGrad(x, g, {}));
  Value x2 = b.Parameter("x2", DType::kF32, {1, 1, 2, 3});
  Value g2 = b.Parameter("g2", DType::kF32, {1, 1, 1, 2});
  Pool2dOptions overlap;
  overlap.strides = {1, 1};
  b.Output("dx_overlap", MaxPool2dGrad(x2, g2, overlap));
  auto out = RunRef(b, {F32({1, 1, 2, 4}, {1, 3, 3, 0, 3, 2, 0, 0}), F32({1, 1, 1, 2}, {10, 20}),
                        F32({1, 1, 2, 3}, {1, 5, 2, 0, 1, 3}), F32({1, 1, 1, 2}, {1, 2})});
  ASSERT_EQ(out.size(), 2u);
  ExpectValues(out[0], {0, 10, 20, 0, 0, 0, 0, 0});  // ties: first in row-major order
  ExpectValues(out[1], {0, 3, 0, 0, 0, 0});          // overlapping windows add up
}

TEST(ReferencePoolTest, AvgPoolGradIsAdjoint) {
  for (bool include : {false, true}) {
    SCOPED_TRACE(include ? "count_include_pad" : "exclude pad");
    Pool2dOptions o;
    o.window = {3, 2};
    o.strides = {2, 1};
    o.padding = {1, 2, 0, 1};
    o.count_include_pad = include;
    Shape xs{2, 3, 5, 4};
    Builder b;
    Value x = b.Parameter("x", DType::kF64, xs);
    Value y = AvgPool2d(x, o);
    Shape ys = y.shape();
    Value g = b.Parameter("g", DType::kF64, ys);
    b.Output("y", y);
    b.Output("dx", AvgPool2dGrad(g, xs, o));
    Tensor xt = F64(xs, Values(xs.num_elements(), 6)), gt = F64(ys, Values(ys.num_elements(), 7));
    auto out = RunRef(b, {xt, gt});
    ASSERT_EQ(out.size(), 2u);
    EXPECT_NEAR(Dot(xt, out[1]), Dot(out[0], gt), 1e-12);
  }
}

TEST(ReferencePoolTest, AvgPoolGradHandComputed) {
  Pool2dOptions o;  // 2x2 window, stride 2
  Builder b;
  Value g = b.Parameter("g", DType::kF32, {1, 1, 1, 2});
  b.Output("dx", AvgPool2dGrad(g, Shape{1, 1, 2, 4}, o));
  auto out = RunRef(b, {F32({1, 1, 1, 2}, {4, 8})});
  ASSERT_EQ(out.size(), 1u);
  ExpectValues(out[0], {1, 1, 2, 2, 1, 1, 2, 2});
}

// ---------------------------------------------------------------------------------------------
// Composites

TEST(ReferenceCompositeTest, SoftmaxAndLogSoftmax) {
  Builder b;
  Value x = b.Parameter("x", DType::kF64, {3});
  b.Output("softmax", Softmax(x));
  b.Output("log_softmax", LogSoftmax(x));
  Value m = b.Parameter("m", DType::kF64, {2, 2});
  b.Output("softmax_axis0", Softmax(m, 0));
  auto out = RunRef(b, {F64({3}, {1, 2, 3}), F64({2, 2}, {0, -kInf, 0, 5})});
  ASSERT_EQ(out.size(), 3u);
  // torch.softmax([1., 2., 3.])
  ExpectValues(out[0], {0.090030573170380, 0.244728471054798, 0.665240955774822}, 1e-15);
  double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  ExpectValues(out[1], {1 - lse, 2 - lse, 3 - lse}, 1e-15);
  ExpectValues(out[2], {0.5, 0, 0.5, 1});
}

TEST(ReferenceCompositeTest, SoftmaxIsStableForLargeInputs) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2});
  b.Output("y", Softmax(x));
  auto out = RunRef(b, {F32({2}, {1000, 1000})});
  ASSERT_EQ(out.size(), 1u);
  ExpectValues(out[0], {0.5, 0.5});
}

TEST(ReferenceCompositeTest, LayerNormAndRmsNorm) {
  Builder b;
  Value x = b.Parameter("x", DType::kF64, {1, 4});
  Value gamma = b.Parameter("gamma", DType::kF64, {4});
  Value beta = b.Parameter("beta", DType::kF64, {4});
  b.Output("ln", LayerNorm(x, gamma, beta, 1e-5));
  Value r = b.Parameter("r", DType::kF64, {2, 2});
  Value rg = b.Parameter("rg", DType::kF64, {2});
  b.Output("rms", RmsNorm(r, rg, 1e-6));
  auto out = RunRef(b, {F64({1, 4}, {1, 2, 3, 4}), F64({4}, {1, 2, 1, 1}), F64({4}, {0, 0, 1, 0}),
                        F64({2, 2}, {3, 4, 0, 0}), F64({2}, {1, 2})});
  ASSERT_EQ(out.size(), 2u);
  // torch.nn.functional.layer_norm(x, (4,), gamma, beta, eps=1e-5)
  ExpectValues(out[0],
               {-1.341635419968927, -0.894423613312618, 1.447211806656309, 1.341635419968927},
               1e-14);
  double s = std::sqrt(12.5 + 1e-6);  // mean(3^2, 4^2) + eps
  ExpectValues(out[1], {3 / s, 8 / s, 0, 0}, 1e-15);
}

TEST(ReferenceCompositeTest, CrossEntropy) {
  Builder b;
  Value logits = b.Parameter("logits", DType::kF64, {3, 3});
  Value labels = b.Parameter("labels", DType::kS32, {3});
  b.Output("loss", SparseCrossEntropy(logits, labels));
  auto out =
      RunRef(b, {F64({3, 3}, {1, 2, 3, 0, 0, 0, 5, 5, 5}), Make(DType::kS32, {3}, {2, 0, -100})});
  ASSERT_EQ(out.size(), 1u);
  // torch cross_entropy(reduction='none'); an out-of-range label (ignore_index) gives 0.
  ExpectValues(out[0], {0.407605964444380, std::log(3.0), 0}, 1e-14);
}

TEST(ReferenceCompositeTest, AttentionPlainAndCausal) {
  // q [2,1], k [3,1], v [3,1], scale 1: query i scores key j as q_i * k_j.
  Builder b;
  Value q = b.Parameter("q", DType::kF64, {1, 2, 1});
  Value k = b.Parameter("k", DType::kF64, {1, 3, 1});
  Value v = b.Parameter("v", DType::kF64, {1, 3, 1});
  b.Output("plain", Attention(q, k, v, false, 1.0));
  b.Output("causal", Attention(q, k, v, true, 1.0));
  b.Output("scaled", Attention(q, k, v, false, 0.5));
  auto out =
      RunRef(b, {F64({1, 2, 1}, {1, 2}), F64({1, 3, 1}, {0, 1, 2}), F64({1, 3, 1}, {10, 20, 30})});
  ASSERT_EQ(out.size(), 3u);
  auto expect = [](std::vector<double> scores, std::vector<double> vals) {
    double z = 0, s = 0;
    for (size_t j = 0; j < scores.size(); ++j) z += std::exp(scores[j]);
    for (size_t j = 0; j < scores.size(); ++j) s += std::exp(scores[j]) / z * vals[j];
    return s;
  };
  ExpectValues(out[0], {expect({0, 1, 2}, {10, 20, 30}), expect({0, 2, 4}, {10, 20, 30})}, 1e-13);
  // Sk - Sq = 1: query 0 sees keys 0..1, query 1 sees all three.
  ExpectValues(out[1], {expect({0, 1}, {10, 20}), expect({0, 2, 4}, {10, 20, 30})}, 1e-13);
  ExpectValues(out[2], {expect({0, 0.5, 1}, {10, 20, 30}), expect({0, 1, 2}, {10, 20, 30})}, 1e-13);
}

TEST(ReferenceCompositeTest, AttentionBatchesDefaultScaleAndMaskedRows) {
  // Two batches with D = 2 and the default scale 1/sqrt(2); a causal query that sees no key is NaN.
  Builder b;
  Value q = b.Parameter("q", DType::kF64, {2, 1, 2});
  Value k = b.Parameter("k", DType::kF64, {2, 2, 2});
  Value v = b.Parameter("v", DType::kF64, {2, 2, 1});
  b.Output("y", Attention(q, k, v));
  Value q3 = b.Parameter("q3", DType::kF64, {2, 1});
  Value k1 = b.Parameter("k1", DType::kF64, {1, 1});
  Value v1 = b.Parameter("v1", DType::kF64, {1, 1});
  b.Output("masked", Attention(q3, k1, v1, true, 1.0));
  auto out = RunRef(
      b, {F64({2, 1, 2}, {1, 1, 2, 0}), F64({2, 2, 2}, {1, 0, 0, 1, 1, 1, 0, 0}),
          F64({2, 2, 1}, {1, 3, 5, 7}), F64({2, 1}, {1, 1}), F64({1, 1}, {1}), F64({1, 1}, {9})});
  ASSERT_EQ(out.size(), 2u);
  // Batch 0: scores (1, 1) -> mean of v = 2. Batch 1: scores (2, 0) / sqrt 2.
  double a = std::exp(2 / std::sqrt(2.0)), z = a + 1;
  ExpectValues(out[0], {2, (5 * a + 7) / z}, 1e-14);
  // Sq = 2, Sk = 1: query 0 may see keys j <= -1 (none), query 1 sees key 0.
  ExpectValues(out[1], {kNaN, 9});
}

TEST(ReferenceCompositeTest, RunsInNarrowFloats) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    Builder b;
    Value x = b.Parameter("x", t, {2, 3});
    Value gamma = b.Parameter("gamma", t, {3});
    b.Output("softmax", Softmax(x));
    b.Output("rms", RmsNorm(x, gamma, 0.0));
    auto out = RunRef(b, {Make(t, {2, 3}, {1, 2, 3, 0, 0, 0}), Make(t, {3}, {1, 1, 1})});
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].dtype(), t);
    double tol = t == DType::kBF16 ? 4e-3 : t == DType::kF16 ? 5e-4 : 1e-7;
    ExpectValues(
        out[0],
        {0.090030573170380, 0.244728471054798, 0.665240955774822, 1.0 / 3, 1.0 / 3, 1.0 / 3}, tol);
    double s = std::sqrt(14.0 / 3);
    ExpectValues(out[1], {1 / s, 2 / s, 3 / s, kNaN, kNaN, kNaN}, tol * 4);  // 0/0 with eps 0
  }
}

}  // namespace
}  // namespace kiln::runtime
