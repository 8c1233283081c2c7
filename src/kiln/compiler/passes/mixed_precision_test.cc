#include "kiln/compiler/passes/mixed_precision.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/status.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::compiler {
namespace {

using testing::ExpectRewrite;
using testing::ExpectUnchanged;
using ::testing::HasSubstr;

TEST(MixedPrecision, ParsesPolicyNames) {
  for (PrecisionPolicy p :
       {PrecisionPolicy::kF32, PrecisionPolicy::kMixedBf16, PrecisionPolicy::kBf16}) {
    absl::StatusOr<PrecisionPolicy> back = ParsePrecisionPolicy(PrecisionPolicyName(p));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p);
  }
  absl::StatusOr<PrecisionPolicy> bad = ParsePrecisionPolicy("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("'fp16' (allowed: f32, mixed_bf16, bf16)"));
}

constexpr const char* kDense = R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[8,16]
      %w = parameter() {index=1, name="w"} : f32[16,4]
      %b = parameter() {index=2, name="b"} : f32[4]
      %d = dot_general(%x, %w) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[8,4]}
      %a = add(%d, %bb)
      %r = relu(%a)
      %s = reduce_sum(%r) {dimensions=[0,1]}
      %n = constant() {value=32.0} : f32[]
      %m = div(%s, %n)
      return y=%r, s=%m
    })";

TEST(MixedPrecision, F32PolicyChangesNothing) {
  MixedPrecisionPass pass(PrecisionPolicy::kF32);
  EXPECT_EQ(pass.name(), "mixed-precision");
  ExpectUnchanged(pass, kDense);
}

TEST(MixedPrecision, MixedComputesOnlyTheContractionInBf16) {
  MixedPrecisionPass pass(PrecisionPolicy::kMixedBf16);
  ExpectRewrite(pass, kDense, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[8,16]
      %1 = parameter() {index=1, name="w"} : f32[16,4]
      %2 = parameter() {index=2, name="b"} : f32[4]
      %3 = convert(%0) : bf16[8,16]
      %4 = convert(%1) : bf16[16,4]
      %5 = dot_general(%3, %4) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : bf16[8,4]
      %6 = convert(%5) : f32[8,4]
      %7 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[8,4]} : f32[8,4]
      %8 = add(%6, %7) : f32[8,4]
      %9 = relu(%8) : f32[8,4]
      %10 = reduce_sum(%9) {dimensions=[0,1]} : f32[]
      %11 = constant() {value=32.0} : f32[]
      %12 = div(%10, %11) : f32[]
      return y=%9, s=%12
    })");
}

TEST(MixedPrecision, Bf16PolicyAlsoComputesElementwiseInBf16ButNotReductions) {
  MixedPrecisionPass pass(PrecisionPolicy::kBf16);
  // The dot's bf16 result feeds the add directly (no convert pair); reduce_sum reads f32, the
  // scalar division after it stays f32; the outputs keep their f32 types.
  ExpectRewrite(pass, kDense, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[8,16]
      %1 = parameter() {index=1, name="w"} : f32[16,4]
      %2 = parameter() {index=2, name="b"} : f32[4]
      %3 = convert(%0) : bf16[8,16]
      %4 = convert(%1) : bf16[16,4]
      %5 = dot_general(%3, %4) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : bf16[8,4]
      %6 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[8,4]} : f32[8,4]
      %7 = convert(%6) : bf16[8,4]
      %8 = add(%5, %7) : bf16[8,4]
      %9 = relu(%8) : bf16[8,4]
      %10 = convert(%9) : f32[8,4]
      %11 = reduce_sum(%10) {dimensions=[0,1]} : f32[]
      %12 = constant() {value=32.0} : f32[]
      %13 = div(%11, %12) : f32[]
      return y=%10, s=%13
    })");
}

TEST(MixedPrecision, OneConvertPerValueAndNoConvertChains) {
  MixedPrecisionPass pass(PrecisionPolicy::kMixedBf16);
  // %h feeds two dots: one convert. %d1's result feeds the next dot through a reshape: the
  // reshape moves the bf16 value and the second dot reads it without convert(convert(..)).
  ExpectRewrite(pass, R"(
    graph @g {
      %h = parameter() {index=0, name="h"} : f32[4,6]
      %w1 = parameter() {index=1, name="w1"} : f32[6,6]
      %w2 = parameter() {index=2, name="w2"} : f32[6,3]
      %d1 = dot_general(%h, %w1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %d2 = dot_general(%h, %w2) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %r = reshape(%d1) {shape=[2,2,6]}
      %d3 = dot_general(%r, %w2) {lhs_batch=[], lhs_contracting=[2], rhs_batch=[], rhs_contracting=[0]}
      return a=%d2, b=%d3
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="h"} : f32[4,6]
      %1 = parameter() {index=1, name="w1"} : f32[6,6]
      %2 = parameter() {index=2, name="w2"} : f32[6,3]
      %3 = convert(%0) : bf16[4,6]
      %4 = convert(%1) : bf16[6,6]
      %5 = dot_general(%3, %4) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : bf16[4,6]
      %6 = convert(%2) : bf16[6,3]
      %7 = dot_general(%3, %6) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : bf16[4,3]
      %8 = convert(%7) : f32[4,3]
      %9 = reshape(%5) {shape=[2,2,6]} : bf16[2,2,6]
      %10 = dot_general(%9, %6) {lhs_batch=[], lhs_contracting=[2], rhs_batch=[], rhs_contracting=[0]} : bf16[2,2,3]
      %11 = convert(%10) : f32[2,2,3]
      return a=%8, b=%11
    })");
}

