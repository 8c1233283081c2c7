#include "kiln/compiler/passes/remat.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/autodiff/grad.h"
#include "kiln/autodiff/graph_copy.h"
#include "kiln/base/status.h"
#include "kiln/compiler/buffer_plan.h"
#include "kiln/compiler/compile.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"
#include "kiln/compiler/passes/schedule.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/verifier.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::compiler {
namespace {

using ir::Value;
using testing::ExpectRewrite;
using testing::ExpectUnchanged;

// %a = relu(%h) is read by %e1 and then only at the end; %h stays live to the end anyway, so
// recomputing %a there costs no memory and frees its buffer during the chain (the peak).
constexpr char kLateReuse[] = R"(
  graph @g {
    %x = parameter() {index=0, name="x"} : f32[32,32]
    %h = dot_general(%x, %x) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
    %a = relu(%h)
    %e1 = neg(%a)
    %e2 = sqrt(%e1)
    %e3 = add(%e2, %e1)
    %e4 = add(%e3, %e2)
    %e5 = add(%e4, %e3)
    %e6 = add(%e5, %e4)
    %e7 = add(%e6, %e5)
    %e8 = add(%e7, %e6)
    %e9 = add(%e8, %e7)
    %g = mul(%a, %e9)
    %k = add(%g, %h)
    return k=%k
  })";

TEST(Remat, RecomputesACheapValueNextToItsLateReader) {
  RematPass pass;
  ExpectRewrite(pass, kLateReuse, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[32,32]
      %h = dot_general(%x, %x) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %a = relu(%h)
      %e1 = neg(%a)
      %e2 = sqrt(%e1)
      %e3 = add(%e2, %e1)
      %e4 = add(%e3, %e2)
      %e5 = add(%e4, %e3)
      %e6 = add(%e5, %e4)
      %e7 = add(%e6, %e5)
      %e8 = add(%e7, %e6)
      %e9 = add(%e8, %e7)
      %a2 = relu(%h)
      %g = mul(%a2, %e9)
      %k = add(%g, %h)
      return k=%k
    })");
}

TEST(Remat, ReportsThePeakItSaved) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(kLateReuse);
  ASSERT_TRUE(g.ok());
  RematPass pass;
  ASSERT_TRUE(pass.Run(*g).ok());
  const RematReport& r = pass.last_report();
  EXPECT_EQ(r.recomputed, 1);
  EXPECT_EQ(r.added_nodes, 1);
  EXPECT_EQ(r.peak_before, 5 * 4096);  // h, a and three chain values
  EXPECT_EQ(r.peak_after, 4 * 4096);
  EXPECT_EQ(PeakLiveBytes(*g), r.peak_after);
  EXPECT_TRUE(r.fits);
  EXPECT_NE(r.ToString().find("1 values recomputed"), std::string::npos) << r.ToString();
}

TEST(Remat, KeepsContractionOutputsAndShortGaps) {
  RematPass pass;
  // The late reader of %d is a dot_general's output: never recomputed.
  ExpectUnchanged(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[32,32]
      %d = dot_general(%x, %x) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %e1 = neg(%d)
      %e2 = sqrt(%e1)
      %e3 = add(%e2, %e1)
      %e4 = add(%e3, %e2)
      %e5 = add(%e4, %e3)
      %e6 = add(%e5, %e4)
      %e7 = add(%e6, %e5)
      %e8 = add(%e7, %e6)
      %e9 = add(%e8, %e7)
      %g = mul(%d, %e9)
      return g=%g
    })");
  // A late reader only a few steps on: not worth a copy.
  ExpectUnchanged(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[1024]
      %h = exp(%x)
      %a = relu(%h)
      %e1 = neg(%a)
      %e2 = sqrt(%e1)
      %g = mul(%a, %e2)
      %k = add(%g, %h)
      return k=%k
    })");
}

// ---------------------------------------------------------------------------------------------
// A 6-layer GELU MLP train step (SGD), where activations made in the forward wait for the
// backward. GELU's gradient reads its input, which therefore stays live into the backward anyway:
// its output (read again by the weight gradient) is cheaper recomputed than kept. (With ReLU the
// backward reads the output itself, and nothing is left to gain.)

const std::vector<std::string> kParams = {"w0", "b0", "w1", "b1", "w2", "b2",
                                          "w3", "b3", "w4", "b4", "w5", "b5"};

absl::StatusOr<ir::Graph> TrainStep() {
  ir::Builder b("mlp");
  constexpr int64_t kBatch = 256, kWidth = 32;
  Value h = b.Parameter("x", DType::kF32, {kBatch, kWidth});
  Value labels = b.Parameter("labels", DType::kS32, {kBatch});
  for (int i = 0; i < 6; ++i) {
    int64_t out = i == 5 ? 8 : kWidth;
    Value w = b.Parameter("w" + std::to_string(i), DType::kF32, {kWidth, out});
    Value bias = b.Parameter("b" + std::to_string(i), DType::kF32, {out});
    h = ir::MatMul(h, w) + bias;
    if (i < 5) h = ir::Gelu(h);
  }
  b.Output("loss", ir::Mean(ir::SparseCrossEntropy(h, labels), {0}));
  KILN_ASSIGN_OR_RETURN(ir::Graph loss, b.Build());
  KILN_ASSIGN_OR_RETURN(ir::Graph g, autodiff::Grad(loss, kParams));
  ir::Builder s("train_step");
  KILN_ASSIGN_OR_RETURN(autodiff::ValueMap map, autodiff::CopyGraph(g, s));
  s.Output("loss", map[g.outputs()[g.FindOutput("loss")].node]);
  for (const std::string& p : kParams) {
    Value param = map[g.FindParameter(p)];
    Value grad = map[g.outputs()[g.FindOutput("grad/" + p)].node];
    s.Output("new/" + p, param - grad * 0.1);
  }
  return s.Build();
}

