// Layers (embedding, norms, conv, pooling, dropout, attention, transformer block) and the vision
// models (ResNet-style CNN, ViT): signatures, numerics on small cases, and short training runs.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/autodiff/grad.h"
#include "kiln/ir/builder.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/train_step.h"
#include "kiln/nn/transformer.h"
#include "kiln/nn/vision.h"
#include "kiln/runtime/cpu/cpu_backend.h"
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

// Builds `g`, runs it on the reference backend with `inputs` (parameter order).
std::vector<Tensor> RunRef(absl::StatusOr<ir::Graph> g, const std::vector<Tensor>& inputs) {
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return {};
  auto ref = runtime::MakeReferenceBackend();
  auto exe = ref->Compile(*g);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  auto out = (*exe)->Run(inputs);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<Tensor>{};
}

Tensor Iota(DType dtype, Shape shape, double scale = 1.0, double offset = 0.0) {
  Tensor t(dtype, shape);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetDouble(i, offset + scale * i);
  return t;
}

TEST(Embedding, GathersRowsAndRejectsFloatIds) {
  Embedding emb("tok", 5, 3);
  EXPECT_THAT(Names(emb.Params()), ElementsAre("tok/weight"));
  ir::Builder b("emb");
  ParamValues p = AddParameters(b, emb.Params());
  b.Output("y", emb.Apply(p, b.Parameter("ids", DType::kS32, Shape{2, 2})));
  std::vector<Tensor> out = RunRef(
      b.Build(),
      {Iota(DType::kF32, Shape{5, 3}), Tensor::FromVector<int32_t>(Shape{2, 2}, {4, 0, 2, 2})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].TypeString(), "f32[2,2,3]");
  EXPECT_THAT(out[0].ToDoubles(), ElementsAre(12, 13, 14, 0, 1, 2, 6, 7, 8, 6, 7, 8));

  ir::Builder bad("bad");
  ParamValues q = AddParameters(bad, emb.Params());
  bad.Output("y", emb.Apply(q, bad.Parameter("ids", DType::kF32, Shape{2})));
  EXPECT_THAT(std::string(bad.Build().status().message()), HasSubstr("integer ids"));
}

TEST(Norms, InitAndNumerics) {
  LayerNorm ln("ln", 4);
  RmsNorm rms("rms", 4, 1e-6, DType::kF32, '.');
  EXPECT_THAT(Names(ln.Params()), ElementsAre("ln/weight", "ln/bias"));
  EXPECT_THAT(Names(rms.Params()), ElementsAre("rms.weight"));
  auto init = InitParams({ln.Params()[0], ln.Params()[1], rms.Params()[0]}, 0);
  ASSERT_TRUE(init.ok());
  EXPECT_THAT(init->Find("ln/weight")->ToDoubles(), ElementsAre(1, 1, 1, 1));
  EXPECT_THAT(init->Find("ln/bias")->ToDoubles(), ElementsAre(0, 0, 0, 0));

  ir::Builder b("norms");
  ParamValues p = AddParameters(b, ln.Params());
  ParamValues r = AddParameters(b, rms.Params());
  ir::Value x = b.Parameter("x", DType::kF32, Shape{1, 4});
  b.Output("ln", ln.Apply(p, x));
  b.Output("rms", rms.Apply(r, x));
  const Tensor xs = Tensor::FromVector<float>(Shape{1, 4}, {1, 2, 3, 6});
  std::vector<Tensor> out =
      RunRef(b.Build(), {Tensor::FromVector<float>(Shape{4}, {1, 2, 1, 1}),
                         Tensor::FromVector<float>(Shape{4}, {0, 0, 0, 0.5}),
                         Tensor::FromVector<float>(Shape{4}, {1, 1, 2, 1}), xs});
  ASSERT_EQ(out.size(), 2u);
  // mean 3, biased variance (4 + 1 + 0 + 9) / 4 = 3.5.
  const double inv = 1.0 / std::sqrt(3.5 + 1e-5);
  EXPECT_NEAR(out[0].GetDouble(0), -2 * inv, 1e-6);
  EXPECT_NEAR(out[0].GetDouble(1), 2 * -1 * inv, 1e-6);
  EXPECT_NEAR(out[0].GetDouble(3), 3 * inv + 0.5, 1e-6);
  const double rinv = 1.0 / std::sqrt((1 + 4 + 9 + 36) / 4.0 + 1e-6);
  EXPECT_NEAR(out[1].GetDouble(2), 2 * 3 * rinv, 1e-6);
}

