#include "kiln/compiler/passes/sharding_propagation.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "kiln/compiler/passes/spmd_partitioner.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/sharding.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

const sharding::Mesh kMesh2{"model", 2};

ir::Graph Parse(const std::string& text) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : ir::Graph();
}

// The sharding text of every node, by node id ("" when replicated).
std::map<int, std::string> Shardings(const ir::Graph& g) {
  std::map<int, std::string> m;
  for (const ir::Node& n : g.nodes()) {
    auto it = n.attrs().find(ir::kShardingAttr);
    m[n.id()] = it == n.attrs().end() ? "" : std::get<std::string>(it->second);
  }
  return m;
}

int CountOps(const ir::Graph& g, ir::Opcode op) {
  int k = 0;
  for (const ir::Node& n : g.nodes()) k += n.opcode() == op;
  return k;
}

constexpr char kMlp[] = R"(
  graph @mlp {
    %0 = parameter() {index=0, name="x"} : f32[8,16]
    %1 = parameter() {index=1, name="w1", sharding="[_,model]"} : f32[16,32]
    %2 = parameter() {index=2, name="b1", sharding="[model]"} : f32[32]
    %3 = parameter() {index=3, name="w2", sharding="[model,_]"} : f32[32,16]
    %4 = parameter() {index=4, name="b2"} : f32[16]
    %5 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[8,32]
    %6 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[8,32]} : f32[8,32]
    %7 = add(%5, %6) : f32[8,32]
    %8 = relu(%7) : f32[8,32]
    %9 = dot_general(%8, %3) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[8,16]
    %10 = broadcast_in_dim(%4) {broadcast_dimensions=[1], shape=[8,16]} : f32[8,16]
    %11 = add(%9, %10) : f32[8,16]
    %12 = reduce_sum(%11) {dimensions=[0,1]} : f32[]
    return loss=%12, y=%11
  })";

TEST(ShardingPropagation, MegatronMlpColumnThenRow) {
  ir::Graph g = Parse(kMlp);
  ShardingPropagation pass(kMesh2);
  absl::StatusOr<bool> changed = pass.Run(g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  std::map<int, std::string> s = Shardings(g);
  EXPECT_EQ(s[5], "[_,model]");  // x @ w1: split by column
  EXPECT_EQ(s[6], "[_,model]");  // the bias broadcast follows b1
  EXPECT_EQ(s[7], "[_,model]");
  EXPECT_EQ(s[8], "[_,model]");
  EXPECT_EQ(s[9], "[_,_] sum(model)");  // row-split contraction: a partial sum
  EXPECT_EQ(s[10], "");
  EXPECT_EQ(s[11], "");
  EXPECT_EQ(s[12], "");
  // Idempotent.
  absl::StatusOr<bool> again = pass.Run(g);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
}

TEST(ShardingPropagation, GroupedSplitFollowsSliceReshapeTranspose) {
  // A fused q | k | v projection split into heads: "3*model" keeps whole heads per rank.
  ir::Graph g = Parse(R"(
    graph @qkv {
      %0 = parameter() {index=0, name="x"} : f32[2,4,8]
      %1 = parameter() {index=1, name="w", sharding="[_,3*model]"} : f32[8,24]
      %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[2], rhs_batch=[], rhs_contracting=[0]} : f32[2,4,24]
      %3 = slice(%2) {limit=[2,4,16], start=[0,0,8], stride=[1,1,1]} : f32[2,4,8]
      %4 = reshape(%3) {shape=[2,4,2,4]} : f32[2,4,2,4]
      %5 = transpose(%4) {permutation=[0,2,1,3]} : f32[2,2,4,4]
      %6 = slice(%2) {limit=[2,4,12], start=[0,0,4], stride=[1,1,1]} : f32[2,4,8]
      return k=%5, odd=%6
    })");
  ShardingPropagation pass(kMesh2);
  ASSERT_TRUE(pass.Run(g).ok());
  std::map<int, std::string> s = Shardings(g);
  EXPECT_EQ(s[2], "[_,_,3*model]");
  EXPECT_EQ(s[3], "[_,_,model]");    // k: group 1 of 3
  EXPECT_EQ(s[4], "[_,_,model,_]");  // heads split
  EXPECT_EQ(s[5], "[_,model,_,_]");
  EXPECT_EQ(s[6], "");  // a slice across group boundaries: replicated
}

