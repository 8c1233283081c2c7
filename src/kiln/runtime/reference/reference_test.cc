// Reference backend: elementwise, structural, reduction and random kernels, dtype handling, and
// the executable it produces. Contractions, pooling and composites are in reference_nn_test.cc.
#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/eval/kernels.h"
#include "kiln/runtime/reference/reference_test_util.h"

namespace kiln::runtime {
namespace {

using namespace kiln::ir;  // NOLINT: builder functions read best unqualified here
using testing::ExpectValues;
using testing::F32;
using testing::F64;
using ::testing::HasSubstr;
using testing::Make;
using testing::RunRef;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------
// Elementwise

TEST(ReferenceElementwiseTest, UnaryFloat) {
  Builder b;
  Value x = b.Parameter("x", DType::kF64, {4});
  b.Output("abs", Abs(x));
  b.Output("neg", Neg(x));
  b.Output("relu", Relu(x));
  b.Output("sign", Sign(x));
  b.Output("sigmoid", Sigmoid(x));
  b.Output("silu", Silu(x));
  b.Output("gelu", Gelu(x));
  b.Output("gelu_tanh", Gelu(x, /*tanh_approximation=*/true));
  auto out = RunRef(b, {F64({4}, {-1, 0, 1, 2})});
  ASSERT_EQ(out.size(), 8u);
  ExpectValues(out[0], {1, 0, 1, 2});
  ExpectValues(out[1], {1, 0, -1, -2});
  ExpectValues(out[2], {0, 0, 1, 2});
  ExpectValues(out[3], {-1, 0, 1, 1});
  // Values from torch 1.13 in float64.
  ExpectValues(out[4], {0.268941421369995, 0.5, 0.731058578630005, 0.880797077977882}, 1e-14);
  ExpectValues(out[5], {-0.268941421369995, 0, 0.731058578630005, 1.761594155955765}, 1e-14);
  ExpectValues(out[6], {-0.158655253931457, 0, 0.841344746068543, 1.954499736103642}, 1e-14);
  ExpectValues(out[7], {-0.158808009391723, 0, 0.841191990608277, 1.954597694087775}, 1e-14);
}

TEST(ReferenceElementwiseTest, Transcendental) {
  Builder b;
  Value x = b.Parameter("x", DType::kF64, {3});
  b.Output("exp", Exp(x));
  b.Output("log", Log(x));
  b.Output("sqrt", Sqrt(x));
  b.Output("rsqrt", Rsqrt(x));
  b.Output("sin", Sin(x));
  b.Output("cos", Cos(x));
  b.Output("tanh", Tanh(x));
  b.Output("erf", Erf(x));
  auto out = RunRef(b, {F64({3}, {0, 1, 4})});
  ASSERT_EQ(out.size(), 8u);
  ExpectValues(out[0], {1, M_E, std::exp(4.0)});
  ExpectValues(out[1], {-kInf, 0, std::log(4.0)});
  ExpectValues(out[2], {0, 1, 2});
  ExpectValues(out[3], {kInf, 1, 0.5});
  ExpectValues(out[4], {0, std::sin(1.0), std::sin(4.0)});
  ExpectValues(out[5], {1, std::cos(1.0), std::cos(4.0)});
  ExpectValues(out[6], {0, std::tanh(1.0), std::tanh(4.0)});
  ExpectValues(out[7], {0, 0.8427007929497149, 0.9999999845827421}, 1e-15);
}

TEST(ReferenceElementwiseTest, NanHandling) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {3});
  Value y = b.Parameter("y", DType::kF32, {3});
  b.Output("max", Max(x, y));
  b.Output("min", Min(x, y));
  b.Output("sign", Sign(x));
  b.Output("relu", Relu(x));
  auto out = RunRef(b, {F32({3}, {kNaN, 1, 5}), F32({3}, {1, kNaN, 2})});
  ASSERT_EQ(out.size(), 4u);
  ExpectValues(out[0], {kNaN, kNaN, 5});
  ExpectValues(out[1], {kNaN, kNaN, 2});
  ExpectValues(out[2], {0, 1, 1});  // PyTorch: sign(NaN) = 0
  ExpectValues(out[3], {kNaN, 1, 5});
}

