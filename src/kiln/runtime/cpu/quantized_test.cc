// The int8 ops against hand-computed values, on the reference backend (the oracle) and the cpu
// backend, which must agree bit for bit on every CPU: oneDNN's int8 primitives and the VNNI gemv
// on AVX-512 VNNI and above, Kiln's exact widening GEMM below it (run this binary with
// KILN_CPU_ISA=avx512, avx2 or sse41 to test those paths on a VNNI machine; CTest's isa variants
// do).
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/cpu/internal/qgemv.h"
#include "kiln/runtime/cpu/internal/quantized_loops.h"
#include "kiln/runtime/cpu/isa.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::runtime {
namespace {

using ir::Builder;
using ir::Value;

std::vector<std::unique_ptr<Backend>> Backends() {
  std::vector<std::unique_ptr<Backend>> b;
  b.push_back(MakeReferenceBackend());
  b.push_back(MakeCpuBackend());
  return b;
}

std::vector<Tensor> RunOn(Backend& backend, const ir::Graph& g, const std::vector<Tensor>& in) {
  absl::StatusOr<std::unique_ptr<Executable>> exe = backend.Compile(g);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  absl::StatusOr<std::vector<Tensor>> out = (*exe)->Run(in);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<Tensor>{};
}

TEST(QuantizeOp, RoundsHalfToEvenClampsAndZeroesNaN) {
  // x / 0.5: 0.5, 1.5, 2.5, -0.5, -1.5, 3.2, -3.3, 63.25 (126.5 -> 126), 64 (128 -> 127),
  // -100 (-200 -> -127), NaN, inf; three times over (36 values: the cpu kernel's 16-wide steps
  // and its scalar tail both see every case).
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.25f,
                                0.75f,
                                1.25f,
                                -0.25f,
                                -0.75f,
                                1.6f,
                                -1.65f,
                                63.25f,
                                64.f,
                                -100.f,
                                std::numeric_limits<float>::quiet_NaN(),
                                inf};
  const std::vector<int8_t> q = {0, 2, 2, 0, -2, 3, -3, 126, 127, -127, 0, 127};
  std::vector<float> in_values;
  std::vector<int8_t> want;
  for (int r = 0; r < 3; ++r) {
    in_values.insert(in_values.end(), x.begin(), x.end());
    want.insert(want.end(), q.begin(), q.end());
  }
  const int64_t n = static_cast<int64_t>(want.size());
  Builder b("q");
  Value xv = b.Parameter("x", DType::kF32, {n});
  b.Output("q", ir::Quantize(xv, 0.5f));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  Tensor in = Tensor::FromVector<float>({n}, in_values);
  for (auto& backend : Backends()) {
    std::vector<Tensor> out = RunOn(*backend, *g, {in});
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(out[0].dtype(), DType::kS8);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(out[0].data<int8_t>()[i], want[i]) << backend->name() << " element " << i;
  }
}

TEST(QuantizedDotOp, IntegerSumTimesChannelScale) {
  Builder b("qd");
  Value x = b.Parameter("x", DType::kS8, {2, 3});
  Value w = b.Parameter("w", DType::kS8, {3, 2});
  Value s = b.Parameter("s", DType::kF32, {2});
  b.Output("y", ir::QuantizedDot(x, w, s));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  Tensor xt = Tensor::FromVector<int8_t>({2, 3}, {1, -2, 3, 127, -127, 0});
  Tensor wt = Tensor::FromVector<int8_t>({3, 2}, {4, -1, 5, 2, -6, 127});
  Tensor st = Tensor::FromVector<float>({2}, {0.5f, 0.125f});
  // Row 0: [1*4 - 2*5 - 3*6, -1 - 4 + 381] = [-24, 376]; row 1: [508 - 635, -127 - 254] =
  // [-127, -381]; times [0.5, 0.125].
  const std::vector<float> want = {-12.f, 47.f, -63.5f, -47.625f};
  for (auto& backend : Backends()) {
    std::vector<Tensor> out = RunOn(*backend, *g, {xt, wt, st});
    ASSERT_EQ(out.size(), 1u);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(out[0].data<float>()[i], want[i]) << backend->name() << " element " << i;
  }
}

