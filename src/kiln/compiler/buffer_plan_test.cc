#include "kiln/compiler/buffer_plan.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "kiln/ir/op_traits.h"

namespace kiln::compiler {
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
// bytes (except a result that took, exactly, the buffer of an operand dying at it, by an op the
// planner may run in place), that offsets are aligned, and that the arena holds everything.
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
  auto in_place = [&](int a, int b) {  // b overwrote a, which died at b
    const auto& nb = g.node(b);
    bool elementwise_op = nb.opcode() == Opcode::kNeg ||
                          (nb.opcode() == Opcode::kAdd && nb.operand(0) == a) ||
                          nb.opcode() == Opcode::kMax;
    return elementwise_op && last[a] == b && plan.offsets[a] == plan.offsets[b] &&
           g.node(a).type() == nb.type() &&
           std::find(nb.operands().begin(), nb.operands().end(), a) != nb.operands().end();
  };
  for (int a = 0; a < n; ++a) {
    if (plan.offsets[a] < 0) continue;
    for (int b = a + 1; b < n; ++b) {
      if (plan.offsets[b] < 0) continue;
      bool live_together = a <= last[b] && b <= last[a];
      if (!live_together) continue;
      int64_t a0 = plan.offsets[a], a1 = a0 + g.node(a).type().byte_size();
      int64_t b0 = plan.offsets[b], b1 = b0 + g.node(b).type().byte_size();
      bool disjoint = a1 <= b0 || b1 <= a0 || a0 == a1 || b0 == b1;  // empty buffers hold nothing
      EXPECT_TRUE(disjoint || in_place(a, b))
          << "nodes " << a << " [" << a0 << "," << a1 << ") and " << b << " [" << b0 << "," << b1
          << ") are live together but share bytes";
    }
  }
  EXPECT_GE(plan.arena_bytes, plan.lower_bound_bytes);
}

// A plan of one kernel per node in id order, every node in the arena: what the tests then edit.
ExecutionPlan NodeByNode(const Graph& g) {
  ExecutionPlan s;
  const int n = g.num_nodes();
  s.step.resize(n);
  s.reads.resize(n);
  s.in_arena.assign(n, 1);
  for (int i = 0; i < n; ++i) {
    s.step[i] = i;
    s.reads[i] = g.node(i).operands();
  }
  return s;
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
  EXPECT_EQ(plan.lower_bound_bytes, 64);
}

constexpr BufferPlanOptions kNoInPlace{.in_place = false};

TEST(BufferPlanTest, OperandAndResultNeverShareWithoutInPlace) {
  Graph g;
  int p = Param(g, 0, 32);
  int a = Unary(g, p, 32);
  int b = Unary(g, a, 32);
  g.AddOutput("y", b);
  BufferPlan plan = PlanBuffers(g, nullptr, kNoInPlace);
  EXPECT_NE(plan.offsets[a], plan.offsets[b]);
  EXPECT_EQ(plan.in_place_reuses, 0);
  CheckPlan(g, plan);
}

TEST(BufferPlanTest, ChainReusesBuffers) {
  // p -> a -> b -> c -> d -> e (output): only two values are ever live at once.
  Graph g;
  int x = Param(g, 0, 256);
  for (int i = 0; i < 5; ++i) x = Unary(g, x, 256);
  g.AddOutput("y", x);
  BufferPlan plan = PlanBuffers(g, nullptr, kNoInPlace);
  CheckPlan(g, plan);
  EXPECT_EQ(plan.lower_bound_bytes, 2 * 1024);
  EXPECT_EQ(plan.arena_bytes, plan.lower_bound_bytes);
}