TEST(ReferenceElementwiseTest, BinaryFloat) {
  Builder b;
  Value x = b.Parameter("x", DType::kF64, {4});
  Value y = b.Parameter("y", DType::kF64, {4});
  b.Output("add", x + y);
  b.Output("sub", x - y);
  b.Output("mul", x * y);
  b.Output("div", x / y);
  b.Output("pow", Pow(x, y));
  auto out = RunRef(b, {F64({4}, {1, -8, 2, 0}), F64({4}, {2, 1.0 / 3, -1, 0})});
  ASSERT_EQ(out.size(), 5u);
  ExpectValues(out[0], {3, -8 + 1.0 / 3, 1, 0});
  ExpectValues(out[1], {-1, -8 - 1.0 / 3, 3, 0});
  ExpectValues(out[2], {2, -8.0 / 3, -2, 0});
  ExpectValues(out[3], {0.5, -24, -2, kNaN});
  ExpectValues(out[4], {1, kNaN, 0.5, 1});  // std::pow(-8, 1/3) is NaN, pow(0, 0) = 1
}

TEST(ReferenceElementwiseTest, IntegersAreExactAndWrap) {
  Builder b;
  Value x = b.Parameter("x", DType::kS32, {5});
  Value y = b.Parameter("y", DType::kS32, {5});
  b.Output("add", x + y);
  b.Output("div", x / y);
  b.Output("pow", Pow(x, y));
  b.Output("abs", Abs(x));
  b.Output("sign", Sign(x));
  b.Output("max", Max(x, y));
  const double kMin = std::numeric_limits<int32_t>::min();
  auto out = RunRef(b, {Make(DType::kS32, {5}, {2147483647, 7, -7, 5, kMin}),
                        Make(DType::kS32, {5}, {1, 2, 2, 0, -1})});
  ASSERT_EQ(out.size(), 6u);
  ExpectValues(out[0], {kMin, 9, -5, 5, 2147483647});
  ExpectValues(out[1], {2147483647, 3, -3, -1, kMin});  // truncation; x / 0 = -1; MIN / -1 wraps
  ExpectValues(out[2], {2147483647, 49, 49, 1, 0});     // pow(MIN, -1) truncates to 0
  ExpectValues(out[3], {2147483647, 7, 7, 5, kMin});
  ExpectValues(out[4], {1, 1, -1, 1, -1});
  ExpectValues(out[5], {2147483647, 7, 2, 5, -1});

  Builder u;
  Value a = u.Parameter("a", DType::kU8, {3});
  u.Output("sum", a + a);
  u.Output("neg", Neg(a));
  auto uo = RunRef(u, {Make(DType::kU8, {3}, {200, 1, 0})});
  ASSERT_EQ(uo.size(), 2u);
  ExpectValues(uo[0], {144, 2, 0});
  ExpectValues(uo[1], {56, 255, 0});
}

TEST(ReferenceElementwiseTest, IntegerPow) {
  Builder b;
  Value x = b.Parameter("x", DType::kS64, {5});
  Value y = b.Parameter("y", DType::kS64, {5});
  b.Output("pow", Pow(x, y));
  auto out = RunRef(
      b, {Make(DType::kS64, {5}, {2, 3, -1, 1, 2}), Make(DType::kS64, {5}, {10, 0, -3, -5, -1})});
  ASSERT_EQ(out.size(), 1u);
  ExpectValues(out[0], {1024, 1, -1, 1, 0});
}