TEST(QuantizedConv2dOp, PaddedWindowSums) {
  Builder b("qc");
  Value x = b.Parameter("x", DType::kS8, {1, 1, 2, 2});
  Value w = b.Parameter("w", DType::kS8, {2, 1, 2, 2});
  Value s = b.Parameter("s", DType::kF32, {2});
  ir::Conv2dOptions o;
  o.padding = {1, 0, 1, 0};  // top and left: output 2x2, (0,0) sees only x[0][0]
  b.Output("y", ir::QuantizedConv2d(x, w, s, o));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  Tensor xt = Tensor::FromVector<int8_t>({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor wt = Tensor::FromVector<int8_t>({2, 1, 2, 2}, {1, 1, 1, 1, 1, -1, 2, 3});
  Tensor st = Tensor::FromVector<float>({2}, {1.f, 0.25f});
  // Output (i, j) = sum over a, b of x[i-1+a][j-1+b] * w[a][b] (0 outside x). Channel 0 (all
  // ones): [1, 3, 4, 10]. Channel 1 ([[1, -1], [2, 3]]): (0,0) = 1*3 = 3, (0,1) = 1*2 + 2*3 = 8,
  // (1,0) = 1*(-1) + 3*3 = 8, (1,1) = 1 - 2 + 6 + 12 = 17; times 0.25.
  const std::vector<float> want = {1.f, 3.f, 4.f, 10.f, 0.75f, 2.f, 2.f, 4.25f};
  for (auto& backend : Backends()) {
    std::vector<Tensor> out = RunOn(*backend, *g, {xt, wt, st});
    ASSERT_EQ(out.size(), 1u);
    for (int i = 0; i < 8; ++i)
      EXPECT_EQ(out[0].data<float>()[i], want[i]) << backend->name() << " element " << i;
  }
}

// The cpu kernel packs the filter once and repacks only when its bytes change: one executable
// run with two filters in turn must give each filter's result.
TEST(QuantizedConv2dOp, RepacksChangedWeights) {
  Builder b("qc");
  Value x = b.Parameter("x", DType::kS8, {2, 16, 6, 6});
  Value w = b.Parameter("w", DType::kS8, {32, 16, 3, 3});
  Value s = b.Parameter("s", DType::kF32, {32});
  ir::Conv2dOptions o;
  o.padding = {1, 1, 1, 1};
  b.Output("y", ir::QuantizedConv2d(x, w, s, o));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto fill = [](Tensor& t, int seed) {
    for (int64_t i = 0; i < t.num_elements(); ++i)
      t.data<int8_t>()[i] = static_cast<int8_t>((i * 37 + seed * 11) % 255 - 127);
  };
  Tensor xt(DType::kS8, Shape{2, 16, 6, 6}), w1(DType::kS8, Shape{32, 16, 3, 3});
  fill(xt, 1);
  fill(w1, 2);
  Tensor w2 = w1.Clone();
  w2.data<int8_t>()[100] = static_cast<int8_t>(-w2.data<int8_t>()[100] + 1);  // one byte differs
  Tensor st(DType::kF32, Shape{32});
  for (int i = 0; i < 32; ++i) st.data<float>()[i] = 0.001f * (i + 1);
  auto cpu = MakeCpuBackend()->Compile(*g);
  auto ref = MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(cpu.ok() && ref.ok());
  for (const Tensor* wt : {&w1, &w2, &w1}) {
    absl::StatusOr<std::vector<Tensor>> c = (*cpu)->Run({xt, *wt, st});
    absl::StatusOr<std::vector<Tensor>> r = (*ref)->Run({xt, *wt, st});
    ASSERT_TRUE(c.ok() && r.ok());
    EXPECT_TRUE((*c)[0].BitwiseEquals((*r)[0])) << (wt == &w2 ? "second filter" : "first filter");
  }
}

TEST(QuantizedDotOp, RepacksChangedWeights) {
  Builder b("qd");
  Value x = b.Parameter("x", DType::kS8, {8, 64});
  Value w = b.Parameter("w", DType::kS8, {64, 48});
  Value s = b.Parameter("s", DType::kF32, {48});
  b.Output("y", ir::QuantizedDot(x, w, s));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  Tensor xt(DType::kS8, Shape{8, 64}), w1(DType::kS8, Shape{64, 48}), st(DType::kF32, Shape{48});
  for (int64_t i = 0; i < xt.num_elements(); ++i)
    xt.data<int8_t>()[i] = static_cast<int8_t>((i * 29) % 255 - 127);
  for (int64_t i = 0; i < w1.num_elements(); ++i)
    w1.data<int8_t>()[i] = static_cast<int8_t>((i * 53 + 7) % 255 - 127);
  for (int i = 0; i < 48; ++i) st.data<float>()[i] = 0.01f * (i + 1);
  Tensor w2 = w1.Clone();
  w2.data<int8_t>()[w2.num_elements() - 1] ^= 0x5;  // the last byte differs
  auto cpu = MakeCpuBackend()->Compile(*g);
  auto ref = MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(cpu.ok() && ref.ok());
  for (const Tensor* wt : {&w1, &w2, &w1}) {
    absl::StatusOr<std::vector<Tensor>> c = (*cpu)->Run({xt, *wt, st});
    absl::StatusOr<std::vector<Tensor>> r = (*ref)->Run({xt, *wt, st});
    ASSERT_TRUE(c.ok() && r.ok());
    EXPECT_TRUE((*c)[0].BitwiseEquals((*r)[0])) << (wt == &w2 ? "second" : "first") << " weights";
  }
}

// Deterministic s8 values covering the extremes (-128 and 127 included).
void FillS8(Tensor& t, uint32_t seed) {
  uint32_t state = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    state = state * 1664525u + 1013904223u;
    t.data<int8_t>()[i] = static_cast<int8_t>(static_cast<int>(state >> 24) - 128);
  }
}

Tensor Scales(int64_t n, uint32_t seed) {
  Tensor t(DType::kF32, Shape{n});
  for (int64_t i = 0; i < n; ++i)
    t.data<float>()[i] =
        (i % 3 == 2 ? -1.f : 1.f) * 1e-3f * static_cast<float>((i * 7 + seed) % 97 + 1);
  return t;
}

// quantized_dot x[M, K] . w[K, N] with its weights and scales bound constant, as kiln serve binds
// them: rows 1..8 take the packed s8 gemv (qgemv.cc) on a VNNI cpu, which must agree with the
// reference bit for bit at every M, at K not a multiple of 4 or 64 and N not a multiple of 16.
TEST(QuantizedDotOp, BoundWeightsSmallBatchMatchesReference) {
  const std::vector<std::pair<int64_t, int64_t>> kn = {
      {1, 1}, {3, 5}, {4, 16}, {63, 17}, {64, 48}, {100, 33}, {129, 64}, {1000, 10}, {1024, 1024}};
  for (const auto& [K, N] : kn) {
    for (int64_t M = 1; M <= 9; ++M) {
      if (K * N > 4096 && M != 1 && M != 5 && M != 8 && M != 9) continue;  // keep it fast
      Builder b("qd");
      Value x = b.Parameter("x", DType::kS8, {M, K});
      Value w = b.Parameter("w", DType::kS8, {K, N});
      Value s = b.Parameter("s", DType::kF32, {N});
      b.Output("y", ir::QuantizedDot(x, w, s));
      absl::StatusOr<ir::Graph> g = b.Build();
      ASSERT_TRUE(g.ok()) << g.status();
      Tensor xt(DType::kS8, Shape{M, K}), wt(DType::kS8, Shape{K, N});
      FillS8(xt, static_cast<uint32_t>(M * 31 + K));
      FillS8(wt, static_cast<uint32_t>(K * 17 + N));
      Tensor st = Scales(N, static_cast<uint32_t>(M));
      const std::string where =
          "M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
      auto ref = MakeReferenceBackend()->Compile(*g);
      auto cpu = MakeCpuBackend()->Compile(*g);
      ASSERT_TRUE(ref.ok() && cpu.ok()) << where;
      ASSERT_TRUE((*cpu)->BindConstantParameters({{1, wt}, {2, st}}).ok()) << where;
      absl::StatusOr<std::vector<Tensor>> r = (*ref)->Run({xt, wt, st});
      absl::StatusOr<std::vector<Tensor>> c = (*cpu)->Run({xt, wt, st});
      ASSERT_TRUE(r.ok() && c.ok()) << where;
      EXPECT_TRUE((*c)[0].BitwiseEquals((*r)[0])) << where;
      // The path the test means to cover is the one that ran.
      const std::string name = (*cpu)->thunk((*cpu)->num_thunks() - 1).name();
      const bool packed = name.find("packed s8 gemv") != std::string::npos;
      EXPECT_EQ(packed, runtime::cpu::QGemvSupported() && M <= runtime::cpu::kQGemvMaxRows)
          << where << ": " << name;
      // Unbound again: the oneDNN matmul (the exact widening GEMM without VNNI), same bits.
      ASSERT_TRUE((*cpu)->BindConstantParameters({}).ok());
      c = (*cpu)->Run({xt, wt, st});
      ASSERT_TRUE(c.ok()) << where;
      EXPECT_TRUE((*c)[0].BitwiseEquals((*r)[0])) << where << " unbound";
    }
  }
}

// A new binding repacks: the second weights' result, never the first's pack.
TEST(QuantizedDotOp, RebindingRepacksWeights) {
  const int64_t M = 2, K = 70, N = 20;
  Builder b("qd");
  Value x = b.Parameter("x", DType::kS8, {M, K});
  Value w = b.Parameter("w", DType::kS8, {K, N});
  Value s = b.Parameter("s", DType::kF32, {N});
  b.Output("y", ir::QuantizedDot(x, w, s));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  Tensor xt(DType::kS8, Shape{M, K}), w1(DType::kS8, Shape{K, N}), w2(DType::kS8, Shape{K, N});
  FillS8(xt, 1);
  FillS8(w1, 2);
  FillS8(w2, 3);
  Tensor st = Scales(N, 4);
  auto ref = MakeReferenceBackend()->Compile(*g);
  auto cpu = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(ref.ok() && cpu.ok());
  for (const Tensor* wt : {&w1, &w2, &w1}) {
    ASSERT_TRUE((*cpu)->BindConstantParameters({{1, *wt}}).ok());
    absl::StatusOr<std::vector<Tensor>> r = (*ref)->Run({xt, *wt, st});
    absl::StatusOr<std::vector<Tensor>> c = (*cpu)->Run({xt, *wt, st});
    ASSERT_TRUE(r.ok() && c.ok());
    EXPECT_TRUE((*c)[0].BitwiseEquals((*r)[0])) << (wt == &w2 ? "second" : "first") << " weights";
  }
}

// quantize -> quantized_dot -> + bias -> relu, the kiln quantize rewrite's layer, with NaN and
// infinities in the f32 input and the weights bound: every backend the same bits.
TEST(QuantizedDotOp, QuantizedLayerWithNonFiniteInputsMatchesReference) {
  const int64_t M = 3, K = 77, N = 19;
  Builder b("layer");
  Value x = b.Parameter("x", DType::kF32, {M, K});
  Value w = b.Parameter("w", DType::kS8, {K, N});
  Value s = b.Parameter("s", DType::kF32, {N});
  Value bias = b.Parameter("b", DType::kF32, {N});
  b.Output("y", ir::Relu(ir::QuantizedDot(ir::Quantize(x, 0.03f), w, s) +
                         ir::BroadcastInDim(bias, Shape{M, N}, {1})));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  Tensor xt(DType::kF32, Shape{M, K}), wt(DType::kS8, Shape{K, N}), bt(DType::kF32, Shape{N});
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < xt.num_elements(); ++i)
    xt.data<float>()[i] = static_cast<float>((i * 37) % 101 - 50) * 0.05f;
  xt.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  xt.data<float>()[K + 5] = inf;
  xt.data<float>()[2 * K + 7] = -inf;
  FillS8(wt, 9);
  for (int64_t i = 0; i < N; ++i) bt.data<float>()[i] = 0.01f * static_cast<float>(i - 9);
  Tensor st = Scales(N, 5);
  auto ref = MakeReferenceBackend()->Compile(*g);
  auto cpu = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(ref.ok() && cpu.ok());
  ASSERT_TRUE((*cpu)->BindConstantParameters({{1, wt}, {2, st}, {3, bt}}).ok());
  absl::StatusOr<std::vector<Tensor>> r = (*ref)->Run({xt, wt, st, bt});
  absl::StatusOr<std::vector<Tensor>> c = (*cpu)->Run({xt, wt, st, bt});
  ASSERT_TRUE(r.ok() && c.ok());
  EXPECT_TRUE((*c)[0].BitwiseEquals((*r)[0]));
}

