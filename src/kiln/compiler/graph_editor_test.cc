#include "kiln/compiler/graph_editor.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

using ::testing::HasSubstr;

ir::Graph Parse(const char* text) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : ir::Graph();
}

TEST(GraphEditor, AddedNodesGoBeforeTheirPositionAndIdsAreCompact) {
  ir::Graph g = Parse(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %a = exp(%x)
      %b = log(%a)
      %c = add(%b, %x)
      return c=%c
    })");
  GraphEditor e(g);
  e.set_position(2);  // before %b
  absl::StatusOr<int> n = e.Add(ir::Opcode::kNeg, {1});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(e.type(*n), g.node(1).type());
  ASSERT_TRUE(e.Replace(2, *n).ok());
  EXPECT_TRUE(e.changed());
  EXPECT_EQ(e.Resolve(2), *n);
  absl::StatusOr<ir::Graph> built = std::move(e).Build();
  ASSERT_TRUE(built.ok()) << built.status();
  ir::Graph& out = *built;
  ASSERT_TRUE(ir::Verify(out).ok());
  EXPECT_EQ(ir::PrintGraph(out), testing::Canonical(R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = exp(%0)
      %2 = neg(%1)
      %3 = add(%2, %0)
      return c=%3
    })"));
}

TEST(GraphEditor, NodesAddedAtTheEndStillComeOutTopological) {
  ir::Graph g = Parse(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %a = exp(%x)
      %b = log(%a)
      return b=%b
    })");
  GraphEditor e(g);  // position -1: appended after every source node
  absl::StatusOr<int> n = e.Add(ir::Opcode::kNeg, {0});
  ASSERT_TRUE(n.ok());
  ASSERT_TRUE(e.Replace(0 + 1, *n).ok());  // %a := neg(%x); %b, a source node, must follow it
  absl::StatusOr<ir::Graph> built = std::move(e).Build();
  ASSERT_TRUE(built.ok()) << built.status();
  ir::Graph& out = *built;
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::PrintGraph(out);
  EXPECT_EQ(ir::PrintGraph(out), testing::Canonical(R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = neg(%0)
      %2 = log(%1)
      return b=%2
    })"));
}

TEST(GraphEditor, AddSplat) {
  ir::Graph g = Parse(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : s32[2,3]
      %a = abs(%x)
      return a=%a
    })");
  GraphEditor e(g);
  absl::StatusOr<int> z = e.AddSplat(0, g.node(1).type());
  ASSERT_TRUE(z.ok()) << z.status();
  absl::StatusOr<int> s = e.AddSplat(7, ir::Type{DType::kS32, Shape{}});
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<int> m = e.Add(ir::Opcode::kMul, {*z, 0});
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(e.Replace(1, *m).ok());
  absl::StatusOr<ir::Graph> built = std::move(e).Build();
  ASSERT_TRUE(built.ok()) << built.status();
  ir::Graph& out = *built;
  EXPECT_EQ(ir::PrintGraph(out), testing::Canonical(R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : s32[2,3]
      %1 = constant() {value=0} : s32[]
      %2 = broadcast_in_dim(%1) {broadcast_dimensions=[], shape=[2,3]}
      %3 = mul(%2, %0)
      return a=%3
    })"));
}

TEST(GraphEditor, CycleIsAnError) {
  ir::Graph g = Parse(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %a = exp(%x)
      return a=%a
    })");
  GraphEditor e(g);
  absl::StatusOr<int> n = e.Add(ir::Opcode::kNeg, {1});  // uses %a ...
  ASSERT_TRUE(n.ok());
  ASSERT_TRUE(e.Replace(1, *n).ok());  // ... and replaces it
  absl::StatusOr<ir::Graph> out = std::move(e).Build();
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("cycle"));
}

TEST(GraphEditor, ReplaceErrors) {
  ir::Graph g = Parse(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %y = parameter() {index=1, name="y"} : f32[3]
      %a = exp(%x)
      %b = exp(%y)
      return a=%a, b=%b
    })");
  GraphEditor e(g);
  absl::Status s = e.Replace(2, 3);
  EXPECT_THAT(std::string(s.message()), HasSubstr("has type f32[2] but its replacement %3"));
  s = e.Replace(0, 2);
  EXPECT_THAT(std::string(s.message()), HasSubstr("parameter %0 cannot be replaced"));
  s = e.Replace(2, 2);
  EXPECT_THAT(std::string(s.message()), HasSubstr("would stand for itself"));
  absl::StatusOr<int> bad = e.Add(ir::Opcode::kAdd, {2, 3});
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(e.changed());
}

}  // namespace
}  // namespace kiln::compiler
