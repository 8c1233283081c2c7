// Tensor parallelism (SPMD) end to end on thread communicators: a global program with annotated
// parameters is partitioned (compiler/passes/spmd_partitioner.h), every rank runs the per-rank
// program on its shards, and the results (outputs, losses, gradients) must match the
// unpartitioned program run in one process within 1e-5 relative.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/autodiff/grad.h"
#include "kiln/base/status.h"
#include "kiln/compiler/passes/spmd_partitioner.h"
#include "kiln/dist/collectives_adapter.h"
#include "kiln/dist/mesh_collectives.h"
#include "kiln/dist/thread_communicator.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/sharding.h"
#include "kiln/nn/gpt.h"
#include "kiln/nn/params.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln {
namespace {

using compiler::sharding::Mesh;

std::unique_ptr<runtime::Backend> MakeBackend(bool cpu) {
  return cpu ? runtime::MakeCpuBackend() : runtime::MakeReferenceBackend();
}

int Count(const ir::Graph& g, ir::Opcode op) {
  int k = 0;
  for (const ir::Node& n : g.nodes()) k += n.opcode() == op;
  return k;
}

struct Partitioned {
  ir::Graph local;
  // Per rank: output name -> value (as the rank computed it; replicated outputs whole).
  std::vector<std::map<std::string, Tensor>> outputs;
};

// Partitions `global` over `ranks` and runs it on that many threads, each feeding its shards of
// `inputs` (by parameter name).
Partitioned RunPartitioned(const ir::Graph& global, const std::map<std::string, Tensor>& inputs,
                           int ranks, bool cpu) {
  Partitioned result;
  const Mesh mesh{"model", ranks};
  absl::StatusOr<ir::Graph> local = compiler::PartitionSpmd(global, {.mesh = mesh});
  EXPECT_TRUE(local.ok()) << local.status();
  if (!local.ok()) return result;
  result.local = *local;
  if (const char* dump = std::getenv("KILN_TP_TEST_DUMP"))
    if (FILE* f = std::fopen(dump, "w")) {
      std::fputs(ir::PrintGraph(result.local).c_str(), f);
      std::fclose(f);
    }
  std::vector<std::unique_ptr<dist::Communicator>> comms =
      dist::MakeThreadCommunicators(ranks, std::chrono::milliseconds(60000));
  result.outputs.resize(ranks);
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<runtime::Backend> backend = MakeBackend(cpu);
      absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = backend->Compile(result.local);
      if (!exe.ok()) {
        status[r] = exe.status();
        return;
      }
      dist::CommunicatorCollectives collectives(*comms[r]);
      (*exe)->set_collectives(&collectives);
      std::map<std::string, Tensor> mine;
      for (const ir::Node& n : global.nodes()) {
        if (n.opcode() != ir::Opcode::kParameter) continue;
        const std::string& name = n.attr_str("name");
        absl::StatusOr<ir::Sharding> s = ir::ShardingOf(n);
        absl::StatusOr<Tensor> shard = compiler::ShardOf(inputs.at(name), *s, mesh, r);
        if (!shard.ok()) {
          status[r] = shard.status();
          return;
        }
        mine[name] = *shard;
      }
      absl::StatusOr<std::map<std::string, Tensor>> out = (*exe)->RunNamed(mine);
      if (!out.ok()) {
        status[r] = out.status();
        return;
      }
      result.outputs[r] = *out;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  return result;
}

std::map<std::string, Tensor> RunOneProcess(const ir::Graph& global,
                                            const std::map<std::string, Tensor>& inputs, bool cpu) {
  std::unique_ptr<runtime::Backend> backend = MakeBackend(cpu);
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = backend->Compile(global);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  absl::StatusOr<std::map<std::string, Tensor>> out = (*exe)->RunNamed(inputs);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::map<std::string, Tensor>{};
}

// max |a - b| over max |b|: the difference on the tensor's own scale (elements near zero, e.g.
// gradient sums that cancel, are not compared to themselves: summing in another order, as the
// per-rank matmuls and the all-reduce do, moves them by rounding alone).
double RelativeDiff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.ToDoubles(), y = b.ToDoubles();
  if (x.size() != y.size()) return INFINITY;
  double scale = 0, worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    scale = std::max(scale, std::fabs(y[i]));
    worst = std::max(worst, std::fabs(x[i] - y[i]));
  }
  return scale == 0 ? worst : worst / scale;
}