std::vector<Tensor> Inputs(const ir::Graph& g) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<Tensor> in;
  for (int id : g.parameters()) {
    const ir::Type& t = g.node(id).type();
    std::vector<double> v(t.shape.num_elements());
    for (double& x : v) x = t.dtype == DType::kS32 ? static_cast<double>(rng() % 8) : u(rng);
    in.push_back(Tensor::FromDoubles(t.dtype, t.shape, v));
  }
  return in;
}

std::vector<Tensor> RunRef(const ir::Graph& g) {
  auto exe = runtime::MakeReferenceBackend()->Compile(g);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  auto out = (*exe)->Run(Inputs(g));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<Tensor>();
}

void ExpectBitIdentical(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].dtype(), b[i].dtype());
    ASSERT_EQ(a[i].shape(), b[i].shape());
    EXPECT_EQ(0, std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].byte_size()))
        << "output " << i << " differs";
  }
}

CompileOptions Options(int64_t limit = -1) {
  CompileOptions o;
  o.pipeline.verify_each_pass = true;
  o.keep_composite = [](ir::Opcode) { return true; };
  if (limit >= 0) {
    o.remat.enabled = true;
    o.remat.memory_limit_bytes = limit;
    o.remat.measure = [](const ir::Graph& g) { return PlanBuffers(g).arena_bytes; };
  }
  return o;
}

TEST(Remat, TrainStepPolicyShrinksTheArenaAndKeepsOutputsBitIdentical) {
  absl::StatusOr<ir::Graph> step = TrainStep();
  ASSERT_TRUE(step.ok()) << step.status();
  absl::StatusOr<ir::Graph> plain = Optimize(*step, Options());
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<ir::Graph> remat = Optimize(*step, Options(/*limit=*/0));
  ASSERT_TRUE(remat.ok()) << remat.status();
  int64_t plain_arena = PlanBuffers(*plain).arena_bytes;
  int64_t remat_arena = PlanBuffers(*remat).arena_bytes;
  std::printf("train step: %d -> %d nodes, arena %lld -> %lld bytes with remat (policy)\n",
              plain->num_nodes(), remat->num_nodes(), static_cast<long long>(plain_arena),
              static_cast<long long>(remat_arena));
  EXPECT_GT(remat->num_nodes(), plain->num_nodes());
  EXPECT_LT(remat_arena, plain_arena);
  ExpectBitIdentical(RunRef(*plain), RunRef(*remat));
}

TEST(Remat, MemoryLimitModeFitsABudgetThePlainPlanExceeds) {
  absl::StatusOr<ir::Graph> step = TrainStep();
  ASSERT_TRUE(step.ok()) << step.status();
  absl::StatusOr<ir::Graph> plain = Optimize(*step, Options());
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<ir::Graph> policy = Optimize(*step, Options(/*limit=*/0));
  ASSERT_TRUE(policy.ok()) << policy.status();
  int64_t plain_arena = PlanBuffers(*plain).arena_bytes;
  int64_t policy_arena = PlanBuffers(*policy).arena_bytes;
  ASSERT_LT(policy_arena, plain_arena);
  int64_t budget = (plain_arena + policy_arena) / 2;

  ir::Graph g = *plain;
  RematOptions o = Options(budget).remat;
  RematPass pass(o);
  absl::StatusOr<bool> changed = pass.Run(g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  const RematReport& r = pass.last_report();
  std::printf("%s\n", r.ToString().c_str());
  EXPECT_EQ(r.measured_before, plain_arena);
  EXPECT_TRUE(r.fits);
  EXPECT_LE(r.measured_after, budget);
  EXPECT_EQ(PlanBuffers(g).arena_bytes, r.measured_after);
  EXPECT_TRUE(ir::Verify(g).ok());
  ExpectBitIdentical(RunRef(*plain), RunRef(g));

  // An impossible budget: it recomputes what helps, then says it does not fit.
  RematPass hopeless(Options(/*limit=*/1).remat);
  ir::Graph h = *plain;
  ASSERT_TRUE(hopeless.Run(h).ok());
  EXPECT_FALSE(hopeless.last_report().fits);
  // It goes on past what the policy alone does, as far as anything lowers the peak.
  EXPECT_LE(hopeless.last_report().measured_after, policy_arena);
  std::printf("%s\n", hopeless.last_report().ToString().c_str());
  EXPECT_NE(hopeless.last_report().ToString().find("does not fit"), std::string::npos);
  ExpectBitIdentical(RunRef(*plain), RunRef(h));
}

TEST(Remat, InTheDefaultPipelineOnlyWhenAskedFor) {
  auto names = [](const CompileOptions& o) { return DefaultPipeline(o)->PassNames(); };
  std::vector<std::string> off = names(CompileOptions());
  EXPECT_EQ(std::find(off.begin(), off.end(), "remat"), off.end());
  CompileOptions on;
  on.remat.enabled = true;
  std::vector<std::string> with = names(on);
  auto it = std::find(with.begin(), with.end(), "remat");
  ASSERT_NE(it, with.end());
  EXPECT_EQ(*(it + 1), "schedule");  // remat, then the scheduler last
}

}  // namespace
}  // namespace kiln::compiler