TEST(ReferenceElementwiseTest, CompareLogicalSelect) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {3});
  Value y = b.Parameter("y", DType::kF32, {3});
  b.Output("eq", Eq(x, y));
  b.Output("ne", Ne(x, y));
  b.Output("lt", Lt(x, y));
  b.Output("le", Le(x, y));
  b.Output("gt", Gt(x, y));
  b.Output("ge", Ge(x, y));
  Value p = Lt(x, y);
  b.Output("and", LogicalAnd(p, Eq(x, x)));
  b.Output("or", LogicalOr(p, Gt(x, y)));
  b.Output("not", LogicalNot(p));
  b.Output("select", Select(Le(x, y), x, y));
  auto out = RunRef(b, {F32({3}, {1, 2, kNaN}), F32({3}, {2, 2, kNaN})});
  ASSERT_EQ(out.size(), 10u);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(out[i].dtype(), DType::kBool);
  ExpectValues(out[0], {0, 1, 0});
  ExpectValues(out[1], {1, 0, 1});
  ExpectValues(out[2], {1, 0, 0});
  ExpectValues(out[3], {1, 1, 0});
  ExpectValues(out[4], {0, 0, 0});
  ExpectValues(out[5], {0, 1, 0});
  ExpectValues(out[6], {1, 0, 0});
  ExpectValues(out[7], {1, 0, 0});
  ExpectValues(out[8], {0, 1, 1});
  ExpectValues(out[9], {1, 2, kNaN});

  // Integer logical ops: nonzero is true, the result keeps the dtype.
  Builder c;
  Value i = c.Parameter("i", DType::kS32, {3});
  Value j = c.Parameter("j", DType::kS32, {3});
  c.Output("and", LogicalAnd(i, j));
  c.Output("not", LogicalNot(i));
  c.Output("lt", Lt(i, j));
  auto io = RunRef(c, {Make(DType::kS32, {3}, {2, 0, -4}), Make(DType::kS32, {3}, {3, 3, 0})});
  ASSERT_EQ(io.size(), 3u);
  ExpectValues(io[0], {1, 0, 0});
  ExpectValues(io[1], {0, 1, 0});
  ExpectValues(io[2], {1, 1, 1});
}

TEST(ReferenceElementwiseTest, Convert) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {5});
  b.Output("s32", Convert(x, DType::kS32));
  b.Output("bool", Convert(x, DType::kBool));
  b.Output("bf16", Convert(x, DType::kBF16));
  Value w = b.Parameter("w", DType::kS64, {3});
  b.Output("s8", Convert(w, DType::kS8));
  b.Output("u8", Convert(w, DType::kU8));
  b.Output("f8", Convert(x, DType::kF8E4M3));
  auto out = RunRef(
      b, {F32({5}, {1.9, -1.9, 3e9, kNaN, 1.01171875}), Make(DType::kS64, {3}, {300, -1, 127})});
  ASSERT_EQ(out.size(), 6u);
  ExpectValues(out[0], {1, -1, 2147483647, 0, 1});  // truncate, saturate, NaN -> 0
  ExpectValues(out[1], {1, 1, 1, 1, 1});
  // bf16 rounds to nearest even: 1.01171875 = 1 + 1.5 * 2^-7 -> 1 + 2^-6.
  EXPECT_EQ(out[2].GetDouble(4), 1.015625);
  EXPECT_EQ(out[2].GetDouble(0), 1.8984375);
  ExpectValues(out[3], {44, -1, 127});  // integer -> integer wraps like a C++ cast
  ExpectValues(out[4], {44, 255, 127});
  EXPECT_EQ(out[5].GetDouble(0), 1.875);  // f8e4m3: 1.9 -> 1.875
  EXPECT_EQ(out[5].GetDouble(2), 448);    // saturates
}

TEST(ReferenceElementwiseTest, F8IsConvertedInAndOut) {
  // f8 types are storage only: the verifier allows them in convert (and sources) alone.
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    Builder b;
    Value x = b.Parameter("x", t, {3});
    b.Output("y", Convert(Convert(x, DType::kF32) * 2.0, t));
    auto out = RunRef(b, {Make(t, {3}, {1.5, -0.25, 0})});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].dtype(), t);
    ExpectValues(out[0], {3, -0.5, 0});
  }
}

TEST(ReferenceElementwiseTest, NarrowFloatsRoundOnce) {
  // In bf16, 1 + 2^-8 is a tie and rounds to 1; computing in double and rounding once must see it.
  for (DType t : {DType::kBF16, DType::kF16}) {
    Builder b;
    Value x = b.Parameter("x", t, {2});
    Value y = b.Parameter("y", t, {2});
    b.Output("add", x + y);
    auto out = RunRef(
        b, {Make(t, {2}, {1, 3}), Make(t, {2}, {t == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048, 0.5})});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].dtype(), t);
    ExpectValues(out[0], {1, 3.5});
  }
}

