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

}  // namespace
}  // namespace kiln::compiler