TEST(QuantizeOp, RejectsNonPositiveScales) {
  for (float scale : {-0.5f, 0.f, std::numeric_limits<float>::infinity()}) {
    Builder b("q");
    Value xv = b.Parameter("x", DType::kF32, {4});
    b.Output("q", ir::Quantize(xv, scale));
    absl::StatusOr<ir::Graph> g = b.Build();
    ASSERT_FALSE(g.ok()) << scale;
    EXPECT_NE(g.status().message().find("scale"), std::string::npos) << g.status();
  }
}

// quantize -> quantized_conv2d -> + bias -> relu, the kiln quantize rewrite's convolution layer:
// the cpu quantize writes the convolution's NHWC input itself (16 x 16 tiles and scalar edges:
// channels and spatial sizes below, at and off multiples of 16), the scale loop writes NCHW
// (4 x 4 tiles and edges). NaN and infinities in the input; every case the reference's bits.
TEST(QuantizedConv2dOp, QuantizedLayerMatchesReference) {
  struct Case {
    int64_t batch, c, h, w, o, stride = 1, groups = 1;
  };
  // Strided and grouped (depthwise) ones too: whatever layout oneDNN picks for them, writer and
  // reader must agree.
  const std::vector<Case> cases = {
      {1, 1, 8, 8, 16},        {2, 16, 8, 8, 32},       {3, 3, 5, 5, 7},
      {1, 32, 4, 4, 32},       {2, 17, 4, 5, 18},       {1, 20, 7, 3, 5},
      {2, 16, 8, 8, 32, 2, 1}, {2, 16, 8, 8, 32, 1, 2}, {1, 16, 6, 6, 16, 1, 16}};
  const float inf = std::numeric_limits<float>::infinity();
  for (const Case& k : cases) {
    const std::string where = "batch " + std::to_string(k.batch) + " c " + std::to_string(k.c) +
                              " " + std::to_string(k.h) + "x" + std::to_string(k.w) + " o " +
                              std::to_string(k.o) + " stride " + std::to_string(k.stride) +
                              " groups " + std::to_string(k.groups);
    const int64_t oh = (k.h - 1) / k.stride + 1, ow = (k.w - 1) / k.stride + 1;
    const Shape xs{k.batch, k.c, k.h, k.w}, ys{k.batch, k.o, oh, ow};
    const Shape fs{k.o, k.c / k.groups, 3, 3};
    Builder b("qconv");
    Value x = b.Parameter("x", DType::kF32, xs);
    Value w = b.Parameter("w", DType::kS8, fs);
    Value s = b.Parameter("s", DType::kF32, {k.o});
    Value bias = b.Parameter("b", DType::kF32, {k.o});
    ir::Conv2dOptions o;
    o.padding = {1, 1, 1, 1};
    o.strides = {k.stride, k.stride};
    o.groups = k.groups;
    b.Output("y", ir::Relu(ir::QuantizedConv2d(ir::Quantize(x, 0.04f), w, s, o) +
                           ir::BroadcastInDim(bias, ys, {1})));
    absl::StatusOr<ir::Graph> g = b.Build();
    ASSERT_TRUE(g.ok()) << g.status();
    Tensor xt(DType::kF32, xs), wt(DType::kS8, fs), bt(DType::kF32, Shape{k.o});
    for (int64_t i = 0; i < xt.num_elements(); ++i)
      xt.data<float>()[i] = static_cast<float>((i * 53) % 211 - 105) * 0.05f;
    xt.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    xt.data<float>()[xt.num_elements() / 2] = inf;
    xt.data<float>()[xt.num_elements() - 1] = -inf;
    FillS8(wt, static_cast<uint32_t>(k.c * 7 + k.o));
    for (int64_t i = 0; i < k.o; ++i) bt.data<float>()[i] = 0.02f * static_cast<float>(i % 5 - 2);
    Tensor st = Scales(k.o, 3);
    auto ref = MakeReferenceBackend()->Compile(*g);
    auto cpu = MakeCpuBackend()->Compile(*g);
    ASSERT_TRUE(ref.ok() && cpu.ok()) << where;
    bool nhwc = false;
    for (int t = 0; t < (*cpu)->num_thunks(); ++t)
      nhwc |= (*cpu)->thunk(t).name().find("NCHW -> NHWC") != std::string::npos;
    // NHWC only for oneDNN's convolution: the exact one (no VNNI) reads NCHW.
    if (k.groups == 1) {
      EXPECT_EQ(nhwc, runtime::OneDnnHasExactInt8()) << where << ": the quantize's layout";
    }
    for (bool bind : {false, true}) {
      if (bind) {
        ASSERT_TRUE((*cpu)->BindConstantParameters({{1, wt}, {2, st}, {3, bt}}).ok());
      }
      absl::StatusOr<std::vector<Tensor>> r = (*ref)->Run({xt, wt, st, bt});
      absl::StatusOr<std::vector<Tensor>> c = (*cpu)->Run({xt, wt, st, bt});
      ASSERT_TRUE(r.ok() && c.ok()) << where;
      EXPECT_TRUE((*c)[0].BitwiseEquals((*r)[0])) << where << (bind ? " bound" : " unbound");
    }
  }
}

