// Fusion groups in the IR: the typed group table on Graph, its IR text (`fusion <id> kind=<kind>`
// lines), and what the verifier checks about groups (docs/ir.md "Fusion groups").
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"

namespace kiln::ir {
namespace {

using ::testing::HasSubstr;

// One group of each kind, in canonical form (PrintGraph's output).
constexpr char kAllKinds[] = R"(graph @g {
  fusion 0 kind=matmul_epilogue
  fusion 1 kind=loop
  fusion 2 kind=reduction
  fusion 5 kind=conv_epilogue
  %0 = parameter() {index=0, name="x"} : f32[8,16]
  %1 = parameter() {index=1, name="w"} : f32[16,4]
  %2 = parameter() {index=2, name="b"} : f32[4]
  %3 = parameter() {index=3, name="img"} : f32[1,2,5,5]
  %4 = parameter() {index=4, name="f"} : f32[3,2,3,3]
  %5 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[8,4]} : f32[8,4]
  %6 = dot_general(%0, %1) {fusion=0, lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[8,4]
  %7 = add(%6, %5) {fusion=0} : f32[8,4]
  %8 = relu(%7) {fusion=0} : f32[8,4]
  %9 = mul(%8, %8) {fusion=1} : f32[8,4]
  %10 = neg(%9) {fusion=1} : f32[8,4]
  %11 = sub(%10, %8) {fusion=2} : f32[8,4]
  %12 = reduce_sum(%11) {dimensions=[0], fusion=2} : f32[4]
  %13 = conv2d(%3, %4) {dilation=[1,1], fusion=5, groups=1, padding=[1,1,1,1], strides=[1,1]} : f32[1,3,5,5]
  %14 = tanh(%13) {fusion=5} : f32[1,3,5,5]
  return y=%10, s=%12, c=%14
}
)";

Graph MustParse(const std::string& text) {
  absl::StatusOr<Graph> g = ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << text;
  return g.ok() ? *std::move(g) : Graph();
}

TEST(FusionIr, TableRoundTripsThroughText) {
  Graph g = MustParse(kAllKinds);
  ASSERT_EQ(g.fusion_groups().size(), 4u);
  EXPECT_EQ(g.fusion_groups()[0], (FusionGroup{0, FusionKind::kMatmulEpilogue}));
  EXPECT_EQ(g.fusion_groups()[1], (FusionGroup{1, FusionKind::kLoop}));
  EXPECT_EQ(g.fusion_groups()[2], (FusionGroup{2, FusionKind::kReduction}));
  EXPECT_EQ(g.fusion_groups()[3], (FusionGroup{5, FusionKind::kConvEpilogue}));
  EXPECT_EQ(g.FusionMembers(0), (std::vector<int>{6, 7, 8}));
  EXPECT_EQ(g.FusionMembers(2), (std::vector<int>{11, 12}));
  EXPECT_EQ(g.FusionMembers(3), std::vector<int>{});
  EXPECT_EQ(g.FusionGroupOf(13), 5);
  EXPECT_EQ(g.FusionGroupOf(5), -1);
  EXPECT_EQ(g.FindFusionGroup(5)->kind, FusionKind::kConvEpilogue);
  EXPECT_EQ(g.FindFusionGroup(4), nullptr);
  EXPECT_EQ(PrintGraph(g), kAllKinds);  // exact round trip
  Graph copy = g;                       // copies keep the table
  EXPECT_EQ(copy.fusion_groups(), g.fusion_groups());
  EXPECT_TRUE(Verify(copy).ok());
}

TEST(FusionIr, KindNames) {
  for (FusionKind k : {FusionKind::kLoop, FusionKind::kReduction, FusionKind::kMatmulEpilogue,
                       FusionKind::kConvEpilogue}) {
    FusionKind back = FusionKind::kLoop;
    ASSERT_TRUE(ParseFusionKind(FusionKindName(k), &back)) << FusionKindName(k);
    EXPECT_EQ(back, k);
  }
  FusionKind k;
  EXPECT_FALSE(ParseFusionKind("epilogue", &k));
}