TEST(Conv2dLayer, OihwWeightsAndBiasPerOutputChannel) {
  Conv2d conv("c", {.in_channels = 2, .out_channels = 3, .kernel_h = 1, .kernel_w = 1});
  std::vector<ParamSpec> specs = conv.Params();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].shape, (Shape{3, 2, 1, 1}));
  EXPECT_EQ(specs[1].shape, (Shape{3}));
  EXPECT_NEAR(specs[1].init.bound, 1 / std::sqrt(2.0), 1e-12);  // fan_in = 2 * 1 * 1
  ir::Builder b("conv");
  ParamValues p = AddParameters(b, specs);
  b.Output("y", conv.Apply(p, b.Parameter("x", DType::kF32, Shape{1, 2, 2, 2})));
  const Tensor w = Tensor::FromVector<float>(Shape{3, 2, 1, 1}, {1, 0, 0, 1, 1, -1});
  const Tensor bias = Tensor::FromVector<float>(Shape{3}, {10, 20, 30});
  const Tensor x = Iota(DType::kF32, Shape{1, 2, 2, 2});  // channel 0: 0..3, channel 1: 4..7
  std::vector<Tensor> out = RunRef(b.Build(), {w, bias, x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(out[0].ToDoubles(), ElementsAre(10, 11, 12, 13, 24, 25, 26, 27, 26, 26, 26, 26));
  EXPECT_FALSE(
      Conv2d("g", {.in_channels = 3, .out_channels = 4, .conv = {.groups = 2}}).Validate().ok());
}

TEST(Pooling, WrappersAndGlobalAverage) {
  ir::Builder b("pool");
  ir::Value x = b.Parameter("x", DType::kF32, Shape{1, 1, 4, 4});
  b.Output("max", MaxPool(x, 2, 2));
  b.Output("avg", AvgPool(x, 3, 1, 1));
  b.Output("global", GlobalAvgPool(x));
  std::vector<Tensor> out = RunRef(b.Build(), {Iota(DType::kF32, Shape{1, 1, 4, 4})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_THAT(out[0].ToDoubles(), ElementsAre(5, 7, 13, 15));
  EXPECT_EQ(out[1].TypeString(), "f32[1,1,4,4]");
  EXPECT_DOUBLE_EQ(out[1].GetDouble(0), (0 + 1 + 4 + 5) / 4.0);  // padding not counted
  EXPECT_EQ(out[2].TypeString(), "f32[1,1]");
  EXPECT_DOUBLE_EQ(out[2].GetDouble(0), 7.5);
}

TEST(DropoutLayer, DeterministicPerSeedStepAndSite) {
  ir::Builder b("drop");
  ir::Value x = b.Parameter("x", DType::kF32, Shape{4096});
  RngInputs rng = RngInputs::AddParameters(b);
  b.Output("site0", Dropout(0.25, 0).Apply(x, rng));
  b.Output("site1", Dropout(0.25, 1).Apply(x, rng));
  b.Output("eval", Dropout(0.25, 0).Apply(x, RngInputs{}));
  auto g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto ref = runtime::MakeReferenceBackend();
  auto cpu = runtime::MakeCpuBackend();
  auto r = ref->Compile(*g);
  auto c = cpu->Compile(*g);
  ASSERT_TRUE(r.ok() && c.ok());
  Tensor ones(DType::kF32, Shape{4096});
  for (int64_t i = 0; i < 4096; ++i) ones.SetDouble(i, 1.0);
  auto s64 = [](int64_t v) { return Tensor::FromVector<int64_t>(Shape{}, {v}); };
  auto a = (*r)->Run({ones, s64(7), s64(3)});
  auto a_cpu = (*c)->Run({ones, s64(7), s64(3)});
  auto next_step = (*r)->Run({ones, s64(7), s64(4)});
  ASSERT_TRUE(a.ok() && a_cpu.ok() && next_step.ok());
  for (int k = 0; k < 3; ++k) EXPECT_TRUE((*a)[k].BitwiseEquals((*a_cpu)[k])) << "output " << k;
  EXPECT_FALSE((*a)[0].BitwiseEquals((*a)[1]));          // sites differ
  EXPECT_FALSE((*a)[0].BitwiseEquals((*next_step)[0]));  // steps differ
  EXPECT_TRUE((*a)[2].BitwiseEquals(ones));              // eval: identity
  int kept = 0;
  for (double v : (*a)[0].ToDoubles()) {
    ASSERT_TRUE(v == 0.0 || std::abs(v - 1 / 0.75) < 1e-6) << v;
    kept += v != 0.0;
  }
  EXPECT_NEAR(kept / 4096.0, 0.75, 0.03);
  EXPECT_FALSE(Dropout(1.0, 0).Validate().ok());
  EXPECT_FALSE(Dropout(0.5, kDropoutSitesPerStep).Validate().ok());
}

TEST(MultiHeadAttention, FusedAndSeparateProjectionsAgreeAndCausalIgnoresTheFuture) {
  const int64_t d = 8;
  MultiHeadAttention fused("attn", {.dim = d, .num_heads = 2, .causal = true});
  MultiHeadAttention separate("attn",
                              {.dim = d, .num_heads = 2, .causal = true, .fused_qkv = false});
  EXPECT_THAT(Names(fused.Params()), ElementsAre("attn/c_attn/weight", "attn/c_attn/bias",
                                                 "attn/c_proj/weight", "attn/c_proj/bias"));
  EXPECT_THAT(Names(separate.Params()),
              ElementsAre("attn/q_proj/weight", "attn/q_proj/bias", "attn/k_proj/weight",
                          "attn/k_proj/bias", "attn/v_proj/weight", "attn/v_proj/bias",
                          "attn/c_proj/weight", "attn/c_proj/bias"));
  auto fp = InitParams(fused.Params(), 11);
  ASSERT_TRUE(fp.ok());
  // The separate weights are column blocks of c_attn: q = [:, 0:d], k = [:, d:2d], v = [:, 2d:3d].
  const Tensor& cw = *fp->Find("attn/c_attn/weight");
  const Tensor& cb = *fp->Find("attn/c_attn/bias");
  std::vector<Tensor> sep_inputs;
  for (int part = 0; part < 3; ++part) {
    Tensor w(DType::kF32, Shape{d, d}), bias(DType::kF32, Shape{d});
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < d; ++j)
        w.SetDouble(i * d + j, cw.GetDouble(i * 3 * d + part * d + j));
      bias.SetDouble(i, cb.GetDouble(part * d + i));
    }
    sep_inputs.push_back(w);
    sep_inputs.push_back(bias);
  }
  sep_inputs.push_back(*fp->Find("attn/c_proj/weight"));
  sep_inputs.push_back(*fp->Find("attn/c_proj/bias"));

  auto graph = [&](const MultiHeadAttention& attn) {
    ir::Builder b("mha");
    ParamValues p = AddParameters(b, attn.Params());
    b.Output("y", attn.Apply(p, b.Parameter("x", DType::kF32, Shape{1, 5, d})));
    return b.Build();
  };
  Tensor x = Iota(DType::kF32, Shape{1, 5, d}, 0.03, -0.5);
  std::vector<Tensor> fused_inputs;
  for (int i = 0; i < fp->size(); ++i) fused_inputs.push_back(fp->value(i));
  fused_inputs.push_back(x);
  sep_inputs.push_back(x);
  std::vector<Tensor> a = RunRef(graph(fused), fused_inputs);
  std::vector<Tensor> s = RunRef(graph(separate), sep_inputs);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(s.size(), 1u);
  for (int64_t i = 0; i < a[0].num_elements(); ++i) {
    EXPECT_NEAR(a[0].GetDouble(i), s[0].GetDouble(i), 1e-6);
  }
  // Changing the last position changes only the last position's output.
  Tensor x2 = x.Clone();
  for (int64_t j = 0; j < d; ++j) x2.SetDouble(4 * d + j, 3.0);
  fused_inputs.back() = x2;
  std::vector<Tensor> a2 = RunRef(graph(fused), fused_inputs);
  ASSERT_EQ(a2.size(), 1u);
  for (int64_t i = 0; i < 4 * d; ++i) EXPECT_EQ(a2[0].GetDouble(i), a[0].GetDouble(i)) << i;
  EXPECT_NE(a2[0].GetDouble(4 * d), a[0].GetDouble(4 * d));
  EXPECT_FALSE(MultiHeadAttention("bad", {.dim = 6, .num_heads = 4}).Validate().ok());
}

TEST(TransformerBlock, NamesAndRmsNormVariant) {
  TransformerBlock ln_block("blocks/0", {.dim = 8, .num_heads = 2}, 1);
  EXPECT_THAT(
      Names(ln_block.Params()),
      ElementsAre("blocks/0/ln_1/weight", "blocks/0/ln_1/bias", "blocks/0/attn/c_attn/weight",
                  "blocks/0/attn/c_attn/bias", "blocks/0/attn/c_proj/weight",
                  "blocks/0/attn/c_proj/bias", "blocks/0/ln_2/weight", "blocks/0/ln_2/bias",
                  "blocks/0/mlp/c_fc/weight", "blocks/0/mlp/c_fc/bias",
                  "blocks/0/mlp/c_proj/weight", "blocks/0/mlp/c_proj/bias"));
  TransformerBlock rms_block(
      "b", {.dim = 8, .num_heads = 2, .mlp_hidden = 16, .norm = NormKind::kRmsNorm}, 1);
  std::vector<ParamSpec> specs = rms_block.Params();
  EXPECT_EQ(specs.size(), 10u);
  EXPECT_EQ(specs[0].name, "b/ln_1/weight");
  EXPECT_EQ(specs[6].shape, (Shape{8, 16}));
  ir::Builder b("block");
  ParamValues p = AddParameters(b, specs);
  ir::Value y = rms_block.Apply(p, b.Parameter("x", DType::kF32, Shape{2, 3, 8}), RngInputs{});
  EXPECT_EQ(y.type().ToString(), "f32[2,3,8]");
  b.Output("y", y);
  EXPECT_TRUE(b.Build().ok());
}

// 8x8 one-channel images: class k (of 4) lights up quadrant k, plus a deterministic texture.
struct Quadrants {
  static constexpr int kBatch = 16;
  Tensor x{DType::kF32, Shape{kBatch, 64}};
  Tensor labels{DType::kS32, Shape{kBatch}};
  Quadrants() {
    for (int n = 0; n < kBatch; ++n) {
      const int k = n % 4;
      labels.SetDouble(n, k);
      for (int i = 0; i < 8; ++i) {
        for (int j = 0; j < 8; ++j) {
          const bool lit = (i / 4) * 2 + (j / 4) == k;
          x.SetDouble(n * 64 + i * 8 + j, (lit ? 1.0 : 0.0) + 0.1 * std::sin(n * 7 + i * 3 + j));
        }
      }
    }
  }
};

// Trains `model` for `steps` AdamW steps on the quadrants; returns {first loss, last loss}.
std::pair<float, float> TrainQuadrants(const Model& model, int steps, double lr) {
  Quadrants data;
  auto loss = model.TrainLossGraph(Quadrants::kBatch);
  EXPECT_TRUE(loss.ok()) << loss.status();
  auto params = InitParams(model.Params(), 1);
  EXPECT_TRUE(params.ok());
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kAdamW;
  opt.schedule.lr = lr;
  opt.clip_norm = 1.0;
  auto cpu = runtime::MakeCpuBackend();
  auto step = TrainStep::Create(*cpu, *loss, std::move(params).value(), {.optimizer = opt});
  EXPECT_TRUE(step.ok()) << step.status();
  if (!step.ok()) return {0, 0};
  if (getenv("KILN_NN_TEST_VERBOSE")) printf("compile %.3f s\n", (*step)->compile_seconds());
  float first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    auto m = (*step)->Run({&data.x, &data.labels});
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) break;
    if (s == 0) first = m->loss;
    if (getenv("KILN_NN_TEST_VERBOSE")) printf("step %d loss %f gn %f\n", s, m->loss, m->grad_norm);
    last = m->loss;
  }
  return {first, last};
}

