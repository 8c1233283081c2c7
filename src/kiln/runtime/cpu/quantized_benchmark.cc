// The int8 ops against their f32 peers on the cpu backend, in the shape `kiln quantize` gives a
// served model: quantize -> quantized_dot -> + bias -> relu per layer (the 1024-wide MLP of
// bench/serve_compute.cc) and quantize -> quantized_conv2d -> + bias -> relu (a 16 -> 32 channel
// 3x3 convolution on 8x8 images, the digits CNN's), weights bound constant as kiln serve binds
// them. Prints, per case and batch, the median microseconds of each side measured alternately in
// the same run and the int8/f32 ratio, then the int8 executable's per-thunk profile.
//
//   build/src/kiln/runtime/cpu/quantized_benchmark [--seconds S] [--rounds R] [--f32-profile]
//       [--f32-unbound]   # f32 weights passed per run: oneDNN's matmul instead of the f32 gemv
//   KILN_CPU_ISA=avx2 build/src/kiln/runtime/cpu/quantized_benchmark   # another CPU's paths
//
// KILN_CPU_ISA caps the ISA level (base/cpu_isa.h) before anything runs, as the kiln command
// does: at avx2, avx512 or sse41 the int8 side runs Kiln's exact widening GEMM (oneDNN's int8 is
// not exact without VNNI), the f32 side oneDNN's kernels at the same level.
//
// Only ratios measured in one run mean anything (docs: measuring on shared machines).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/base/cpu_isa.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/cpu/isa.h"

namespace kiln::runtime {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Tensor Filled(DType dt, const Shape& s, uint32_t seed, float lo, float hi) {
  Tensor t(dt, s);
  uint32_t state = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    state = state * 1664525u + 1013904223u;
    const float u = static_cast<float>(state >> 8) / static_cast<float>(1 << 24);
    if (dt == DType::kS8) {
      t.data<int8_t>()[i] = static_cast<int8_t>(static_cast<int>(u * 255.f) - 127);
    } else {
      t.data<float>()[i] = lo + (hi - lo) * u;
    }
  }
  return t;
}

// A compiled graph with its arguments; every parameter but "x" bound constant.
struct Run {
  std::unique_ptr<Executable> exe;
  std::vector<Tensor> args, outs;
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;

  // `bind`: the weights bound constant (kiln serve's setup; the packed gemv paths), else passed
  // per run (oneDNN's kernels on the f32 side).
  bool Prepare(Backend& backend, const ir::Graph& g, const std::map<std::string, Tensor>& values,
               bool bind_weights = true) {
    auto c = backend.Compile(g);
    if (!c.ok()) {
      fprintf(stderr, "compile: %s\n", std::string(c.status().message()).c_str());
      return false;
    }
    exe = std::move(*c);
    std::map<int, Tensor> bind;
    for (int id : exe->graph().parameters()) {
      const std::string name = exe->graph().node(id).attr_str("name");
      const Tensor& t = values.at(name);
      if (name != "x" && bind_weights) bind[static_cast<int>(args.size())] = t;
      args.push_back(t);
    }
    absl::Status s = exe->BindConstantParameters(bind);
    for (const ir::Output& o : exe->graph().outputs()) {
      const ir::Type& t = exe->graph().node(o.node).type();
      outs.emplace_back(t.dtype, t.shape);
    }
    for (Tensor& t : args) in.push_back(&t);
    for (Tensor& t : outs) out.push_back(&t);
    if (s.ok()) s = exe->RunInto(in, out);
    if (!s.ok()) fprintf(stderr, "run: %s\n", std::string(s.message()).c_str());
    return s.ok();
  }

  double Once() {
    const double t0 = Now();
    (void)exe->RunInto(in, out);
    return (Now() - t0) * 1e6;
  }

  void Profile(int runs) {
    // Medians, not means: on a shared machine one preempted OpenMP barrier outweighs 200 runs.
    std::vector<std::vector<double>> ns(exe->num_thunks());
    exe->set_thunk_observer([&](int t, int64_t start, int64_t end) {
      ns[t].push_back(static_cast<double>(end - start));
    });
    for (int r = 0; r < runs; ++r) (void)exe->RunInto(in, out);
    exe->set_thunk_observer(nullptr);
    for (int t = 0; t < exe->num_thunks(); ++t)
      printf("      %8.2f us  %s\n", Median(ns[t]) / 1e3, exe->thunk(t).name().c_str());
  }
};

struct Case {
  std::string name;
  ir::Graph f32, int8;
  std::map<std::string, Tensor> values;
};

