#include "kiln/compiler/pipeline.h"

#include <stdlib.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/env.h"
#include "kiln/compiler/compile.h"
#include "kiln/compiler/passes/algebraic.h"
#include "kiln/compiler/passes/cse.h"
#include "kiln/compiler/passes/dce.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"

namespace kiln::compiler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

ir::Graph Parse(const char* text) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : ir::Graph();
}

// Needs two rounds of algebraic + cse + dce: CSE merges the two exps, which only then makes
// the select's branches equal for the algebraic pass.
constexpr char kTwoRounds[] = R"(
  graph @g {
    %x = parameter() {index=0, name="x"} : f32[2]
    %p = parameter() {index=1, name="p"} : bool[2]
    %z = constant() {value=0.0} : f32[]
    %zb = broadcast_in_dim(%z) {broadcast_dimensions=[], shape=[2]}
    %a = exp(%x)
    %b = exp(%x)
    %b0 = add(%b, %zb)
    %s = select(%p, %a, %b0)
    %dead = log(%s)
    return s=%s
  })";

constexpr char kTwoRoundsSimplified[] = R"(
  graph @g {
    %0 = parameter() {index=0, name="x"} : f32[2]
    %1 = parameter() {index=1, name="p"} : bool[2]
    %2 = exp(%0)
    return s=%2
  })";

// Sets (or, with null, unsets) an environment variable for one scope, restoring it afterwards: for
// the test that the pipeline ignores the environment.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

PipelineOptions TestOptions() {
  PipelineOptions o;
  o.verify_each_pass = true;
  return o;
}

std::unique_ptr<Pipeline> SimplifyPipeline(PipelineOptions o) {
  auto p = std::make_unique<Pipeline>("test", std::move(o));
  p->AddFixedPointGroup("simplify", MakePasses<AlgebraicSimplifierPass, CsePass, DcePass>());
  return p;
}

// Claims a change for its first `n` runs (without touching the graph).
class CountdownPass : public Pass {
 public:
  explicit CountdownPass(int n) : n_(n) {}
  std::string name() const override { return "countdown"; }
  absl::StatusOr<bool> Run(ir::Graph&) override { return n_-- > 0; }

 private:
  int n_;
};

// Leaves a graph the verifier rejects: the output's declared type is wrong.
class BreakingPass : public Pass {
 public:
  std::string name() const override { return "breaker"; }
  absl::StatusOr<bool> Run(ir::Graph& g) override {
    ir::Graph bad(g.name());
    for (const ir::Node& n : g.nodes())
      bad.AddNode(n.opcode(), n.operands(), n.type(), n.attrs(), n.shared_literal());
    int x = g.outputs()[0].node;
    int y = bad.AddNode(ir::Opcode::kExp, {x}, ir::Type{DType::kF32, Shape{99}}, {});
    bad.AddOutput("broken", y);
    g = std::move(bad);
    return true;
  }
};

class FailingPass : public Pass {
 public:
  std::string name() const override { return "failing"; }
  absl::StatusOr<bool> Run(ir::Graph&) override {
    return absl::UnimplementedError("cannot do that");
  }
};

