#include "kiln/compiler/passes/float_normalization.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/status.h"
#include "kiln/compiler/compile.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"
#include "kiln/compiler/passes/mixed_precision.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/op_traits.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::compiler {
namespace {

using ::testing::ElementsAre;
using testing::ExpectRewrite;
using testing::ExpectUnchanged;

// A backend without bf16 contractions (the cpu backend below avx512_core).
bool NoBf16Contractions(const ir::Node& n) {
  const ir::KernelFamily f = ir::OpTraits(n.opcode()).family;
  return f != ir::KernelFamily::kDot && f != ir::KernelFamily::kConv;
}
bool NoBf16At(const ir::Node&) { return false; }

// What one run of `pass` on `text` records (ExpectRewrite runs it twice: the second changes
// nothing and records nothing).
std::vector<OpCount> Changes(FloatNormalizationPass& pass, std::string_view text) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return {};
  absl::StatusOr<bool> changed = pass.Run(*g);
  EXPECT_TRUE(changed.ok()) << changed.status();
  return pass.last_changes();
}

// What mixed_bf16 makes of x . w followed by relu (mixed_precision.h).
constexpr const char* kMixedDense = R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[8,16]
      %w = parameter() {index=1, name="w"} : f32[16,4]
      %xb = convert(%x) : bf16[8,16]
      %wb = convert(%w) : bf16[16,4]
      %d = dot_general(%xb, %wb) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %u = convert(%d) : f32[8,4]
      %r = relu(%u)
      return y=%r
    })";

TEST(FloatNormalization, NullTraitsOrAllSupportedChangeNothing) {
  FloatNormalizationPass null_traits(nullptr);
  EXPECT_EQ(null_traits.name(), "float-normalization");
  ExpectUnchanged(null_traits, kMixedDense);
  FloatNormalizationPass all([](const ir::Node&) { return true; });
  ExpectUnchanged(all, kMixedDense);
  EXPECT_TRUE(all.last_changes().empty());
}

TEST(FloatNormalization, AnUnsupportedDotComputesInF32BetweenConverts) {
  FloatNormalizationPass pass(NoBf16Contractions);
  // The bf16 operands are widened (the f32 -> bf16 -> f32 pair rounds x and w: it stays), the dot
  // runs in f32 and its result is rounded to bf16 once, as the reference computes a bf16 dot.
  ExpectRewrite(pass, kMixedDense, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[8,16]
      %1 = parameter() {index=1, name="w"} : f32[16,4]
      %2 = convert(%0) : bf16[8,16]
      %3 = convert(%1) : bf16[16,4]
      %4 = convert(%2) : f32[8,16]
      %5 = convert(%3) : f32[16,4]
      %6 = dot_general(%4, %5) {float_normalized="bf16", lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[8,4]
      %7 = convert(%6) : bf16[8,4]
      %8 = convert(%7) : f32[8,4]
      %9 = relu(%8) : f32[8,4]
      return y=%9
    })");
  EXPECT_THAT(Changes(pass, kMixedDense), ElementsAre(OpCount{ir::Opcode::kDotGeneral, 1}));
}

TEST(FloatNormalization, ConvolutionsAndTheirGradientsToo) {
  FloatNormalizationPass pass(NoBf16Contractions);
  constexpr const char* kIn = R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : bf16[1,1,5,5]
      %f = parameter() {index=1, name="f"} : bf16[3,1,3,3]
      %c = conv2d(%x, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
      %dx = conv2d_backward_input(%c, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1], input_shape=[1,1,5,5]}
      %df = conv2d_backward_filter(%x, %c) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1], filter_shape=[3,1,3,3]}
      return c=%c, dx=%dx, df=%df
    })";
  ExpectRewrite(pass, kIn, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : bf16[1,1,5,5]
      %1 = parameter() {index=1, name="f"} : bf16[3,1,3,3]
      %2 = convert(%0) : f32[1,1,5,5]
      %3 = convert(%1) : f32[3,1,3,3]
      %4 = conv2d(%2, %3) {dilation=[1,1], float_normalized="bf16", groups=1, padding=[1,1,1,1], strides=[1,1]} : f32[1,3,5,5]
      %5 = convert(%4) : bf16[1,3,5,5]
      %6 = convert(%5) : f32[1,3,5,5]
      %7 = convert(%1) : f32[3,1,3,3]
      %8 = conv2d_backward_input(%6, %7) {dilation=[1,1], float_normalized="bf16", groups=1, input_shape=[1,1,5,5], padding=[1,1,1,1], strides=[1,1]} : f32[1,1,5,5]
      %9 = convert(%8) : bf16[1,1,5,5]
      %10 = convert(%0) : f32[1,1,5,5]
      %11 = convert(%5) : f32[1,3,5,5]
      %12 = conv2d_backward_filter(%10, %11) {dilation=[1,1], filter_shape=[3,1,3,3], float_normalized="bf16", groups=1, padding=[1,1,1,1], strides=[1,1]} : f32[3,1,3,3]
      %13 = convert(%12) : bf16[3,1,3,3]
      return c=%5, dx=%9, df=%13
    })");
  // One f32 copy per bf16 operand of each rewritten op: x, f and c are each widened twice, so
  // that between a forward op and a backward one only their bf16 values stay alive.
  EXPECT_THAT(Changes(pass, kIn), ElementsAre(OpCount{ir::Opcode::kConv2d, 1},
                                              OpCount{ir::Opcode::kConv2dBackwardFilter, 1},
                                              OpCount{ir::Opcode::kConv2dBackwardInput, 1}));
}

