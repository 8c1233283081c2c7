// The default pipeline on a real training step: the autodiff'd MLP (forward, backward and an SGD
// update) must compute the same outputs on the reference backend after optimization, with fewer
// nodes. Node counts are printed for the record.
#include "kiln/compiler/compile.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/autodiff/grad.h"
#include "kiln/autodiff/graph_copy.h"
#include "kiln/base/status.h"
#include "kiln/compiler/passes/decompose.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/sharding.h"
#include "kiln/ir/verifier.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::compiler {
namespace {

using ir::Value;

const std::vector<std::string> kParams = {"w1", "b1", "w2", "b2", "w3", "b3"};

// loss(x, labels; w1..b3) = mean cross-entropy of a 3-layer ReLU MLP (8 -> 16 -> 16 -> 4).
absl::StatusOr<ir::Graph> MlpLoss(DType dt, int64_t batch) {
  ir::Builder b("mlp");
  Value x = b.Parameter("x", dt, {batch, 8});
  Value labels = b.Parameter("labels", DType::kS32, {batch});
  Value w1 = b.Parameter("w1", dt, {8, 16});
  Value b1 = b.Parameter("b1", dt, {16});
  Value w2 = b.Parameter("w2", dt, {16, 16});
  Value b2 = b.Parameter("b2", dt, {16});
  Value w3 = b.Parameter("w3", dt, {16, 4});
  Value b3 = b.Parameter("b3", dt, {4});
  Value h1 = ir::Relu(ir::MatMul(x, w1) + b1);
  Value h2 = ir::Relu(ir::MatMul(h1, w2) + b2);
  Value logits = ir::MatMul(h2, w3) + b3;
  b.Output("loss", ir::Mean(ir::SparseCrossEntropy(logits, labels), {0}));
  return b.Build();
}

// The SGD training step: the loss, the gradients, and p - 0.1 * grad for each parameter.
absl::StatusOr<ir::Graph> TrainStep(DType dt, int64_t batch) {
  KILN_ASSIGN_OR_RETURN(ir::Graph loss, MlpLoss(dt, batch));
  KILN_ASSIGN_OR_RETURN(ir::Graph g, autodiff::Grad(loss, kParams));
  ir::Builder b("train_step");
  KILN_ASSIGN_OR_RETURN(autodiff::ValueMap map, autodiff::CopyGraph(g, b));
  autodiff::CopyOutputs(g, map, b);
  for (const std::string& p : kParams) {
    Value param = map[g.FindParameter(p)];
    Value grad = map[g.outputs()[g.FindOutput("grad/" + p)].node];
    b.Output("new/" + p, param - grad * 0.1);
  }
  return b.Build();
}

std::vector<Tensor> Inputs(const ir::Graph& g, std::mt19937& rng) {
  std::vector<Tensor> in;
  std::uniform_real_distribution<double> u(-1, 1);
  for (int id : g.parameters()) {
    const ir::Type& t = g.node(id).type();
    std::vector<double> v(t.shape.num_elements());
    for (double& x : v) x = t.dtype == DType::kS32 ? static_cast<double>(rng() % 4) : u(rng);
    in.push_back(Tensor::FromDoubles(t.dtype, t.shape, v));
  }
  return in;
}

std::vector<Tensor> RunReference(const ir::Graph& g, const std::vector<Tensor>& in) {
  std::unique_ptr<runtime::Backend> ref = runtime::MakeReferenceBackend();
  auto exe = ref->Compile(g);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  auto out = (*exe)->Run(in);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<Tensor>();
}

CompileOptions TestOptions(bool decompose) {
  CompileOptions o;
  o.pipeline.verify_each_pass = true;
  if (const char* dir = std::getenv("KILN_DUMP_IR")) o.pipeline.dump_dir = dir;  // debugging aid
  if (!decompose) o.keep_composite = [](ir::Opcode) { return true; };
  return o;
}

// Counts nodes by opcode name, for the printed record.
std::string OpHistogram(const ir::Graph& g) {
  std::map<std::string, int> count;
  for (const ir::Node& n : g.nodes()) ++count[std::string(ir::OpcodeName(n.opcode()))];
  std::string s;
  for (const auto& [op, c] : count) s += " " + op + ":" + std::to_string(c);
  return s;
}

void CheckSameOutputs(const ir::Graph& a, const ir::Graph& b, double tol) {
  std::mt19937 rng(42);
  std::vector<Tensor> in = Inputs(a, rng);
  std::vector<Tensor> ya = RunReference(a, in), yb = RunReference(b, in);
  ASSERT_EQ(ya.size(), a.outputs().size());
  ASSERT_EQ(yb.size(), ya.size());
  for (size_t k = 0; k < ya.size(); ++k) {
    ASSERT_EQ(ya[k].dtype(), yb[k].dtype());
    ASSERT_EQ(ya[k].shape(), yb[k].shape());
    for (int64_t i = 0; i < ya[k].num_elements(); ++i) {
      double p = ya[k].GetDouble(i), q = yb[k].GetDouble(i);
      if (tol == 0)
        ASSERT_EQ(p, q) << a.outputs()[k].name << "[" << i << "]";
      else
        ASSERT_NEAR(p, q, tol * (1 + std::fabs(p))) << a.outputs()[k].name << "[" << i << "]";
    }
  }
}

TEST(Optimize, MlpTrainStepKeepingComposites) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    absl::StatusOr<ir::Graph> step = TrainStep(dt, 6);
    ASSERT_TRUE(step.ok()) << step.status();
    auto p = DefaultPipeline(TestOptions(/*decompose=*/false));
    ir::Graph opt = *step;
    ASSERT_TRUE(p->Run(opt).ok());
    std::printf("mlp train step (%s, composites kept): %d -> %d nodes\n",
                std::string(DTypeName(dt)).c_str(), step->num_nodes(), opt.num_nodes());
    std::printf("  before:%s\n  after: %s\n%s", OpHistogram(*step).c_str(),
                OpHistogram(opt).c_str(), p->Summary().c_str());
    EXPECT_LT(opt.num_nodes(), step->num_nodes());
    // Same signature.
    ASSERT_EQ(opt.outputs().size(), step->outputs().size());
    for (size_t k = 0; k < opt.outputs().size(); ++k)
      EXPECT_EQ(opt.outputs()[k].name, step->outputs()[k].name);
    ASSERT_EQ(opt.parameters().size(), step->parameters().size());
    for (size_t i = 0; i < opt.parameters().size(); ++i)
      EXPECT_EQ(opt.node(opt.parameters()[i]).attr_str("name"),
                step->node(step->parameters()[i]).attr_str("name"));
    // Without decomposition every rewrite is exact (up to the sign of zero, which == ignores).
    CheckSameOutputs(*step, opt, 0.0);
  }
}