TEST(Pipeline, FixedPointGroupConverges) {
  auto p = SimplifyPipeline(TestOptions());
  ir::Graph g = Parse(kTwoRounds);
  absl::StatusOr<bool> changed = p->Run(g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(ir::PrintGraph(g), testing::Canonical(kTwoRoundsSimplified));
  // The group record comes first and says how many rounds ran: two that changed, one that
  // confirmed the fixed point.
  const std::vector<PassRecord>& r = p->last_run();
  ASSERT_EQ(r.size(), 1u + 3 * 3);
  EXPECT_EQ(r[0].name, "simplify");
  EXPECT_EQ(r[0].round, 3);
  EXPECT_TRUE(r[0].changed);
  EXPECT_EQ(r[0].nodes_before, 9);
  EXPECT_EQ(r[0].nodes_after, 3);
  EXPECT_EQ(r[1].name, "simplify/algebraic");
  EXPECT_EQ(r[2].name, "simplify/cse");
  EXPECT_EQ(r[3].name, "simplify/dce");
  for (int i = 7; i < 10; ++i) EXPECT_FALSE(r[i].changed) << r[i].name;
  std::printf("%s", p->Summary().c_str());

  // Running again on the result changes nothing.
  changed = p->Run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(p->last_run()[0].round, 1);
}

TEST(Pipeline, FixedPointCountsRoundsAndStopsAtTheLimit) {
  PipelineOptions o = TestOptions();
  o.max_fixed_point_rounds = 5;
  Pipeline p("test", o);
  std::vector<std::unique_ptr<Pass>> group;
  group.push_back(std::make_unique<CountdownPass>(3));
  p.AddFixedPointGroup("loop", std::move(group));
  ir::Graph g = Parse(kTwoRounds);
  ASSERT_TRUE(p.Run(g).ok());
  EXPECT_EQ(p.last_run()[0].round, 4);

  Pipeline q("test", o);
  std::vector<std::unique_ptr<Pass>> forever;
  forever.push_back(std::make_unique<CountdownPass>(1000));
  q.AddFixedPointGroup("loop", std::move(forever));
  absl::StatusOr<bool> c = q.Run(g);
  ASSERT_TRUE(c.ok());  // a warning, not an error
  EXPECT_EQ(q.last_run()[0].round, 5);
}

TEST(Pipeline, DisablePassesByNameFromOptions) {
  PipelineOptions o = TestOptions();
  o.disabled_passes = {"cse"};
  auto p = SimplifyPipeline(o);
  ir::Graph g = Parse(kTwoRounds);
  ASSERT_TRUE(p->Run(g).ok());
  // Without CSE the two exps stay apart, so the select stays too.
  EXPECT_EQ(ir::PrintGraph(g), testing::Canonical(R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = parameter() {index=1, name="p"} : bool[2]
      %2 = exp(%0)
      %3 = exp(%0)
      %4 = select(%1, %2, %3)
      return s=%4
    })"));
  EXPECT_TRUE(p->last_run()[2].skipped);
  EXPECT_EQ(p->last_run()[2].name, "simplify/cse");

  // A whole group by its name.
  o.disabled_passes = {"simplify"};
  auto q = SimplifyPipeline(o);
  ir::Graph h = Parse(kTwoRounds);
  absl::StatusOr<bool> changed = q->Run(h);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(ir::PrintGraph(h), testing::Canonical(kTwoRounds));
  ASSERT_EQ(q->last_run().size(), 1u);
  EXPECT_TRUE(q->last_run()[0].skipped);

  // A typo is an error, not a silently running pass.
  o.disabled_passes = {"cse ", "csee"};
  auto r = SimplifyPipeline(o);
  absl::Status s = r->Run(h).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown pass 'cse '"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("simplify, algebraic, cse, dce"));
}

TEST(Pipeline, DisablePassesFromVariables) {
  PipelineOptions o = TestOptions();
  ASSERT_TRUE(ApplyPipelineVariables({.disable_passes = " cse , ,"}, &o).ok());
  EXPECT_THAT(o.disabled_passes, ElementsAre("cse"));
  auto p = SimplifyPipeline(o);
  ir::Graph g = Parse(kTwoRounds);
  absl::Status s = p->Run(g).status();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(p->last_run()[2].skipped);
  EXPECT_FALSE(p->last_run()[1].skipped);
  EXPECT_EQ(g.num_nodes(), 5);
}

TEST(Pipeline, UnknownPassInVariablesIsAnErrorListingTheKnownOnes) {
  PipelineOptions o = TestOptions();
  absl::Status s = ApplyPipelineVariables({.disable_passes = "cse,csee"}, &o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("KILN_DISABLE_PASSES names unknown pass 'csee'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("(KILN_DISABLE_PASSES=cse,csee)"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the passes are decompose, simplify, algebraic, constant-fold, cse, "
                        "transpose-fold, dce, float-normalization, fusion, remat, schedule, "
                        "overlap-collectives"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("unset KILN_DISABLE_PASSES"));

  // Names of passes another configuration has are accepted (one list, many pipelines): the
  // default pipeline without fusion accepts a disabled fusion pass; a typo lists the passes.
  CompileOptions no_fusion;
  no_fusion.pipeline = TestOptions();
  ASSERT_TRUE(ApplyPipelineVariables({.disable_passes = "fusion"}, &no_fusion.pipeline).ok());
  ir::Graph g = Parse(kTwoRounds);
  EXPECT_TRUE(DefaultPipeline(no_fusion)->Run(g).ok());
  no_fusion.pipeline.disabled_passes = {"fusoin"};
  s = DefaultPipeline(no_fusion)->Run(g).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown pass 'fusoin'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("fusion, remat"));
}

TEST(Pipeline, VariablesSetVerificationAndDumps) {
  PipelineOptions o = TestOptions();
  ASSERT_TRUE(ApplyPipelineVariables({.verify_each_pass = "0", .dump_ir = "/d"}, &o).ok());
  EXPECT_FALSE(o.verify_each_pass);
  EXPECT_EQ(o.dump_dir, "/d");
  ASSERT_TRUE(ApplyPipelineVariables({.verify_each_pass = "1", .dump_ir = "/e"}, &o).ok());
  EXPECT_TRUE(o.verify_each_pass);
  EXPECT_EQ(o.dump_dir, "/d");  // an explicit dump_dir wins
  ASSERT_TRUE(ApplyPipelineVariables({.verify_each_pass = ""}, &o).ok());  // empty: unset
  EXPECT_TRUE(o.verify_each_pass);
  EXPECT_TRUE(o.disabled_passes.empty());
}

// The library reads no environment: only the options (the CLI reads the variables into them).
TEST(Pipeline, TheEnvironmentIsNotRead) {
  ScopedEnv disable("KILN_DISABLE_PASSES", "cse,nosuchpass");
  ScopedEnv verify("KILN_VERIFY_EACH_PASS", "0");
  auto p = SimplifyPipeline(TestOptions());
  ir::Graph g = Parse(kTwoRounds);
  absl::Status s = p->Run(g).status();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(p->last_run()[2].skipped);
  EXPECT_EQ(ir::PrintGraph(g), testing::Canonical(kTwoRoundsSimplified));
  Pipeline breaking("test", TestOptions());
  breaking.Add<BreakingPass>();
  EXPECT_EQ(breaking.Run(g).status().code(), absl::StatusCode::kInternal);
}

class TempDir {
 public:
  TempDir() {
    std::string t = CleanPath(::testing::TempDir() + "/kiln_pipeline_XXXXXX");
    path_ = mkdtemp(t.data()) ? t : "";
  }
  ~TempDir() {
    if (!path_.empty()) (void)Env::Default()->DeleteDir(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Pipeline, DumpsIrBeforeAndAfterEachPass) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::string dir = tmp.path() + "/dumps";  // created by the pipeline
  PipelineOptions o = TestOptions();
  o.dump_dir = dir;
  Pipeline p("test", o);
  p.Add<DcePass>();
  std::vector<std::unique_ptr<Pass>> group;
  group.push_back(std::make_unique<AlgebraicSimplifierPass>());
  group.push_back(std::make_unique<CsePass>());
  p.AddFixedPointGroup("simplify", std::move(group));
  ir::Graph g = Parse(kTwoRounds);
  absl::Status s = p.Run(g).status();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(p.dump_status().ok()) << p.dump_status();

  // One folder for this run, named by a process-wide sequence number and the graph.
  absl::StatusOr<std::vector<std::string>> runs = Env::Default()->GetChildren(dir);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_THAT((*runs)[0], MatchesRegex("[0-9][0-9][0-9][0-9]-g"));
  dir += "/" + (*runs)[0];
  absl::StatusOr<std::vector<std::string>> files = Env::Default()->GetChildren(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  // dce; then the group (rounds: algebraic+cse change, algebraic changes (select), nothing).
  EXPECT_THAT(*files, ElementsAre("000-before-dce.ir", "001-after-dce.ir", "002-before-simplify.ir",
                                  "003-before-simplify.algebraic.ir",
                                  "004-after-simplify.algebraic.ir", "005-before-simplify.cse.ir",
                                  "006-after-simplify.cse.ir", "007-before-simplify.algebraic.ir",
                                  "008-after-simplify.algebraic.ir", "009-before-simplify.cse.ir",
                                  "010-after-simplify.cse.ir", "011-before-simplify.algebraic.ir",
                                  "012-after-simplify.algebraic.ir", "013-before-simplify.cse.ir",
                                  "014-after-simplify.cse.ir", "015-after-simplify.ir"));
  // Each dump is parseable IR; the first is the input, the last the result.
  absl::StatusOr<std::string> first = ReadFileToString(Env::Default(), dir + "/000-before-dce.ir");
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(*first, HasSubstr("# kiln IR dump: before dce, pipeline test, graph g\n"));
  absl::StatusOr<ir::Graph> in = ir::ParseGraph(*first);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(ir::PrintGraph(*in), testing::Canonical(kTwoRounds));
  absl::StatusOr<std::string> mid =
      ReadFileToString(Env::Default(), dir + "/008-after-simplify.algebraic.ir");
  ASSERT_TRUE(mid.ok());
  EXPECT_THAT(*mid, HasSubstr("after simplify/algebraic (round 2)"));
  absl::StatusOr<std::string> last =
      ReadFileToString(Env::Default(), dir + "/015-after-simplify.ir");
  ASSERT_TRUE(last.ok());
  absl::StatusOr<ir::Graph> out = ir::ParseGraph(*last);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(ir::PrintGraph(*out), ir::PrintGraph(g));
}

TEST(Pipeline, EveryRunDumpsIntoItsOwnFolder) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.path() + "/dumps";
  PipelineOptions o = TestOptions();
  o.dump_dir = dir;
  Pipeline p("test", o);
  p.Add<DcePass>();
  // A folder left by an earlier process with the number this run would take next must survive.
  ir::Graph first = Parse(kTwoRounds);
  ASSERT_TRUE(p.Run(first).ok());
  absl::StatusOr<std::vector<std::string>> runs = Env::Default()->GetChildren(dir);
  ASSERT_TRUE(runs.ok() && runs->size() == 1u);
  const int n = std::stoi((*runs)[0].substr(0, 4));
  const std::string squatter = dir + absl::StrFormat("/%04d-g", n + 1);
  ASSERT_TRUE(Env::Default()->CreateDir(squatter).ok());
  ASSERT_TRUE(WriteStringToFile(Env::Default(), "keep", squatter + "/000-before-dce.ir").ok());

  // The same graph again, and a graph whose name needs cleaning for a folder name.
  ir::Graph again = Parse(kTwoRounds);
  ASSERT_TRUE(p.Run(again).ok());
  ir::Graph other = Parse(kTwoRounds);
  other.set_name("my model/v2");
  ASSERT_TRUE(p.Run(other).ok());
  EXPECT_TRUE(p.dump_status().ok()) << p.dump_status();

  runs = Env::Default()->GetChildren(dir);
  ASSERT_TRUE(runs.ok());
  EXPECT_THAT(*runs, ElementsAre(absl::StrFormat("%04d-g", n), absl::StrFormat("%04d-g", n + 1),
                                 absl::StrFormat("%04d-g", n + 2),
                                 absl::StrFormat("%04d-my_model_v2", n + 3)));
  absl::StatusOr<std::string> kept =
      ReadFileToString(Env::Default(), squatter + "/000-before-dce.ir");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "keep");
  for (const std::string& run : *runs) {
    absl::StatusOr<std::vector<std::string>> files = Env::Default()->GetChildren(dir + "/" + run);
    ASSERT_TRUE(files.ok());
    if (run != Basename(squatter)) {
      EXPECT_THAT(*files, ElementsAre("000-before-dce.ir", "001-after-dce.ir"));
    }
  }
  absl::StatusOr<std::string> text = ReadFileToString(
      Env::Default(), dir + absl::StrFormat("/%04d-my_model_v2/000-before-dce.ir", n + 3));
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, HasSubstr("graph my model/v2\n"));
}