TEST(FloatNormalization, SupportedBf16OpsStayBf16) {
  // The relu and the add run in bf16 (the backend has them); only the dot is widened.
  FloatNormalizationPass pass(NoBf16Contractions);
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : bf16[2,3]
      %w = parameter() {index=1, name="w"} : bf16[3,3]
      %d = dot_general(%x, %w) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %r = relu(%d)
      %a = add(%r, %d)
      return y=%a
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : bf16[2,3]
      %1 = parameter() {index=1, name="w"} : bf16[3,3]
      %2 = convert(%0) : f32[2,3]
      %3 = convert(%1) : f32[3,3]
      %4 = dot_general(%2, %3) {float_normalized="bf16", lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[2,3]
      %5 = convert(%4) : bf16[2,3]
      %6 = relu(%5) : bf16[2,3]
      %7 = add(%6, %5) : bf16[2,3]
      return y=%7
    })");
}

TEST(FloatNormalization, KeepsTheRoundingBetweenTwoWidenedOps) {
  // dot(dot(x, w), w): the first result is rounded to bf16 before the second reads it, as in
  // the bf16 program (no convert pair is folded away).
  FloatNormalizationPass pass(NoBf16Contractions);
  constexpr const char* kIn = R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : bf16[2,2]
      %w = parameter() {index=1, name="w"} : bf16[2,2]
      %d = dot_general(%x, %w) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %e = dot_general(%d, %w) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      return y=%e
    })";
  ExpectRewrite(pass, kIn, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : bf16[2,2]
      %1 = parameter() {index=1, name="w"} : bf16[2,2]
      %2 = convert(%0) : f32[2,2]
      %3 = convert(%1) : f32[2,2]
      %4 = dot_general(%2, %3) {float_normalized="bf16", lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[2,2]
      %5 = convert(%4) : bf16[2,2]
      %6 = convert(%5) : f32[2,2]
      %7 = convert(%1) : f32[2,2]
      %8 = dot_general(%6, %7) {float_normalized="bf16", lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[2,2]
      %9 = convert(%8) : bf16[2,2]
      return y=%9
    })");
  EXPECT_THAT(Changes(pass, kIn), ElementsAre(OpCount{ir::Opcode::kDotGeneral, 2}));
}

TEST(FloatNormalization, NonBf16OperandsAndResultsKeepTheirTypes) {
  // A backend with no bf16 at all: the gather's s32 indices stay s32, the compare's bool result
  // needs no convert back, the f32 value is read as it is, and sources and converts are left.
  FloatNormalizationPass pass(NoBf16At);
  constexpr const char* kIn = R"(
    graph @g {
      %t = parameter() {index=0, name="t"} : bf16[4,3]
      %i = parameter() {index=1, name="i"} : s32[2]
      %g = gather(%t, %i) {axis=0}
      %c = compare(%g, %g) {direction="lt"}
      %z = iota() {dimension=0} : bf16[2,3]
      %s = select(%c, %g, %z)
      return s=%s, c=%c
    })";
  ExpectRewrite(pass, kIn, R"(
    graph @g {
      %0 = parameter() {index=0, name="t"} : bf16[4,3]
      %1 = parameter() {index=1, name="i"} : s32[2]
      %2 = convert(%0) : f32[4,3]
      %3 = gather(%2, %1) {axis=0, float_normalized="bf16"} : f32[2,3]
      %4 = convert(%3) : bf16[2,3]
      %5 = convert(%4) : f32[2,3]
      %6 = compare(%5, %5) {direction="lt", float_normalized="bf16"} : bool[2,3]
      %7 = iota() {dimension=0} : bf16[2,3]
      %8 = convert(%4) : f32[2,3]
      %9 = convert(%7) : f32[2,3]
      %10 = select(%6, %8, %9) {float_normalized="bf16"} : f32[2,3]
      %11 = convert(%10) : bf16[2,3]
      return s=%11, c=%6
    })");
  EXPECT_THAT(Changes(pass, kIn),
              ElementsAre(OpCount{ir::Opcode::kCompare, 1}, OpCount{ir::Opcode::kGather, 1},
                          OpCount{ir::Opcode::kSelect, 1}));
}