// A quantize that is also a graph output, or that feeds a convolution and something else, keeps
// NCHW (its other readers see the plain layout); one feeding two convolutions writes NHWC for both.
TEST(QuantizedConv2dOp, QuantizeLayoutFollowsEveryReader) {
  const Shape xs{2, 16, 4, 4};
  ir::Conv2dOptions o;
  o.padding = {1, 1, 1, 1};
  Tensor xt(DType::kF32, xs), w1(DType::kS8, Shape{8, 16, 3, 3}),
      w2(DType::kS8, Shape{8, 16, 3, 3});
  for (int64_t i = 0; i < xt.num_elements(); ++i)
    xt.data<float>()[i] = static_cast<float>((i * 29) % 97 - 48) * 0.1f;
  FillS8(w1, 5);
  FillS8(w2, 6);
  Tensor st = Scales(8, 1);
  for (int variant = 0; variant < 3; ++variant) {
    Builder b("qconv");
    Value x = b.Parameter("x", DType::kF32, xs);
    Value wa = b.Parameter("wa", DType::kS8, {8, 16, 3, 3});
    Value wb = b.Parameter("wb", DType::kS8, {8, 16, 3, 3});
    Value s = b.Parameter("s", DType::kF32, {8});
    Value q = ir::Quantize(x, 0.05f);
    b.Output("a", ir::QuantizedConv2d(q, wa, s, o));
    if (variant == 0) b.Output("q", q);
    if (variant == 1) b.Output("c", ir::Convert(q, DType::kF32));
    if (variant == 2) b.Output("c", ir::QuantizedConv2d(q, wb, s, o));
    absl::StatusOr<ir::Graph> g = b.Build();
    ASSERT_TRUE(g.ok()) << g.status();
    auto ref = MakeReferenceBackend()->Compile(*g);
    auto cpu = MakeCpuBackend()->Compile(*g);
    ASSERT_TRUE(ref.ok() && cpu.ok()) << variant;
    bool nhwc = false;
    for (int t = 0; t < (*cpu)->num_thunks(); ++t)
      nhwc |= (*cpu)->thunk(t).name().find("NCHW -> NHWC") != std::string::npos;
    EXPECT_EQ(nhwc, variant == 2 && runtime::OneDnnHasExactInt8()) << variant;
    absl::StatusOr<std::vector<Tensor>> r = (*ref)->Run({xt, w1, w2, st});
    absl::StatusOr<std::vector<Tensor>> c = (*cpu)->Run({xt, w1, w2, st});
    ASSERT_TRUE(r.ok() && c.ok()) << variant;
    ASSERT_EQ(r->size(), c->size());
    for (size_t i = 0; i < r->size(); ++i)
      EXPECT_TRUE((*c)[i].BitwiseEquals((*r)[i])) << "variant " << variant << " output " << i;
  }
}