TEST(ReferenceElementwiseTest, FloatOpsRunInEveryFloatDType) {
  for (DType t : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    Builder b;
    Value x = b.Parameter("x", t, {3});
    b.Output("y", Exp(x) * 2.0 + Tanh(x));
    auto out = RunRef(b, {Make(t, {3}, {0, 0.5, -1})});
    ASSERT_EQ(out.size(), 1u);
    double tol = t == DType::kBF16 ? 2e-2 : t == DType::kF16 ? 2e-3 : 1e-6;
    ExpectValues(
        out[0], {2, 2 * std::exp(0.5) + std::tanh(0.5), 2 * std::exp(-1.0) + std::tanh(-1.0)}, tol);
  }
}

// ---------------------------------------------------------------------------------------------
// Structural

TEST(ReferenceStructuralTest, BroadcastTransposeSliceReshape) {
  Builder b;
  Value v = b.Parameter("v", DType::kF32, {3});
  Value col = b.Parameter("col", DType::kF32, {2, 1});
  Value m = b.Parameter("m", DType::kF32, {2, 3});
  b.Output("bcast_row", BroadcastInDim(v, Shape{2, 3}, {1}));
  b.Output("bcast_col", BroadcastInDim(col, Shape{2, 3}, {0, 1}));
  b.Output("transpose", Transpose(m, {1, 0}));
  b.Output("slice", Slice(m, {0, 1}, {2, 3}, {1, 1}));
  b.Output("slice_strided", Slice(Reshape(m, Shape{6}), {1}, {6}, {3}));
  auto out = RunRef(b, {F32({3}, {1, 2, 3}), F32({2, 1}, {7, 8}), F32({2, 3}, {1, 2, 3, 4, 5, 6})});
  ASSERT_EQ(out.size(), 5u);
  ExpectValues(out[0], {1, 2, 3, 1, 2, 3});
  ExpectValues(out[1], {7, 7, 7, 8, 8, 8});
  EXPECT_EQ(out[2].shape(), (Shape{3, 2}));
  ExpectValues(out[2], {1, 4, 2, 5, 3, 6});
  ExpectValues(out[3], {2, 3, 5, 6});
  ExpectValues(out[4], {2, 5});
}

TEST(ReferenceStructuralTest, Transpose3d) {
  Builder b;
  Value x = b.Parameter("x", DType::kS32, {2, 3, 4});
  b.Output("t", Transpose(x, {2, 0, 1}));
  std::vector<double> in(24);
  for (int i = 0; i < 24; ++i) in[i] = i;
  auto out = RunRef(b, {Make(DType::kS32, {2, 3, 4}, in)});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].shape(), (Shape{4, 2, 3}));
  // out[a][b][c] = x[b][c][a]
  for (int a = 0; a < 4; ++a)
    for (int bb = 0; bb < 2; ++bb)
      for (int c = 0; c < 3; ++c)
        EXPECT_EQ(out[0].GetDouble((a * 2 + bb) * 3 + c), (bb * 3 + c) * 4 + a);
}

TEST(ReferenceStructuralTest, ConcatenatePadIota) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 1});
  Value y = b.Parameter("y", DType::kF32, {2, 2});
  Value v = b.Parameter("v", DType::kF32, {2});
  b.Output("concat", Concatenate({x, y, x}, 1));
  b.Output("pad", Pad(v, {1}, {2}, {1}, 9));
  b.Output("pad2d", Pad(x, {0, 1}, {1, 0}, {0, 0}, -1));
  b.Output("iota_s32", b.Iota(DType::kS32, Shape{2, 3}, 1));
  b.Output("iota_f32", b.Iota(DType::kF32, Shape{2, 3}, 0));
  auto out = RunRef(b, {F32({2, 1}, {1, 2}), F32({2, 2}, {3, 4, 5, 6}), F32({2}, {1, 2})});
  ASSERT_EQ(out.size(), 5u);
  ExpectValues(out[0], {1, 3, 4, 1, 2, 5, 6, 2});
  ExpectValues(out[1], {9, 1, 9, 2, 9, 9});
  EXPECT_EQ(out[2].shape(), (Shape{3, 2}));
  ExpectValues(out[2], {-1, 1, -1, 2, -1, -1});
  ExpectValues(out[3], {0, 1, 2, 0, 1, 2});
  ExpectValues(out[4], {0, 0, 0, 1, 1, 1});
}