// Every rank's outputs equal the one-process outputs within `tol` (and all ranks agree).
void ExpectMatches(const Partitioned& p, const std::map<std::string, Tensor>& want, double tol) {
  ASSERT_FALSE(p.outputs.empty());
  ASSERT_FALSE(want.empty());
  double worst = 0;
  for (const auto& [name, w] : want) {
    for (size_t r = 0; r < p.outputs.size(); ++r) {
      auto it = p.outputs[r].find(name);
      ASSERT_NE(it, p.outputs[r].end()) << name;
      ASSERT_EQ(it->second.shape(), w.shape()) << name;
      const double d = RelativeDiff(it->second, w);
      EXPECT_LE(d, tol) << name << " on rank " << r;
      if (r == 0) worst = std::max(worst, d);
    }
  }
  std::printf("largest relative difference over %zu outputs: %.3g\n", want.size(), worst);
}

std::map<std::string, Tensor> RandomInputs(const ir::Graph& g, uint64_t seed,
                                           const std::map<std::string, Tensor>& fixed = {}) {
  std::vector<nn::ParamSpec> specs;
  for (int id : g.parameters()) {
    const ir::Node& n = g.node(id);
    if (fixed.count(n.attr_str("name"))) continue;
    specs.push_back(
        {n.attr_str("name"), n.type().dtype, n.type().shape, nn::Initializer::Normal(0.5)});
  }
  absl::StatusOr<nn::ParamStore> store = nn::InitParams(specs, seed);
  EXPECT_TRUE(store.ok()) << store.status();
  std::map<std::string, Tensor> out = fixed;
  for (int i = 0; i < store->size(); ++i) out[store->names()[i]] = store->value(i);
  return out;
}

// x -> relu(x w1 + b1) w2 + b2 -> cross-entropy: w1 and b1 split by column, w2 by row.
ir::Graph MlpLossAndGrads() {
  ir::Builder b("mlp");
  ir::Value x = b.Parameter("x", DType::kF32, {8, 16});
  ir::Value w1 = b.Parameter("w1", DType::kF32, {16, 32});
  ir::Value b1 = b.Parameter("b1", DType::kF32, {32});
  ir::Value w2 = b.Parameter("w2", DType::kF32, {32, 10});
  ir::Value b2 = b.Parameter("b2", DType::kF32, {10});
  ir::Value labels = b.Parameter("labels", DType::kS32, {8});
  ir::Value h = ir::Relu(ir::MatMul(x, w1) + ir::BroadcastTo(b1, Shape{8, 32}));
  ir::Value y = ir::MatMul(h, w2) + ir::BroadcastTo(b2, Shape{8, 10});
  ir::Value loss = ir::Mean(ir::SparseCrossEntropy(y, labels), {0});
  b.Output("loss", loss);
  b.Output("y", y);
  absl::StatusOr<ir::Graph> f = b.Build();
  EXPECT_TRUE(f.ok()) << f.status();
  absl::StatusOr<ir::Graph> g = autodiff::Grad(*f, {"w1", "b1", "w2", "b2"}, "loss");
  EXPECT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(compiler::AnnotateParameters(*g, {{"w1", *ir::ParseSharding("[_,model]")},
                                                {"b1", *ir::ParseSharding("[model]")},
                                                {"w2", *ir::ParseSharding("[model,_]")}})
                  .ok());
  return *g;
}

std::map<std::string, Tensor> MlpInputs(const ir::Graph& g) {
  std::vector<int32_t> labels = {0, 3, 9, 2, 5, 5, 1, 7};
  return RandomInputs(g, 7, {{"labels", Tensor::FromVector(Shape{8}, labels)}});
}

