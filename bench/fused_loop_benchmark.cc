// The cpu backend's fused loop kernels (runtime/cpu/fused_loop.cc) on the memory-bound groups of a
// GPT-2-small train step, against memcpy bandwidth measured in the same run (DESIGN.md §5):
//   adamw_l2     the same over [128,256], in cache: what the ops alone cost
//   adamw        the AdamW update of nn/optim.cc over [3072,768] (4 tensors in, 3 out), outputs
//                in separate tensors and in place of p, m, v (as the train step runs it)
//   layernorm    (x - mean) * rstd * gamma + beta over [4,128,768]: per-row [4,128] (column
//                views) and per-feature [768] (row views) broadcasts, 2 outputs
//   rowreduce    d = x - mean, sum(d * d) over the last dim: a column-view reduction
//   xent_grad    p * scale - onehot over [4,128,50257] with [4,128] and [50257] broadcasts
//   sumsq        sum(g * g) over [50257,768] into one value: the clipping norm of the embedding
//   xent         cross_entropy over [4,128,50257] logits (log-sum-exp per row minus the label's)
//   xent_train   the mean loss and its logits gradient as autodiff writes them (the train step's
//                LM-head loss: cross_entropy, then exp(logits - lse) - onehot in one fused pass);
//                bytes counted: the logits read once and the gradient written once
//   gelu         GELU (tanh form) over the MLP's [4,128,3072] activations
//   gelu_grad    its backward as autodiff writes it, with the bias gradient's column sum
//   *_l2         xent, xent_train and gelu_grad on few enough rows to stay in L2: a kernel that
//                is no faster there is bound by its arithmetic (the exp / tanh per element), not
//                by memory
// Prints per kernel the median time, GB/s of the bytes it reads and writes, and that as a share of
// memcpy (median of the measurements taken between kernels).
//
//   fused_loop_benchmark [--threads=2] [--reps=20] [--only=name]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "kiln/autodiff/grad.h"
#include "kiln/base/memory.h"
#include "kiln/base/status.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/cpu/cpu_backend.h"