TEST(ReferenceStructuralTest, GatherClampsIndices) {
  Builder b;
  Value table = b.Parameter("table", DType::kF32, {3, 2});
  Value idx = b.Parameter("idx", DType::kS32, {2, 2});
  b.Output("rows", Gather(table, idx, 0));
  Value cols = b.Parameter("cols", DType::kS64, {3});
  b.Output("cols", Gather(table, cols, 1));
  auto out = RunRef(b, {F32({3, 2}, {1, 2, 3, 4, 5, 6}), Make(DType::kS32, {2, 2}, {2, -5, 7, 0}),
                        Make(DType::kS64, {3}, {1, 0, 9})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape(), (Shape{2, 2, 2}));
  ExpectValues(out[0], {5, 6, 1, 2, 5, 6, 1, 2});
  EXPECT_EQ(out[1].shape(), (Shape{3, 3}));
  ExpectValues(out[1], {2, 1, 2, 4, 3, 4, 6, 5, 6});
}

TEST(ReferenceStructuralTest, ScatterAddDropsOutOfRange) {
  Builder b;
  Value operand = b.Parameter("operand", DType::kF32, {3, 2});
  Value idx = b.Parameter("idx", DType::kS32, {5});
  Value upd = b.Parameter("upd", DType::kF32, {5, 2});
  b.Output("y", ScatterAdd(operand, idx, upd, 0));
  auto out = RunRef(b, {F32({3, 2}, {1, 1, 1, 1, 1, 1}), Make(DType::kS32, {5}, {0, 2, 0, 3, -1}),
                        F32({5, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10})});
  ASSERT_EQ(out.size(), 1u);
  ExpectValues(out[0], {7, 9, 1, 1, 4, 5});
}

TEST(ReferenceStructuralTest, MovesEveryDType) {
  for (DType t : {DType::kF64, DType::kBF16, DType::kF16, DType::kS8, DType::kU8, DType::kBool,
                  DType::kS64}) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    Builder b;
    Value x = b.Parameter("x", t, {2, 2});
    b.Output("y", Slice(Transpose(x, {1, 0}), {0, 0}, {2, 1}, {1, 1}));
    auto out = RunRef(b, {Make(t, {2, 2}, {1, 0, 1, 1})});
    ASSERT_EQ(out.size(), 1u);
    ExpectValues(out[0], {1, 0});
  }
}

// ---------------------------------------------------------------------------------------------
// Reductions

TEST(ReferenceReductionTest, SumMaxMin) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 3});
  b.Output("sum0", ReduceSum(x, {0}));
  b.Output("sum1", ReduceSum(x, {1}));
  b.Output("sum01", ReduceSum(x, {0, 1}));
  b.Output("max1", ReduceMax(x, {1}));
  b.Output("min0", ReduceMin(x, {0}));
  auto out = RunRef(b, {F32({2, 3}, {1, 2, 3, 4, -5, kNaN})});
  ASSERT_EQ(out.size(), 5u);
  ExpectValues(out[0], {5, -3, kNaN});
  ExpectValues(out[1], {6, kNaN});
  EXPECT_EQ(out[2].shape(), Shape{});
  ExpectValues(out[2], {kNaN});
  ExpectValues(out[3], {3, kNaN});
  ExpectValues(out[4], {1, -5, kNaN});
}

TEST(ReferenceReductionTest, ReduceMiddleDims) {
  Builder b;
  Value x = b.Parameter("x", DType::kF64, {2, 3, 2});
  b.Output("sum", ReduceSum(x, {0, 2}));
  b.Output("max", ReduceMax(x, {1}));
  std::vector<double> in(12);
  for (int i = 0; i < 12; ++i) in[i] = i;
  auto out = RunRef(b, {F64({2, 3, 2}, in)});
  ASSERT_EQ(out.size(), 2u);
  ExpectValues(out[0], {0 + 1 + 6 + 7, 2 + 3 + 8 + 9, 4 + 5 + 10 + 11});
  ExpectValues(out[1], {4, 5, 10, 11});
}