TEST(Pipeline, DumpErrorsAreReportedNotFatal) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::string file = tmp.path() + "/a_file";
  ASSERT_TRUE(WriteStringToFile(Env::Default(), "x", file).ok());
  PipelineOptions o = TestOptions();
  o.dump_dir = file + "/dumps";  // under a regular file: cannot be created
  auto p = SimplifyPipeline(o);
  ir::Graph g = Parse(kTwoRounds);
  absl::Status s = p->Run(g).status();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(ir::PrintGraph(g), testing::Canonical(kTwoRoundsSimplified));
  EXPECT_FALSE(p->dump_status().ok());
  EXPECT_THAT(p->dump_status().ToString(), HasSubstr("KILN_DUMP_IR"));
}

TEST(Pipeline, VerifyAfterEachPassCatchesABrokenPass) {
  PipelineOptions o = TestOptions();
  Pipeline p("test", o);
  p.Add<DcePass>();
  p.Add<BreakingPass>();
  p.Add<CsePass>();
  ir::Graph g = Parse(kTwoRounds);
  absl::Status s = p.Run(g).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("pass breaker produced an invalid graph"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("f32[99]"));
  // On error the caller's graph is untouched (not even dce's work shows).
  EXPECT_EQ(ir::PrintGraph(g), testing::Canonical(kTwoRounds));

  // With verification off the broken graph goes through (that is what the option is for).
  o.verify_each_pass = false;
  Pipeline q("test", o);
  q.Add<BreakingPass>();
  EXPECT_TRUE(q.Run(g).ok());
}

