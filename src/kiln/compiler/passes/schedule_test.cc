#include "kiln/compiler/passes/schedule.h"

#include <random>

#include "gtest/gtest.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

using testing::ExpectRewrite;
using testing::ExpectUnchanged;

ir::Graph Parse(const std::string& text) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : ir::Graph();
}

// Two big temporaries each reduced to a scalar: computing both before either reduction keeps
// both alive (8 KiB); finishing one chain first needs half.
constexpr char kTwoChains[] = R"(
  graph @g {
    %x = parameter() {index=0, name="x"} : f32[1024]
    %a = exp(%x)
    %b = exp(%x)
    %ra = reduce_sum(%a) {dimensions=[0]}
    %rb = reduce_sum(%b) {dimensions=[0]}
    %y = add(%ra, %rb)
    return y=%y
  })";

TEST(Schedule, FinishesOneChainBeforeStartingTheNext) {
  SchedulePass pass;
  ExpectRewrite(pass, kTwoChains, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[1024]
      %a = exp(%x)
      %ra = reduce_sum(%a) {dimensions=[0]}
      %b = exp(%x)
      %rb = reduce_sum(%b) {dimensions=[0]}
      %y = add(%ra, %rb)
      return y=%y
    })");
}

TEST(Schedule, StrictlyLowersThePeakAndReportsIt) {
  ir::Graph g = Parse(kTwoChains);
  EXPECT_EQ(PeakLiveBytes(g), 4096 + 4096 + 64);  // a, b and ra live at ra's step
  SchedulePass pass;
  absl::StatusOr<bool> changed = pass.Run(g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(PeakLiveBytes(g), 4096 + 64 + 64);  // b, ra and rb at rb's step
  EXPECT_EQ(pass.last_report().input_peak_bytes, 4096 + 4096 + 64);
  EXPECT_EQ(pass.last_report().peak_bytes, 4096 + 64 + 64);
  EXPECT_NE(pass.last_report().chosen, "input");
}

TEST(Schedule, KeepsAnOrderThatIsAlreadyBest) {
  // %a is an output (it lives to the end), so it is best made last.
  SchedulePass pass;
  ExpectUnchanged(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[1024]
      %b = neg(%x)
      %rb = reduce_sum(%b) {dimensions=[0]}
      %a = exp(%x)
      %ra = reduce_sum(%a) {dimensions=[0]}
      %y = add(%ra, %rb)
      return y=%y, a=%a
    })");
}

TEST(Schedule, KeepsFusionGroupsContiguousAndModelsThem) {
  // Each chain's fused pair stores only its last member; the scheduler moves whole groups.
  constexpr char kInput[] = R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[1024]
      %a = exp(%x)
      %b = exp(%x)
      %fa1 = mul(%a, %a) {fusion=0}
      %fa2 = add(%fa1, %a) {fusion=0}
      %fb1 = mul(%b, %b) {fusion=1}
      %fb2 = add(%fb1, %b) {fusion=1}
      %ra = reduce_sum(%fa2) {dimensions=[0]}
      %rb = reduce_sum(%fb2) {dimensions=[0]}
      %y = add(%ra, %rb)
      return y=%y
    })";
  // b, fa2 and fb2 live at group 1's step (the fused intermediates fa1/fb1 are never stored).
  EXPECT_EQ(PeakLiveBytes(Parse(kInput)), 3 * 4096);
  SchedulePass pass;
  ExpectRewrite(pass, kInput, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[1024]
      %a = exp(%x)
      %fa1 = mul(%a, %a) {fusion=0}
      %fa2 = add(%fa1, %a) {fusion=0}
      %ra = reduce_sum(%fa2) {dimensions=[0]}
      %b = exp(%x)
      %fb1 = mul(%b, %b) {fusion=1}
      %fb2 = add(%fb1, %b) {fusion=1}
      %rb = reduce_sum(%fb2) {dimensions=[0]}
      %y = add(%ra, %rb)
      return y=%y
    })");
}

TEST(Schedule, MatmulEpilogueGroupsMoveAsOneKernel) {
  // dot + bias + gelu + residual carry one `fusion` value (a matmul with post-ops): the
  // scheduler never puts anything between them, and only the group's result is stored.
  constexpr char kInput[] = R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[8,32]
      %w = parameter() {index=1, name="w"} : f32[32,32]
      %b = parameter() {index=2, name="b"} : f32[32]
      %r = parameter() {index=3, name="r"} : f32[8,32]
      %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[8,32]}
      %d = dot_general(%x, %w) {fusion=0, lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %a = add(%d, %bb) {fusion=0}
      %g = gelu(%a) {approximate="none", fusion=0}
      %y = add(%g, %r) {fusion=0}
      %e = exp(%x)
      %s = reduce_sum(%e) {dimensions=[0, 1]}
      return y=%y, s=%s
    })";
  ir::Graph g = Parse(kInput);
  EXPECT_EQ(PeakLiveBytes(g), 1024 + 1024 + 64);  // y, e and s at s's step
  SchedulePass pass;
  absl::StatusOr<bool> changed = pass.Run(g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(PeakLiveBytes(g), 1024 + 64);  // the reduction first, then the group
  std::vector<int> members;
  for (const ir::Node& n : g.nodes())
    if (n.has_attr("fusion")) members.push_back(n.id());
  ASSERT_EQ(members.size(), 4u);
  EXPECT_EQ(members.back() - members.front(), 3);  // contiguous
  EXPECT_EQ(g.node(members[0]).opcode(), ir::Opcode::kDotGeneral);
  EXPECT_EQ(g.node(members[2]).opcode(), ir::Opcode::kGelu);
}