TEST(BufferPlanTest, InPlaceChainIsOneBuffer) {
  // Each neg overwrites its dying operand: the whole chain runs in one buffer, and the lower
  // bound counts each in-place pair once.
  Graph g;
  int x = Param(g, 0, 256);
  std::vector<int> chain;
  for (int i = 0; i < 5; ++i) chain.push_back(x = Unary(g, x, 256));
  g.AddOutput("y", x);
  BufferPlan plan = PlanBuffers(g);
  CheckPlan(g, plan);
  EXPECT_EQ(plan.in_place_reuses, 4);  // the first reads a parameter, which is not in the arena
  for (int id : chain) EXPECT_EQ(plan.offsets[id], 0);
  EXPECT_EQ(plan.lower_bound_bytes, 1024);
  EXPECT_EQ(plan.arena_bytes, 1024);
}

TEST(BufferPlanTest, InPlaceNeedsADyingOperandOfTheSameType) {
  Graph g;
  int p = Param(g, 0, 64);
  int a = Unary(g, p, 64);
  int b = Unary(g, a, 64);      // a is still read by d: no reuse
  int c = Unary(g, b, 32);      // different size: no reuse
  int d = Binary(g, a, b, 64);  // a and b die here: add may overwrite operand 0 (a)
  g.AddOutput("c", c);
  g.AddOutput("d", d);
  BufferPlan plan = PlanBuffers(g);
  CheckPlan(g, plan);
  EXPECT_NE(plan.offsets[b], plan.offsets[a]);
  EXPECT_NE(plan.offsets[c], plan.offsets[b]);
  EXPECT_EQ(plan.offsets[d], plan.offsets[a]);
  EXPECT_EQ(plan.in_place_reuses, 1);
}

TEST(BufferPlanTest, InPlaceOperandIndicesFollowTheWhitelist) {
  // add may overwrite only operand 0 (oneDNN binary's in-place contract), max either one.
  for (Opcode op : {Opcode::kAdd, Opcode::kMax}) {
    Graph g;
    int p = Param(g, 0, 64);
    int a = Unary(g, p, 64);
    int s = g.AddNode(op, {p, a}, Type{DType::kF32, Shape{64}}, {});  // a dies here, as operand 1
    g.AddOutput("s", s);
    BufferPlan plan = PlanBuffers(g);
    CheckPlan(g, plan);
    if (op == Opcode::kAdd)
      EXPECT_NE(plan.offsets[s], plan.offsets[a]);
    else
      EXPECT_EQ(plan.offsets[s], plan.offsets[a]);
  }
}

// A softmax writes over its dying operand (the LM head's logits and their softmax are one
// [tokens x vocab] buffer).
TEST(BufferPlanTest, SoftmaxTakesItsDyingOperand) {
  Graph g;
  int p = g.AddNode(Opcode::kParameter, {}, Type{DType::kF32, Shape{8, 8}},
                    {{"index", int64_t{0}}, {"name", "p"}});
  int a = g.AddNode(Opcode::kNeg, {p}, Type{DType::kF32, Shape{8, 8}}, {});
  int b = g.AddNode(Opcode::kSoftmax, {a}, Type{DType::kF32, Shape{8, 8}}, {{"axis", int64_t{1}}});
  int c = g.AddNode(Opcode::kNeg, {b}, Type{DType::kF32, Shape{8, 8}}, {});
  g.AddOutput("c", c);
  BufferPlan plan = PlanBuffers(g);
  EXPECT_EQ(plan.offsets[a], plan.offsets[b]);
  EXPECT_GE(plan.in_place_reuses, 1);
}

TEST(BufferPlanTest, NoInPlaceForOpsThatReadOtherElements) {
  // Same size and a dying operand, but these kernels read other elements than the one they
  // write (or are library calls without an in-place contract).
  struct Case {
    Opcode op;
    ir::AttrMap attrs;
  };
  std::vector<Case> cases = {
      {Opcode::kTranspose, {{"permutation", std::vector<int64_t>{1, 0}}}},
      {Opcode::kDotGeneral, {}},
      {Opcode::kBroadcastInDim, {}},
      {Opcode::kReduceSum, {}},
      {Opcode::kConvert, {}},
  };
  for (const Case& c : cases) {
    Graph g;
    int p = g.AddNode(Opcode::kParameter, {}, Type{DType::kF32, Shape{8, 8}},
                      {{"index", int64_t{0}}, {"name", "p"}});
    int a = g.AddNode(Opcode::kNeg, {p}, Type{DType::kF32, Shape{8, 8}}, {});
    int b = g.AddNode(c.op, {a}, Type{DType::kF32, Shape{8, 8}}, c.attrs);
    g.AddOutput("b", b);
    BufferPlan plan = PlanBuffers(g);
    EXPECT_NE(plan.offsets[a], plan.offsets[b]) << ir::OpcodeName(c.op);
    EXPECT_EQ(plan.in_place_reuses, 0) << ir::OpcodeName(c.op);
  }
}

