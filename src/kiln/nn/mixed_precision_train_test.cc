// TrainStep with a precision policy: the loss graph is rewritten by compiler::MixedPrecisionPass
// before autodiff, so forward and backward contractions run in bf16 while the parameters, their
// gradients and the optimizer update stay f32.
#include <cmath>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/compiler/passes/float_normalization.h"
#include "kiln/compiler/passes/mixed_precision.h"
#include "kiln/ir/builder.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/cpu/isa.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::nn {
namespace {

using compiler::PrecisionPolicy;
using ::testing::HasSubstr;

constexpr int64_t kBatch = 32, kIn = 16, kClasses = 4;

// Four Gaussian blobs in 16 dimensions: separable, so a few SGD steps lower the loss a lot.
struct Blobs {
  Tensor x{DType::kF32, Shape{kBatch, kIn}};
  Tensor labels{DType::kS32, Shape{kBatch}};
  Blobs() {
    for (int64_t n = 0; n < kBatch; ++n) {
      const int k = static_cast<int>(n % kClasses);
      labels.data<int32_t>()[n] = k;
      for (int64_t i = 0; i < kIn; ++i) {
        x.SetDouble(n * kIn + i, (i % kClasses == k ? 1.0 : 0.0) + 0.3 * std::sin(n * 5 + i * 3));
      }
    }
  }
};

MlpClassifier Model() {
  return MlpClassifier({.in_features = kIn, .hidden = {32}, .num_classes = kClasses});
}

struct TrainRun {
  std::vector<float> losses;
  ParamStore params;
  int bf16_dots = 0;  // in the compiled train step: dot_generals computing in bf16
  // dot_generals on bf16 values computed in f32 (float-normalization: no bf16 matmul here)
  int f32_compute_dots = 0;
};

TrainRun Train(runtime::Backend& backend, PrecisionPolicy precision, int steps) {
  TrainRun r;
  Blobs data;
  MlpClassifier model = Model();
  absl::StatusOr<ir::Graph> loss = model.TrainLossGraph(kBatch);
  EXPECT_TRUE(loss.ok()) << loss.status();
  absl::StatusOr<ParamStore> init = InitParams(model.Params(), 3);
  EXPECT_TRUE(init.ok()) << init.status();
  if (!loss.ok() || !init.ok()) return r;
  OptimizerConfig opt;
  opt.schedule.lr = 0.2;
  opt.sgd.momentum = 0.9;
  auto step = TrainStep::Create(backend, *loss, *std::move(init),
                                {.optimizer = opt, .precision = precision});
  EXPECT_TRUE(step.ok()) << step.status();
  if (!step.ok()) return r;
  for (const ir::Node& n : (*step)->train_step_graph().nodes()) {
    if (n.opcode() != ir::Opcode::kDotGeneral) continue;
    r.bf16_dots += n.type().dtype == DType::kBF16;
    r.f32_compute_dots += n.has_attr(compiler::kFloatNormalizedAttr);
  }
  for (int s = 0; s < steps; ++s) {
    absl::StatusOr<StepMetrics> m = (*step)->Run({&data.x, &data.labels});
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) break;
    r.losses.push_back(m->loss);
  }
  r.params = (*step)->params().Clone();
  return r;
}

TEST(MixedPrecisionTraining, LossFallsAndTracksF32WithF32MasterWeights) {
  auto cpu = runtime::MakeCpuBackend();
  constexpr int kSteps = 20;
  const TrainRun f32 = Train(*cpu, PrecisionPolicy::kF32, kSteps);
  ASSERT_EQ(f32.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(f32.bf16_dots, 0);
  EXPECT_EQ(f32.f32_compute_dots, 0);
  for (PrecisionPolicy p : {PrecisionPolicy::kMixedBf16, PrecisionPolicy::kBf16}) {
    SCOPED_TRACE(compiler::PrecisionPolicyName(p));
    const TrainRun low = Train(*cpu, p, kSteps);
    ASSERT_EQ(low.losses.size(), static_cast<size_t>(kSteps));
    // Forward (2 layers) and backward (input gradient of layer 1, weight gradients of both) run
    // on bf16 values: in bf16 where oneDNN has a bf16 matmul, else in f32 between converts.
    if (runtime::OneDnnHasBf16()) {
      EXPECT_GE(low.bf16_dots, 4);
      EXPECT_EQ(low.f32_compute_dots, 0);
    } else {
      EXPECT_EQ(low.bf16_dots, 0);
      EXPECT_GE(low.f32_compute_dots, 4);
    }
    EXPECT_LT(low.losses.back(), 0.5f * low.losses.front());
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(low.losses[s], f32.losses[s], 0.03 + 0.05 * f32.losses[s]) << "step " << s;
    }
    // Master weights stay f32, and bf16 compute did change them a little.
    ASSERT_EQ(low.params.size(), f32.params.size());
    double max_diff = 0;
    for (int i = 0; i < low.params.size(); ++i) {
      const Tensor& a = low.params.value(i);
      const Tensor& b = f32.params.value(i);
      EXPECT_EQ(a.dtype(), DType::kF32) << low.params.names()[i];
      for (int64_t j = 0; j < a.num_elements(); ++j) {
        max_diff = std::max(max_diff, std::abs(a.GetDouble(j) - b.GetDouble(j)));
      }
    }
    EXPECT_GT(max_diff, 0.0);
    EXPECT_LT(max_diff, 0.1);
  }
}

TEST(MixedPrecisionTraining, ReferenceBackendAgreesWithCpu) {
  auto ref = runtime::MakeReferenceBackend();
  auto cpu = runtime::MakeCpuBackend();
  const TrainRun a = Train(*ref, PrecisionPolicy::kMixedBf16, 3);
  const TrainRun b = Train(*cpu, PrecisionPolicy::kMixedBf16, 3);
  ASSERT_EQ(a.losses.size(), 3u);
  ASSERT_EQ(b.losses.size(), 3u);
  for (int s = 0; s < 3; ++s) EXPECT_NEAR(a.losses[s], b.losses[s], 1e-2) << "step " << s;
}

TEST(MixedPrecisionTraining, NonF32ParametersAreRejected) {
  ir::Builder b("f64");
  ir::Value w = b.Parameter("w", DType::kF64, {4, 2});
  ir::Value x = b.Parameter("x", DType::kF64, {3, 4});
  b.Output("loss", ir::ReduceSum(ir::MatMul(x, w), {0, 1}));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<ParamStore> init =
      InitParams({{"w", DType::kF64, Shape{4, 2}, Initializer::Zeros()}}, 0);
  ASSERT_TRUE(init.ok()) << init.status();
  auto ref = runtime::MakeReferenceBackend();
  auto step =
      TrainStep::Create(*ref, *g, *std::move(init), {.precision = PrecisionPolicy::kMixedBf16});
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr("precision mixed_bf16 keeps f32 master weights, but parameter 'w' is f64"));
}

}  // namespace
}  // namespace kiln::nn
