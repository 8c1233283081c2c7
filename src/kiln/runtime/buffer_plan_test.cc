#include "kiln/runtime/buffer_plan.h"

#include <random>

#include "gtest/gtest.h"

namespace kiln::runtime {
namespace {

using ir::Graph;
using ir::Opcode;
using ir::Type;

int Param(Graph& g, int index, int64_t n) {
  return g.AddNode(Opcode::kParameter, {}, Type{DType::kF32, Shape{n}},
                   {{"index", int64_t{index}}, {"name", "p" + std::to_string(index)}});
}

// Graphs here are only planned, never run, so node types need not satisfy shape inference.
int Unary(Graph& g, int x, int64_t n) {
  return g.AddNode(Opcode::kNeg, {x}, Type{DType::kF32, Shape{n}}, {});
}

int Binary(Graph& g, int a, int b, int64_t n) {
  return g.AddNode(Opcode::kAdd, {a, b}, Type{DType::kF32, Shape{n}}, {});
}

// Independently recomputes liveness and checks that no two buffers live at the same step share
// bytes, that offsets are aligned, and that the arena holds everything.
void CheckPlan(const Graph& g, const BufferPlan& plan) {
  const int n = g.num_nodes();
  ASSERT_EQ(plan.offsets.size(), static_cast<size_t>(n));
  std::vector<int> last(n);
  for (int i = 0; i < n; ++i) last[i] = i;
  for (const auto& node : g.nodes())
    for (int op : node.operands()) last[op] = std::max(last[op], node.id());
  for (const auto& o : g.outputs()) last[o.node] = n;
  for (int i = 0; i < n; ++i) {
    const auto& node = g.node(i);
    bool source = node.opcode() == Opcode::kParameter || node.opcode() == Opcode::kConstant;
    if (source) {
      EXPECT_EQ(plan.offsets[i], -1) << "node " << i;
      continue;
    }
    ASSERT_GE(plan.offsets[i], 0) << "node " << i;
    EXPECT_EQ(plan.offsets[i] % kBufferAlignment, 0) << "node " << i;
    EXPECT_LE(plan.offsets[i] + node.type().byte_size(), plan.arena_bytes) << "node " << i;
  }
  for (int a = 0; a < n; ++a) {
    if (plan.offsets[a] < 0) continue;
    for (int b = a + 1; b < n; ++b) {
      if (plan.offsets[b] < 0) continue;
      bool live_together = a <= last[b] && b <= last[a];
      if (!live_together) continue;
      int64_t a0 = plan.offsets[a], a1 = a0 + g.node(a).type().byte_size();
      int64_t b0 = plan.offsets[b], b1 = b0 + g.node(b).type().byte_size();
      bool disjoint = a1 <= b0 || b1 <= a0 || a0 == a1 || b0 == b1;  // empty buffers hold nothing
      EXPECT_TRUE(disjoint) << "nodes " << a << " [" << a0 << "," << a1 << ") and " << b << " ["
                            << b0 << "," << b1 << ") are live together but share bytes";
    }
  }
  EXPECT_GE(plan.arena_bytes, plan.lower_bound);
}

TEST(BufferPlanTest, ParametersAndConstantsAreNotInTheArena) {
  Graph g;
  int p = Param(g, 0, 16);
  int c = g.AddNode(Opcode::kConstant, {}, Type{DType::kF32, Shape{16}}, {},
                    std::make_shared<Tensor>(DType::kF32, Shape{16}));
  int s = Binary(g, p, c, 16);
  g.AddOutput("y", s);
  BufferPlan plan = PlanBuffers(g);
  EXPECT_EQ(plan.offsets[p], -1);
  EXPECT_EQ(plan.offsets[c], -1);
  EXPECT_EQ(plan.offsets[s], 0);
  EXPECT_EQ(plan.arena_bytes, 64);
  EXPECT_EQ(plan.lower_bound, 64);
}

TEST(BufferPlanTest, OperandAndResultNeverShare) {
  Graph g;
  int p = Param(g, 0, 32);
  int a = Unary(g, p, 32);
  int b = Unary(g, a, 32);
  g.AddOutput("y", b);
  BufferPlan plan = PlanBuffers(g);
  EXPECT_NE(plan.offsets[a], plan.offsets[b]);
  CheckPlan(g, plan);
}

TEST(BufferPlanTest, ChainReusesBuffers) {
  // p -> a -> b -> c -> d -> e (output): only two values are ever live at once.
  Graph g;
  int x = Param(g, 0, 256);
  for (int i = 0; i < 5; ++i) x = Unary(g, x, 256);
  g.AddOutput("y", x);
  BufferPlan plan = PlanBuffers(g);
  CheckPlan(g, plan);
  EXPECT_EQ(plan.lower_bound, 2 * 1024);
  EXPECT_EQ(plan.arena_bytes, plan.lower_bound);
}

TEST(BufferPlanTest, FragmentingChainMeetsTheLowerBound) {
  // Best-fit decreasing alone packs these sizes (in 64-byte units) into 10 units; the bound is 8.
  Graph g;
  int x = Param(g, 0, 16);
  for (int units : {3, 4, 4, 2, 4}) x = Unary(g, x, units * 16);
  g.AddOutput("y", x);
  BufferPlan plan = PlanBuffers(g);
  CheckPlan(g, plan);
  EXPECT_EQ(plan.lower_bound, 8 * 64);
  EXPECT_EQ(plan.arena_bytes, 8 * 64);
}

TEST(BufferPlanTest, RandomChainsMeetTheLowerBound) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Graph g;
    int len = 2 + rng() % 12;
    int x = Param(g, 0, 1 + rng() % 100);
    for (int i = 0; i < len; ++i) x = Unary(g, x, 1 + rng() % 300);
    g.AddOutput("y", x);
    BufferPlan plan = PlanBuffers(g);
    CheckPlan(g, plan);
    EXPECT_EQ(plan.arena_bytes, plan.lower_bound) << "trial " << trial;
  }
}