TEST(ReferenceReductionTest, SumAccumulatesInDouble) {
  // 1 + 256 * 2^-9 = 1.5; a bf16 running sum would stay at 1 (each 2^-9 step is below half an ulp).
  Builder b;
  Value x = b.Parameter("x", DType::kBF16, {257});
  b.Output("sum", ReduceSum(x, {0}));
  std::vector<double> in(257, 1.0 / 512);
  in[0] = 1;
  auto out = RunRef(b, {Make(DType::kBF16, {257}, in)});
  ASSERT_EQ(out.size(), 1u);
  ExpectValues(out[0], {1.5});
}

TEST(ReferenceReductionTest, IntegerSumIsExact) {
  Builder b;
  Value x = b.Parameter("x", DType::kS64, {2});
  b.Output("sum", ReduceSum(x, {0}));
  Tensor in(DType::kS64, Shape{2});
  in.data<int64_t>()[0] = (int64_t{1} << 53) + 1;  // not representable in double
  in.data<int64_t>()[1] = 1;
  auto out = RunRef(b, {in});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data<int64_t>()[0], (int64_t{1} << 53) + 2);
}

TEST(ReferenceReductionTest, ArgMaxFirstMaxAndNan) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 3});
  b.Output("a1", ArgMax(x, 1));
  b.Output("a0", ArgMax(x, 0));
  auto out = RunRef(b, {F32({2, 3}, {1, 3, 3, kNaN, 1, kNaN})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].dtype(), DType::kS32);
  ExpectValues(out[0], {1, 0});  // first of the tied maxima; first NaN wins
  ExpectValues(out[1], {1, 0, 1});
}

// ---------------------------------------------------------------------------------------------
// Random

TEST(ReferenceRandomTest, PhiloxKnownAnswers) {
  using eval::Philox4x32;
  // Random123's known-answer vectors for philox4x32-10.
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(ReferenceRandomTest, RandomBitsLayout) {
  Builder b;
  Value seed = b.Parameter("seed", DType::kS64, Shape{});
  Value counter = b.Parameter("counter", DType::kS64, Shape{});
  b.Output("bits", RandomBits(seed, counter, DType::kS32, Shape{2, 3}));
  b.Output("uniform", RandomBits(seed, counter, DType::kF32, Shape{6}));
  const int64_t s = 0x123456789abcdef0, c = 0x0000000500000007;
  Tensor st(DType::kS64, Shape{}), ct(DType::kS64, Shape{});
  st.data<int64_t>()[0] = s;
  ct.data<int64_t>()[0] = c;
  auto out = RunRef(b, {st, ct});
  ASSERT_EQ(out.size(), 2u);
  std::array<uint32_t, 2> key = {0x9abcdef0u, 0x12345678u};
  auto b0 = eval::Philox4x32({0, 0, 7, 5}, key);
  auto b1 = eval::Philox4x32({1, 0, 7, 5}, key);
  uint32_t want[6] = {b0[0], b0[1], b0[2], b0[3], b1[0], b1[1]};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(static_cast<uint32_t>(out[0].data<int32_t>()[i]), want[i]) << i;
    EXPECT_EQ(out[1].data<float>()[i], static_cast<float>(want[i] >> 8) / 16777216.0f) << i;
    EXPECT_GE(out[1].data<float>()[i], 0.0f);
    EXPECT_LT(out[1].data<float>()[i], 1.0f);
  }
}

TEST(ReferenceRandomTest, SeedZeroCounterZeroIsTheKnownVector) {
  Builder b;
  Value seed = b.Parameter("seed", DType::kS64, Shape{});
  Value counter = b.Parameter("counter", DType::kS64, Shape{});
  b.Output("bits", RandomBits(seed, counter, DType::kS32, Shape{4}));
  auto out = RunRef(b, {Tensor(DType::kS64, Shape{}), Tensor(DType::kS64, Shape{})});
  ASSERT_EQ(out.size(), 1u);
  const uint32_t want[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(static_cast<uint32_t>(out[0].data<int32_t>()[i]), want[i]);
}

// ---------------------------------------------------------------------------------------------
// Backend and executable

TEST(ReferenceBackendTest, OneNamedThunkPerComputedNode) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2});
  Value c = b.Constant(Tensor::FromVector<float>(Shape{2}, {1, 2}));
  b.Output("y", Exp(x + c));
  auto g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto exe = MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->backend_name(), "reference");
  ASSERT_EQ((*exe)->num_thunks(), 2);
  EXPECT_EQ((*exe)->thunk(0).name(), "add %2");
  EXPECT_EQ((*exe)->thunk(1).name(), "exp %3");
}

