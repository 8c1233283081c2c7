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

// The whole-graph rebuild controls the passes use (fusion, schedule, remat, dce).
constexpr char kChain[] = R"(
  graph @g {
    %x = parameter() {index=0, name="x"} : f32[4]
    %a = neg(%x)
    %b = exp(%x)
    %dead = abs(%x)
    %c = add(%a, %b)
    return c=%c
  })";

TEST(GraphEditor, ExplicitOrderAndDeadCodeModes) {
  ir::Graph g = Parse(kChain);
  {
    GraphEditor e(g);
    e.set_order({0, 2, 1, 3, 4});
    absl::StatusOr<ir::Graph> out = std::move(e).Build();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->node(1).opcode(), ir::Opcode::kExp);
    EXPECT_EQ(out->node(2).opcode(), ir::Opcode::kNeg);
    EXPECT_EQ(out->node(4).operands(), (std::vector<int>{2, 1}));
  }
  {
    GraphEditor e(g);
    e.set_order({0, 1, 4, 2});  // %c before its operand %b
    absl::StatusOr<ir::Graph> out = std::move(e).Build();
    ASSERT_FALSE(out.ok());
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("placed before its operand %2"));
  }
  {
    GraphEditor e(g);
    e.set_order({0, 1, 1, 2, 4});
    EXPECT_FALSE(std::move(e).Build().ok());  // repeated
  }
  {
    GraphEditor e(g);
    e.set_dead_code(GraphEditor::DeadCode::kDrop);
    absl::StatusOr<ir::Graph> out = std::move(e).Build();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->num_nodes(), 4);  // %dead is gone
  }
  {
    // kKeep keeps what a rewrite orphaned, which the default drops.
    for (auto mode : {GraphEditor::DeadCode::kDropOrphaned, GraphEditor::DeadCode::kKeep}) {
      GraphEditor e(g);
      e.set_dead_code(mode);
      ASSERT_TRUE(e.Replace(4, 1).ok());  // c := a: b and c are orphaned
      absl::StatusOr<ir::Graph> out = std::move(e).Build();
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->num_nodes(), mode == GraphEditor::DeadCode::kKeep ? 4 : 3);
    }
  }
}

TEST(GraphEditor, OperandAndAttributeEditsAndCopies) {
  ir::Graph g = Parse(kChain);
  GraphEditor e(g);
  e.set_dead_code(GraphEditor::DeadCode::kKeep);
  e.set_position(4);
  int copy = e.AddCopy(g.node(1), {0}, {{"note", int64_t{1}}});  // a second neg(%x)
  ASSERT_TRUE(e.SetOperand(4, 0, copy).ok());
  EXPECT_TRUE(e.changed());
  EXPECT_EQ(e.operand(4, 0), copy);
  EXPECT_FALSE(e.SetOperand(4, 2, copy).ok());  // no operand 2
  EXPECT_FALSE(e.SetOperand(4, 0, 6).ok());     // no node %6
  e.SetAttrs(3, {{"tag", std::string("x")}});
  EXPECT_EQ(e.attrs_of(3).count("tag"), 1u);
  absl::StatusOr<ir::Graph> out = std::move(e).Build();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(ir::Verify(*out).ok()) << ir::Verify(*out);
  EXPECT_EQ(testing::Canonical(ir::PrintGraph(*out)), testing::Canonical(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[4]
      %a = neg(%x)
      %b = exp(%x)
      %dead = abs(%x) {tag="x"}
      %a2 = neg(%x) {note=1}
      %c = add(%a2, %b)
      return c=%c
    })"));
}

// A rewrite that breaks a fusion group (a node outside it placed between its members, or every
// member gone) dissolves it; intact groups stay in the table.
TEST(GraphEditor, BrokenFusionGroupsAreDissolved) {
  ir::Graph g = Parse(R"(
    graph @g {
      fusion 0 kind=loop
      fusion 1 kind=loop
      fusion 2 kind=loop
      %x = parameter() {index=0, name="x"} : f32[4]
      %a = neg(%x) {fusion=0}
      %b = abs(%a) {fusion=0}
      %e = exp(%b)
      %c = add(%e, %x) {fusion=1}
      %d = mul(%c, %c) {fusion=1}
      %f = sub(%d, %x) {fusion=2}
      return f=%f
    })");
  GraphEditor e(g);
  e.set_position(2);
  absl::StatusOr<int> s = e.Add(ir::Opcode::kSqrt, {1});  // between %a and %b, outside group 0
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(e.SetOperand(2, 0, *s).ok());  // %b now reads the sqrt
  ASSERT_TRUE(e.Replace(6, 5).ok());         // %f := %d: group 2 loses its only member
  absl::StatusOr<ir::Graph> out = std::move(e).Build();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(ir::Verify(*out).ok()) << ir::Verify(*out) << "\n" << ir::PrintGraph(*out);
  EXPECT_EQ(out->fusion_groups(), (std::vector<ir::FusionGroup>{{1, ir::FusionKind::kLoop}}));
}

}  // namespace
}  // namespace kiln::compiler