// Text written before group declarations existed: each group gets the kind its members imply.
TEST(FusionIr, TextWithoutDeclarationsGetsKindsFromMembers) {
  Graph g = MustParse(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[8,16]
      %w = parameter() {index=1, name="w"} : f32[16,4]
      %d = dot_general(%x, %w) {fusion=3, lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %r = relu(%d) {fusion=3}
      %m = mul(%r, %r) {fusion=7}
      %s = reduce_sum(%m) {dimensions=[0], fusion=7}
      %n = neg(%r) {fusion=8}
      return s=%s, n=%n
    })");
  EXPECT_EQ(g.fusion_groups(), (std::vector<FusionGroup>{{3, FusionKind::kMatmulEpilogue},
                                                         {7, FusionKind::kReduction},
                                                         {8, FusionKind::kLoop}}));
}

// The parse error for `text`, which must not parse.
std::string ParseError(const std::string& text) {
  absl::StatusOr<Graph> g = ParseGraph(text);
  EXPECT_FALSE(g.ok()) << "parsed:\n" << text;
  return g.ok() ? "" : std::string(g.status().message());
}

TEST(FusionIr, ParserRejectsBadDeclarations) {
  EXPECT_THAT(ParseError(R"(graph @g {
    fusion 0 kind=loop
    fusion 0 kind=loop
    %x = parameter() {index=0, name="x"} : f32[4]
    %n = neg(%x) {fusion=0}
    return y=%n
  })"),
              HasSubstr("line 3, col 12: fusion group 0 is already declared"));
  EXPECT_THAT(
      ParseError(R"(graph @g {
    fusion 0 kind=epilogue
    %x = parameter() {index=0, name="x"} : f32[4]
    return y=%x
  })"),
      HasSubstr("expected a fusion kind (loop, reduction, matmul_epilogue, conv_epilogue)"));
  EXPECT_THAT(ParseError(R"(graph @g {
    fusion -1 kind=loop
    %x = parameter() {index=0, name="x"} : f32[4]
    return y=%x
  })"),
              HasSubstr("must not be negative"));
  // Declarations come first.
  EXPECT_THAT(ParseError(R"(graph @g {
    %x = parameter() {index=0, name="x"} : f32[4]
    fusion 0 kind=loop
    return y=%x
  })"),
              HasSubstr("expected a statement"));
  // With declarations, every group a member names must be declared.
  EXPECT_THAT(ParseError(R"(graph @g {
    fusion 0 kind=loop
    %x = parameter() {index=0, name="x"} : f32[4]
    %n = neg(%x) {fusion=0}
    %a = abs(%n) {fusion=1}
    return y=%a
  })"),
              HasSubstr("line 5, col 5: node %2 (abs): fusion group 1 is not declared"));
}

// The verifier's message for `text`, a graph whose groups are malformed. The parser runs the
// verifier, so the message comes back with a line and column.
std::string GroupError(const std::string& text) { return ParseError(text); }

constexpr char kHead[] = R"(
  %x = parameter() {index=0, name="x"} : f32[8,16]
  %w = parameter() {index=1, name="w"} : f32[16,16]
  %v = parameter() {index=2, name="v"} : f32[8,16]
)";

TEST(FusionIr, VerifierRejectsMalformedGroups) {
  const std::string h = kHead;
  // Not consecutive.
  EXPECT_THAT(GroupError("graph @g {\n  fusion 0 kind=loop" + h + R"(
    %a = neg(%x) {fusion=0}
    %e = log(%a)
    %b = add(%a, %e) {fusion=0}
    return y=%b
  })"),
              HasSubstr("node %5 (add): fusion group 0 (loop): members must be consecutive nodes, "
                        "but the member before it is %3"));
  // No members.
  EXPECT_THAT(GroupError("graph @g {\n  fusion 4 kind=loop" + h + R"(
    return y=%x
  })"),
              HasSubstr("graph @g: fusion group 4 (loop) has no members"));
  // A loop group runs only loop-fusible ops.
  EXPECT_THAT(GroupError("graph @g {\n  fusion 0 kind=loop" + h + R"(
    %a = neg(%x) {fusion=0}
    %e = log(%a) {fusion=0}
    return y=%e
  })"),
              HasSubstr("node %4 (log): fusion group 0 (loop): not a loop-fusible elementwise op"));
  // A sink makes it a reduction group; a reduction group needs one.
  EXPECT_THAT(GroupError("graph @g {\n  fusion 0 kind=loop" + h + R"(
    %a = neg(%x) {fusion=0}
    %s = reduce_sum(%a) {dimensions=[0], fusion=0}
    return y=%s
  })"),
              HasSubstr("node %4 (reduce_sum): fusion group 0 (loop): a reduce_sum sink makes it "
                        "a reduction group"));
  EXPECT_THAT(GroupError("graph @g {\n  fusion 0 kind=reduction" + h + R"(
    %a = neg(%x) {fusion=0}
    return y=%a
  })"),
              HasSubstr("node %3 (neg): fusion group 0 (reduction): has no reduce_sum sink"));
  // Nothing in a reduction group reads its sink.
  EXPECT_THAT(GroupError("graph @g {\n  fusion 0 kind=reduction" + h + R"(
    %s = reduce_sum(%x) {dimensions=[0,1], fusion=0}
    %n = neg(%s) {fusion=0}
    return y=%n
  })"),
              HasSubstr("node %4 (neg): fusion group 0 (reduction): reads the reduction %3"));
}