TEST(ShardingPropagation, BackwardHintSplitsTheOneHot) {
  // softmax(logits) - one_hot(labels) over split logits: the one-hot is built split, from an
  // iota with the rank's offset, instead of being built whole and sliced.
  ir::Graph g = Parse(R"(
    graph @ce_grad {
      %0 = parameter() {index=0, name="h"} : f32[4,8]
      %1 = parameter() {index=1, name="wte", sharding="[model,_]"} : f32[16,8]
      %2 = parameter() {index=2, name="labels"} : s32[4]
      %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[1]} : f32[4,16]
      %4 = softmax(%3) {axis=1} : f32[4,16]
      %5 = iota() {dimension=0} : s32[16]
      %6 = broadcast_in_dim(%5) {broadcast_dimensions=[1], shape=[4,16]} : s32[4,16]
      %7 = broadcast_in_dim(%2) {broadcast_dimensions=[0], shape=[4,16]} : s32[4,16]
      %8 = compare(%6, %7) {direction="eq"} : bool[4,16]
      %9 = constant() {value=1.0} : f32[4,16]
      %10 = constant() {value=0.0} : f32[4,16]
      %11 = select(%8, %9, %10) : f32[4,16]
      %12 = sub(%4, %11) : f32[4,16]
      return g=%12
    })");
  ShardingPropagation pass(kMesh2);
  ASSERT_TRUE(pass.Run(g).ok());
  std::map<int, std::string> s = Shardings(g);
  EXPECT_EQ(s[3], "[_,model]");
  EXPECT_EQ(s[4], "[_,model]");
  EXPECT_EQ(s[5], "[model]");  // the vocabulary iota, split
  EXPECT_EQ(s[6], "[_,model]");
  EXPECT_EQ(s[7], "[_,model]");  // labels broadcast straight into the local shape
  EXPECT_EQ(s[8], "[_,model]");
  EXPECT_EQ(s[11], "[_,model]");
  EXPECT_EQ(s[12], "[_,model]");
  EXPECT_EQ(s[9], "");  // constants stay replicated (sliced where used)
}

TEST(ShardingPropagation, ConflictKeepsTheFirstOperandsSplit) {
  ir::Graph g = Parse(R"(
    graph @conflict {
      %0 = parameter() {index=0, name="a", sharding="[model,_]"} : f32[4,4]
      %1 = parameter() {index=1, name="b", sharding="[_,model]"} : f32[4,4]
      %2 = add(%0, %1) : f32[4,4]
      %3 = reduce_max(%2) {dimensions=[0]} : f32[4]
      return y=%3
    })");
  ShardingPropagation pass(kMesh2);
  ASSERT_TRUE(pass.Run(g).ok());
  std::map<int, std::string> s = Shardings(g);
  EXPECT_EQ(s[2], "[model,_]");
  EXPECT_EQ(s[3], "[_] max(model)");
}

TEST(ShardingPropagation, RejectsBadAnnotations) {
  ShardingPropagation pass(kMesh2);
  ir::Graph other_axis = Parse(R"(
    graph @g {
      %0 = parameter() {index=0, name="w", sharding="[data,_]"} : f32[4,4]
      return y=%0
    })");
  absl::StatusOr<bool> r = pass.Run(other_axis);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("axis 'data'"), std::string::npos) << r.status();
  ir::Graph odd = Parse(R"(
    graph @g {
      %0 = parameter() {index=0, name="w", sharding="[model,_]"} : f32[3,4]
      return y=%0
    })");
  r = pass.Run(odd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not divide over the 2 ranks"), std::string::npos)
      << r.status();
  // The verifier checks the attribute's text and rank.
  absl::StatusOr<ir::Graph> bad = ir::ParseGraph(R"(
    graph @g {
      %0 = parameter() {index=0, name="w", sharding="[model]"} : f32[4,4]
      return y=%0
    })");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("has 1 dimensions"), std::string::npos) << bad.status();
  bad = ir::ParseGraph(R"(
    graph @g {
      %0 = parameter() {index=0, name="w", sharding="[model,model]"} : f32[4,4]
      return y=%0
    })");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("more than one dimension"), std::string::npos)
      << bad.status();
}

