// Optimizers, clipping and schedules against PyTorch 1.13 numbers. The expected values come from
// src/kiln/nn/testdata/gen_optim_expected.py (run with /usr/bin/python3; it prints the blocks
// below), which runs torch.optim on the same tiny quadratic.
#include "kiln/nn/optim.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/ir/builder.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::nn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// loss = sum(c * (w - t)^2) + sum((M @ x - y)^2); w f32[3], M f32[2,2], x f32[2,1] (data).
ir::Graph QuadraticLoss() {
  ir::Builder b("quad");
  ir::Value w = b.Parameter("w", DType::kF32, Shape{3});
  ir::Value m = b.Parameter("m", DType::kF32, Shape{2, 2});
  ir::Value x = b.Parameter("x", DType::kF32, Shape{2, 1});
  ir::Value c = b.Constant(Tensor::FromVector<float>(Shape{3}, {1.0f, 2.0f, 0.5f}));
  ir::Value t = b.Constant(Tensor::FromVector<float>(Shape{3}, {1.0f, 0.0f, -1.0f}));
  ir::Value y = b.Constant(Tensor::FromVector<float>(Shape{2, 1}, {0.3f, -0.7f}));
  ir::Value d = w - t;
  ir::Value r = ir::MatMul(m, x) - y;
  b.Output("loss", ir::ReduceSum(c * d * d, {0}) + ir::ReduceSum(r * r, {0, 1}));
  return *b.Build();
}

ParamStore QuadraticParams() {
  ParamStore p;
  EXPECT_TRUE(p.Add("w", Tensor::FromVector<float>(Shape{3}, {0.5f, -1.0f, 2.0f})).ok());
  EXPECT_TRUE(p.Add("m", Tensor::FromVector<float>(Shape{2, 2}, {1.0f, -0.5f, 0.25f, 2.0f})).ok());
  return p;
}

Tensor QuadraticX() { return Tensor::FromVector<float>(Shape{2, 1}, {1.5f, -0.5f}); }

struct Expected {
  std::vector<double> losses, grad_norms, lrs, w, m;
};

struct Case {
  std::string name;
  OptimizerConfig config;
  Expected expected;
};

