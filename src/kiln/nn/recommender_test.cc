// The DLRM-style recommender: signature, the loss as sigmoid binary cross-entropy, gradients
// against central finite differences (reference backend), the cpu backend against the reference
// backend (loss and every gradient), and a short training run that learns a planted preference.
#include "kiln/nn/recommender.h"

#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/autodiff/grad.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::nn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

RecommenderOptions Small(const std::string& interaction = "dot") {
  return {.tables = {5, 7},
          .dense = 2,
          .embed_dim = 4,
          .bottom = {6},
          .top = {5},
          .interaction = interaction};
}

// A batch: ids in range, dense N(0,1), labels 0/1.
void MakeBatch(int64_t batch, uint64_t seed, Tensor* x, Tensor* y) {
  std::mt19937_64 rng(seed);
  *x = Tensor(DType::kF32, Shape{batch, 4});
  *y = Tensor(DType::kS32, Shape{batch});
  for (int64_t i = 0; i < batch; ++i) {
    x->SetDouble(i * 4 + 0, static_cast<double>(rng() % 5));
    x->SetDouble(i * 4 + 1, static_cast<double>(rng() % 7));
    x->SetDouble(i * 4 + 2, static_cast<double>(rng() % 1000) / 500.0 - 1.0);
    x->SetDouble(i * 4 + 3, static_cast<double>(rng() % 1000) / 500.0 - 1.0);
    y->data<int32_t>()[i] = static_cast<int32_t>(rng() % 2);
  }
}

std::vector<Tensor> Inputs(const ParamStore& p, const Tensor& x, const Tensor& y) {
  std::vector<Tensor> in;
  for (int i = 0; i < p.size(); ++i) in.push_back(p.value(i));
  in.push_back(x);
  in.push_back(y);
  return in;
}

TEST(Recommender, SignatureAndValidation) {
  Recommender rec(Small());
  ASSERT_TRUE(rec.Validate().ok()) << rec.Validate();
  EXPECT_EQ(rec.Describe(), "recommender tables 5-7 dim 4 dense 2 bottom 6 top 5 dot -> 1");
  std::vector<std::string> names;
  for (const ParamSpec& s : rec.Params()) names.push_back(s.name);
  EXPECT_THAT(names, ElementsAre("tables/0/weight", "tables/1/weight", "bottom/0/weight",
                                 "bottom/0/bias", "bottom/1/weight", "bottom/1/bias",
                                 "top/0/weight", "top/0/bias", "top/1/weight", "top/1/bias"));
  // dot: the bottom output (4) and the 3 pairs of (e0, e1, h).
  EXPECT_EQ(rec.interaction_width(), 7);
  EXPECT_EQ(Recommender(Small("concat")).interaction_width(), 12);
  EXPECT_EQ(rec.Params()[0].shape, (Shape{5, 4}));
  auto pred = rec.PredictGraph(3);
  ASSERT_TRUE(pred.ok()) << pred.status();
  EXPECT_EQ(pred->node(pred->outputs()[0].node).type().ToString(), "f32[3,2]");

  RecommenderOptions bad = Small();
  bad.interaction = "cross";
  EXPECT_THAT(std::string(Recommender(bad).Validate().message()), HasSubstr("not one of dot"));
  bad = Small();
  bad.tables = {};
  EXPECT_FALSE(Recommender(bad).Validate().ok());
  bad = Small();
  bad.tables = {4};
  bad.dense = 0;
  EXPECT_THAT(std::string(Recommender(bad).Validate().message()), HasSubstr("nothing"));
}

// The loss is mean(softplus(z) - y z) of the predict graph's logit z = logits[:, 1] (and
// logits[:, 0] is 0): sigmoid binary cross-entropy, as torch.nn.BCEWithLogitsLoss.
TEST(Recommender, LossIsSigmoidBinaryCrossEntropy) {
  for (const char* interaction : {"dot", "concat"}) {
    SCOPED_TRACE(interaction);
    Recommender rec(Small(interaction));
    auto params = InitParams(rec.Params(), 3);
    ASSERT_TRUE(params.ok());
    Tensor x, y;
    MakeBatch(16, 1, &x, &y);
    auto ref = runtime::MakeReferenceBackend();
    auto loss_exe = ref->Compile(*rec.LossGraph(16));
    auto pred_exe = ref->Compile(*rec.PredictGraph(16));
    ASSERT_TRUE(loss_exe.ok() && pred_exe.ok());
    std::vector<Tensor> in = Inputs(*params, x, y);
    auto loss = (*loss_exe)->Run(in);
    in.pop_back();
    auto pred = (*pred_exe)->Run(in);
    ASSERT_TRUE(loss.ok() && pred.ok());
    double expected = 0;
    for (int64_t i = 0; i < 16; ++i) {
      EXPECT_EQ((*pred)[0].GetDouble(i * 2), 0.0);
      const double z = (*pred)[0].GetDouble(i * 2 + 1);
      const double label = y.data<int32_t>()[i];
      expected += std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z))) - label * z;
      EXPECT_EQ((*pred)[1].GetDouble(i), z > 0 ? 1.0 : 0.0);
    }
    EXPECT_NEAR((*loss)[0].GetDouble(0), expected / 16, 1e-6);
  }
}