TEST(FloatNormalization, ReportsWhatRanInF32) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : bf16[2,2]
      %w = parameter() {index=1, name="w"} : bf16[2,2]
      %f = parameter() {index=2, name="f"} : bf16[1,2,3,3]
      %d = dot_general(%x, %w) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %e = dot_general(%d, %w) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %c = conv2d(%f, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
      return y=%e, c=%c
    })");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(FloatNormalizedOps(*g).empty());
  FloatNormalizationPass pass(NoBf16Contractions);
  absl::StatusOr<bool> changed = pass.Run(*g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  // Read off the graph, as for a program from the compile cache: the same as the pass's record.
  EXPECT_EQ(FloatNormalizedOps(*g), pass.last_changes());
  EXPECT_EQ(DescribeOpCounts(pass.last_changes()), "2 dot_general, 1 conv2d");
  EXPECT_EQ(F32ComputeNote(pass.last_changes(), "no bf16 kernels here"),
            "2 dot_general, 1 conv2d compute in f32 with bf16 storage: no bf16 kernels here");
  EXPECT_EQ(DescribeOpCounts({}), "");
}

TEST(FloatNormalization, InThePipelineAfterSimplifyBeforeFusionWhenTheBackendAsks) {
  CompileOptions o;
  o.fuse_loops = true;
  std::vector<std::string> without = DefaultPipeline(o)->PassNames();
  EXPECT_EQ(std::find(without.begin(), without.end(), "float-normalization"), without.end());
  o.traits.supports_bf16 = NoBf16Contractions;
  EXPECT_THAT(DefaultPipeline(o)->PassNames(),
              ElementsAre("decompose", "simplify", "algebraic", "constant-fold", "cse",
                          "transpose-fold", "dce", "float-normalization", "fusion", "schedule"));
  std::vector<std::string> all = AllPassNames();
  EXPECT_NE(std::find(all.begin(), all.end(), "float-normalization"), all.end());
  // Disabling it by name is fine in a pipeline that does not have it.
  CompileOptions plain;
  plain.pipeline.disabled_passes = {"float-normalization"};
  EXPECT_TRUE(DefaultPipeline(plain)->CheckDisabledPasses().ok());
}

// A mixed_bf16 MLP: x . w1 + b1, relu, . w2, cross entropy.
ir::Graph MixedMlp() {
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
  absl::StatusOr<ir::Graph> mixed = ApplyPrecisionPolicy(*g, PrecisionPolicy::kMixedBf16);
  KILN_CHECK_OK(mixed.status());
  return *std::move(mixed);
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

// The rewrite is the reference's own bf16 math (f32 products and sums, one rounding to bf16):
// the reference gives the same results on both graphs up to the double rounding f64 -> f32 ->
// bf16 of a contraction's result (at most one bf16 ulp, rarely), and the cpu backend runs the
// rewritten graph within its usual f32-accumulation tolerance of them.
TEST(FloatNormalization, KeepsTheReferenceBackendsBf16Results) {
  const ir::Graph mixed = MixedMlp();
  ir::Graph normalized = mixed;
  FloatNormalizationPass pass(NoBf16Contractions);
  absl::StatusOr<bool> changed = pass.Run(normalized);
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_TRUE(*changed);
  EXPECT_EQ(DescribeOpCounts(pass.last_changes()), "2 dot_general");
  const std::vector<Tensor> inputs = MlpInputs();
  std::unique_ptr<runtime::Backend> ref = runtime::MakeReferenceBackend();
  std::unique_ptr<runtime::Backend> cpu = runtime::MakeCpuBackend();
  const std::vector<Tensor> want = RunOn(*ref, mixed, inputs);
  const std::vector<Tensor> ref_out = RunOn(*ref, normalized, inputs);
  const std::vector<Tensor> cpu_out = RunOn(*cpu, normalized, inputs);
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(ref_out.size(), 2u);
  ASSERT_EQ(cpu_out.size(), 2u);
  for (int o = 0; o < 2; ++o) {
    ASSERT_EQ(want[o].shape(), ref_out[o].shape());
    for (int64_t i = 0; i < want[o].num_elements(); ++i) {
      const double w = want[o].GetDouble(i);
      // One bf16 ulp of a logit carried through: 2^-8 relative, and the loss's mean of them.
      EXPECT_NEAR(ref_out[o].GetDouble(i), w, std::ldexp(std::abs(w), -7) + 1e-6)
          << "reference, output " << o << " element " << i;
      EXPECT_NEAR(cpu_out[o].GetDouble(i), w, 2e-2 * std::abs(w) + 2e-2)
          << "cpu, output " << o << " element " << i;
    }
  }
}

}  // namespace
}  // namespace kiln::compiler