// ---- Worst cases for the exact widening GEMM (quantized_exact.cc, where oneDNN's int8 is not
// exact). Saturating u8 x s8 pair sums (oneDNN's vpmaddubsw) break first on extreme values: a
// -128 activation is 0 after oneDNN's +128 shift and -128 x -128 pairs overflow s16. These cases
// failed on the oneDNN path at KILN_CPU_ISA=avx2 and must give the reference's bits everywhere.

// x and w drawn from {-128, -127, 127} (mostly extremes), some rows / columns all -128 or 127, so
// sums reach +-K * 16384 (past 2^24: the f32 conversion rounds) and every pair-sum edge case
// occurs.
void FillExtremes(Tensor& t, uint32_t seed, int64_t period) {
  uint32_t state = seed * 2246822519u + 3266489917u;
  const int8_t v[] = {-128, 127, -128, -127, 127, -128};
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    state = state * 1664525u + 1013904223u;
    t.data<int8_t>()[i] = v[(state >> 24) % 6];
  }
  // Period `period` in the flat index: rows of x or columns of w that are all one value.
  for (int64_t i = 0; i < t.num_elements(); i += period) t.data<int8_t>()[i] = -128;
}

bool IsExactGemm(const Executable& exe) {
  for (int t = 0; t < exe.num_thunks(); ++t)
    if (exe.thunk(t).name().find("exact int8") != std::string::npos) return true;
  return false;
}