TEST(MixedPrecision, ConvolutionsComputeInBf16) {
  MixedPrecisionPass pass(PrecisionPolicy::kMixedBf16);
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[1,2,5,5]
      %f = parameter() {index=1, name="f"} : f32[3,2,3,3]
      %c = conv2d(%x, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
      return y=%c
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[1,2,5,5]
      %1 = parameter() {index=1, name="f"} : f32[3,2,3,3]
      %2 = convert(%0) : bf16[1,2,5,5]
      %3 = convert(%1) : bf16[3,2,3,3]
      %4 = conv2d(%2, %3) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]} : bf16[1,3,5,5]
      %5 = convert(%4) : f32[1,3,5,5]
      return y=%5
    })");
}

TEST(MixedPrecision, IntegersBoolsAndOtherFloatsAreUntouched) {
  for (PrecisionPolicy p : {PrecisionPolicy::kMixedBf16, PrecisionPolicy::kBf16}) {
    SCOPED_TRACE(PrecisionPolicyName(p));
    MixedPrecisionPass pass(p);
    ExpectUnchanged(pass, R"(
      graph @g {
        %0 = parameter() {index=0, name="a"} : s32[4,3]
        %1 = parameter() {index=1, name="b"} : s32[3,2]
        %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : s32[4,2]
        %3 = add(%2, %2) : s32[4,2]
        %4 = compare(%3, %3) {direction="lt"} : bool[4,2]
        %5 = logical_not(%4) : bool[4,2]
        %6 = parameter() {index=2, name="c"} : f64[3,3]
        %7 = dot_general(%6, %6) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f64[3,3]
        %8 = parameter() {index=3, name="d"} : bf16[3,3]
        %9 = dot_general(%8, %8) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : bf16[3,3]
        return s=%3, m=%5, f=%7, h=%9
      })");
  }
  // bf16 policy: a select computes in bf16 but its bool predicate stays; gather with s32
  // indices stays (it is not elementwise); a softmax stays f32 and reads the up-convert.
  MixedPrecisionPass pass(PrecisionPolicy::kBf16);
  ExpectRewrite(pass, R"(
    graph @g {
      %t = parameter() {index=0, name="t"} : f32[5,3]
      %i = parameter() {index=1, name="i"} : s32[2]
      %g = gather(%t, %i) {axis=0}
      %p = compare(%g, %g) {direction="gt"}
      %e = exp(%g)
      %s = select(%p, %e, %g)
      %m = softmax(%s) {axis=1}
      return m=%m
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="t"} : f32[5,3]
      %1 = parameter() {index=1, name="i"} : s32[2]
      %2 = gather(%0, %1) {axis=0} : f32[2,3]
      %3 = compare(%2, %2) {direction="gt"} : bool[2,3]
      %4 = convert(%2) : bf16[2,3]
      %5 = exp(%4) : bf16[2,3]
      %6 = select(%3, %5, %4) : bf16[2,3]
      %7 = convert(%6) : f32[2,3]
      %8 = softmax(%7) {axis=1} : f32[2,3]
      return m=%8
    })");
}