TEST(BufferPlanTest, OutputsLiveToTheEnd) {
  Graph g;
  int p = Param(g, 0, 16);
  int a = Unary(g, p, 16);  // output, never used again
  int b = Unary(g, p, 16);
  int c = Unary(g, b, 16);
  g.AddOutput("a", a);
  g.AddOutput("c", c);
  BufferPlan plan = PlanBuffers(g);
  CheckPlan(g, plan);
  EXPECT_NE(plan.offsets[a], plan.offsets[c]);
  EXPECT_NE(plan.offsets[a], plan.offsets[b]);
}

TEST(BufferPlanTest, RandomDagsNeverOverlapLiveBuffers) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    Graph g;
    int num_params = 1 + rng() % 3;
    for (int i = 0; i < num_params; ++i) Param(g, i, 1 + rng() % 64);
    if (rng() % 2)
      g.AddNode(Opcode::kConstant, {}, Type{DType::kF32, Shape{4}}, {},
                std::make_shared<Tensor>(DType::kF32, Shape{4}));
    int num_ops = 1 + rng() % 30;
    for (int i = 0; i < num_ops; ++i) {
      int n = g.num_nodes();
      int64_t size = rng() % 5 == 0 ? 0 : 1 + rng() % 500;  // some empty tensors
      // Prefer recent operands so graphs look like programs, but reach back sometimes.
      auto pick = [&] {
        return rng() % 3 == 0 ? int(rng() % n) : std::max(0, n - 1 - int(rng() % 3));
      };
      if (rng() % 2)
        Unary(g, pick(), size);
      else
        Binary(g, pick(), pick(), size);
    }
    int num_outputs = 1 + rng() % 3;
    for (int i = 0; i < num_outputs; ++i)
      g.AddOutput("o" + std::to_string(i), rng() % g.num_nodes());
    BufferPlan plan = PlanBuffers(g);
    SCOPED_TRACE("trial " + std::to_string(trial));
    CheckPlan(g, plan);
  }
}

TEST(BufferPlanTest, EmptyGraph) {
  Graph g;
  BufferPlan plan = PlanBuffers(g);
  EXPECT_TRUE(plan.offsets.empty());
  EXPECT_EQ(plan.arena_bytes, 0);
  EXPECT_EQ(plan.lower_bound, 0);
}

}  // namespace
}  // namespace kiln::runtime