TEST(FusionIr, VerifierRejectsMalformedEpilogues) {
  const std::string h = kHead;
  constexpr char kDot[] =
      "dot_general(%x, %w) {fusion=0, lhs_batch=[], lhs_contracting=[1], rhs_batch=[], "
      "rhs_contracting=[0]}";
  EXPECT_THAT(GroupError("graph @g {\n  fusion 0 kind=matmul_epilogue" + h + R"(
    %a = neg(%x) {fusion=0}
    %r = relu(%a) {fusion=0}
    return y=%r
  })"),
              HasSubstr("node %3 (neg): fusion group 0 (matmul_epilogue) must start with "
                        "dot_general"));
  EXPECT_THAT(GroupError("graph @g {\n  fusion 0 kind=conv_epilogue" + h + "    %d = " + kDot + R"(
    %r = relu(%d) {fusion=0}
    return y=%r
  })"),
              HasSubstr("node %3 (dot_general): fusion group 0 (conv_epilogue) must start with "
                        "conv2d"));
  // Each member reads the one before.
  EXPECT_THAT(
      GroupError("graph @g {\n  fusion 0 kind=matmul_epilogue" + h + "    %d = " + kDot + R"(
    %r = relu(%v) {fusion=0}
    %s = add(%r, %d)
    return y=%s
  })"),
      HasSubstr("node %4 (relu): fusion group 0 (matmul_epilogue): an epilogue member "
                "must read the member before it, %3"));
  EXPECT_THAT(
      GroupError("graph @g {\n  fusion 0 kind=matmul_epilogue" + h + "    %d = " + kDot + R"(
    %r = mul(%d, %v) {fusion=0}
    return y=%r
  })"),
      HasSubstr("node %4 (mul): fusion group 0 (matmul_epilogue): an epilogue runs only "
                "add and the epilogue activations"));
  EXPECT_THAT(
      GroupError("graph @g {\n  fusion 0 kind=matmul_epilogue" + h + "    %d = " + kDot + R"(
    %r = relu(%d) {fusion=0}
    %t = tanh(%r) {fusion=0}
    return y=%t
  })"),
      HasSubstr("node %5 (tanh): fusion group 0 (matmul_epilogue): an epilogue is at most "
                "[bias add] [activation] [residual add]"));
}

TEST(FusionIr, VerifierChecksAttributes) {
  EXPECT_THAT(ParseError(R"(graph @g {
    %x = parameter() {index=0, name="x"} : f32[4]
    %n = neg(%x) {fusion="a"}
    return y=%n
  })"),
              HasSubstr("node %1 (neg): attribute 'fusion' must be a non-negative integer"));
  // A graph assembled by hand with a member but no table entry.
  Graph g("g");
  int x = g.AddNode(Opcode::kParameter, {}, {DType::kF32, Shape{4}},
                    {{"index", int64_t{0}}, {"name", std::string("x")}});
  int n = g.AddNode(Opcode::kNeg, {x}, {DType::kF32, Shape{4}}, {{kFusionAttr, int64_t{2}}});
  g.AddOutput("y", n);
  absl::Status s = Verify(g);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("node %1 (neg): fusion group 2 is not declared in the graph's fusion group "
                        "table"));
  g.AddFusionGroup({2, FusionKind::kLoop});
  EXPECT_TRUE(Verify(g).ok()) << Verify(g);
  EXPECT_EQ(FusionGroupProblem(g, {2, FusionKind::kLoop}, {1}), "");
  EXPECT_EQ(InferFusionKind(g, {1}), FusionKind::kLoop);
}

}  // namespace
}  // namespace kiln::ir