// Every gradient against central differences of the loss (f32, eps 1e-2: a few elements per
// parameter), on the reference backend; then the cpu backend's loss and gradients against the
// reference backend's.
TEST(Recommender, GradientsMatchFiniteDifferencesAndTheCpuBackend) {
  for (const char* interaction : {"dot", "concat"}) {
    SCOPED_TRACE(interaction);
    Recommender rec(Small(interaction));
    auto params = InitParams(rec.Params(), 5);
    ASSERT_TRUE(params.ok());
    Tensor x, y;
    MakeBatch(8, 2, &x, &y);
    // A row of table 0 looked up twice and row 0 of table 1 never: scatter-add and zeros.
    x.SetDouble(0, 3.0);
    x.SetDouble(4, 3.0);
    for (int64_t i = 0; i < 8; ++i) {
      if (x.GetDouble(i * 4 + 1) == 0.0) x.SetDouble(i * 4 + 1, 1.0);
    }
    std::vector<std::string> names = params->names();
    auto loss_graph = rec.LossGraph(8);
    ASSERT_TRUE(loss_graph.ok()) << loss_graph.status();
    auto grad_graph = autodiff::Grad(*loss_graph, names);
    ASSERT_TRUE(grad_graph.ok()) << grad_graph.status();
    auto ref = runtime::MakeReferenceBackend();
    auto cpu = runtime::MakeCpuBackend();
    auto gref = ref->Compile(*grad_graph);
    auto gcpu = cpu->Compile(*grad_graph);
    auto lref = ref->Compile(*loss_graph);
    ASSERT_TRUE(gref.ok() && gcpu.ok() && lref.ok());
    const std::vector<Tensor> in = Inputs(*params, x, y);
    auto out_ref = (*gref)->Run(in);
    auto out_cpu = (*gcpu)->Run(in);
    ASSERT_TRUE(out_ref.ok() && out_cpu.ok());
    EXPECT_NEAR((*out_cpu)[0].GetDouble(0), (*out_ref)[0].GetDouble(0), 1e-5);
    for (size_t k = 0; k < names.size(); ++k) {
      const Tensor& gr = (*out_ref)[k + 1];
      const Tensor& gc = (*out_cpu)[k + 1];
      for (int64_t i = 0; i < gr.num_elements(); ++i) {
        ASSERT_NEAR(gc.GetDouble(i), gr.GetDouble(i), 1e-5 + 1e-4 * std::abs(gr.GetDouble(i)))
            << names[k] << "[" << i << "]";
      }
      // Finite differences at up to 6 elements spread over the parameter.
      const int64_t n = gr.num_elements();
      for (int64_t j = 0; j < std::min<int64_t>(n, 6); ++j) {
        const int64_t i = j * n / std::min<int64_t>(n, 6);
        const double eps = 1e-2;
        std::vector<Tensor> plus = in, minus = in;
        plus[k] = in[k].Clone();
        minus[k] = in[k].Clone();
        plus[k].SetDouble(i, in[k].GetDouble(i) + eps);
        minus[k].SetDouble(i, in[k].GetDouble(i) - eps);
        const double lp = (*(*lref)->Run(plus))[0].GetDouble(0);
        const double lm = (*(*lref)->Run(minus))[0].GetDouble(0);
        const double fd = (lp - lm) / (2 * eps);
        EXPECT_NEAR(gr.GetDouble(i), fd, 2e-3 + 2e-2 * std::abs(fd)) << names[k] << "[" << i << "]";
      }
    }
    // Row 0 of table 1 is never looked up: its gradient is zero.
    const Tensor& g_table1 = (*out_ref)[2];
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(g_table1.GetDouble(c), 0.0);
  }
}

// A planted preference (click iff user and item ids have the same parity) is learned: the loss
// falls well below the 0.693 of a coin.
TEST(Recommender, LearnsAPlantedPreference) {
  Recommender rec({.tables = {8, 8}, .dense = 0, .embed_dim = 4, .top = {8}});
  ASSERT_TRUE(rec.Validate().ok());
  auto params = InitParams(rec.Params(), 1);
  auto loss = rec.LossGraph(64);
  ASSERT_TRUE(params.ok() && loss.ok());
  auto cpu = runtime::MakeCpuBackend();
  TrainStepOptions opts;
  opts.optimizer.kind = OptimizerKind::kAdamW;
  opts.optimizer.schedule.lr = 0.05;
  auto step = TrainStep::Create(*cpu, *loss, std::move(*params), opts);
  ASSERT_TRUE(step.ok()) << step.status();
  Tensor x(DType::kF32, Shape{64, 2}), y(DType::kS32, Shape{64});
  for (int64_t i = 0; i < 64; ++i) {
    const int64_t u = i % 8, v = i / 8;
    x.SetDouble(i * 2, static_cast<double>(u));
    x.SetDouble(i * 2 + 1, static_cast<double>(v));
    y.data<int32_t>()[i] = (u % 2) == (v % 2) ? 1 : 0;
  }
  float first = 0, last = 0;
  for (int s = 0; s < 150; ++s) {
    auto m = (*step)->Run({&x, &y});
    ASSERT_TRUE(m.ok()) << m.status();
    if (s == 0) first = m->loss;
    last = m->loss;
  }
  EXPECT_NEAR(first, 0.693, 0.2);
  EXPECT_LT(last, 0.1);
}

}  // namespace
}  // namespace kiln::nn
