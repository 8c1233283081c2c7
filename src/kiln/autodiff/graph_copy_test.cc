#include "kiln/autodiff/graph_copy.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"

namespace kiln::autodiff {
namespace {

using ir::Opcode;

// A graph whose parameters appear in the node list out of index order, with every kind of node
// CopyNode treats specially: constant, iota, convert, random_bits.
ir::Graph HandBuilt() {
  ir::Graph g("hand");
  const ir::Type f32{DType::kF32, Shape{2, 3}};
  int b =
      g.AddNode(Opcode::kParameter, {}, f32, {{"index", int64_t{1}}, {"name", std::string("b")}});
  int a =
      g.AddNode(Opcode::kParameter, {}, f32, {{"index", int64_t{0}}, {"name", std::string("a")}});
  int seed = g.AddNode(Opcode::kParameter, {}, {DType::kS64, Shape{}},
                       {{"index", int64_t{2}}, {"name", std::string("seed")}});
  auto lit = std::make_shared<Tensor>(Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6}));
  int c = g.AddNode(Opcode::kConstant, {}, f32, {}, lit);
  int iota = g.AddNode(Opcode::kIota, {}, {DType::kS32, Shape{2, 3}}, {{"dimension", int64_t{1}}});
  int conv = g.AddNode(Opcode::kConvert, {iota}, f32, {});
  int bits = g.AddNode(Opcode::kRandomBits, {seed, seed}, f32, {});
  int s1 = g.AddNode(Opcode::kAdd, {a, b}, f32, {});
  int s2 = g.AddNode(Opcode::kMul, {s1, c}, f32, {});
  int s3 = g.AddNode(Opcode::kAdd, {s2, conv}, f32, {});
  int s4 = g.AddNode(Opcode::kAdd, {s3, bits}, f32, {});
  g.AddOutput("y", s4);
  g.AddOutput("sum", s1);
  return g;
}

TEST(GraphCopy, CopiesEveryNodeAndKeepsTheInterface) {
  ir::Graph g = HandBuilt();
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  ir::Builder b(g.name());
  absl::StatusOr<ValueMap> map = CopyGraph(g, b);
  ASSERT_TRUE(map.ok()) << map.status();
  CopyOutputs(g, *map, b);
  absl::StatusOr<ir::Graph> copy = b.Build();
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(ir::Verify(*copy).ok()) << ir::Verify(*copy);

  EXPECT_EQ(copy->name(), "hand");
  EXPECT_EQ(copy->num_nodes(), g.num_nodes());
  ASSERT_EQ(copy->parameters().size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const ir::Node& p = copy->node(copy->parameters()[i]);
    const ir::Node& q = g.node(g.parameters()[i]);
    EXPECT_EQ(p.attr_str("name"), q.attr_str("name"));
    EXPECT_EQ(p.attr_int("index"), i);
    EXPECT_EQ(p.type(), q.type());
  }
  for (int id = 0; id < g.num_nodes(); ++id) {
    const ir::Node& src = g.node(id);
    const ir::Node& dst = copy->node((*map)[id].id());
    EXPECT_EQ(dst.opcode(), src.opcode()) << "node " << id;
    EXPECT_EQ(dst.type(), src.type()) << "node " << id;
    EXPECT_EQ(dst.attrs(), src.attrs()) << "node " << id;
  }
  ASSERT_EQ(copy->outputs().size(), 2u);
  EXPECT_EQ(copy->outputs()[0].name, "y");
  EXPECT_EQ(copy->outputs()[1].name, "sum");
  EXPECT_EQ(copy->node(copy->outputs()[1].node).opcode(), Opcode::kAdd);
  const Tensor* lit = copy->node((*map)[3].id()).literal();
  ASSERT_NE(lit, nullptr);
  EXPECT_THAT(lit->ToDoubles(), ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(GraphCopy, RewriterReplacesNodes) {
  ir::Graph g = HandBuilt();
  ir::Builder b(g.name());
  int rewritten = 0;
  absl::StatusOr<ValueMap> map =
      CopyGraph(g, b,
                [&](const ir::Node& n,
                    const std::vector<ir::Value>& ops) -> absl::StatusOr<std::optional<ir::Value>> {
                  if (n.opcode() != Opcode::kMul) return std::nullopt;
                  ++rewritten;
                  return std::optional<ir::Value>(ops[1] * ops[0]);
                });
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(rewritten, 1);
  CopyOutputs(g, *map, b);
  ASSERT_TRUE(b.Build().ok());
}

TEST(GraphCopy, RewriterErrorsPropagate) {
  ir::Graph g = HandBuilt();
  ir::Builder b(g.name());
  absl::StatusOr<ValueMap> wrong_type =
      CopyGraph(g, b,
                [&](const ir::Node& n,
                    const std::vector<ir::Value>& ops) -> absl::StatusOr<std::optional<ir::Value>> {
                  if (n.opcode() != Opcode::kMul) return std::nullopt;
                  return std::optional<ir::Value>(ir::ReduceSum(ops[0], {0}));
                });
  EXPECT_EQ(wrong_type.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(wrong_type.status().message()), ::testing::HasSubstr("changed its type"));

  ir::Builder b2(g.name());
  absl::StatusOr<ValueMap> failed =
      CopyGraph(g, b2,
                [&](const ir::Node& n,
                    const std::vector<ir::Value>&) -> absl::StatusOr<std::optional<ir::Value>> {
                  if (n.opcode() != Opcode::kMul) return std::nullopt;
                  return absl::UnimplementedError("no");
                });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnimplemented);
}

// A fused graph copies into an unfused one: membership is the fusion pass's to form again on the
// copy (whose node order may differ), so no member keeps a `fusion` attribute naming a group the
// copy lacks, and the copy verifies.
TEST(GraphCopy, DropsFusionMembership) {
  absl::StatusOr<ir::Graph> fused = ir::ParseGraph(R"(graph @g {
  fusion 0 kind=loop
  %0 = parameter() {index=0, name="x"} : f32[4]
  %1 = mul(%0, %0) {fusion=0} : f32[4]
  %2 = neg(%1) {fusion=0} : f32[4]
  return y=%2
}
)");
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_TRUE(ir::Verify(*fused).ok());
  ir::Builder b("copy");
  absl::StatusOr<ValueMap> map = CopyGraph(*fused, b);
  ASSERT_TRUE(map.ok()) << map.status();
  b.Output("y", (*map)[2]);
  absl::StatusOr<ir::Graph> copy = b.Build();
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_TRUE(ir::Verify(*copy).ok()) << ir::Verify(*copy);
  for (const ir::Node& n : copy->nodes()) EXPECT_FALSE(n.has_attr(ir::kFusionAttr)) << n.id();
}

}  // namespace
}  // namespace kiln::autodiff