// A group that is not contiguous is not valid IR (the verifier and the parser reject it), but a
// graph assembled by hand may carry one: the schedule pass leaves such a graph as it is.
TEST(Schedule, LeavesNonContiguousGroupsAlone) {
  ir::Graph plain = Parse(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[1024]
      %a = exp(%x)
      %b = exp(%x)
      %m1 = mul(%a, %a)
      %n = neg(%b)
      %m2 = add(%m1, %a)
      %ra = reduce_sum(%m2) {dimensions=[0]}
      %rb = reduce_sum(%n) {dimensions=[0]}
      %y = add(%ra, %rb)
      return y=%y
    })");
  ir::Graph g(plain.name());
  for (const ir::Node& n : plain.nodes()) {
    ir::AttrMap attrs = n.attrs();
    if (n.id() == 3 || n.id() == 5) attrs[ir::kFusionAttr] = int64_t{0};  // %m1 and %m2
    g.AddNode(n.opcode(), n.operands(), n.type(), std::move(attrs), n.shared_literal());
  }
  for (const ir::Output& o : plain.outputs()) g.AddOutput(o.name, o.node);
  g.AddFusionGroup({0, ir::FusionKind::kLoop});
  EXPECT_FALSE(ir::Verify(g).ok());
  const std::string before = ir::PrintGraph(g);
  SchedulePass pass;
  absl::StatusOr<bool> changed = pass.Run(g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  EXPECT_EQ(ir::PrintGraph(g), before);
}

TEST(Schedule, BroadcastsReadOnlyByFusedMembersAreViews) {
  ir::Graph g = Parse(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[1024]
      %s = parameter() {index=1, name="s"} : f32[]
      %e = exp(%x)
      %bs = broadcast_in_dim(%s) {broadcast_dimensions=[], shape=[1024]}
      %m = mul(%e, %bs) {fusion=0}
      %n = neg(%bs)
      return y=%m, z=%n
    })");
  // bs is stored (neg reads it directly): e, bs and m live at m's step.
  EXPECT_EQ(PeakLiveBytes(g), 3 * 4096);
  ir::Graph h = Parse(R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[1024]
      %s = parameter() {index=1, name="s"} : f32[]
      %e = exp(%x)
      %bs = broadcast_in_dim(%s) {broadcast_dimensions=[], shape=[1024]}
      %m = mul(%e, %bs) {fusion=0}
      return y=%m
    })");
  EXPECT_EQ(PeakLiveBytes(h), 2 * 4096);  // e and m; the broadcast is a view
}

TEST(Schedule, ReorderNodesRejectsBadOrders) {
  ir::Graph g = Parse(kTwoChains);
  EXPECT_FALSE(ReorderNodes(g, {0, 1, 2}).ok());           // too short
  EXPECT_FALSE(ReorderNodes(g, {0, 1, 1, 3, 4, 5}).ok());  // repeated
  EXPECT_FALSE(ReorderNodes(g, {0, 3, 1, 2, 4, 5}).ok());  // %ra before %a
  absl::StatusOr<ir::Graph> ok = ReorderNodes(g, {0, 2, 1, 4, 3, 5});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ir::Verify(*ok).ok());
}

