#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/ir/builder.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/params.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::nn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Names(const std::vector<ParamSpec>& specs) {
  std::vector<std::string> names;
  for (const ParamSpec& s : specs) names.push_back(s.name);
  return names;
}

TEST(Linear, ParamsAndOutputShapes) {
  Linear fc("fc", 3, 4);
  std::vector<ParamSpec> specs = fc.Params();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "fc/weight");
  EXPECT_EQ(specs[0].shape, (Shape{3, 4}));
  EXPECT_EQ(specs[1].name, "fc/bias");
  EXPECT_EQ(specs[1].shape, (Shape{4}));
  EXPECT_EQ(Linear("nb", 3, 4, /*bias=*/false).Params().size(), 1u);

  ir::Builder b("linear");
  ParamValues p = AddParameters(b, specs);
  ir::Value y2 = fc.Apply(p, b.Parameter("x", DType::kF32, Shape{5, 3}));
  ir::Value y3 = fc.Apply(p, b.Parameter("z", DType::kF32, Shape{2, 5, 3}));
  EXPECT_EQ(y2.type().ToString(), "f32[5,4]");
  EXPECT_EQ(y3.type().ToString(), "f32[2,5,4]");
  b.Output("y2", y2);
  b.Output("y3", y3);
  auto g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->parameters().size(), 4u);
}

TEST(Linear, WrongInputWidthOrMissingParamIsABuildError) {
  Linear fc("fc", 3, 4);
  {
    ir::Builder b;
    ParamValues p = AddParameters(b, fc.Params());
    b.Output("y", fc.Apply(p, b.Parameter("x", DType::kF32, Shape{5, 2})));
    auto g = b.Build();
    ASSERT_FALSE(g.ok());
    EXPECT_THAT(std::string(g.status().message()), HasSubstr("layer fc expects input [..., 3]"));
  }
  {
    ir::Builder b;
    ParamValues p;  // nothing added
    b.Output("y", fc.Apply(p, b.Parameter("x", DType::kF32, Shape{5, 3})));
    auto g = b.Build();
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string(g.status().message()), HasSubstr("fc/weight"));
  }
}