namespace kiln {
namespace {

using ir::Value;

using bench::Median;
using bench::Seconds;

struct Case {
  std::string name;
  ir::Graph graph;
  // Output k is written over input in_place[k] (or a fresh tensor when -1).
  std::vector<int> in_place;
};

ir::Graph AdamW(int64_t r, int64_t c) {
  ir::Builder b("adamw");
  Value p = b.Parameter("p", DType::kF32, {r, c});
  Value g = b.Parameter("g", DType::kF32, {r, c});
  Value m0 = b.Parameter("m", DType::kF32, {r, c});
  Value v0 = b.Parameter("v", DType::kF32, {r, c});
  Value decay = b.Parameter("decay", DType::kF32, {});
  Value step_size = b.Parameter("step_size", DType::kF32, {});
  Value bc2_sqrt = b.Parameter("bc2_sqrt", DType::kF32, {});
  Value pd = p * decay;
  Value m = m0 * 0.9 + g * (1.0 - 0.9);
  Value v = v0 * 0.999 + g * g * (1.0 - 0.999);
  Value denom = ir::Sqrt(v) / bc2_sqrt + 1e-8;
  // In place of p, m and v, as nn/optim.cc declares them (used when the bench passes them).
  b.Output("p", pd - step_size * (m / denom), p);
  b.Output("m", m, m0);
  b.Output("v", v, v0);
  return b.Build().value();
}

ir::Graph LayerNorm(int64_t b0, int64_t b1, int64_t d) {
  ir::Builder b("layernorm");
  Value x = b.Parameter("x", DType::kF32, {b0, b1, d});
  Value mean = b.Parameter("mean", DType::kF32, {b0, b1});
  Value rstd = b.Parameter("rstd", DType::kF32, {b0, b1});
  Value gamma = b.Parameter("gamma", DType::kF32, {d});
  Value beta = b.Parameter("beta", DType::kF32, {d});
  Shape s{b0, b1, d};
  Value xhat = (x - ir::BroadcastInDim(mean, s, {0, 1})) * ir::BroadcastInDim(rstd, s, {0, 1});
  b.Output("xhat", xhat);
  b.Output("y", xhat * ir::BroadcastInDim(gamma, s, {2}) + ir::BroadcastInDim(beta, s, {2}));
  return b.Build().value();
}

ir::Graph RowReduce(int64_t b0, int64_t b1, int64_t d) {
  ir::Builder b("rowreduce");
  Value x = b.Parameter("x", DType::kF32, {b0, b1, d});
  Value mean = b.Parameter("mean", DType::kF32, {b0, b1});
  Value dx = x - ir::BroadcastInDim(mean, Shape{b0, b1, d}, {0, 1});
  b.Output("d", dx);
  b.Output("var", ir::ReduceSum(dx * dx, {2}));
  return b.Build().value();
}

// The squared norm of one gradient, as gradient clipping sums it: a read-only stream into one f32.
ir::Graph SumSquares(int64_t r, int64_t c) {
  ir::Builder b("sumsq");
  Value g = b.Parameter("g", DType::kF32, {r, c});
  b.Output("sumsq", ir::ReduceSum(g * g, {0, 1}));
  return b.Build().value();
}

// The LM head's loss: log-sum-exp of each [vocab] row minus the label's logit (one read).
ir::Graph Xent(int64_t b0, int64_t b1, int64_t v) {
  ir::Builder b("xent");
  Value logits = b.Parameter("logits", DType::kF32, {b0, b1, v});
  Value labels = b.Parameter("labels", DType::kS32, {b0, b1});
  b.Output("loss", ir::SparseCrossEntropy(logits, labels));
  return b.Build().value();
}

// The LM head's loss as the train step differentiates it: mean cross-entropy and d/dlogits.
ir::Graph XentTrain(int64_t b0, int64_t b1, int64_t v) {
  ir::Builder b("xent_train");
  Value logits = b.Parameter("logits", DType::kF32, {b0, b1, v});
  Value labels = b.Parameter("labels", DType::kS32, {b0, b1});
  b.Output("loss", ir::ReduceSum(ir::SparseCrossEntropy(logits, labels), {0, 1}) *
                       (1.0 / static_cast<double>(b0 * b1)));
  return autodiff::Grad(b.Build().value(), {"logits"}).value();
}

ir::Graph XentGrad(int64_t b0, int64_t b1, int64_t v) {
  ir::Builder b("xent_grad");
  Value p = b.Parameter("p", DType::kF32, {b0, b1, v});
  Value scale = b.Parameter("scale", DType::kF32, {b0, b1});
  Value onehot = b.Parameter("onehot", DType::kF32, {v});
  Shape s{b0, b1, v};
  b.Output("dlogits",
           p * ir::BroadcastInDim(scale, s, {0, 1}) - ir::BroadcastInDim(onehot, s, {2}));
  return b.Build().value();
}

// The MLP's activation, GELU (tanh form), forward over [4,128,3072]: one read, one write.
ir::Graph Gelu(int64_t b0, int64_t b1, int64_t d) {
  ir::Builder b("gelu");
  Value x = b.Parameter("x", DType::kF32, {b0, b1, d});
  b.Output("y", ir::Gelu(x, /*tanh=*/true));
  return b.Build().value();
}

// GELU's backward as autodiff writes it (the derivative of 0.5 x (1 + tanh(k (x + c x^3))) times
// the incoming gradient), with the bias gradient's column sum beside it: x and dy in, dx and the
// [d] sum out.
ir::Graph GeluGrad(int64_t b0, int64_t b1, int64_t d) {
  ir::Builder b("gelu_grad");
  Value x = b.Parameter("x", DType::kF32, {b0, b1, d});
  Value dy = b.Parameter("dy", DType::kF32, {b0, b1, d});
  const double k = 0.7978845608028654, c = 0.044715;
  Value x2 = x * x;
  Value t = ir::Tanh((x + x2 * x * c) * k);
  Value dinner = (x2 * (3 * c) + 1.0) * k;
  Value dgelu = (t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * dinner;
  Value dx = dy * dgelu;
  b.Output("dx", dx);
  b.Output("dbias", ir::ReduceSum(dx, {0, 1}));
  return b.Build().value();
}

struct Timing {
  double seconds, bytes;
  std::string thunk;
};

Timing Run(const Case& c, int reps) {
  auto exe = runtime::MakeCpuBackend()->Compile(c.graph).value();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(0.5f, 1.5f);
  std::vector<Tensor> ins, outs;
  double bytes = 0;
  for (int id : c.graph.parameters()) {
    const ir::Type& t = c.graph.node(id).type();
    Tensor x(t.dtype, t.shape);
    if (t.dtype == DType::kS32) {  // labels: small valid class ids
      int32_t* l = static_cast<int32_t*>(x.raw_data());
      for (int64_t i = 0; i < t.shape.num_elements(); ++i)
        l[i] = static_cast<int32_t>(rng() % 1000);
    } else {
      float* f = static_cast<float*>(x.raw_data());
      for (int64_t i = 0; i < t.shape.num_elements(); ++i) f[i] = dist(rng);
    }
    bytes += 4.0 * static_cast<double>(t.shape.num_elements());
    ins.push_back(std::move(x));
  }
  for (const ir::Output& o : c.graph.outputs()) {
    const ir::Type& t = c.graph.node(o.node).type();
    outs.emplace_back(t.dtype, t.shape);
    bytes += 4.0 * static_cast<double>(t.shape.num_elements());
  }
  std::vector<const Tensor*> ip;
  for (const Tensor& t : ins) ip.push_back(&t);
  std::vector<Tensor*> op;
  for (size_t k = 0; k < outs.size(); ++k)
    op.push_back(k < c.in_place.size() && c.in_place[k] >= 0 ? &ins[c.in_place[k]] : &outs[k]);
  std::vector<double> times;
  for (int i = 0; i < reps + 3; ++i) {  // 3 untimed
    double t0 = Seconds();
    KILN_CHECK_OK(exe->RunInto(ip, op));
    if (i >= 3) times.push_back(Seconds() - t0);
  }
  std::string thunk;
  for (int i = 0; i < exe->num_thunks(); ++i) thunk += (i ? "; " : "") + exe->thunk(i).name();
  return {Median(times), bytes, thunk};
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  using namespace kiln;
  int threads = 2, reps = 20;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--threads=", 0) == 0) threads = std::atoi(a.c_str() + 10);
    if (a.rfind("--reps=", 0) == 0) reps = std::atoi(a.c_str() + 7);
    if (a.rfind("--only=", 0) == 0) only = a.substr(7);
  }
  omp_set_num_threads(threads);
  std::vector<Case> cases;
  cases.push_back({"adamw_l2", AdamW(128, 256), {}});  // in cache: the compute limit
  cases.push_back({"adamw", AdamW(3072, 768), {}});
  cases.push_back({"adamw_in_place", AdamW(3072, 768), {0, 2, 3}});
  cases.push_back({"layernorm", LayerNorm(4, 128, 768), {}});
  cases.push_back({"rowreduce", RowReduce(4, 128, 768), {}});
  cases.push_back({"xent_grad", XentGrad(4, 128, 50257), {}});
  cases.push_back({"sumsq", SumSquares(50257, 768), {}});
  cases.push_back({"xent", Xent(4, 128, 50257), {}});
  cases.push_back({"xent_train", XentTrain(4, 128, 50257), {}});
  cases.push_back({"gelu", Gelu(4, 128, 3072), {}});
  cases.push_back({"gelu_grad", GeluGrad(4, 128, 3072), {}});
  cases.push_back({"xent_l2", Xent(1, 2, 50257), {}});
  cases.push_back({"xent_train_l2", XentTrain(1, 2, 50257), {}});
  cases.push_back({"gelu_grad_l2", GeluGrad(1, 16, 3072), {}});
  std::vector<double> memcpy_bw;
  memcpy_bw.push_back(MemcpyBytesPerSecond(threads, 5));
  std::vector<std::pair<std::string, Timing>> results;
  for (const Case& c : cases) {
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    results.emplace_back(c.name, Run(c, reps));
    memcpy_bw.push_back(MemcpyBytesPerSecond(threads, 5));
  }
  const double bw = Median(memcpy_bw);
  std::printf("memcpy %.2f GB/s (median of %zu, %d threads)\n", bw / 1e9, memcpy_bw.size(),
              threads);
  for (const auto& [name, t] : results) {
    const double r = t.bytes / t.seconds;
    std::printf("%-15s %9.3f ms %8.2f GB/s = %3.0f%% of memcpy   [%s]\n", name.c_str(),
                1e3 * t.seconds, r / 1e9, 100 * r / bw, t.thunk.c_str());
  }
  return 0;
}