class TensorParallel : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(TensorParallel, MlpColumnRowMatchesOneProcess) {
  const auto [ranks, cpu] = GetParam();
  ir::Graph g = MlpLossAndGrads();
  std::map<std::string, Tensor> inputs = MlpInputs(g);
  Partitioned p = RunPartitioned(g, inputs, ranks, cpu);
  ExpectMatches(p, RunOneProcess(g, inputs, cpu), 1e-5);
  // Megatron: one all-reduce in forward (after the row-split matmul) and one in backward (dx
  // of the column-split matmul is not needed: x is no parameter, so none) plus the gradients'
  // own; nothing is all-gathered but the outputs.
  EXPECT_GE(Count(p.local, ir::Opcode::kAllReduce), 1) << ir::PrintGraph(p.local);
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallel,
                         ::testing::Values(std::make_tuple(2, true), std::make_tuple(4, true),
                                           std::make_tuple(2, false)));

nn::GptConfig TinyGpt(int64_t layers) {
  return {.vocab_size = 64, .context = 16, .dim = 32, .layers = layers, .heads = 4, .seq_len = 8};
}

struct GptCase {
  ir::Graph graph;
  std::map<std::string, Tensor> inputs;
};

// The GPT's loss and every parameter's gradient, annotated with the Megatron layouts.
GptCase GptLossAndGrads(int64_t layers, int ranks, int64_t batch) {
  nn::Gpt gpt(TinyGpt(layers));
  GptCase c;
  absl::StatusOr<ir::Graph> loss = gpt.LossGraph(batch);
  EXPECT_TRUE(loss.ok()) << loss.status();
  std::vector<std::string> wrt;
  for (const nn::ParamSpec& s : gpt.Params()) wrt.push_back(s.name);
  absl::StatusOr<ir::Graph> g = autodiff::Grad(*loss, wrt, "loss");
  EXPECT_TRUE(g.ok()) << g.status();
  auto layout = gpt.TensorParallelShardings(ranks);
  EXPECT_TRUE(layout.ok()) << layout.status();
  EXPECT_TRUE(compiler::AnnotateParameters(*g, *layout).ok());
  c.graph = *g;
  absl::StatusOr<nn::ParamStore> params = nn::InitParams(gpt.Params(), 3);
  EXPECT_TRUE(params.ok());
  for (int i = 0; i < params->size(); ++i) {
    // Biases and norms are initialized to constants: randomize them a little so that a wrong
    // layout of them shows.
    Tensor v = params->value(i).Clone();
    for (int64_t k = 0; k < v.num_elements(); ++k)
      v.SetDouble(k, v.GetDouble(k) + 0.01 * std::sin(static_cast<double>(k * 7 + i)));
    c.inputs[params->names()[i]] = v;
  }
  std::vector<int32_t> tokens, targets;
  for (int64_t k = 0; k < batch * 8; ++k) {
    tokens.push_back(static_cast<int32_t>((k * 13 + 5) % 64));
    targets.push_back(static_cast<int32_t>((k * 29 + 3) % 64));
  }
  c.inputs["tokens"] = Tensor::FromVector(Shape{batch, 8}, tokens);
  c.inputs["targets"] = Tensor::FromVector(Shape{batch, 8}, targets);
  return c;
}

TEST(TensorParallelGpt, OneBlockMatchesOneProcessOnFourRanks) {
  GptCase c = GptLossAndGrads(/*layers=*/1, /*ranks=*/4, /*batch=*/2);
  Partitioned p = RunPartitioned(c.graph, c.inputs, 4, /*cpu=*/true);
  ExpectMatches(p, RunOneProcess(c.graph, c.inputs, true), 1e-5);
}