std::vector<Case> TorchCases() {
  std::vector<Case> cases;
  {
    OptimizerConfig c;
    c.kind = OptimizerKind::kSgd;
    c.sgd = {.momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
    c.schedule.lr = 0.05;
    cases.push_back({"sgd momentum 0.9 dampening 0.1 wd 0.01 lr 0.05",
                     c,
                     {
                         .losses = {8.85812569, 6.72347879, 4.18833494, 2.58133125, 2.22297597},
                         .grad_norms = {6.86157799, 5.56726456, 3.67041254, 2.34846497, 2.96215749},
                         .lrs = {0.05, 0.05, 0.05, 0.05, 0.05},
                         .w = {0.985461712, 0.535544157, 0.34750703},
                         .m = {-0.468323767, -0.00953997392, 0.171661779, 2.01337743},
                     }});
  }
  {
    OptimizerConfig c;
    c.kind = OptimizerKind::kSgd;
    c.sgd = {.momentum = 0.8, .nesterov = true};
    c.schedule.lr = 0.05;
    cases.push_back({"sgd nesterov momentum 0.8 lr 0.05",
                     c,
                     {
                         .losses = {8.85812569, 5.3514576, 3.14593101, 2.0974381, 1.54785359},
                         .grad_norms = {6.86157799, 4.58867884, 2.78764868, 2.14303684, 2.18474579},
                         .lrs = {0.05, 0.05, 0.05, 0.05, 0.05},
                         .w = {0.978501856, 0.265394598, 0.244259939},
                         .m = {-0.116794236, -0.127735227, 0.192234889, 2.0192554},
                     }});
  }
  OptimizerConfig adamw;
  adamw.kind = OptimizerKind::kAdamW;
  adamw.adamw = {.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  adamw.schedule.lr = 0.1;
  cases.push_back({"adamw lr 0.1 betas (0.9, 0.99) eps 1e-8 wd 0.1",
                   adamw,
                   {
                       .losses = {8.85812569, 7.42858267, 6.17212105, 5.11292648, 4.24226427},
                       .grad_norms = {6.86157799, 6.07911825, 5.3098402, 4.58774424, 3.92939281},
                       .lrs = {0.1, 0.1, 0.1, 0.1, 0.1},
                       .w = {0.942069888, -0.469493985, 1.41390228},
                       .m = {0.475761861, -0.00026679039, 0.219415724, 1.92031229},
                   }});
  {
    OptimizerConfig c = adamw;
    c.clip_norm = 1.0;
    cases.push_back({"adamw lr 0.1 clip 1.0",
                     c,
                     {
                         .losses = {8.85812569, 7.42858267, 6.16615868, 5.09875154, 4.21046019},
                         .grad_norms = {6.86157799, 6.07911825, 5.3052249, 4.57608271, 3.89788818},
                         .lrs = {0.1, 0.1, 0.1, 0.1, 0.1},
                         .w = {0.955225348, -0.460818082, 1.41003335},
                         .m = {0.464406431, 0.0110885128, 0.199937925, 1.93979001},
                     }});
  }
  {
    OptimizerConfig c = adamw;
    c.clip_norm = 0.5;
    c.schedule = {.kind = ScheduleKind::kCosine,
                  .lr = 0.1,
                  .warmup_steps = 2,
                  .total_steps = 6,
                  .min_lr = 0.01};
    cases.push_back({"adamw lr 0.1 clip 0.5, warmup 2 + cosine to 0.01 at 6 (SequentialLR)",
                     c,
                     {
                         .losses = {8.85812569, 8.11203575, 6.77739, 5.60905123, 4.75190783,
                                    4.27693415, 4.09134769},
                         .grad_norms = {6.86157799, 6.46106243, 5.69127131, 4.93448687, 4.32008123,
                                        3.95107532, 3.80016446},
                         .lrs = {0.05, 0.1, 0.1, 0.0868198052, 0.055, 0.0231801948, 0.01},
                         .w = {0.889812112, -0.540423632, 1.49700427},
                         .m = {0.543002665, -0.0638887733, 0.209329873, 1.94668329},
                     }});
  }
  return cases;
}

std::vector<std::unique_ptr<runtime::Backend>> Backends() {
  std::vector<std::unique_ptr<runtime::Backend>> out;
  out.push_back(runtime::MakeReferenceBackend());
  out.push_back(runtime::MakeCpuBackend());
  return out;
}

TEST(TrainStep, MatchesTorchOptimOnAQuadratic) {
  const ir::Graph loss = QuadraticLoss();
  const Tensor x = QuadraticX();
  for (const auto& backend : Backends()) {
    for (const Case& c : TorchCases()) {
      SCOPED_TRACE(backend->name() + ": " + c.name);
      auto step = TrainStep::Create(*backend, loss, QuadraticParams(), {.optimizer = c.config});
      ASSERT_TRUE(step.ok()) << step.status();
      EXPECT_THAT((*step)->data_inputs(), ElementsAre("x"));
      for (size_t s = 0; s < c.expected.losses.size(); ++s) {
        auto m = (*step)->Run({&x});
        ASSERT_TRUE(m.ok()) << m.status();
        EXPECT_NEAR(m->loss, c.expected.losses[s], 2e-6 * c.expected.losses[s]) << "step " << s;
        EXPECT_NEAR(m->grad_norm, c.expected.grad_norms[s], 2e-6 * c.expected.grad_norms[s])
            << "step " << s;
        EXPECT_NEAR(m->lr, c.expected.lrs[s], 1e-7) << "step " << s;
      }
      EXPECT_EQ((*step)->step(), static_cast<int64_t>(c.expected.losses.size()));
      std::vector<double> w = (*step)->params().Find("w")->ToDoubles();
      std::vector<double> mm = (*step)->params().Find("m")->ToDoubles();
      for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], c.expected.w[i], 2e-6) << "w " << i;
      for (size_t i = 0; i < mm.size(); ++i) EXPECT_NEAR(mm[i], c.expected.m[i], 2e-6) << "m " << i;
    }
  }
}