TEST(MixedPrecision, OutputsKeepTheirTypesWhenAnOutputIsTheRewrittenOp) {
  MixedPrecisionPass pass(PrecisionPolicy::kMixedBf16);
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(kDense);
  ASSERT_TRUE(g.ok()) << g.status();
  const ir::Graph before = *g;
  absl::StatusOr<bool> changed = pass.Run(*g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_TRUE(*changed);
  ASSERT_EQ(g->outputs().size(), before.outputs().size());
  for (size_t i = 0; i < g->outputs().size(); ++i) {
    EXPECT_EQ(g->outputs()[i].name, before.outputs()[i].name);
    EXPECT_EQ(g->node(g->outputs()[i].node).type(), before.node(before.outputs()[i].node).type());
  }
  for (int p : g->parameters()) EXPECT_EQ(g->node(p).type().dtype, DType::kF32);
}

// ---- numeric check ----

// An MLP with a mean cross-entropy loss: x[16,32] -> 64 (relu) -> 10, returns logits and loss.
ir::Graph Mlp() {
  ir::Builder b("mlp");
  ir::Value x = b.Parameter("x", DType::kF32, {16, 32});
  ir::Value labels = b.Parameter("labels", DType::kS32, {16});
  ir::Value w1 = b.Parameter("w1", DType::kF32, {32, 64});
  ir::Value b1 = b.Parameter("b1", DType::kF32, {64});
  ir::Value w2 = b.Parameter("w2", DType::kF32, {64, 10});
  ir::Value h = ir::Relu(ir::MatMul(x, w1) + b1);
  ir::Value logits = ir::MatMul(h, w2);
  ir::Value loss = ir::ReduceSum(ir::SparseCrossEntropy(logits, labels), {0}) * (1.0f / 16);
  b.Output("logits", logits);
  b.Output("loss", loss);
  absl::StatusOr<ir::Graph> g = b.Build();
  KILN_CHECK_OK(g.status());
  return *std::move(g);
}

std::vector<Tensor> MlpInputs() {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0, 1);
  auto randn = [&](Shape s, double scale) {
    Tensor t(DType::kF32, s);
    for (int64_t i = 0; i < t.num_elements(); ++i) t.SetDouble(i, scale * normal(rng));
    return t;
  };
  Tensor labels(DType::kS32, Shape{16});
  for (int i = 0; i < 16; ++i) labels.data<int32_t>()[i] = (i * 7) % 10;
  return {randn({16, 32}, 1.0), labels, randn({32, 64}, 0.18), randn({64}, 0.1),
          randn({64, 10}, 0.13)};
}

std::vector<Tensor> RunOn(runtime::Backend& backend, const ir::Graph& g,
                          const std::vector<Tensor>& inputs) {
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = backend.Compile(g);
  EXPECT_TRUE(exe.ok()) << backend.name() << ": " << exe.status();
  if (!exe.ok()) return {};
  absl::StatusOr<std::vector<Tensor>> out = (*exe)->Run(inputs);
  EXPECT_TRUE(out.ok()) << backend.name() << ": " << out.status();
  return out.ok() ? *std::move(out) : std::vector<Tensor>{};
}

// max |a - b| / (atol + rtol |a|) over the elements: <= 1 passes.
double WorstRatio(const Tensor& a, const Tensor& b, double rtol, double atol) {
  EXPECT_EQ(a.shape(), b.shape());
  EXPECT_EQ(b.dtype(), DType::kF32);
  double worst = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    const double x = a.GetDouble(i), y = b.GetDouble(i);
    worst = std::max(worst, std::abs(x - y) / (atol + rtol * std::abs(x)));
  }
  return worst;
}

TEST(MixedPrecision, AgreesWithF32WithinBf16ToleranceOnBothBackends) {
  const ir::Graph f32 = Mlp();
  const std::vector<Tensor> inputs = MlpInputs();
  std::unique_ptr<runtime::Backend> ref = runtime::MakeReferenceBackend();
  std::unique_ptr<runtime::Backend> cpu = runtime::MakeCpuBackend();
  const std::vector<Tensor> want = RunOn(*ref, f32, inputs);
  ASSERT_EQ(want.size(), 2u);
  for (PrecisionPolicy p : {PrecisionPolicy::kMixedBf16, PrecisionPolicy::kBf16}) {
    SCOPED_TRACE(PrecisionPolicyName(p));
    ir::Graph g = f32;
    MixedPrecisionPass pass(p);
    absl::StatusOr<bool> changed = pass.Run(g);
    ASSERT_TRUE(changed.ok()) << changed.status();
    ASSERT_TRUE(*changed);
    int bf16_dots = 0;
    for (const ir::Node& n : g.nodes()) {
      bf16_dots += n.opcode() == ir::Opcode::kDotGeneral && n.type().dtype == DType::kBF16;
    }
    EXPECT_EQ(bf16_dots, 2);
    const std::vector<Tensor> ref_out = RunOn(*ref, g, inputs);
    const std::vector<Tensor> cpu_out = RunOn(*cpu, g, inputs);
    ASSERT_EQ(ref_out.size(), 2u);
    ASSERT_EQ(cpu_out.size(), 2u);
    // Logits are O(1): bf16 rounding (2^-8 relative) of inputs, hidden and outputs.
    const double rtol = 2e-2, atol = 2e-2;
    for (int o = 0; o < 2; ++o) {
      EXPECT_LE(WorstRatio(want[o], ref_out[o], rtol, atol), 1.0) << "reference, output " << o;
      EXPECT_LE(WorstRatio(want[o], cpu_out[o], rtol, atol), 1.0) << "cpu, output " << o;
    }
    // It is not the f32 result either: the pass really rounds.
    bool differs = false;
    for (int64_t i = 0; i < want[0].num_elements(); ++i) {
      differs |= want[0].GetDouble(i) != ref_out[0].GetDouble(i);
    }
    EXPECT_TRUE(differs);
  }
}

}  // namespace
}  // namespace kiln::compiler