TEST(TensorParallelGpt, TwoLayersMatchOneProcessAndUseMegatronCollectives) {
  GptCase c = GptLossAndGrads(/*layers=*/2, /*ranks=*/2, /*batch=*/2);
  Partitioned p = RunPartitioned(c.graph, c.inputs, 2, /*cpu=*/true);
  ExpectMatches(p, RunOneProcess(c.graph, c.inputs, true), 1e-5);
  // Per rank, the split parameters arrive as local shards.
  const ir::Graph& g = p.local;
  EXPECT_EQ(g.node(g.FindParameter("transformer.h.0.attn.c_attn.weight")).type().ToString(),
            "f32[32,48]");
  EXPECT_EQ(g.node(g.FindParameter("transformer.wte.weight")).type().ToString(), "f32[32,32]");
  EXPECT_EQ(g.node(g.FindParameter("transformer.h.1.mlp.c_proj.weight")).type().ToString(),
            "f32[64,32]");
  // Megatron's communication and nothing else. all_reduce: per block one after each row-split
  // matmul (attention's and the MLP's c_proj) in forward and one for each column-split input's
  // gradient (c_attn's and c_fc's) in backward: 4 x 2 layers; the vocab-parallel embedding 1;
  // the vocab-parallel cross-entropy 3 (max, sum, target logit); its gradient 1 (the target
  // logit again: the gradient is exp(logits - lse), lse = loss + target logit, autodiff's f32
  // form); the LM head's input gradient 1. all_gather: only the outputs (each split
  // parameter's gradient, gathered because this graph returns it whole): 1 + 6 x 2 layers.
  EXPECT_EQ(Count(g, ir::Opcode::kAllReduce), 4 * 2 + 1 + 3 + 1 + 1) << ir::PrintGraph(g);
  EXPECT_EQ(Count(g, ir::Opcode::kAllGather), 1 + 6 * 2);
  EXPECT_EQ(Count(g, ir::Opcode::kReduceScatter), 1);  // the partition id
}

TEST(TensorParallelGpt, LogitsMatchOneProcess) {
  nn::Gpt gpt(TinyGpt(2));
  absl::StatusOr<ir::Graph> g = gpt.PredictGraph(2);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(compiler::AnnotateParameters(*g, *gpt.TensorParallelShardings(2)).ok());
  GptCase c = GptLossAndGrads(2, 2, 2);
  std::map<std::string, Tensor> inputs = c.inputs;
  inputs.erase("targets");
  Partitioned p = RunPartitioned(*g, inputs, 2, /*cpu=*/true);
  ExpectMatches(p, RunOneProcess(*g, inputs, true), 1e-5);
}