TEST(BufferPlanTest, GraphOutputsAreNeverOverwritten) {
  Graph g;
  int p = Param(g, 0, 64);
  int a = Unary(g, p, 64);
  int b = Unary(g, a, 64);  // a's last reader, but a is an output
  g.AddOutput("a", a);
  g.AddOutput("b", b);
  BufferPlan plan = PlanBuffers(g);
  CheckPlan(g, plan);
  EXPECT_NE(plan.offsets[a], plan.offsets[b]);
}

// A hand-made fused kernel: members m1 = add(a, bcast(q)), m2 = mul(m1, c) run as one kernel at
// m2's step, reading a, c and q (through the broadcast's view); only m2 is stored.
TEST(BufferPlanTest, FusedKernelOutputTakesADirectlyReadInput) {
  Graph g;
  int p = Param(g, 0, 64);
  int q = Param(g, 1, 1);
  int a = Unary(g, p, 64);
  int c = Unary(g, p, 64);
  int bq = g.AddNode(
      Opcode::kBroadcastInDim, {q}, Type{DType::kF32, Shape{64}},
      {{"broadcast_dimensions", std::vector<int64_t>{}}, {"shape", std::vector<int64_t>{64}}});
  int m1 = Binary(g, a, bq, 64);
  int m2 = g.AddNode(Opcode::kMul, {m1, c}, Type{DType::kF32, Shape{64}}, {});
  g.AddOutput("y", m2);
  ExecutionPlan s = NodeByNode(g);
  s.step[m1] = m2;
  s.reads[m1] = {a, q};
  s.reads[m2] = {c};
  s.in_arena[m1] = 0;
  s.in_arena[bq] = 0;
  BufferPlan plan = PlanBuffers(g, &s);
  EXPECT_EQ(plan.offsets[m1], -1);
  EXPECT_EQ(plan.offsets[bq], -1);
  EXPECT_EQ(plan.in_place_reuses, 1);
  EXPECT_TRUE(plan.offsets[m2] == plan.offsets[a] || plan.offsets[m2] == plan.offsets[c]);
  EXPECT_NE(plan.offsets[a], plan.offsets[c]);
  EXPECT_EQ(plan.arena_bytes, 2 * 256);
  EXPECT_EQ(plan.lower_bound_bytes, 2 * 256);

  // The same two nodes at one step but one of them a contraction: not a fused loop, no reuse.
  Graph h;
  int hp = h.AddNode(Opcode::kParameter, {}, Type{DType::kF32, Shape{8, 8}},
                     {{"index", int64_t{0}}, {"name", "p"}});
  int ha = h.AddNode(Opcode::kNeg, {hp}, Type{DType::kF32, Shape{8, 8}}, {});
  int hd = h.AddNode(Opcode::kDotGeneral, {ha, ha}, Type{DType::kF32, Shape{8, 8}}, {});
  int hr = h.AddNode(Opcode::kRelu, {hd}, Type{DType::kF32, Shape{8, 8}}, {});
  h.AddOutput("y", hr);
  ExecutionPlan hs;
  hs.step = {0, 1, 3, 3};
  hs.reads = {{}, {hp}, {ha}, {}};
  hs.in_arena = {1, 1, 0, 1};
  BufferPlan hplan = PlanBuffers(h, &hs);
  EXPECT_EQ(hplan.in_place_reuses, 0);
  EXPECT_NE(hplan.offsets[hr], hplan.offsets[ha]);
}