TEST(Optimize, MlpTrainStepDecomposed) {
  absl::StatusOr<ir::Graph> step = TrainStep(DType::kF64, 6);
  ASSERT_TRUE(step.ok()) << step.status();
  // Decomposition alone, for the record: it adds nodes that simplification then cleans up.
  absl::StatusOr<ir::Graph> decomposed = DecomposeComposites(*step);
  ASSERT_TRUE(decomposed.ok());
  absl::StatusOr<ir::Graph> opt = Optimize(*step, TestOptions(/*decompose=*/true));
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::printf("mlp train step (f64, decomposed): %d nodes, %d after decompose, %d optimized\n",
              step->num_nodes(), decomposed->num_nodes(), opt->num_nodes());
  EXPECT_LT(opt->num_nodes(), decomposed->num_nodes());
  for (const ir::Node& n : opt->nodes()) EXPECT_FALSE(ir::IsComposite(n.opcode()));
  CheckSameOutputs(*step, *opt, 1e-12);
}

TEST(Optimize, EachPassDisabledInTurnStillComputesTheSame) {
  absl::StatusOr<ir::Graph> step = TrainStep(DType::kF64, 4);
  ASSERT_TRUE(step.ok()) << step.status();
  for (const std::string& name : DefaultPipeline()->PassNames()) {
    SCOPED_TRACE("disabled: " + name);
    CompileOptions o = TestOptions(/*decompose=*/true);
    o.pipeline.disabled_passes = {name};
    absl::StatusOr<ir::Graph> opt = Optimize(*step, o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    CheckSameOutputs(*step, *opt, 1e-12);
  }
}

// Compile runs the precision policy first: under mixed_bf16 the matmuls of a forward graph compute
// in bf16 (with optimize off too: the policy is what the program computes), the parameters and
// outputs keep their f32 types, and the result is what ApplyPrecisionPolicy gives.
TEST(Compile, AppliesThePrecisionPolicy) {
  absl::StatusOr<ir::Graph> loss = MlpLoss(DType::kF32, 4);
  ASSERT_TRUE(loss.ok()) << loss.status();
  auto bf16_matmuls = [](const ir::Graph& g) {
    int n = 0;
    for (const ir::Node& node : g.nodes())
      n += node.opcode() == ir::Opcode::kDotGeneral && node.type().dtype == DType::kBF16;
    return n;
  };
  for (bool optimize : {false, true}) {
    SCOPED_TRACE(optimize ? "optimized" : "as given");
    CompileOptions o = TestOptions(/*decompose=*/true);
    o.optimize = optimize;
    absl::StatusOr<CompiledModule> f32 = Compile(*loss, BackendTraits{}, o);
    ASSERT_TRUE(f32.ok()) << f32.status();
    EXPECT_EQ(bf16_matmuls(f32->graph), 0);
    o.program.precision = PrecisionPolicy::kMixedBf16;
    absl::StatusOr<CompiledModule> mixed = Compile(*loss, BackendTraits{}, o);
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    EXPECT_EQ(bf16_matmuls(mixed->graph), 3);
    EXPECT_EQ(mixed->graph.node(mixed->graph.parameters()[2]).type().dtype, DType::kF32);
    EXPECT_EQ(mixed->graph.node(mixed->graph.outputs()[0].node).type().dtype, DType::kF32);
    if (!optimize) {
      absl::StatusOr<ir::Graph> rewritten =
          ApplyPrecisionPolicy(*loss, PrecisionPolicy::kMixedBf16, kParams);
      ASSERT_TRUE(rewritten.ok()) << rewritten.status();
      EXPECT_EQ(ir::PrintGraph(mixed->graph), ir::PrintGraph(*rewritten));
    }
  }
}

TEST(Compile, PrecisionPolicyKeepsF32MasterWeights) {
  absl::StatusOr<ir::Graph> loss = MlpLoss(DType::kF64, 4);
  ASSERT_TRUE(loss.ok()) << loss.status();
  absl::StatusOr<ir::Graph> r = ApplyPrecisionPolicy(*loss, PrecisionPolicy::kBf16, kParams);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("precision bf16 keeps f32 master weights, but parameter "
                                      "'w1' is f64"),
            std::string::npos)
      << r.status();
  // kF32 is no rewrite at all, whatever the dtypes.
  absl::StatusOr<ir::Graph> same = ApplyPrecisionPolicy(*loss, PrecisionPolicy::kF32, kParams);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(ir::PrintGraph(*same), ir::PrintGraph(*loss));
}