TEST(TrainStep, GraphSignatureAndStateNames) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdamW;
  auto g = BuildTrainStep(QuadraticLoss(), {"w", "m"}, c);
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<std::string> inputs, outputs;
  for (int id : g->parameters()) inputs.push_back(g->node(id).attr_str("name"));
  for (const ir::Output& o : g->outputs()) outputs.push_back(o.name);
  EXPECT_THAT(inputs,
              ElementsAre("w", "m", "x", "opt/m/w", "opt/m/m", "opt/v/w", "opt/v/m", "opt/step"));
  EXPECT_THAT(outputs, ElementsAre("loss", "grad_norm", "lr", "new/w", "new/m", "new/opt/m/w",
                                   "new/opt/m/m", "new/opt/v/w", "new/opt/v/m"));
  // Plain SGD has no state; momentum has one slot.
  c.kind = OptimizerKind::kSgd;
  EXPECT_TRUE(OptimizerStateSpecs(c, {{"w", DType::kF32, Shape{3}, {}}}).empty());
  c.sgd.momentum = 0.9;
  auto specs = OptimizerStateSpecs(c, {{"w", DType::kBF16, Shape{3}, {}}});
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].name, "opt/momentum/w");
  EXPECT_EQ(specs[0].dtype, DType::kF32);
}

TEST(TrainStep, WeightDecayMinRankSkipsVectors) {
  // A loss that does not depend on the parameters: zero gradients, so only decay moves them.
  ir::Builder b("const");
  ir::Value w = b.Parameter("w", DType::kF32, Shape{2});
  ir::Value m = b.Parameter("m", DType::kF32, Shape{1, 2});
  b.Output("loss", ir::ReduceSum(w * 0.0, {0}) + ir::ReduceSum(m * 0.0, {0, 1}));
  ir::Graph loss = *b.Build();
  ParamStore p;
  ASSERT_TRUE(p.Add("w", Tensor::FromVector<float>(Shape{2}, {1.0f, 2.0f})).ok());
  ASSERT_TRUE(p.Add("m", Tensor::FromVector<float>(Shape{1, 2}, {1.0f, 2.0f})).ok());
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdamW;
  c.adamw.weight_decay = 0.5;
  c.schedule.lr = 0.1;
  c.weight_decay_min_rank = 2;
  auto ref = runtime::MakeReferenceBackend();
  auto step = TrainStep::Create(*ref, loss, std::move(p), {.optimizer = c});
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_TRUE((*step)->Run({}).ok());
  // Zero gradients: AdamW moves nothing but the decayed matrix (p *= 1 - 0.1 * 0.5).
  EXPECT_THAT((*step)->params().Find("w")->ToDoubles(), ElementsAre(1.0, 2.0));
  EXPECT_THAT((*step)->params().Find("m")->ToDoubles(), ElementsAre(0.95f, 1.9f));
}

// Bytes of a tensor, for bit-for-bit comparisons.
std::string Bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.byte_size());
}

TEST(ParamGroups, FrozenParametersKeepTheirBitsAndGetNoState) {
  const ir::Graph loss = QuadraticLoss();
  const Tensor x = QuadraticX();
  for (const auto& backend : Backends()) {
    SCOPED_TRACE(backend->name());
    for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
      OptimizerConfig c;
      c.kind = kind;
      c.sgd.momentum = 0.9;
      c.adamw.weight_decay = 0.1;  // decay must not touch a frozen parameter either
      c.schedule.lr = 0.05;
      c.param_groups = {{.match = "m", .freeze = true}};
      const ParamStore initial = QuadraticParams();
      auto step = TrainStep::Create(*backend, loss, QuadraticParams(), {.optimizer = c});
      ASSERT_TRUE(step.ok()) << step.status();
      for (int s = 0; s < 4; ++s) ASSERT_TRUE((*step)->Run({&x}).ok());
      EXPECT_EQ(Bytes(*(*step)->params().Find("m")), Bytes(*initial.Find("m")));
      EXPECT_NE(Bytes(*(*step)->params().Find("w")), Bytes(*initial.Find("w")));
      // Optimizer state only for the trained parameter; no update output for the frozen one.
      if (kind == OptimizerKind::kSgd) {
        EXPECT_THAT((*step)->optimizer_state().names(), ElementsAre("opt/momentum/w"));
      } else {
        EXPECT_THAT((*step)->optimizer_state().names(), ElementsAre("opt/m/w", "opt/v/w"));
      }
      EXPECT_LT((*step)->train_step_graph().FindOutput("new/m"), 0);
      EXPECT_GE((*step)->train_step_graph().FindOutput("new/w"), 0);
    }
  }
}