TEST(ReferenceBackendTest, ReuseAcrossRunsAndBindingErrors) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 2});
  Value w = b.Parameter("w", DType::kF32, {2, 2});
  b.Output("y", MatMul(x, w) + 1.0);
  b.Output("x", x);
  auto g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto exe_or = MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(exe_or.ok()) << exe_or.status();
  Executable& exe = **exe_or;
  Tensor id = F32({2, 2}, {1, 0, 0, 1});
  for (int r = 1; r <= 3; ++r) {
    Tensor xr = F32({2, 2}, {1.0 * r, 2, 3, 4});
    auto out = exe.Run({xr, id});
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectValues((*out)[0], {1.0 + r, 3, 4, 5});
    ExpectValues((*out)[1], {1.0 * r, 2, 3, 4});
  }
  auto named = exe.RunNamed({{"x", id}, {"w", F32({2, 2}, {2, 0, 0, 2})}});
  ASSERT_TRUE(named.ok()) << named.status();
  ExpectValues(named->at("y"), {3, 1, 1, 3});

  auto bad_shape = exe.Run({id, F32({4}, {1, 2, 3, 4})});
  EXPECT_EQ(bad_shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_shape.status().message(), HasSubstr("'w'"));
  auto bad_dtype = exe.Run({F64({2, 2}, {1, 2, 3, 4}), id});
  EXPECT_THAT(bad_dtype.status().message(), HasSubstr("'x'"));
  auto missing = exe.RunNamed({{"x", id}});
  EXPECT_THAT(missing.status().message(), HasSubstr("'w'"));
  auto unknown = exe.RunNamed({{"x", id}, {"w", id}, {"bias", id}});
  EXPECT_THAT(unknown.status().message(), HasSubstr("'bias'"));

  // RunInto writes into the caller's tensors.
  Tensor y(DType::kF32, Shape{2, 2}), xo(DType::kF32, Shape{2, 2});
  ASSERT_TRUE(exe.RunInto({&id, &id}, {&y, &xo}).ok());
  ExpectValues(y, {2, 1, 1, 2});
}

TEST(ReferenceBackendTest, CompileRejectsWhatItCannotRun) {
  {
    Builder b;
    Value x = b.Parameter("x", DType::kF32, {2});
    b.Output("y", AllGather(x, 0, 2));
    auto g = b.Build();
    ASSERT_TRUE(g.ok()) << g.status();
    // An all_gather over 2 replicas compiles (the SPMD partitioner's programs use them) and runs
    // through the Shard* calls of the run's Collectives; without them the run fails, naming the op.
    auto exe = MakeReferenceBackend()->Compile(*g);
    ASSERT_TRUE(exe.ok()) << exe.status();
    auto run = (*exe)->Run({Tensor(DType::kF32, Shape{2})});
    EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(run.status().message(), HasSubstr("all_gather %1: runs over 2 ranks"));
  }
  {
    // A hand-built graph that does not verify is an error, not a crash.
    Graph g;
    int p = g.AddNode(Opcode::kParameter, {}, Type{DType::kF32, Shape{2}},
                      {{"index", int64_t{0}}, {"name", std::string("x")}});
    int e = g.AddNode(Opcode::kExp, {p}, Type{DType::kF32, Shape{3}}, {});
    g.AddOutput("y", e);
    EXPECT_FALSE(MakeReferenceBackend()->Compile(g).ok());
  }
}

TEST(ReferenceBackendTest, SingleReplicaCollectivesAreIdentities) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 2});
  b.Output("ar", AllReduce(x));
  b.Output("ag", AllGather(x, 1, 1));
  b.Output("rs", ReduceScatter(x, 0, 1));
  auto out = RunRef(b, {F32({2, 2}, {1, 2, 3, 4})});
  ASSERT_EQ(out.size(), 3u);
  for (const Tensor& t : out) ExpectValues(t, {1, 2, 3, 4});
}

}  // namespace
}  // namespace kiln::runtime