TEST(ResNetCnn, SignatureAndShortTraining) {
  ResNetCnn cnn({.in_channels = 1, .height = 8, .width = 8, .num_classes = 4, .widths = {8, 16}});
  ASSERT_TRUE(cnn.Validate().ok());
  EXPECT_EQ(cnn.Describe(), "resnet 1x8x8 widths 8-16 blocks 1 -> 4");
  EXPECT_THAT(Names(cnn.Params()),
              ElementsAre("stem/weight", "stem/bias", "stage0/block0/conv1/weight",
                          "stage0/block0/conv1/bias", "stage0/block0/conv2/weight",
                          "stage0/block0/conv2/bias", "stage1/down/weight", "stage1/down/bias",
                          "stage1/block0/conv1/weight", "stage1/block0/conv1/bias",
                          "stage1/block0/conv2/weight", "stage1/block0/conv2/bias", "head/weight",
                          "head/bias"));
  auto pred = cnn.PredictGraph(3);
  ASSERT_TRUE(pred.ok()) << pred.status();
  EXPECT_EQ(pred->node(pred->outputs()[0].node).type().ToString(), "f32[3,4]");
  auto [first, last] = TrainQuadrants(cnn, 25, 1e-2);
  EXPECT_LT(last, 0.3 * first);
  EXPECT_FALSE(
      ResNetCnn({.height = 2, .width = 2, .num_classes = 4, .widths = {4, 4, 4}}).Validate().ok());
}