// Random DAGs of elementwise ops, reductions and broadcasts: the result is valid, never has a
// higher peak, and a second run changes nothing.
TEST(Schedule, RandomGraphsNeverGetWorse) {
  std::mt19937 rng(11);
  int improved = 0;
  for (int trial = 0; trial < 60; ++trial) {
    ir::Builder b("r");
    std::vector<ir::Value> big = {b.Parameter("x", DType::kF32, {256})};
    std::vector<ir::Value> small;
    int ops = 5 + rng() % 25;
    for (int i = 0; i < ops; ++i) {
      auto pick = [&](std::vector<ir::Value>& v) {
        return rng() % 3 ? v[v.size() - 1 - rng() % std::min<size_t>(v.size(), 3)]
                         : v[rng() % v.size()];
      };
      switch (rng() % 5) {
        case 0:
          big.push_back(ir::Exp(pick(big)));
          break;
        case 1:
          big.push_back(pick(big) + pick(big));
          break;
        case 2:
          small.push_back(ir::ReduceSum(pick(big), {0}));
          break;
        case 3:
          if (!small.empty()) big.push_back(pick(big) * ir::BroadcastInDim(pick(small), {256}, {}));
          break;
        default:
          big.push_back(-pick(big));
      }
    }
    b.Output("y", big.back());
    if (!small.empty()) b.Output("s", small.back());
    absl::StatusOr<ir::Graph> g = b.Build();
    ASSERT_TRUE(g.ok()) << g.status();
    int64_t before = PeakLiveBytes(*g);
    SchedulePass pass;
    absl::StatusOr<bool> changed = pass.Run(*g);
    ASSERT_TRUE(changed.ok()) << changed.status();
    ASSERT_TRUE(ir::Verify(*g).ok()) << "trial " << trial;
    int64_t after = PeakLiveBytes(*g);
    EXPECT_LE(after, before) << "trial " << trial;
    EXPECT_EQ(after, pass.last_report().peak_bytes);
    if (*changed) EXPECT_LT(after, before) << "trial " << trial;
    improved += after < before;
    absl::StatusOr<bool> again = pass.Run(*g);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(*again) << "trial " << trial << " is not idempotent";
  }
  EXPECT_GT(improved, 0);
}

BackendTraits AsyncTraits() {
  BackendTraits t;
  t.async_collectives = true;
  return t;
}

// Two buckets: the all-reduce of %u1 starts right after %u1, before the rest of the backward
// pass (%g2, %g3), so it is in flight while they run; the reader of both (%v) and what follows
// stay after every kernel that reads no reduced value.
TEST(OverlapCollectives, StartsEachBucketEarlyAndReadsItLate) {
  OverlapCollectivesPass pass(AsyncTraits());
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[64]
      %w = parameter() {index=1, name="w"} : f32[64]
      %g1 = mul(%x, %w)
      %u1 = mul(%g1, %x)
      %g2 = exp(%x)
      %g3 = exp(%g2)
      %r2 = all_reduce(%g3) {reduction="sum"}
      %r1 = all_reduce(%u1) {reduction="sum"}
      %v = add(%r1, %r2)
      %z = add(%v, %w)
      return z=%z, loss=%g2
    })",
                R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[64]
      %w = parameter() {index=1, name="w"} : f32[64]
      %g1 = mul(%x, %w)
      %u1 = mul(%g1, %x)
      %r1 = all_reduce(%u1) {reduction="sum"}
      %g2 = exp(%x)
      %g3 = exp(%g2)
      %r2 = all_reduce(%g3) {reduction="sum"}
      %v = add(%r1, %r2)
      %z = add(%v, %w)
      return z=%z, loss=%g2
    })");
}

// A bucket of two gradients: the reshapes and the concatenation that assemble it move up with
// its all-reduce; the slices that read it move down, after the independent %h.
TEST(OverlapCollectives, MovesTheBucketsAssemblyAndDefersItsReaders) {
  OverlapCollectivesPass pass(AsyncTraits());
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2,4]
      %y = parameter() {index=1, name="y"} : f32[8]
      %a = exp(%x)
      %b = exp(%y)
      %h = exp(%b)
      %ra = reshape(%a) {shape=[8]}
      %cat = concatenate(%ra, %b) {dimension=0}
      %s = all_reduce(%cat) {reduction="sum"}
      %s0 = slice(%s) {start=[0], limit=[8], stride=[1]}
      %k = exp(%h)
      %out = add(%s0, %k)
      return out=%out
    })",
                R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2,4]
      %y = parameter() {index=1, name="y"} : f32[8]
      %a = exp(%x)
      %ra = reshape(%a) {shape=[8]}
      %b = exp(%y)
      %cat = concatenate(%ra, %b) {dimension=0}
      %s = all_reduce(%cat) {reduction="sum"}
      %h = exp(%b)
      %k = exp(%h)
      %s0 = slice(%s) {start=[0], limit=[8], stride=[1]}
      %out = add(%s0, %k)
      return out=%out
    })");
}

// Only the data-parallel all-reduce is asynchronous: an all_reduce over a mesh axis (the SPMD
// partitioner's) is read at once and moves nothing; without async traits the pass is not in the
// pipeline, and a graph without collectives is left alone.
TEST(OverlapCollectives, LeavesOtherCollectivesAndPlainGraphsAlone) {
  OverlapCollectivesPass pass(AsyncTraits());
  ExpectUnchanged(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[64]
      %g1 = exp(%x)
      %g2 = exp(%x)
      %r = all_reduce(%g2) {reduction="sum", axis="model"}
      %u = add(%r, %g1)
      return u=%u
    })");
  ExpectUnchanged(pass, kTwoChains);
}

}  // namespace
}  // namespace kiln::compiler