TEST(ParamGroups, LrScaleIsExactlyTheScaledRate) {
  const ir::Graph loss = QuadraticLoss();
  const Tensor x = QuadraticX();
  auto backend = runtime::MakeCpuBackend();
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    SCOPED_TRACE(kind == OptimizerKind::kSgd ? "sgd" : "adamw");
    // One step from the same start: the scaled group moves exactly as a run at lr * scale, the
    // unmatched parameter as a run at lr.
    auto one_step = [&](double lr, std::vector<ParamGroup> groups) {
      OptimizerConfig c;
      c.kind = kind;
      c.adamw.weight_decay = 0.1;
      c.schedule.lr = lr;
      c.param_groups = std::move(groups);
      auto step = TrainStep::Create(*backend, loss, QuadraticParams(), {.optimizer = c});
      EXPECT_TRUE(step.ok()) << step.status();
      auto m = (*step)->Run({&x});
      EXPECT_TRUE(m.ok()) << m.status();
      return std::make_pair(Bytes(*(*step)->params().Find("w")),
                            Bytes(*(*step)->params().Find("m")));
    };
    const auto grouped = one_step(0.5, {{.match = "w", .lr_scale = 0.1}});
    const auto full = one_step(0.5, {});
    const auto scaled = one_step(0.05, {});
    EXPECT_EQ(grouped.first, scaled.first);
    EXPECT_EQ(grouped.second, full.second);
    EXPECT_NE(grouped.first, full.first);
  }
}

TEST(ParamGroups, FirstMatchWinsAndBadGroupsAreNamed) {
  const std::vector<ParamGroup> groups = {{.match = "blocks/0/*", .lr_scale = 0.5},
                                          {.match = "blocks/*", .freeze = true}};
  EXPECT_EQ(MatchParamGroup(groups, "blocks/0/attn/qkv/weight"), 0);  // '*' crosses '/'
  EXPECT_EQ(MatchParamGroup(groups, "blocks/1/mlp/fc1/bias"), 1);
  EXPECT_EQ(MatchParamGroup(groups, "head/weight"), -1);
  OptimizerConfig c;
  c.param_groups = {{.match = "w*"}, {.match = "w"}};
  absl::Status s = CheckParamGroups(c, {"w", "m"});
  EXPECT_THAT(s.message(), HasSubstr("param_groups[1] (match 'w') matches no parameter that an "
                                     "earlier group does not already take"));
  EXPECT_THAT(s.message(), HasSubstr("the model's parameters: w, m"));
  c.param_groups = {{.match = "*", .freeze = true}};
  EXPECT_THAT(CheckParamGroups(c, {"w", "m"}).message(), HasSubstr("freeze every parameter"));
  c.param_groups = {{.match = "w", .lr_scale = -1}};
  EXPECT_THAT(CheckParamGroups(c, {"w", "m"}).message(), HasSubstr("lr_scale must be"));
  auto ref = runtime::MakeReferenceBackend();
  c.param_groups = {{.match = "zz*", .freeze = true}};
  auto step = TrainStep::Create(*ref, QuadraticLoss(), QuadraticParams(), {.optimizer = c});
  EXPECT_THAT(step.status().message(), HasSubstr("param_groups[0] (match 'zz*') matches no"));
}