TEST(BufferPlanTest, AnInputReadThroughABroadcastViewIsNeverOverwritten) {
  // m = add(a, bcast(a)) with bcast an identity-shaped view of a: the kernel reads a both
  // directly and through the view, so m must not take a's buffer.
  Graph g;
  int p = Param(g, 0, 64);
  int a = Unary(g, p, 64);
  int ba = g.AddNode(
      Opcode::kBroadcastInDim, {a}, Type{DType::kF32, Shape{64}},
      {{"broadcast_dimensions", std::vector<int64_t>{0}}, {"shape", std::vector<int64_t>{64}}});
  int m = Binary(g, a, ba, 64);
  g.AddOutput("y", m);
  ExecutionPlan s = NodeByNode(g);
  s.reads[m] = {a, a};
  s.in_arena[ba] = 0;
  BufferPlan plan = PlanBuffers(g, &s);
  EXPECT_EQ(plan.in_place_reuses, 0);
  EXPECT_NE(plan.offsets[m], plan.offsets[a]);
}

TEST(BufferPlanTest, FragmentingChainMeetsTheLowerBound) {
  // Best-fit decreasing alone packs these sizes (in 64-byte units) into 10 units; the bound is 8.
  Graph g;
  int x = Param(g, 0, 16);
  for (int units : {3, 4, 4, 2, 4}) x = Unary(g, x, units * 16);
  g.AddOutput("y", x);
  BufferPlan plan = PlanBuffers(g, nullptr, kNoInPlace);
  CheckPlan(g, plan);
  EXPECT_EQ(plan.lower_bound_bytes, 8 * 64);
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
    BufferPlan plan = PlanBuffers(g, nullptr, kNoInPlace);
    CheckPlan(g, plan);
    EXPECT_EQ(plan.arena_bytes, plan.lower_bound_bytes) << "trial " << trial;
    BufferPlan in_place = PlanBuffers(g);
    CheckPlan(g, in_place);
    EXPECT_LE(in_place.lower_bound_bytes, plan.lower_bound_bytes) << "trial " << trial;
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
      // Some ops keep an operand's size so in-place reuse gets exercised.
      int a = pick(), b = pick();
      if (rng() % 2) size = g.node(a).type().shape.num_elements();
      if (rng() % 2)
        Unary(g, a, size);
      else
        Binary(g, a, b, size);
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
  EXPECT_EQ(plan.lower_bound_bytes, 0);
}

TEST(BufferPlanTest, InPlaceColumnIsTheDocumentedRule) {
  // buffer_plan.h's rule, by kernel family (so a new plain op's row is held to it too): what a
  // one-node kernel may overwrite.
  using F = ir::KernelFamily;
  const std::vector<int> none, first = {0}, either = {0, 1};
  for (int i = 0; i < ir::kNumOpcodes; ++i) {
    auto op = static_cast<Opcode>(i);
    const ir::OpInfo& t = ir::OpTraits(op);
    const std::vector<int>* want = &none;
    if (t.family == F::kUnary || (t.family == F::kLogical && t.arity == 1))
      want = &first;
    else if (t.family == F::kBinary)  // oneDNN binary is in place for src0 only
      want = t.alg != ir::EltwiseAlg::kNone ? &first : &either;
    else if (t.family == F::kLogical)
      want = &either;
    else if (t.family == F::kSoftmax)  // every kernel reads a row whole before writing it
      want = &first;
    else if (op == Opcode::kScatterAdd)  // adds the updates into its operand's elements
      want = &first;
    EXPECT_EQ(ir::InPlaceOperands(op), *want) << t.name;
  }
  EXPECT_EQ(ir::InPlaceOperands(Opcode::kExp), first);
  EXPECT_EQ(ir::InPlaceOperands(Opcode::kDiv), first);
  EXPECT_EQ(ir::InPlaceOperands(Opcode::kPow), either);
  EXPECT_EQ(ir::InPlaceOperands(Opcode::kLogicalOr), either);
  EXPECT_EQ(ir::InPlaceOperands(Opcode::kSelect), none);
  EXPECT_EQ(ir::InPlaceOperands(Opcode::kConvert), none);
}

}  // namespace
}  // namespace kiln::compiler

