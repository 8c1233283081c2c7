// The execution plan works out an epilogue group's steps once (MatchEpilogue), for backends to
// read.
#include "kiln/compiler/execution_plan.h"

#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/ir/parser.h"

namespace kiln::compiler {
namespace {

ir::Graph MustParse(const std::string& text) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : ir::Graph();
}

constexpr char kMatmulBiasReluResidual[] = R"(graph @g {
  fusion 0 kind=matmul_epilogue
  %0 = parameter() {index=0, name="x"} : f32[8,16]
  %1 = parameter() {index=1, name="w"} : f32[16,4]
  %2 = parameter() {index=2, name="b"} : f32[4]
  %3 = parameter() {index=3, name="r"} : f32[8,4]
  %4 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[8,4]} : f32[8,4]
  %5 = dot_general(%0, %1) {fusion=0, lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[8,4]
  %6 = add(%4, %5) {fusion=0} : f32[8,4]
  %7 = relu(%6) {fusion=0} : f32[8,4]
  %8 = add(%7, %3) {fusion=0} : f32[8,4]
  return y=%8
}
)";

TEST(ExecutionPlan, EpilogueStepsAreOnTheKernel) {
  ir::Graph g = MustParse(kMatmulBiasReluResidual);
  ExecutionPlan plan = PlanExecution(g, PlainTraits());
  ASSERT_EQ(plan.groups.size(), 1u);
  const ExecutionPlan::Kernel& k = plan.groups[0];
  EXPECT_EQ(k.kind, ExecutionPlan::KernelKind::kMatmulEpilogue);
  EXPECT_EQ(k.epilogue.bias_broadcast, 4);
  EXPECT_EQ(k.epilogue.bias, 2);
  EXPECT_EQ(k.epilogue.activation, 7);
  EXPECT_EQ(k.epilogue.residual, 3);
  EXPECT_EQ(k.epilogue.out, 8);
  // The bias is read through its broadcast's view: its operand, not the broadcast.
  EXPECT_EQ(plan.reads[6], (std::vector<int>{2}));
}

TEST(ExecutionPlan, MatchEpilogueRefusesAnythingButTheChain) {
  ir::Graph g = MustParse(kMatmulBiasReluResidual);
  EXPECT_TRUE(MatchEpilogue(g, {5, 6, 7, 8}).has_value());
  EXPECT_TRUE(MatchEpilogue(g, {5}).has_value());  // a bare head: no steps
  // The activation must come before the residual add, and each step must read the one before.
  EXPECT_FALSE(MatchEpilogue(g, {5, 8}).has_value());
  EXPECT_FALSE(MatchEpilogue(g, {5, 7}).has_value());
  std::optional<EpilogueSteps> bias_only = MatchEpilogue(g, {5, 6});
  ASSERT_TRUE(bias_only.has_value());
  EXPECT_EQ(bias_only->bias, 2);
  EXPECT_EQ(bias_only->activation, -1);
  EXPECT_EQ(bias_only->residual, -1);
}

