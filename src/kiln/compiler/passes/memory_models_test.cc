// Memory of the benchmark training steps (bench/train_bench.cc's models) as the cpu backend
// compiles them: the planned arena against the lower bound (compiler/buffer_plan.h), and what
// rematerialization saves. The numbers are printed for the record.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/base/status.h"
#include "kiln/compiler/buffer_plan.h"
#include "kiln/compiler/passes/schedule.h"
#include "kiln/ir/builder.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/optim.h"
#include "kiln/nn/params.h"
#include "kiln/nn/transformer.h"
#include "kiln/runtime/cpu/cpu_backend.h"

namespace kiln {
namespace {

nn::OptimizerConfig AdamW() {
  nn::OptimizerConfig c;
  c.kind = nn::OptimizerKind::kAdamW;
  c.schedule.lr = 1e-3;
  c.weight_decay_min_rank = 0;
  return c;
}

std::vector<std::string> Names(const std::vector<nn::ParamSpec>& specs) {
  std::vector<std::string> names;
  for (const nn::ParamSpec& s : specs) names.push_back(s.name);
  return names;
}

// 1024 -> 1024 -> 1024 -> 1024 -> 10, ReLU, batch 256, cross-entropy, AdamW.
absl::StatusOr<ir::Graph> MlpTrainStep(DType dt) {
  nn::MlpClassifier mlp({.in_features = 1024,
                         .hidden = {1024, 1024, 1024},
                         .num_classes = 10,
                         .activation = nn::Activation::kRelu,
                         .dtype = dt});
  KILN_ASSIGN_OR_RETURN(ir::Graph loss, mlp.LossGraph(256));
  return nn::BuildTrainStep(loss, Names(mlp.Params()), AdamW());
}

// The same MLP with GELU: its gradient reads the activation's input, so the output is cheaper
// recomputed than kept (remat's case).
absl::StatusOr<ir::Graph> GeluMlpTrainStep(DType dt) {
  nn::MlpClassifier mlp({.in_features = 1024,
                         .hidden = {1024, 1024, 1024},
                         .num_classes = 10,
                         .activation = nn::Activation::kGelu,
                         .dtype = dt});
  KILN_ASSIGN_OR_RETURN(ir::Graph loss, mlp.LossGraph(256));
  return nn::BuildTrainStep(loss, Names(mlp.Params()), AdamW());
}

// A pre-norm encoder layer (d 256, 4 heads, ff 1024, ReLU), sequence 128, batch 32, MSE, AdamW.
absl::StatusOr<ir::Graph> EncoderTrainStep(DType dt) {
  nn::TransformerBlock block("enc",
                             {.dim = 256,
                              .num_heads = 4,
                              .mlp_hidden = 1024,
                              .fused_qkv = true,
                              .activation = nn::Activation::kRelu,
                              .norm_epsilon = 1e-5},
                             /*dropout_site=*/0, dt);
  KILN_RETURN_IF_ERROR(block.Validate());
  ir::Builder b("encoder_loss");
  nn::ParamValues p = nn::AddParameters(b, block.Params());
  ir::Value x = b.Parameter("x", dt, {32, 128, 256});
  ir::Value y = block.Apply(p, x, nn::RngInputs{});
  ir::Value t = b.Parameter("target", dt, {32, 128, 256});
  ir::Value d = ir::Convert(y - t, DType::kF32);
  b.Output("loss", ir::Mean(d * d, {0, 1, 2}));
  KILN_ASSIGN_OR_RETURN(ir::Graph loss, b.Build());
  return nn::BuildTrainStep(loss, Names(block.Params()), AdamW());
}

double MiB(int64_t b) { return b / 1048576.0; }

struct Workload {
  const char* name;
  absl::StatusOr<ir::Graph> (*build)(DType);
  DType dtype;
};
const Workload kWorkloads[] = {{"mlp_train_f32", MlpTrainStep, DType::kF32},
                               {"mlp_train_bf16", MlpTrainStep, DType::kBF16},
                               {"encoder_train_f32", EncoderTrainStep, DType::kF32},
                               {"encoder_train_bf16", EncoderTrainStep, DType::kBF16}};

TEST(MemoryModels, ArenaIsWithinTenPercentOfTheLowerBound) {
  std::unique_ptr<runtime::Backend> cpu = runtime::MakeCpuBackend({.use_compile_cache = false});
  for (const Workload& w : kWorkloads) {
    SCOPED_TRACE(w.name);
    absl::StatusOr<ir::Graph> g = w.build(w.dtype);
    ASSERT_TRUE(g.ok()) << g.status();
    absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = cpu->Compile(*g);
    ASSERT_TRUE(exe.ok()) << exe.status();
    const compiler::BufferPlan& plan = (*exe)->plan();
    std::printf(
        "%-20s arena %7.2f MiB, lower bound %7.2f MiB (x%.3f), %d in-place reuses, "
        "%d nodes\n",
        w.name, MiB(plan.arena_bytes), MiB(plan.lower_bound_bytes),
        static_cast<double>(plan.arena_bytes) / plan.lower_bound_bytes, plan.in_place_reuses,
        (*exe)->graph().num_nodes());
    EXPECT_LE(plan.lower_bound_bytes, plan.arena_bytes);
    EXPECT_LE(plan.arena_bytes, plan.lower_bound_bytes * 1.10);
    // One plan, read by all: the peak the schedule pass minimized is the lower bound of the
    // executable's arena before in-place reuse, and the executable's arena is the plan's.
    const ir::Graph& graph = (*exe)->graph();
    compiler::BackendTraits traits = runtime::CpuBackendTraits();
    compiler::ExecutionPlan ep = compiler::PlanExecution(graph, traits);
    int64_t predicted = compiler::PeakLiveBytes(graph, traits);
    EXPECT_EQ(predicted, compiler::PlanBuffers(graph, &ep, {.in_place = false}).lower_bound_bytes);
    EXPECT_LE(plan.lower_bound_bytes, predicted);
    EXPECT_EQ(plan.arena_bytes, compiler::PlanBuffers(graph, &ep).arena_bytes);
    std::printf("%-20s schedule's predicted peak %7.2f MiB\n", w.name, MiB(predicted));
  }
}

TEST(MemoryModels, RematNeverGrowsTheArenaOfATrainStep) {
  std::unique_ptr<runtime::Backend> plain = runtime::MakeCpuBackend({.use_compile_cache = false});
  std::unique_ptr<runtime::Backend> remat =
      runtime::MakeCpuBackend({.use_compile_cache = false, .remat = true});
  const Workload gelu{"gelu_mlp_train_f32", GeluMlpTrainStep, DType::kF32};
  for (const Workload& w : {kWorkloads[0], kWorkloads[2], gelu}) {
    SCOPED_TRACE(w.name);
    absl::StatusOr<ir::Graph> g = w.build(w.dtype);
    ASSERT_TRUE(g.ok()) << g.status();
    absl::StatusOr<std::unique_ptr<runtime::Executable>> a = plain->Compile(*g);
    absl::StatusOr<std::unique_ptr<runtime::Executable>> b = remat->Compile(*g);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    std::printf("%-20s arena %7.2f MiB, with remat %7.2f MiB (%d -> %d nodes)\n", w.name,
                MiB((*a)->plan().arena_bytes), MiB((*b)->plan().arena_bytes),
                (*a)->graph().num_nodes(), (*b)->graph().num_nodes());
    EXPECT_LE((*b)->plan().arena_bytes, (*a)->plan().arena_bytes);
  }
}

}  // namespace
}  // namespace kiln