TEST(ShardingText, RoundTrips) {
  for (const char* text : {"[_,model]", "[3*model,_,_]", "[]", "[_] sum(model)", "[_,_] max(tp)"}) {
    absl::StatusOr<ir::Sharding> s = ir::ParseSharding(text);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status();
    EXPECT_EQ(s->ToString(), text);
  }
  EXPECT_EQ(ir::ParseSharding(" [ _ , 1*model ] ")->ToString(), "[_,model]");
  for (const char* bad : {"model", "[0*model]", "[x*model]", "[_] prod(model)",
                          "[model] sum(model)", "[a,_] sum(b)", "[_,m-1]"}) {
    EXPECT_FALSE(ir::ParseSharding(bad).ok()) << bad;
  }
}

TEST(SpmdPartitioner, MlpLocalProgramHasOneAllReduce) {
  absl::StatusOr<ir::Graph> local = PartitionSpmd(Parse(kMlp), {.mesh = kMesh2});
  ASSERT_TRUE(local.ok()) << local.status();
  const ir::Graph& g = *local;
  EXPECT_EQ(g.node(g.FindParameter("w1")).type().ToString(), "f32[16,16]");
  EXPECT_EQ(g.node(g.FindParameter("b1")).type().ToString(), "f32[16]");
  EXPECT_EQ(g.node(g.FindParameter("w2")).type().ToString(), "f32[16,16]");
  EXPECT_EQ(g.node(g.FindParameter("x")).type().ToString(), "f32[8,16]");
  EXPECT_EQ(CountOps(g, ir::Opcode::kAllReduce), 1) << ir::PrintGraph(g);
  EXPECT_EQ(CountOps(g, ir::Opcode::kAllGather), 0) << ir::PrintGraph(g);
  EXPECT_EQ(CountOps(g, ir::Opcode::kReduceScatter), 0) << ir::PrintGraph(g);  // no offsets
  for (const ir::Node& n : g.nodes()) EXPECT_FALSE(n.has_attr(ir::kShardingAttr));
  // The per-rank program is final: partitioning it again changes nothing.
  ir::Graph again = g;
  SpmdPartitioner pass({.mesh = kMesh2});
  absl::StatusOr<bool> changed = pass.Run(again);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
}

TEST(SpmdPartitioner, RefusesAnnotationsPropagationWouldNotWrite) {
  ir::Graph g = Parse(R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[4,4]
      %1 = reduce_sum(%0) {dimensions=[0], sharding="[model]"} : f32[4]
      return y=%1
    })");
  SpmdPartitioner pass({.mesh = kMesh2});
  absl::StatusOr<bool> r = pass.Run(g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("run sharding-propagation first"), std::string::npos)
      << r.status();
}

TEST(SpmdShards, ShardOfAndUnshardRoundTrip) {
  std::vector<float> v(2 * 12);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  Tensor full = Tensor::FromVector(Shape{2, 12}, v);
  const sharding::Mesh mesh{"model", 2};
  ir::Sharding s = *ir::ParseSharding("[_,3*model]");
  absl::StatusOr<Tensor> r1 = ShardOf(full, s, mesh, 1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  // Row 0: groups [0..3] [4..7] [8..11]; rank 1 holds the second half of each.
  EXPECT_EQ(r1->ToDoubles(), (std::vector<double>{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23}));
  absl::StatusOr<Tensor> r0 = ShardOf(full, s, mesh, 0);
  absl::StatusOr<Tensor> back = Unshard({*r0, *r1}, s, mesh);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->BitwiseEquals(full));
  EXPECT_FALSE(ShardOf(full, *ir::ParseSharding("[model,_]"), {"model", 4}, 0).ok());
}

}  // namespace
}  // namespace kiln::compiler