// An update in place of its parameter is written over it when every other reader runs first and
// the kernel reads it element for element.
TEST(ExecutionPlan, InPlaceOutputs) {
  const BackendTraits traits{.alias_reshapes = true, .outputs_outside_arena = true};
  // The transpose reads w before the loop kernel that overwrites it: in place.
  ir::Graph before = MustParse(R"(graph @g {
  fusion 0 kind=loop
  %0 = parameter() {index=0, name="w"} : f32[4,4]
  %1 = parameter() {index=1, name="g"} : f32[4,4]
  %2 = transpose(%0) {permutation=[1,0]} : f32[4,4]
  %3 = mul(%1, %1) {fusion=0} : f32[4,4]
  %4 = sub(%0, %3) {fusion=0} : f32[4,4]
  return w_new=%4 in_place_of %0, t=%2
}
)");
  EXPECT_EQ(PlanExecution(before, traits).in_place_outputs, (std::vector<char>{1, 0}));
  // The same reader after the update: not in place (the executable copies instead).
  ir::Graph after = MustParse(R"(graph @g {
  fusion 0 kind=loop
  %0 = parameter() {index=0, name="w"} : f32[4,4]
  %1 = parameter() {index=1, name="g"} : f32[4,4]
  %2 = mul(%1, %1) {fusion=0} : f32[4,4]
  %3 = sub(%0, %2) {fusion=0} : f32[4,4]
  %4 = transpose(%0) {permutation=[1,0]} : f32[4,4]
  return w_new=%3 in_place_of %0, t=%4
}
)");
  EXPECT_EQ(PlanExecution(after, traits).in_place_outputs, (std::vector<char>{0, 0}));
  // A kernel that reads other elements of w than the one it writes: never in place.
  ir::Graph transposed = MustParse(R"(graph @g {
  %0 = parameter() {index=0, name="w"} : f32[4,4]
  %1 = transpose(%0) {permutation=[1,0]} : f32[4,4]
  return w_new=%1 in_place_of %0
}
)");
  EXPECT_EQ(PlanExecution(transposed, traits).in_place_outputs, (std::vector<char>{0}));
  // A loop reading w through a broadcasting view: not in place either.
  ir::Graph viewed = MustParse(R"(graph @g {
  fusion 0 kind=reduction
  %0 = parameter() {index=0, name="w"} : f32[4]
  %1 = parameter() {index=1, name="g"} : f32[4,4]
  %2 = broadcast_in_dim(%0) {broadcast_dimensions=[1], shape=[4,4]} : f32[4,4]
  %3 = add(%2, %1) {fusion=0} : f32[4,4]
  %4 = reduce_sum(%3) {dimensions=[0], fusion=0} : f32[4]
  return w_new=%4 in_place_of %0
}
)");
  EXPECT_EQ(PlanExecution(viewed, traits).in_place_outputs, (std::vector<char>{0}));
  // A graph output that is the parameter itself would see the new value: not in place.
  ir::Graph echoed = MustParse(R"(graph @g {
  %0 = parameter() {index=0, name="w"} : f32[4]
  %1 = neg(%0) : f32[4]
  return w_new=%1 in_place_of %0, w_old=%0
}
)");
  EXPECT_EQ(PlanExecution(echoed, traits).in_place_outputs, (std::vector<char>{0, 0}));
  // Outputs in the arena (no outputs_outside_arena) are copied anyway: not in place.
  EXPECT_EQ(PlanExecution(before, PlainTraits()).in_place_outputs, (std::vector<char>{0, 0}));
}

// Constant-valued one-node kernels are hoisted (run once) when the backend asks, up to
// kMaxHoistedBytes; a bigger one, a random draw and anything reading a parameter run per step.
TEST(ExecutionPlan, HoistsSmallConstantValuedKernels) {
  ir::Graph g = MustParse(R"(graph @g {
  %0 = parameter() {index=0, name="x"} : s64[128,128]
  %1 = iota() {dimension=0} : s64[128,128]
  %2 = iota() {dimension=1} : s64[128,128]
  %3 = compare(%1, %2) {direction="le"} : bool[128,128]
  %4 = iota() {dimension=0} : f32[5000000]
  %5 = add(%0, %1) : s64[128,128]
  %6 = reduce_sum(%4) {dimensions=[0]} : f32[]
  return m=%3, y=%5, s=%6
}
)");
  BackendTraits traits{.outputs_outside_arena = true, .hoist_constants = true};
  ExecutionPlan plan = PlanExecution(g, traits);
  EXPECT_TRUE(plan.hoisted[1]);
  EXPECT_TRUE(plan.hoisted[2]);
  EXPECT_FALSE(plan.hoisted[3]);  // a graph output: written into the caller's tensor each run
  EXPECT_FALSE(plan.hoisted[4]);  // 20 MB: over kMaxHoistedBytes
  EXPECT_FALSE(plan.hoisted[5]);  // reads a parameter
  EXPECT_FALSE(plan.in_arena[1]);
  EXPECT_TRUE(plan.in_arena[4]);
  EXPECT_EQ(PlanExecution(g, PlainTraits()).hoisted[1], 0);
}

}  // namespace
}  // namespace kiln::compiler