// The per-rank collectives themselves: all_gather and reduce_scatter along an inner dim (rank-major
// staging) and all_reduce max over the axis, on 2 thread ranks, both backends.
TEST(ShardCollectives, GatherScatterAndMaxAlongAnInnerDim) {
  for (bool cpu : {true, false}) {
    absl::StatusOr<ir::Graph> g = ir::ParseGraph(R"(
      graph @c {
        %0 = parameter() {index=0, name="x"} : f32[2,4]
        %1 = all_gather(%0) {dimension=1, replicas=2} : f32[2,8]
        %2 = reduce_scatter(%0) {dimension=1, replicas=2} : f32[2,2]
        %3 = all_reduce(%0) {axis="model", reduction="max"} : f32[2,4]
        %4 = all_reduce(%0) {axis="model", reduction="sum"} : f32[2,4]
        return gathered=%1, scattered=%2, max=%3, sum=%4
      })");
    ASSERT_TRUE(g.ok()) << g.status();
    std::vector<std::unique_ptr<dist::Communicator>> comms = dist::MakeThreadCommunicators(2);
    std::vector<std::map<std::string, Tensor>> out(2);
    std::vector<absl::Status> status(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto backend = MakeBackend(cpu);
        auto exe = backend->Compile(*g);
        if (!exe.ok()) {
          status[r] = exe.status();
          return;
        }
        dist::CommunicatorCollectives c(*comms[r]);
        (*exe)->set_collectives(&c);
        std::vector<float> x(8);
        for (int i = 0; i < 8; ++i) x[i] = static_cast<float>(10 * r + i);
        auto o = (*exe)->RunNamed({{"x", Tensor::FromVector(Shape{2, 4}, x)}});
        if (!o.ok()) {
          status[r] = o.status();
          return;
        }
        out[r] = *o;
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_TRUE(status[0].ok()) << status[0];
    ASSERT_TRUE(status[1].ok()) << status[1];
    // rank 0: [[0,1,2,3],[4,5,6,7]]; rank 1: [[10,11,12,13],[14,15,16,17]].
    EXPECT_EQ(out[1]["gathered"].ToDoubles(),
              (std::vector<double>{0, 1, 2, 3, 10, 11, 12, 13, 4, 5, 6, 7, 14, 15, 16, 17}));
    EXPECT_EQ(out[0]["scattered"].ToDoubles(), (std::vector<double>{10, 12, 18, 20}));
    EXPECT_EQ(out[1]["scattered"].ToDoubles(), (std::vector<double>{14, 16, 22, 24}));
    EXPECT_EQ(out[0]["max"].ToDoubles(), (std::vector<double>{10, 11, 12, 13, 14, 15, 16, 17}));
    EXPECT_EQ(out[0]["sum"].ToDoubles(), (std::vector<double>{10, 12, 14, 16, 18, 20, 22, 24}));

    // Without collectives over 2 ranks the run fails, naming the op.
    auto backend = MakeBackend(cpu);
    auto exe = backend->Compile(*g);
    ASSERT_TRUE(exe.ok());
    auto bad = (*exe)->RunNamed({{"x", Tensor(DType::kF32, Shape{2, 4})}});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(bad.status().message().find("all_gather %1: runs over 2 ranks"), std::string::npos)
        << bad.status();
  }
}

// Training: a data x model mesh of TrainSteps on thread ranks against one process with the
// global batch. Data rank d takes rows [d B/D, (d+1) B/D) of every batch.
struct TrainRun {
  std::vector<float> losses;
  nn::ParamStore params;                   // whole tensors after the last step
  dist::MeshCollectives::Traffic traffic;  // of the training steps (before FullParams)
};

// AdamW divides by the root of the squared gradients, so a gradient that is zero in exact
// arithmetic (the key bias: softmax ignores a constant added to every score of a row) gets
// rounding noise amplified into +-lr steps, different noise in any other summation order. Its
// parameters are compared under SGD, where an update is linear in the gradient.
nn::TrainStepOptions Optimizer(bool adamw) {
  nn::TrainStepOptions o;
  o.optimizer.kind = adamw ? nn::OptimizerKind::kAdamW : nn::OptimizerKind::kSgd;
  o.optimizer.schedule.lr = adamw ? 3e-3 : 0.1;
  o.optimizer.clip_norm = 1.0;
  return o;
}

Tensor Rows(const Tensor& t, int part, int parts) {
  const int64_t rows = t.shape().dim(0) / parts;
  std::vector<int64_t> dims = t.shape().dims();
  dims[0] = rows;
  Tensor out(t.dtype(), Shape(dims));
  std::memcpy(out.raw_data(), static_cast<const uint8_t*>(t.raw_data()) + part * out.byte_size(),
              static_cast<size_t>(out.byte_size()));
  return out;
}

std::vector<std::pair<Tensor, Tensor>> Batches(int steps, int64_t batch) {
  std::vector<std::pair<Tensor, Tensor>> out;
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> tokens, targets;
    for (int64_t k = 0; k < batch * 8; ++k) {
      tokens.push_back(static_cast<int32_t>((k * 13 + s * 7 + 5) % 64));
      targets.push_back(static_cast<int32_t>((k * 29 + s * 3 + 1) % 64));
    }
    out.emplace_back(Tensor::FromVector(Shape{batch, 8}, tokens),
                     Tensor::FromVector(Shape{batch, 8}, targets));
  }
  return out;
}

TrainRun TrainOneProcess(int steps, int64_t batch, bool adamw) {
  nn::Gpt gpt(TinyGpt(2));
  std::unique_ptr<runtime::Backend> backend = MakeBackend(true);
  auto step = nn::TrainStep::Create(*backend, *gpt.TrainLossGraph(batch),
                                    *nn::InitParams(gpt.Params(), 5), Optimizer(adamw));
  EXPECT_TRUE(step.ok()) << step.status();
  TrainRun run;
  if (!step.ok()) return run;
  for (const auto& [x, y] : Batches(steps, batch)) {
    absl::StatusOr<nn::StepMetrics> m = (*step)->Run({&x, &y});
    EXPECT_TRUE(m.ok()) << m.status();
    run.losses.push_back(m.ok() ? m->loss : NAN);
  }
  run.params = (*step)->params().Clone();
  return run;
}