// The program pipeline: precision and SPMD partitioning are passes of Compile, listed by name
// (after the optimize passes in AllPassNames), run only where CompileOptions::program asks.
TEST(ProgramPipeline, ListsThePassesTheProgramOptionsChoose) {
  CompileOptions o;
  EXPECT_EQ(ProgramPipeline(o)->name(), "program");
  EXPECT_TRUE(ProgramPipeline(o)->PassNames().empty());
  o.program.precision = PrecisionPolicy::kMixedBf16;
  EXPECT_EQ(ProgramPipeline(o)->PassNames(), std::vector<std::string>({"mixed-precision"}));
  o.program.mesh = {"model", 2};
  EXPECT_EQ(
      ProgramPipeline(o)->PassNames(),
      std::vector<std::string>({"mixed-precision", "sharding-propagation", "spmd-partitioner"}));
  const std::vector<std::string> all = AllPassNames();
  ASSERT_GE(all.size(), 4u);
  EXPECT_EQ(all[0], "decompose");
  EXPECT_EQ(
      std::vector<std::string>(all.end() - 3, all.end()),
      std::vector<std::string>({"mixed-precision", "sharding-propagation", "spmd-partitioner"}));
  // One disabled list serves both pipelines.
  CompileOptions plain;
  plain.pipeline.disabled_passes = {"spmd-partitioner", "cse"};
  EXPECT_TRUE(ProgramPipeline(plain)->CheckDisabledPasses().ok());
  EXPECT_TRUE(DefaultPipeline(plain)->CheckDisabledPasses().ok());
  PipelineOptions from_env;
  EXPECT_TRUE(
      ApplyPipelineVariables({.disable_passes = "mixed-precision,sharding-propagation"}, &from_env)
          .ok());
}