namespace kiln::compiler {
namespace {

bool SharesBytes(const BufferPlan& plan, const ir::Graph& g, int a, int b) {
  const int64_t ea = plan.offsets[a] + g.node(a).type().byte_size();
  const int64_t eb = plan.offsets[b] + g.node(b).type().byte_size();
  return plan.offsets[a] >= 0 && plan.offsets[b] >= 0 && plan.offsets[a] < eb &&
         plan.offsets[b] < ea;
}

// An asynchronous all_reduce %c of %a is in flight from its step until its wait, before %d (its
// first reader): the kernels between (%b, %e) run meanwhile and must not get %a's bytes, which
// the communication thread still reads (and %c's, which it writes). Synchronously, %a dies at %c
// and %b takes its bytes: the test would catch a planner that forgot the window.
TEST(BufferPlanAsync, KernelsInFlightWindowNeverGetTheCollectivesBuffers) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async);
    Graph g;
    const int p = Param(g, 0, 1024);
    const int a = Unary(g, p, 1024);
    const int c = g.AddNode(Opcode::kAllReduce, {a}, Type{DType::kF32, Shape{1024}}, {});
    const int b = Unary(g, p, 1024);
    const int e = Unary(g, b, 1024);
    const int d = Binary(g, c, e, 1024);
    g.AddOutput("d", d);
    BackendTraits traits;
    traits.async_collectives = async;
    ExecutionPlan plan = PlanExecution(g, traits);
    EXPECT_EQ(plan.done_step[c], async ? d : -1);
    BufferPlan bp = PlanBuffers(g, &plan);
    if (!async) {
      EXPECT_TRUE(SharesBytes(bp, g, a, b) || SharesBytes(bp, g, a, e));
      continue;
    }
    for (int k : {b, e}) {
      EXPECT_FALSE(SharesBytes(bp, g, a, k)) << "%" << k << " reuses the operand in flight";
      EXPECT_FALSE(SharesBytes(bp, g, c, k)) << "%" << k << " reuses the result in flight";
    }
  }
}

// A reader of the operand inside the window (%x = neg(%a)) may not take it in place while the
// communication thread reads it; synchronously it does.
TEST(BufferPlanAsync, NoInPlaceReuseOfAnOperandInFlight) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async);
    Graph g;
    const int p = Param(g, 0, 256);
    const int a = Unary(g, p, 256);
    const int c = g.AddNode(Opcode::kAllReduce, {a}, Type{DType::kF32, Shape{256}}, {});
    const int x = Unary(g, a, 256);
    const int d = Binary(g, c, x, 256);
    g.AddOutput("d", d);
    BackendTraits traits;
    traits.async_collectives = async;
    ExecutionPlan plan = PlanExecution(g, traits);
    BufferPlan bp = PlanBuffers(g, &plan);
    EXPECT_EQ(SharesBytes(bp, g, a, x), !async);
    EXPECT_FALSE(SharesBytes(bp, g, a, c));
  }
}

// A collective whose value is a graph output is waited for at the end of the run.
TEST(BufferPlanAsync, AnOutputIsWaitedForAtTheEnd) {
  Graph g;
  const int p = Param(g, 0, 64);
  const int a = Unary(g, p, 64);
  const int c = g.AddNode(Opcode::kAllReduce, {a}, Type{DType::kF32, Shape{64}}, {});
  const int b = Unary(g, p, 64);
  g.AddOutput("c", c);
  g.AddOutput("b", b);
  ExecutionPlan plan = PlanExecution(g, BackendTraits{.async_collectives = true});
  EXPECT_EQ(plan.done_step[c], g.num_nodes());
  EXPECT_EQ(plan.done_step[a], -1);
  BufferPlan bp = PlanBuffers(g, &plan);
  EXPECT_FALSE(SharesBytes(bp, g, a, b));
}

}  // namespace
}  // namespace kiln::compiler