// Every rank's losses and rank 0's gathered parameters.
TrainRun TrainMesh(int data, int model, int steps, int64_t batch, bool adamw) {
  const int ranks = data * model;
  std::vector<std::unique_ptr<dist::Communicator>> comms =
      dist::MakeThreadCommunicators(ranks, std::chrono::milliseconds(60000));
  std::vector<TrainRun> runs(ranks);
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  const std::vector<std::pair<Tensor, Tensor>> batches = Batches(steps, batch);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      status[r] = [&]() -> absl::Status {
        nn::Gpt gpt(TinyGpt(2));
        std::unique_ptr<runtime::Backend> backend = MakeBackend(true);
        KILN_ASSIGN_OR_RETURN(std::unique_ptr<dist::MeshCollectives> mesh,
                              dist::MeshCollectives::Create(*comms[r], data, model));
        dist::MeshCollectives& collectives = *mesh;
        nn::TrainStepOptions o = Optimizer(adamw);
        o.data_parallel = data;
        o.model_parallel = model;
        o.model_rank = r % model;
        o.collectives = &collectives;
        KILN_ASSIGN_OR_RETURN(o.shardings, gpt.TensorParallelShardings(model));
        KILN_ASSIGN_OR_RETURN(ir::Graph loss, gpt.TrainLossGraph(batch / data));
        KILN_ASSIGN_OR_RETURN(nn::ParamStore init, nn::InitParams(gpt.Params(), 5));
        KILN_ASSIGN_OR_RETURN(auto step, nn::TrainStep::Create(*backend, loss, std::move(init), o));
        for (const auto& [x, y] : batches) {
          Tensor xs = Rows(x, r / model, data), ys = Rows(y, r / model, data);
          KILN_ASSIGN_OR_RETURN(nn::StepMetrics m, step->Run({&xs, &ys}));
          runs[r].losses.push_back(m.loss);
        }
        runs[r].traffic = mesh->traffic();
        KILN_ASSIGN_OR_RETURN(runs[r].params, step->FullParams());
        // The local shards really are shards.
        const Tensor* w = step->params().Find("transformer.h.0.mlp.c_fc.weight");
        if (w == nullptr || w->shape().dim(1) != 128 / model)
          return absl::InternalError("c_fc.weight is not split");
        return absl::OkStatus();
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(runs[r].losses, runs[0].losses) << "rank " << r;
  return runs[0];
}

void ExpectSameTraining(const TrainRun& got, const TrainRun& want, bool check_params) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  double worst = 0;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    const double d = std::fabs(got.losses[i] - want.losses[i]) / std::fabs(want.losses[i]);
    EXPECT_LE(d, 1e-5) << "step " << i << ": " << got.losses[i] << " vs " << want.losses[i];
    worst = std::max(worst, d);
  }
  double worst_param = 0;
  for (int i = 0; check_params && i < want.params.size(); ++i) {
    const Tensor* g = got.params.Find(want.params.names()[i]);
    ASSERT_NE(g, nullptr) << want.params.names()[i];
    const double d = RelativeDiff(*g, want.params.value(i));
    EXPECT_LE(d, 1e-5) << want.params.names()[i];
    worst_param = std::max(worst_param, d);
  }
  std::printf("largest relative loss difference over %zu steps: %.3g; parameters: %.3g\n",
              want.losses.size(), worst, worst_param);
}

TEST(TensorParallelTraining, ModelTwoTracksOneProcess) {
  ExpectSameTraining(TrainMesh(/*data=*/1, /*model=*/2, /*steps=*/6, /*batch=*/4, false),
                     TrainOneProcess(6, 4, false), /*check_params=*/true);
}