TEST(ExactInt8, DotWorstCasesMatchReference) {
  struct Case {
    int64_t M, K, N;
  };
  // M = 1 and past every row block (6, 8, 3 rows) and row chunk (48, 64, 24); K long and odd;
  // N off the 16-column panels and the panel chunks.
  const std::vector<Case> cases = {{1, 4096, 10},  {1, 4095, 130}, {7, 4096, 33},  {65, 301, 17},
                                   {130, 64, 300}, {2, 1, 1},      {9, 3, 16},     {1, 1024, 1024},
                                   {49, 4097, 48}, {3, 2, 129},    {64, 4096, 64}, {25, 999, 5}};
  for (const Case& k : cases) {
    const std::string where =
        "M=" + std::to_string(k.M) + " K=" + std::to_string(k.K) + " N=" + std::to_string(k.N);
    Builder b("qd");
    Value x = b.Parameter("x", DType::kS8, {k.M, k.K});
    Value w = b.Parameter("w", DType::kS8, {k.K, k.N});
    Value s = b.Parameter("s", DType::kF32, {k.N});
    b.Output("y", ir::QuantizedDot(x, w, s));
    absl::StatusOr<ir::Graph> g = b.Build();
    ASSERT_TRUE(g.ok()) << g.status();
    Tensor xt(DType::kS8, Shape{k.M, k.K}), wt(DType::kS8, Shape{k.K, k.N});
    FillExtremes(xt, static_cast<uint32_t>(k.M + k.K), k.K + 1);
    FillExtremes(wt, static_cast<uint32_t>(k.K * 3 + k.N), k.N + 1);
    // Row 0 of x all -128; column 0 of w all -128, column 1 all 127: the largest sums of both
    // signs.
    for (int64_t i = 0; i < k.K; ++i) {
      xt.data<int8_t>()[i] = -128;
      wt.data<int8_t>()[i * k.N] = -128;
      if (k.N > 1) wt.data<int8_t>()[i * k.N + 1] = 127;
    }
    Tensor st = Scales(k.N, 7);
    auto ref = MakeReferenceBackend()->Compile(*g);
    auto cpu = MakeCpuBackend()->Compile(*g);
    ASSERT_TRUE(ref.ok() && cpu.ok()) << where;
    EXPECT_EQ(IsExactGemm(**cpu), !runtime::OneDnnHasExactInt8()) << where;
    absl::StatusOr<std::vector<Tensor>> r = (*ref)->Run({xt, wt, st});
    ASSERT_TRUE(r.ok()) << where;
    // Unbound (packed on the first run), bound (packed at binding), unbound again.
    for (int bind : {0, 1, 0}) {
      ASSERT_TRUE((*cpu)
                      ->BindConstantParameters(bind ? std::map<int, Tensor>{{1, wt}, {2, st}}
                                                    : std::map<int, Tensor>{})
                      .ok());
      absl::StatusOr<std::vector<Tensor>> c = (*cpu)->Run({xt, wt, st});
      ASSERT_TRUE(c.ok()) << where;
      EXPECT_TRUE((*c)[0].BitwiseEquals((*r)[0])) << where << (bind ? " bound" : " unbound");
    }
    // The largest sum, written out: K * 16384 (column 0), converted to f32 once, times scale.
    EXPECT_EQ((*r)[0].data<float>()[0],
              static_cast<float>(static_cast<int32_t>(k.K * 16384)) * st.data<float>()[0])
        << where;
  }
}