TEST(Pipeline, PassErrorsAndInvalidInputs) {
  Pipeline p("test", TestOptions());
  p.Add<DcePass>();
  p.Add<FailingPass>();
  ir::Graph g = Parse(kTwoRounds);
  absl::Status s = p.Run(g).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("pass failing: cannot do that"));
  EXPECT_EQ(ir::PrintGraph(g), testing::Canonical(kTwoRounds));

  ir::Graph bad;
  bad.AddNode(ir::Opcode::kConstant, {}, ir::Type{DType::kF32, Shape{}}, {});  // no literal
  bad.AddOutput("y", 0);
  s = SimplifyPipeline(TestOptions())->Run(bad).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("pipeline test: input graph"));
}

TEST(Pipeline, DefaultPipelineOrder) {
  std::unique_ptr<Pipeline> p = DefaultPipeline();
  EXPECT_EQ(p->name(), "optimize");
  EXPECT_THAT(p->PassNames(), ElementsAre("decompose", "simplify", "algebraic", "constant-fold",
                                          "cse", "transpose-fold", "dce", "schedule"));
  CompileOptions with_fusion;
  with_fusion.fuse_loops = true;
  EXPECT_THAT(DefaultPipeline(with_fusion)->PassNames(),
              ElementsAre("decompose", "simplify", "algebraic", "constant-fold", "cse",
                          "transpose-fold", "dce", "fusion", "schedule"));
  CompileOptions async;
  async.traits.async_collectives = true;  // a backend that overlaps collectives
  EXPECT_THAT(DefaultPipeline(async)->PassNames(),
              ElementsAre("decompose", "simplify", "algebraic", "constant-fold", "cse",
                          "transpose-fold", "dce", "schedule", "overlap-collectives"));
}

}  // namespace
}  // namespace kiln::compiler