TEST(TensorParallelTraining, DataTwoModelTwoTracksOneProcess) {
  ExpectSameTraining(TrainMesh(/*data=*/2, /*model=*/2, /*steps=*/6, /*batch=*/4, false),
                     TrainOneProcess(6, 4, false), /*check_params=*/true);
}

// The groups of a {data: 2, model: 3} mesh: world rank r is model rank r % 3 of its row and data
// rank r / 3 of its column; each axis reduces over its own group only. A world of the wrong size
// is refused.
TEST(MeshCollectivesTest, EachAxisReducesOverItsOwnGroup) {
  const int data = 2, model = 3, n = data * model;
  std::vector<std::unique_ptr<dist::Communicator>> comms =
      dist::MakeThreadCommunicators(n, std::chrono::milliseconds(5000));
  std::vector<float> along_model(n), along_data(n);
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      status[r] = [&]() -> absl::Status {
        KILN_ASSIGN_OR_RETURN(std::unique_ptr<dist::MeshCollectives> mesh,
                              dist::MeshCollectives::Create(*comms[r], data, model));
        if (mesh->model_rank() != r % model || mesh->data_rank() != r / model ||
            mesh->num_shards() != model || mesh->size() != data)
          return absl::InternalError("wrong coordinates");
        along_model[r] = along_data[r] = static_cast<float>(1 << r);
        KILN_RETURN_IF_ERROR(mesh->ShardAllReduce(&along_model[r], 1, DType::kF32, false));
        return mesh->AllReduceSum(&along_data[r], 1, DType::kF32);
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_EQ(along_model[r], static_cast<float>(7 << (3 * (r / model)))) << "rank " << r;
    EXPECT_EQ(along_data[r], static_cast<float>((1 << (r % model)) + (1 << (r % model + 3))))
        << "rank " << r;
  }
  std::vector<std::unique_ptr<dist::Communicator>> three = dist::MakeThreadCommunicators(3);
  absl::StatusOr<std::unique_ptr<dist::MeshCollectives>> bad =
      dist::MeshCollectives::Create(*three[0], 2, 2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("needs 4 ranks, the world has 3"),
            std::string::npos)
      << bad.status();
}

// One communicator per mesh axis: on {data: 2, model: 2} every model-axis collective runs among 2
// ranks and the gradient all-reduce among 2, where one world all-gather per collective (the
// former MeshCollectives) made every rank receive (N-1) = 3 times each payload.
TEST(TensorParallelTraining, AxisCommunicatorsMoveOnlyTheirGroupsBytes) {
  const int steps = 2;
  TrainRun run = TrainMesh(/*data=*/2, /*model=*/2, steps, /*batch=*/4, false);
  const auto& t = run.traffic;
  ASSERT_GT(t.model.calls, 0);
  ASSERT_GT(t.data.calls, 0);
  const int64_t world_gather = 3 * (t.model.payload_bytes + t.data.payload_bytes);
  const int64_t axes = t.model.received_bytes + t.data.received_bytes;
  std::printf(
      "bytes per step per rank, {data: 2, model: 2}: model axis %lld collectives, %lld payload "
      "bytes; data axis %lld collectives, %lld payload bytes; received %lld (axis communicators) "
      "vs %lld (world all-gathers): %.2fx less\n",
      static_cast<long long>(t.model.calls / steps),
      static_cast<long long>(t.model.payload_bytes / steps),
      static_cast<long long>(t.data.calls / steps),
      static_cast<long long>(t.data.payload_bytes / steps), static_cast<long long>(axes / steps),
      static_cast<long long>(world_gather / steps),
      static_cast<double>(world_gather) / static_cast<double>(axes));
  EXPECT_LT(axes * 2, world_gather);
}

TEST(TensorParallelTraining, AdamWLossesTrackOneProcess) {
  ExpectSameTraining(TrainMesh(/*data=*/2, /*model=*/2, /*steps=*/6, /*batch=*/4, true),
                     TrainOneProcess(6, 4, true), /*check_params=*/false);
}

}  // namespace
}  // namespace kiln