TEST(VisionTransformer, SignatureAndShortTraining) {
  VisionTransformer vit({.in_channels = 1,
                         .height = 8,
                         .width = 8,
                         .patch = 4,
                         .dim = 16,
                         .depth = 1,
                         .heads = 2,
                         .mlp_ratio = 2,
                         .num_classes = 4,
                         .dropout = 0.1});
  ASSERT_TRUE(vit.Validate().ok());
  EXPECT_EQ(vit.num_patches(), 4);
  std::vector<ParamSpec> specs = vit.Params();
  const std::vector<std::string> names = Names(specs);
  EXPECT_THAT(std::vector<std::string>(names.begin(), names.begin() + 5),
              ElementsAre("patch_embed/weight", "patch_embed/bias", "cls_token", "pos_embed",
                          "blocks/0/ln_1/weight"));
  EXPECT_EQ(specs[0].shape, (Shape{16, 1, 4, 4}));
  EXPECT_EQ(specs[3].shape, (Shape{1, 5, 16}));
  EXPECT_EQ(names.back(), "head/bias");
  auto eval = vit.LossGraph(2);
  auto train = vit.TrainLossGraph(2);
  ASSERT_TRUE(eval.ok() && train.ok());
  EXPECT_EQ(train->parameters().size(), eval->parameters().size() + 2);  // rng/seed, rng/step
  // Training, without dropout (on this tiny problem dropout only adds noise).
  VisionTransformer plain({.in_channels = 1,
                           .height = 8,
                           .width = 8,
                           .patch = 4,
                           .dim = 16,
                           .depth = 1,
                           .heads = 2,
                           .mlp_ratio = 2,
                           .num_classes = 4});
  auto [first, last] = TrainQuadrants(plain, 30, 3e-3);
  EXPECT_LT(last, 0.3 * first);
  EXPECT_FALSE(VisionTransformer(
                   {.height = 8, .width = 8, .patch = 3, .dim = 16, .heads = 2, .num_classes = 4})
                   .Validate()
                   .ok());
}

TEST(Model, EveryModelDifferentiatesThroughTheInterface) {
  std::vector<std::unique_ptr<Model>> models;
  models.push_back(std::make_unique<MlpClassifier>(
      MlpOptions{.in_features = 64, .hidden = {8}, .num_classes = 4}));
  models.push_back(std::make_unique<ResNetCnn>(
      ResNetOptions{.height = 8, .width = 8, .num_classes = 4, .widths = {4}}));
  models.push_back(std::make_unique<VisionTransformer>(VitOptions{
      .height = 8, .width = 8, .patch = 4, .dim = 8, .depth = 1, .heads = 2, .num_classes = 4}));
  for (const auto& model : models) {
    SCOPED_TRACE(model->Describe());
    ASSERT_TRUE(model->Validate().ok());
    auto loss = model->LossGraph(2);
    ASSERT_TRUE(loss.ok()) << loss.status();
    std::vector<std::string> names = Names(model->Params());
    auto g = autodiff::Grad(*loss, names);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->outputs().size(), names.size() + 1);
  }
}

}  // namespace
}  // namespace kiln::nn
