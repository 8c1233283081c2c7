// A fused program keeps its typed fusion groups (ir/graph.h: ids and kinds) wherever it is stored:
// through the compile cache's disk tier and through an exported artifact.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"
#include "kiln/compiler/artifact.h"
#include "kiln/compiler/cache.h"
#include "kiln/compiler/compile.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

// A matmul with bias and activation, a loop chain with a reduce_sum sink, a convolution with an
// activation, and a plain loop group: one group of every kind once fused.
constexpr char kModel[] = R"(
  graph @model {
    %x = parameter() {index=0, name="x"} : f32[8,16]
    %w = parameter() {index=1, name="w"} : f32[16,4]
    %b = parameter() {index=2, name="b"} : f32[4]
    %img = parameter() {index=3, name="img"} : f32[1,2,5,5]
    %f = parameter() {index=4, name="f"} : f32[3,2,3,3]
    %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[8,4]}
    %d = dot_general(%x, %w) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
    %a = add(%d, %bb)
    %r = relu(%a)
    %e = exp(%r)
    %m = mul(%e, %e)
    %s = reduce_sum(%m) {dimensions=[0]}
    %c = conv2d(%img, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
    %t = tanh(%c)
    %n = neg(%t)
    return s=%s, n=%n, r=%r
  })";

CompileOptions FusingOptions() {
  CompileOptions o;
  o.fuse_loops = true;
  o.pipeline.verify_each_pass = true;
  return o;
}

ir::Graph FusedModel() {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(kModel);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return ir::Graph();
  absl::StatusOr<ir::Graph> fused = Optimize(*g, FusingOptions());
  EXPECT_TRUE(fused.ok()) << fused.status();
  return fused.ok() ? *std::move(fused) : ir::Graph();
}

// The kinds of `g`'s groups, with each group's member opcodes ("matmul_epilogue: dot_general add
// relu").
std::vector<std::string> Groups(const ir::Graph& g) {
  std::vector<std::string> out;
  for (const ir::FusionGroup& group : g.fusion_groups()) {
    std::string s(ir::FusionKindName(group.kind));
    s += ":";
    for (int m : g.FusionMembers(group.id))
      s += " " + std::string(ir::OpcodeName(g.node(m).opcode()));
    out.push_back(s);
  }
  return out;
}

TEST(FusedProgram, HasOneGroupOfEveryKind) {
  ir::Graph g = FusedModel();
  EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  std::vector<std::string> groups = Groups(g);
  std::sort(groups.begin(), groups.end());
  EXPECT_EQ(groups, (std::vector<std::string>{"conv_epilogue: conv2d tanh", "loop: neg",
                                              "matmul_epilogue: dot_general add relu",
                                              "reduction: exp mul reduce_sum"}))
      << ir::PrintGraph(g);
}

TEST(FusedProgram, SurvivesTheCompileCacheDiskTier) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  absl::StatusOr<ir::Graph> input = ir::ParseGraph(kModel);
  ASSERT_TRUE(input.ok()) << input.status();
  ir::Graph stored;
  {
    CompileCache cache({.dir = "/cache", .env = env.get()});
    CacheStats stats;
    absl::StatusOr<ir::Graph> g = cache.GetOrOptimize(*input, FusingOptions(), "test", &stats);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(stats.misses, 1);
    stored = *std::move(g);
  }
  ASSERT_FALSE(stored.fusion_groups().empty());
  CompileCache fresh({.dir = "/cache", .env = env.get()});  // empty memory tier
  CacheStats stats;
  absl::StatusOr<ir::Graph> loaded = fresh.GetOrOptimize(*input, FusingOptions(), "test", &stats);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(stats.disk_hits, 1);
  EXPECT_EQ(loaded->fusion_groups(), stored.fusion_groups());
  EXPECT_EQ(Groups(*loaded), Groups(stored));
  EXPECT_EQ(ir::PrintGraph(*loaded), ir::PrintGraph(stored));
}

TEST(FusedProgram, SurvivesAnArtifactRoundTrip) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ir::Graph program = FusedModel();
  ASSERT_FALSE(program.fusion_groups().empty());
  ASSERT_TRUE(WriteArtifact("/models/m", program, {}, {}, env.get()).ok());
  absl::StatusOr<Artifact> a = LoadArtifact("/models/m", env.get());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->program.fusion_groups(), program.fusion_groups());
  EXPECT_EQ(Groups(a->program), Groups(program));
  EXPECT_EQ(ir::PrintGraph(a->program), ir::PrintGraph(program));
}

}  // namespace
}  // namespace kiln::compiler