// Three 1024 -> 1024 layers + bias + relu (the int8 graph as the kiln quantize rewrite writes it).
Case Mlp(int64_t batch) {
  const int64_t d = 1024;
  const int layers = 3;
  Case c;
  c.name = "mlp 3 x 1024-1024";
  ir::Builder f("f32"), q("int8");
  ir::Value xf = f.Parameter("x", DType::kF32, {batch, d});
  ir::Value xq = q.Parameter("x", DType::kF32, {batch, d});
  c.values["x"] = Filled(DType::kF32, Shape{batch, d}, 1, -1.f, 1.f);
  for (int l = 0; l < layers; ++l) {
    const std::string w = "w" + std::to_string(l), b = "b" + std::to_string(l),
                      s = "s" + std::to_string(l);
    ir::Value wf = f.Parameter(w, DType::kF32, {d, d});
    ir::Value bf = f.Parameter(b, DType::kF32, {d});
    xf = ir::Relu(ir::MatMul(xf, wf) + ir::BroadcastInDim(bf, Shape{batch, d}, {1}));
    ir::Value wq = q.Parameter(w + "q", DType::kS8, {d, d});
    ir::Value sq = q.Parameter(s, DType::kF32, {d});
    ir::Value bq = q.Parameter(b, DType::kF32, {d});
    xq = ir::Relu(ir::QuantizedDot(ir::Quantize(xq, 0.02f), wq, sq) +
                  ir::BroadcastInDim(bq, Shape{batch, d}, {1}));
    c.values[w] = Filled(DType::kF32, Shape{d, d}, 10 + l, -0.05f, 0.05f);
    c.values[w + "q"] = Filled(DType::kS8, Shape{d, d}, 20 + l, 0, 0);
    c.values[b] = Filled(DType::kF32, Shape{d}, 30 + l, -0.1f, 0.1f);
    c.values[s] = Filled(DType::kF32, Shape{d}, 40 + l, 1e-4f, 2e-4f);
  }
  f.Output("y", xf);
  q.Output("y", xq);
  c.f32 = *f.Build();
  c.int8 = *q.Build();
  return c;
}

// One 16 -> 32 channel 3x3 convolution, padding 1, + bias + relu on 8x8 images.
Case Conv(int64_t batch) {
  Case c;
  c.name = "conv 16->32 3x3 on 8x8";
  ir::Conv2dOptions o;
  o.padding = {1, 1, 1, 1};
  const Shape xs{batch, 16, 8, 8}, ys{batch, 32, 8, 8};
  ir::Builder f("f32"), q("int8");
  ir::Value xf = f.Parameter("x", DType::kF32, xs);
  ir::Value wf = f.Parameter("w", DType::kF32, {32, 16, 3, 3});
  ir::Value bf = f.Parameter("b", DType::kF32, {32});
  f.Output("y", ir::Relu(ir::Conv2d(xf, wf, o) + ir::BroadcastInDim(bf, ys, {1})));
  ir::Value xq = q.Parameter("x", DType::kF32, xs);
  ir::Value wq = q.Parameter("wq", DType::kS8, {32, 16, 3, 3});
  ir::Value sq = q.Parameter("s", DType::kF32, {32});
  ir::Value bq = q.Parameter("b", DType::kF32, {32});
  q.Output("y", ir::Relu(ir::QuantizedConv2d(ir::Quantize(xq, 0.02f), wq, sq, o) +
                         ir::BroadcastInDim(bq, ys, {1})));
  c.values["x"] = Filled(DType::kF32, xs, 1, -1.f, 1.f);
  c.values["w"] = Filled(DType::kF32, Shape{32, 16, 3, 3}, 2, -0.1f, 0.1f);
  c.values["wq"] = Filled(DType::kS8, Shape{32, 16, 3, 3}, 3, 0, 0);
  c.values["b"] = Filled(DType::kF32, Shape{32}, 4, -0.1f, 0.1f);
  c.values["s"] = Filled(DType::kF32, Shape{32}, 5, 1e-4f, 2e-4f);
  c.f32 = *f.Build();
  c.int8 = *q.Build();
  return c;
}

int Main(int argc, char** argv) {
  double seconds = 0.5;
  int rounds = 5;
  bool f32_profile = false, f32_unbound = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--f32-profile")) f32_profile = true;
    if (!strcmp(argv[i], "--f32-unbound")) f32_unbound = true;
    if (i + 1 >= argc) continue;
    if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[++i]);
    if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[++i]);
  }
  // The cap must come before the first kernel or backend decides the level.
  if (const char* v = std::getenv("KILN_CPU_ISA"); v != nullptr) {
    if (absl::Status s = ApplyCpuIsaSetting(v, /*strict=*/true); !s.ok()) {
      fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  auto backend = MakeCpuBackend();
  printf("cpu isa: %s; int8 exact in oneDNN: %s\n", CpuIsaDescription().c_str(),
         OneDnnHasExactInt8() ? "yes (VNNI)" : "no (Kiln's widening GEMM runs int8)");
  printf("%-26s %6s %10s %10s %9s\n", "case", "batch", "f32 us", "int8 us", "int8/f32");
  for (auto make : {Mlp, Conv}) {
    for (int64_t batch : {int64_t{1}, int64_t{4}, int64_t{256}}) {
      Case c = make(batch);
      Run f, q;
      if (!f.Prepare(*backend, c.f32, c.values, !f32_unbound) ||
          !q.Prepare(*backend, c.int8, c.values))
        return 1;
      std::vector<double> fu, qu;
      for (int r = 0; r < rounds; ++r) {
        for (Run* run : {&f, &q}) {
          std::vector<double>& us = run == &f ? fu : qu;
          const double end = Now() + seconds / 2;
          int n = 0;
          while (n < 5 || Now() < end) {
            us.push_back(run->Once());
            ++n;
          }
        }
      }
      const double fm = Median(fu), qm = Median(qu);
      printf("%-26s %6lld %10.1f %10.1f %8.2fx\n", c.name.c_str(), static_cast<long long>(batch),
             fm, qm, qm / fm);
      printf("    int8 thunks (median us over 200 runs):\n");
      q.Profile(200);
      if (f32_profile) {
        printf("    f32 thunks (median us over 200 runs):\n");
        f.Profile(200);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace kiln::runtime

int main(int argc, char** argv) { return kiln::runtime::Main(argc, argv); }