TEST(InitParams, DeterministicBySeedAndNameAndWithinTorchBounds) {
  MlpClassifier mlp({.in_features = 16, .hidden = {8}, .num_classes = 3});
  std::vector<ParamSpec> specs = mlp.Params();
  EXPECT_THAT(Names(specs), ElementsAre("fc0/weight", "fc0/bias", "fc1/weight", "fc1/bias"));
  auto a = InitParams(specs, 7);
  auto b = InitParams(specs, 7);
  auto c = InitParams(specs, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (int i = 0; i < a->size(); ++i) {
    EXPECT_TRUE(a->value(i).BitwiseEquals(b->value(i))) << a->names()[i];
    EXPECT_FALSE(a->value(i).BitwiseEquals(c->value(i))) << a->names()[i];
  }
  // A parameter's values depend on its name, not its position in the list.
  std::vector<ParamSpec> reversed(specs.rbegin(), specs.rend());
  auto r = InitParams(reversed, 7);
  ASSERT_TRUE(r.ok());
  for (const std::string& name : a->names()) {
    EXPECT_TRUE(a->Find(name)->BitwiseEquals(*r->Find(name))) << name;
  }
  // torch.nn.Linear bounds: +-1/sqrt(fan_in), and the values fill the range.
  for (auto [name, fan_in] : {std::pair<std::string, int>{"fc0/weight", 16},
                              {"fc0/bias", 16},
                              {"fc1/weight", 8},
                              {"fc1/bias", 8}}) {
    const double bound = 1.0 / std::sqrt(fan_in);
    double lo = 1, hi = -1;
    for (double v : a->Find(name)->ToDoubles()) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_GE(lo, -bound) << name;
    EXPECT_LT(hi, bound) << name;
    if (name == "fc0/weight") {  // 128 draws: near both ends
      EXPECT_LT(lo, -0.8 * bound);
      EXPECT_GT(hi, 0.8 * bound);
    }
  }
  EXPECT_EQ(a->num_elements(), 16 * 8 + 8 + 8 * 3 + 3);
}

TEST(InitParams, RejectsDuplicatesAndIntegerUniform) {
  std::vector<ParamSpec> dup = {{"w", DType::kF32, Shape{2}, Initializer::Zeros()},
                                {"w", DType::kF32, Shape{2}, Initializer::Zeros()}};
  EXPECT_EQ(InitParams(dup, 0).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<ParamSpec> ints = {{"i", DType::kS32, Shape{2}, Initializer::Uniform(1)}};
  EXPECT_EQ(InitParams(ints, 0).status().code(), absl::StatusCode::kInvalidArgument);
  ParamStore store;
  ASSERT_TRUE(store.Add("a", Tensor(DType::kF32, Shape{1})).ok());
  EXPECT_EQ(store.Add("a", Tensor(DType::kF32, Shape{1})).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store.Get("b").status().code(), absl::StatusCode::kNotFound);
}

TEST(MlpClassifier, GraphsHaveTheDocumentedSignature) {
  MlpClassifier mlp({.in_features = 6, .hidden = {5, 4}, .num_classes = 3});
  EXPECT_EQ(mlp.Describe(), "6-5-4-3");
  auto loss = mlp.LossGraph(2);
  ASSERT_TRUE(loss.ok()) << loss.status();
  std::vector<std::string> inputs;
  for (int id : loss->parameters()) inputs.push_back(loss->node(id).attr_str("name"));
  EXPECT_THAT(inputs, ElementsAre("fc0/weight", "fc0/bias", "fc1/weight", "fc1/bias", "fc2/weight",
                                  "fc2/bias", "x", "labels"));
  ASSERT_EQ(loss->outputs().size(), 1u);
  EXPECT_EQ(loss->node(loss->outputs()[0].node).type().ToString(), "f32[]");
  auto pred = mlp.PredictGraph(2);
  ASSERT_TRUE(pred.ok()) << pred.status();
  EXPECT_EQ(pred->node(pred->outputs()[pred->FindOutput("prediction")].node).type().ToString(),
            "s32[2]");
  EXPECT_FALSE(
      MlpClassifier({.in_features = 6, .hidden = {0}, .num_classes = 3}).LossGraph(2).ok());
  EXPECT_FALSE(mlp.LossGraph(0).ok());
}

// A linear softmax classifier: the SGD step has a closed form to check the engine against.
struct Tiny {
  static constexpr int kB = 4, kF = 3, kC = 3;
  std::vector<float> x = {0.5f,  -1.0f, 2.0f,  1.5f, 0.0f, -0.5f,
                          -1.0f, 1.0f,  0.25f, 0.0f, 2.0f, 1.0f};
  std::vector<int32_t> y = {0, 2, 1, 2};
  Tensor xt() const { return Tensor::FromVector<float>(Shape{kB, kF}, x); }
  Tensor yt() const { return Tensor::FromVector<int32_t>(Shape{kB}, y); }
};

// Plain SGD at a constant rate, as `kiln demo` trains.
TrainStepOptions PlainSgd(double lr) {
  TrainStepOptions o;
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.schedule.lr = lr;
  return o;
}

TEST(SgdTrainStep, MatchesTheClosedFormSoftmaxRegressionUpdate) {
  Tiny t;
  MlpClassifier model({.in_features = Tiny::kF, .hidden = {}, .num_classes = Tiny::kC});
  auto params = InitParams(model.Params(), 3);
  ASSERT_TRUE(params.ok());
  const ParamStore initial = params->Clone();
  auto loss_graph = model.LossGraph(Tiny::kB);
  ASSERT_TRUE(loss_graph.ok()) << loss_graph.status();
  std::unique_ptr<runtime::Backend> ref = runtime::MakeReferenceBackend();
  const float lr = 0.3f;
  auto step = TrainStep::Create(*ref, *loss_graph, std::move(params).value(), PlainSgd(lr));
  ASSERT_TRUE(step.ok()) << step.status();
  Tensor x = t.xt(), y = t.yt();
  auto res = (*step)->Run({&x, &y});
  ASSERT_TRUE(res.ok()) << res.status();

  // Host: p = softmax(xW + b); loss = mean(-log p[y]); dz = (p - onehot) / B.
  const float* W = initial.Find("fc0/weight")->data<float>();
  const float* bb = initial.Find("fc0/bias")->data<float>();
  std::vector<double> dw(Tiny::kF * Tiny::kC, 0), db(Tiny::kC, 0);
  double loss = 0;
  for (int i = 0; i < Tiny::kB; ++i) {
    double z[Tiny::kC], mx = -1e30, sum = 0;
    for (int c = 0; c < Tiny::kC; ++c) {
      z[c] = bb[c];
      for (int f = 0; f < Tiny::kF; ++f) z[c] += t.x[i * Tiny::kF + f] * W[f * Tiny::kC + c];
      mx = std::max(mx, z[c]);
    }
    for (int c = 0; c < Tiny::kC; ++c) sum += std::exp(z[c] - mx);
    loss += (std::log(sum) + mx - z[t.y[i]]) / Tiny::kB;
    for (int c = 0; c < Tiny::kC; ++c) {
      const double dz = (std::exp(z[c] - mx) / sum - (c == t.y[i])) / Tiny::kB;
      db[c] += dz;
      for (int f = 0; f < Tiny::kF; ++f) dw[f * Tiny::kC + c] += t.x[i * Tiny::kF + f] * dz;
    }
  }
  EXPECT_NEAR(res->loss, loss, 1e-5);
  EXPECT_NEAR(res->lr, lr, 1e-7);
  const Tensor& new_w = *(*step)->params().Find("fc0/weight");
  const Tensor& new_b = *(*step)->params().Find("fc0/bias");
  for (int k = 0; k < Tiny::kF * Tiny::kC; ++k) {
    EXPECT_NEAR(new_w.GetDouble(k), W[k] - lr * dw[k], 1e-5) << "weight " << k;
  }
  for (int c = 0; c < Tiny::kC; ++c) {
    EXPECT_NEAR(new_b.GetDouble(c), bb[c] - lr * db[c], 1e-5) << "bias " << c;
  }
}

TEST(SgdTrainStep, EachStepLowersTheLossOnATinyProblem) {
  Tiny t;
  MlpClassifier model({.in_features = Tiny::kF, .hidden = {8}, .num_classes = Tiny::kC});
  auto params = InitParams(model.Params(), 1);
  ASSERT_TRUE(params.ok());
  const ParamStore initial = params->Clone();
  auto loss_graph = model.LossGraph(Tiny::kB);
  ASSERT_TRUE(loss_graph.ok());
  std::unique_ptr<runtime::Backend> ref = runtime::MakeReferenceBackend();
  Tensor x = t.xt(), y = t.yt();

  // lr 0 changes nothing and reports the same loss twice.
  auto frozen = TrainStep::Create(*ref, *loss_graph, params->Clone(), PlainSgd(0.0));
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  auto l0 = (*frozen)->Run({&x, &y});
  auto l0b = (*frozen)->Run({&x, &y});
  ASSERT_TRUE(l0.ok() && l0b.ok()) << l0.status();
  EXPECT_EQ(l0->loss, l0b->loss);
  for (int i = 0; i < initial.size(); ++i) {
    EXPECT_TRUE((*frozen)->params().value(i).BitwiseEquals(initial.value(i)));
  }

  auto step = TrainStep::Create(*ref, *loss_graph, std::move(params).value(), PlainSgd(0.2));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT((*step)->data_inputs(), ElementsAre("x", "labels"));
  // Run reports the loss before its update, so the first step still sees l0 and each later one
  // sees the parameters the previous step wrote.
  auto first = (*step)->Run({&x, &y});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->loss, l0->loss);
  float previous = first->loss;
  for (int s = 1; s < 20; ++s) {
    auto l = (*step)->Run({&x, &y});
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_LT(l->loss, previous) << "step " << s;
    previous = l->loss;
  }
  EXPECT_LT(previous, 0.5f * l0->loss);
  EXPECT_FALSE((*step)->params().value(0).BitwiseEquals(initial.value(0)));

  EXPECT_EQ((*step)->Run({&x}).status().code(), absl::StatusCode::kInvalidArgument);
  Tensor wrong(DType::kF32, Shape{Tiny::kB + 1, Tiny::kF});
  EXPECT_FALSE((*step)->Run({&wrong, &y}).ok());
}

TEST(SgdTrainStep, RejectsMismatchedParameters) {
  MlpClassifier model({.in_features = 3, .hidden = {}, .num_classes = 2});
  auto loss_graph = model.LossGraph(2);
  ASSERT_TRUE(loss_graph.ok());
  std::unique_ptr<runtime::Backend> ref = runtime::MakeReferenceBackend();
  ParamStore unknown;
  ASSERT_TRUE(unknown.Add("nope", Tensor(DType::kF32, Shape{1})).ok());
  auto t1 = TrainStep::Create(*ref, *loss_graph, std::move(unknown), PlainSgd(0.1));
  ASSERT_FALSE(t1.ok());
  EXPECT_THAT(std::string(t1.status().message()), HasSubstr("'nope'"));
  ParamStore wrong_shape;
  ASSERT_TRUE(wrong_shape.Add("fc0/weight", Tensor(DType::kF32, Shape{2, 3})).ok());
  auto t2 = TrainStep::Create(*ref, *loss_graph, std::move(wrong_shape), PlainSgd(0.1));
  ASSERT_FALSE(t2.ok());
  EXPECT_THAT(std::string(t2.status().message()), HasSubstr("f32[3,2]"));
}

}  // namespace
}  // namespace kiln::nn