TEST(Schedule, HostFormulaMatchesTorchSchedulers) {
  // LinearLR(start_factor=1/4, total_iters=3), lr 2.0 == 4 warmup steps, then constant.
  const std::vector<double> warmup = {0.5, 1, 1.5, 2, 2, 2, 2, 2};
  ScheduleOptions s{.kind = ScheduleKind::kConstant, .lr = 2.0, .warmup_steps = 4};
  for (size_t t = 0; t < warmup.size(); ++t) EXPECT_NEAR(LearningRate(s, t), warmup[t], 1e-12);
  // CosineAnnealingLR(T_max=10, eta_min=0.1), lr 1.0.
  const std::vector<double> cosine = {1,           0.977975432, 0.914057647, 0.814503364,
                                      0.689057647, 0.55,        0.410942353, 0.285496636,
                                      0.185942353, 0.122024568, 0.1};
  s = {.kind = ScheduleKind::kCosine, .lr = 1.0, .total_steps = 10, .min_lr = 0.1};
  for (size_t t = 0; t < cosine.size(); ++t) EXPECT_NEAR(LearningRate(s, t), cosine[t], 1e-9);
  EXPECT_DOUBLE_EQ(LearningRate(s, 25), 0.1);  // holds the floor (torch's would rise again)
  // LinearLR(start_factor=1, end_factor=0.2, total_iters=5), lr 0.5.
  const std::vector<double> linear = {0.5, 0.42, 0.34, 0.26, 0.18, 0.1, 0.1};
  s = {.kind = ScheduleKind::kLinear, .lr = 0.5, .total_steps = 5, .min_lr = 0.1};
  for (size_t t = 0; t < linear.size(); ++t) EXPECT_NEAR(LearningRate(s, t), linear[t], 1e-12);
}

TEST(Schedule, GraphMatchesHost) {
  const std::vector<ScheduleOptions> schedules = {
      {.kind = ScheduleKind::kConstant, .lr = 0.3},
      {.kind = ScheduleKind::kConstant, .lr = 2.0, .warmup_steps = 4},
      {.kind = ScheduleKind::kLinear,
       .lr = 0.5,
       .warmup_steps = 3,
       .total_steps = 9,
       .min_lr = 0.1},
      {.kind = ScheduleKind::kCosine,
       .lr = 1e-3,
       .warmup_steps = 5,
       .total_steps = 20,
       .min_lr = 1e-5},
  };
  for (const auto& backend : Backends()) {
    for (const ScheduleOptions& s : schedules) {
      ir::Builder b("lr");
      ir::Value step = b.Parameter("step", DType::kS64, Shape{});
      b.Output("lr", ScheduledLearningRate(s, step));
      auto g = b.Build();
      ASSERT_TRUE(g.ok()) << g.status();
      auto exe = backend->Compile(*g);
      ASSERT_TRUE(exe.ok()) << exe.status();
      for (int64_t t : {0, 1, 2, 3, 4, 5, 7, 12, 19, 20, 21, 1000}) {
        auto out = (*exe)->Run({Tensor::FromVector<int64_t>(Shape{}, {t})});
        ASSERT_TRUE(out.ok()) << out.status();
        EXPECT_NEAR((*out)[0].GetDouble(0), LearningRate(s, t), 1e-15)
            << backend->name() << " step " << t;
      }
    }
  }
}