int CountBf16Matmuls(const ir::Graph& g) {
  int n = 0;
  for (const ir::Node& node : g.nodes())
    n += node.opcode() == ir::Opcode::kDotGeneral && node.type().dtype == DType::kBF16;
  return n;
}

TEST(ProgramPipeline, MixedPrecisionCanBeDisabledByName) {
  absl::StatusOr<ir::Graph> loss = MlpLoss(DType::kF32, 4);
  ASSERT_TRUE(loss.ok()) << loss.status();
  for (bool optimize : {false, true}) {
    CompileOptions o = TestOptions(/*decompose=*/true);
    o.optimize = optimize;
    o.program.precision = PrecisionPolicy::kMixedBf16;
    absl::StatusOr<CompiledModule> mixed = Compile(*loss, BackendTraits{}, o);
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    EXPECT_EQ(CountBf16Matmuls(mixed->graph), 3);
    o.pipeline.disabled_passes = {"mixed-precision"};
    absl::StatusOr<CompiledModule> off = Compile(*loss, BackendTraits{}, o);
    ASSERT_TRUE(off.ok()) << off.status();
    EXPECT_EQ(CountBf16Matmuls(off->graph), 0);
  }
  // The master-weight check is the pass's.
  absl::StatusOr<ir::Graph> f64 = MlpLoss(DType::kF64, 4);
  ASSERT_TRUE(f64.ok()) << f64.status();
  CompileOptions o;
  o.program = {.precision = PrecisionPolicy::kBf16, .master_weights = kParams};
  ir::Graph g = *f64;
  absl::Status s = ProgramPipeline(o)->Run(g).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pass mixed-precision: precision bf16 keeps f32 master weights"),
            std::string::npos)
      << s;
}

// x . w1 (w1 split by columns over 2 ranks) . w2 (split by rows): the per-rank program takes
// local shards and all-reduces the partial sum; with either SPMD pass disabled it stays global.
TEST(ProgramPipeline, SpmdPassesPartitionAndCanBeDisabledByName) {
  ir::Builder b("tp_mlp");
  Value x = b.Parameter("x", DType::kF32, {4, 8});
  Value w1 = b.Parameter("w1", DType::kF32, {8, 16});
  Value w2 = b.Parameter("w2", DType::kF32, {16, 8});
  b.Output("y", ir::MatMul(ir::Relu(ir::MatMul(x, w1)), w2));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<ir::Sharding> cols = ir::ParseSharding("[_,model]");
  absl::StatusOr<ir::Sharding> rows = ir::ParseSharding("[model,_]");
  ASSERT_TRUE(cols.ok() && rows.ok());
  auto w1_shape = [](const ir::Graph& graph) {
    return graph.node(graph.FindParameter("w1")).type().shape;
  };
  auto all_reduces = [](const ir::Graph& graph) {
    int n = 0;
    for (const ir::Node& node : graph.nodes()) n += node.opcode() == ir::Opcode::kAllReduce;
    return n;
  };
  for (bool optimize : {false, true}) {
    SCOPED_TRACE(optimize ? "optimized" : "as given");
    CompileOptions o = TestOptions(/*decompose=*/true);
    o.optimize = optimize;
    o.program.mesh = {"model", 2};
    o.program.shardings = {{"w1", *cols}, {"w2", *rows}};
    absl::StatusOr<CompiledModule> local = Compile(*g, BackendTraits{}, o);
    ASSERT_TRUE(local.ok()) << local.status();
    EXPECT_EQ(w1_shape(local->graph), Shape({8, 8}));
    EXPECT_EQ(all_reduces(local->graph), 1);
    for (const char* pass : {"sharding-propagation", "spmd-partitioner"}) {
      SCOPED_TRACE(std::string("disabled: ") + pass);
      CompileOptions off = o;
      off.pipeline.disabled_passes = {pass};
      std::unique_ptr<Pipeline> p = ProgramPipeline(off);
      ir::Graph global = *g;
      ASSERT_TRUE(p->Run(global).ok());
      bool skipped = false;
      for (const PassRecord& r : p->last_run()) skipped = skipped || (r.name == pass && r.skipped);
      EXPECT_TRUE(skipped);
      EXPECT_EQ(w1_shape(global), Shape({8, 16}));
      EXPECT_EQ(all_reduces(global), 0);
    }
  }
}

}  // namespace
}  // namespace kiln::compiler