TEST(ExactInt8, ConvWorstCasesMatchReference) {
  struct Case {
    std::string name;
    Shape in, filter;
    std::vector<int64_t> strides, padding, dilation;
    int64_t groups;
  };
  // Image sizes whose positions straddle the 16-column panels and the per-task column chunks
  // (batch x OH x OW past 512), strides, asymmetric padding, dilation, groups and depthwise, a
  // long and an odd reduction (K = CG x KH x KW: 4608, 27, 9, 1).
  const std::vector<Case> cases = {
      {"3x3 pad1", Shape{2, 16, 8, 8}, Shape{32, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
      {"rgb 15x15 x3", Shape{3, 3, 15, 15}, Shape{8, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
      {"stride 2x1", Shape{2, 4, 9, 7}, Shape{5, 4, 3, 3}, {2, 1}, {1, 0, 0, 2}, {1, 1}, 1},
      {"stride 2 dilated", Shape{1, 6, 11, 10}, Shape{7, 6, 3, 2}, {2, 3}, {2, 1, 0, 3}, {2, 2}, 1},
      {"groups 2 dilated", Shape{1, 4, 7, 6}, Shape{6, 2, 3, 3}, {2, 1}, {1, 0, 0, 2}, {1, 2}, 2},
      {"depthwise", Shape{2, 32, 7, 5}, Shape{32, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 32},
      {"depthwise stride 2",
       Shape{1, 8, 9, 9},
       Shape{16, 1, 3, 3},
       {2, 2},
       {0, 1, 1, 0},
       {1, 1},
       8},
      {"1x1", Shape{3, 64, 5, 7}, Shape{20, 64, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},
      {"K 4608", Shape{1, 512, 4, 4}, Shape{17, 512, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
      {"window past input", Shape{1, 2, 2, 3}, Shape{3, 2, 3, 3}, {1, 1}, {2, 2, 2, 2}, {2, 2}, 1},
  };
  for (const Case& k : cases) {
    Builder b("qc");
    Value x = b.Parameter("x", DType::kS8, k.in);
    Value w = b.Parameter("w", DType::kS8, k.filter);
    Value s = b.Parameter("s", DType::kF32, {k.filter.dim(0)});
    ir::Conv2dOptions o;
    o.strides = k.strides;
    o.padding = k.padding;
    o.dilation = k.dilation;
    o.groups = k.groups;
    b.Output("y", ir::QuantizedConv2d(x, w, s, o));
    absl::StatusOr<ir::Graph> g = b.Build();
    ASSERT_TRUE(g.ok()) << k.name << ": " << g.status();
    Tensor xt(DType::kS8, k.in), wt(DType::kS8, k.filter);
    FillExtremes(xt, static_cast<uint32_t>(k.in.num_elements()), 5);
    FillExtremes(wt, static_cast<uint32_t>(k.filter.num_elements()), 3);
    // Input channel 0 of image 0 all -128, filter 0 all -128: the largest sums.
    for (int64_t i = 0; i < k.in.dim(2) * k.in.dim(3); ++i) xt.data<int8_t>()[i] = -128;
    const int64_t per_filter = k.filter.num_elements() / k.filter.dim(0);
    for (int64_t i = 0; i < per_filter; ++i) wt.data<int8_t>()[i] = -128;
    Tensor st = Scales(k.filter.dim(0), 11);
    auto ref = MakeReferenceBackend()->Compile(*g);
    auto cpu = MakeCpuBackend()->Compile(*g);
    ASSERT_TRUE(ref.ok() && cpu.ok()) << k.name;
    EXPECT_EQ(IsExactGemm(**cpu), !runtime::OneDnnHasExactInt8()) << k.name;
    absl::StatusOr<std::vector<Tensor>> r = (*ref)->Run({xt, wt, st});
    ASSERT_TRUE(r.ok()) << k.name;
    for (int bind : {0, 1}) {
      ASSERT_TRUE((*cpu)
                      ->BindConstantParameters(bind ? std::map<int, Tensor>{{1, wt}, {2, st}}
                                                    : std::map<int, Tensor>{})
                      .ok());
      absl::StatusOr<std::vector<Tensor>> c = (*cpu)->Run({xt, wt, st});
      ASSERT_TRUE(c.ok()) << k.name;
      EXPECT_TRUE((*c)[0].BitwiseEquals((*r)[0])) << k.name << (bind ? " bound" : " unbound");
    }
  }
}

// The reference formula, written out again: clamp(rint(x / s), -127, 127), NaN -> 0.
int8_t WantQ(float x, float s) {
  float q = x / s;
  if (std::isnan(q)) return 0;
  return static_cast<int8_t>(std::nearbyint(std::fmin(std::fmax(q, -127.f), 127.f)));
}

// The quantize loops on both ISAs (the AVX-512 one where the cpu has it, and the SSE2 baseline
// that other cpus run) against the formula: halves, clamps, NaN, infinities, denormals, and
// lengths / channel and spatial counts that leave scalar edges.
TEST(QuantizeLoops, BothIsasMatchTheFormula) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x;
  for (int i = 0; i < 1000; ++i) x.push_back(static_cast<float>(i % 523 - 261) * 0.25f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[17] = inf;
  x[18] = -inf;
  x[33] = std::numeric_limits<float>::denorm_min();
  x[34] = -1e30f;
  const float scale = 0.5f;
  for (bool baseline : {false, true}) {
    for (int64_t len : {1, 15, 16, 17, 999, 1000}) {
      std::vector<int8_t> y(len, 99);
      runtime::cpu::QuantizeRange(x.data(), y.data(), scale, 0, len, baseline);
      for (int64_t i = 0; i < len; ++i)
        ASSERT_EQ(y[i], WantQ(x[i], scale))
            << "baseline " << baseline << " len " << len << " at " << i;
    }
    struct Dims {
      int64_t n, c, hw;
    };
    for (Dims d : std::vector<Dims>{{1, 16, 16}, {2, 32, 64}, {1, 17, 20}, {3, 5, 7}, {1, 1, 33}}) {
      std::vector<float> in(d.n * d.c * d.hw);
      for (size_t i = 0; i < in.size(); ++i) in[i] = x[(i * 7) % x.size()];
      std::vector<int8_t> y(in.size(), 99);
      runtime::cpu::QuantizeNchwToNhwc(in.data(), y.data(), scale, d.n, d.c, d.hw, baseline);
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t c = 0; c < d.c; ++c)
          for (int64_t p = 0; p < d.hw; ++p)
            ASSERT_EQ(y[(n * d.hw + p) * d.c + c], WantQ(in[(n * d.c + c) * d.hw + p], scale))
                << "baseline " << baseline << " n " << n << " c " << c << " p " << p << " of "
                << d.n << "x" << d.c << "x" << d.hw;
    }
  }
}

}  // namespace
}  // namespace kiln::runtime