TEST(OptimizerConfig, RejectsBadValuesNamingTheField) {
  auto err = [](OptimizerConfig c) { return std::string(ValidateOptimizerConfig(c).message()); };
  OptimizerConfig c;
  EXPECT_TRUE(ValidateOptimizerConfig(c).ok());
  c.schedule.lr = -1;
  EXPECT_THAT(err(c), HasSubstr("schedule.lr"));
  c = {};
  c.sgd.nesterov = true;
  EXPECT_THAT(err(c), HasSubstr("sgd.nesterov"));
  c = {};
  c.kind = OptimizerKind::kAdamW;
  c.adamw.beta2 = 1.0;
  EXPECT_THAT(err(c), HasSubstr("adamw.beta2"));
  c = {};
  c.schedule = {.kind = ScheduleKind::kCosine, .lr = 1, .warmup_steps = 10, .total_steps = 10};
  EXPECT_THAT(err(c), HasSubstr("schedule.total_steps"));
  c = {};
  c.clip_norm = -1;
  EXPECT_THAT(err(c), HasSubstr("clip_norm"));
  // The config error surfaces from BuildTrainStep too.
  EXPECT_EQ(BuildTrainStep(QuadraticLoss(), {"w"}, c).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TrainStep, RejectsNameClashesAndUnknownParams) {
  ir::Builder b("clash");
  ir::Value s = b.Parameter("opt/step", DType::kF32, Shape{});
  b.Output("loss", s * s);
  ir::Graph g = *b.Build();
  EXPECT_THAT(std::string(BuildTrainStep(g, {"opt/step"}, {}).status().message()),
              HasSubstr("'opt/step'"));
  auto ref = runtime::MakeReferenceBackend();
  ParamStore unknown;
  ASSERT_TRUE(unknown.Add("nope", Tensor(DType::kF32, Shape{1})).ok());
  auto t = TrainStep::Create(*ref, QuadraticLoss(), std::move(unknown), {});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("'nope'"));
}

TEST(TrainStep, ResumeFromRestoredStateIsBitIdentical) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdamW;
  c.clip_norm = 1.0;
  c.schedule = {.kind = ScheduleKind::kCosine, .lr = 0.1, .warmup_steps = 2, .total_steps = 8};
  const ir::Graph loss = QuadraticLoss();
  const Tensor x = QuadraticX();
  auto cpu = runtime::MakeCpuBackend();

  auto full = TrainStep::Create(*cpu, loss, QuadraticParams(), {.optimizer = c});
  ASSERT_TRUE(full.ok()) << full.status();
  std::vector<float> losses;
  for (int s = 0; s < 6; ++s) losses.push_back((*full)->Run({&x})->loss);

  auto first = TrainStep::Create(*cpu, loss, QuadraticParams(), {.optimizer = c});
  ASSERT_TRUE(first.ok());
  for (int s = 0; s < 3; ++s) ASSERT_TRUE((*first)->Run({&x}).ok());
  const ParamStore saved_params = (*first)->params().Clone();
  const ParamStore saved_state = (*first)->optimizer_state().Clone();
  EXPECT_EQ(saved_state.size(), 4);

  auto resumed = TrainStep::Create(*cpu, loss, QuadraticParams(), {.optimizer = c});
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE((*resumed)->Restore(saved_params, saved_state, (*first)->step()).ok());
  for (int s = 3; s < 6; ++s) EXPECT_EQ((*resumed)->Run({&x})->loss, losses[s]) << "step " << s;
  for (int i = 0; i < (*full)->params().size(); ++i) {
    EXPECT_TRUE((*resumed)->params().value(i).BitwiseEquals((*full)->params().value(i)));
  }
  for (int i = 0; i < (*full)->optimizer_state().size(); ++i) {
    EXPECT_TRUE(
        (*resumed)->optimizer_state().value(i).BitwiseEquals((*full)->optimizer_state().value(i)));
  }

  // A restore with a missing or mistyped tensor fails and changes nothing.
  ParamStore wrong;
  ASSERT_TRUE(wrong.Add("w", Tensor(DType::kF32, Shape{4})).ok());
  ASSERT_TRUE(wrong.Add("m", Tensor(DType::kF32, Shape{2, 2})).ok());
  const ParamStore before = (*resumed)->params().Clone();
  absl::Status st = (*resumed)->Restore(wrong, saved_state, 0);
  EXPECT_THAT(std::string(st.message()), HasSubstr("'w'"));
  EXPECT_EQ((*resumed)->step(), 6);
  EXPECT_TRUE((*resumed)->params().value(0).BitwiseEquals(before.value(0)));
  EXPECT_EQ((*resumed)->Run({}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::nn
