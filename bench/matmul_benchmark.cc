// Kiln's matmul lowering against the bare oneDNN configurations for the same math, alternating
// run by run, medians after warmup (DESIGN.md §5). Prints GFLOP/s for each and the ratio of Kiln
// to the best bare configuration (1.00 = as fast as the best oneDNN offers).
//
// Default: a 1024x1024x1024 matmul in f32 and bf16 (Kiln's Executable, run with the
// allocation-free RunInto, against the bare matmul primitive on the same data).
// --shapes=gpt2: the GPT-2-small train step's matmuls in f32 with their exact dimension numbers
// and layouts (the tied LM head W f32[50257,768] forward, dX and dW with the embedding gradient's
// residual post-op, and the per-layer MLP matmuls), each against the default oneDNN matmul
// primitive (brgemm) with the same strides and post-op, and oneDNN's jit sgemm (beta = 1 over a
// copy of the residual where there is one).
// --shapes=packed: serving matmuls with a bound weight (256x1024x1024 + bias + relu, 64x1024x1024,
// ...): Kiln's executable with the weight bound (below AVX-512 the packed sgemm, sgemm.cc; at
// AVX-512 oneDNN over its pre-packed layout) against the bare oneDNN matmul primitive on the plain
// weight with the same post-ops (what runs unbound), and Kiln unbound, alternating run by run.
//
//   matmul_benchmark [--threads=2] [--size=1024] [--reps=30] [--shapes=gpt2|packed] [--only=lm]
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/roofline.h"
#include "bench/timing.h"
#include "kiln/base/cpu_isa.h"
#include "kiln/base/status.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/cpu/isa.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln {
namespace {

using bench::Median;
using bench::Seconds;

struct Result {
  double kiln_gflops, onednn_gflops;
  std::string impl;
  bool identical;  // both paths produced the same bits
};

Result Bench(DType dt, int64_t n, int reps, int warmup) {
  // Kiln: y = x @ w through the cpu backend.
  ir::Builder b("matmul");
  ir::Value x = b.Parameter("x", dt, {n, n});
  ir::Value w = b.Parameter("w", dt, {n, n});
  b.Output("y", ir::MatMul(x, w));
  ir::Graph graph = b.Build().value();
  std::unique_ptr<runtime::Executable> exe = runtime::MakeCpuBackend()->Compile(graph).value();

  std::mt19937 rng(42);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> xv(n * n), wv(n * n);
  for (double& v : xv) v = dist(rng);
  for (double& v : wv) v = dist(rng);
  Tensor xt = Tensor::FromDoubles(dt, Shape{n, n}, xv);
  Tensor wt = Tensor::FromDoubles(dt, Shape{n, n}, wv);
  Tensor yk(dt, Shape{n, n}), yd(dt, Shape{n, n});

  // Bare oneDNN: the same primitive configuration, created once.
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  auto ddt = dt == DType::kF32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
  dnnl::memory::desc md({n, n}, ddt, dnnl::memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), eng);
  dnnl::matmul prim(pd);
  dnnl::memory ms(md, eng, xt.raw_data()), mw(md, eng, wt.raw_data()),
      md_out(md, eng, yd.raw_data());
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md_out}};

  auto run_kiln = [&] { KILN_CHECK_OK(exe->RunInto({&xt, &wt}, {&yk})); };
  auto run_onednn = [&] {
    prim.execute(stream, args);
    stream.wait();
  };
  for (int i = 0; i < warmup; ++i) {
    run_kiln();
    run_onednn();
  }
  std::vector<double> tk, td;
  for (int i = 0; i < reps; ++i) {
    double t0 = Seconds();
    run_kiln();
    double t1 = Seconds();
    run_onednn();
    double t2 = Seconds();
    tk.push_back(t1 - t0);
    td.push_back(t2 - t1);
  }
  double flops = 2.0 * n * n * n;
  return {flops / Median(tk) * 1e-9, flops / Median(td) * 1e-9, pd.impl_info_str(),
          std::memcmp(yk.raw_data(), yd.raw_data(), yk.byte_size()) == 0};
}

// One GPT-2-small matmul: out[M,N] = A[M,K] . B[K,N] (+ residual), A and B as the step stores
// them: trans_a means the model's tensor is [K,M] (contraction over its leading dims), trans_b
// means it is [N,K].
struct GptCase {
  const char* name;
  std::vector<int64_t> lhs, rhs;
  ir::DotDims dims;
  int64_t M, K, N;
  bool trans_a, trans_b, residual;
};

std::vector<GptCase> GptCases() {
  const int64_t b = 4, t = 128, bt = b * t, d = 768, v = 50257, f = 3072;
  return {
      {"lm_head_fwd h.W^T",
       {b, t, d},
       {v, d},
       {.lhs_contracting = {2}, .rhs_contracting = {1}},
       bt,
       d,
       v,
       false,
       true,
       false},
      {"lm_head_dX g.W",
       {b, t, v},
       {v, d},
       {.lhs_contracting = {2}, .rhs_contracting = {0}},
       bt,
       v,
       d,
       false,
       false,
       false},
      {"lm_head_dW g^T.h",
       {b, t, v},
       {b, t, d},
       {.lhs_contracting = {0, 1}, .rhs_contracting = {0, 1}},
       v,
       bt,
       d,
       true,
       false,
       false},
      {"lm_head_dW g^T.h+res",
       {b, t, v},
       {b, t, d},
       {.lhs_contracting = {0, 1}, .rhs_contracting = {0, 1}},
       v,
       bt,
       d,
       true,
       false,
       true},
      {"mlp_fc1_fwd",
       {b, t, d},
       {d, f},
       {.lhs_contracting = {2}, .rhs_contracting = {0}},
       bt,
       d,
       f,
       false,
       false,
       false},
      {"mlp_fc2_fwd+res",
       {b, t, f},
       {f, d},
       {.lhs_contracting = {2}, .rhs_contracting = {0}},
       bt,
       f,
       d,
       false,
       false,
       true},
      {"mlp_fc1_dX g.W1^T",
       {b, t, f},
       {d, f},
       {.lhs_contracting = {2}, .rhs_contracting = {1}},
       bt,
       f,
       d,
       false,
       true,
       false},
      {"mlp_fc2_dX g.W2^T",
       {b, t, d},
       {f, d},
       {.lhs_contracting = {2}, .rhs_contracting = {1}},
       bt,
       d,
       f,
       false,
       true,
       false},
      {"mlp_fc1_dW h^T.g",
       {b, t, d},
       {b, t, f},
       {.lhs_contracting = {0, 1}, .rhs_contracting = {0, 1}},
       d,
       bt,
       f,
       true,
       false,
       false},
      {"mlp_fc2_dW h^T.g",
       {b, t, f},
       {b, t, d},
       {.lhs_contracting = {0, 1}, .rhs_contracting = {0, 1}},
       f,
       bt,
       d,
       true,
       false,
       false},
  };
}

Tensor Random(const std::vector<int64_t>& dims, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1, 1);
  Tensor x(DType::kF32, Shape(dims));
  float* p = static_cast<float*>(x.raw_data());
  for (int64_t i = 0; i < x.shape().num_elements(); ++i) p[i] = dist(rng);
  return x;
}

struct GptResult {
  double kiln, primitive, sgemm;  // GFLOP/s
  std::string kiln_impl, primitive_impl;
  float max_diff;  // Kiln vs the sgemm result, max |a - b|
};

GptResult BenchGpt(const GptCase& c, int reps, int warmup) {
  using dt = dnnl::memory::data_type;
  ir::Builder b("gpt_matmul");
  ir::Value x = b.Parameter("a", DType::kF32, Shape(c.lhs));
  ir::Value w = b.Parameter("b", DType::kF32, Shape(c.rhs));
  ir::Value y = ir::DotGeneral(x, w, c.dims);
  std::vector<int64_t> out_dims;  // the free dims of lhs, then of rhs
  for (size_t i = 0; i < c.lhs.size(); ++i)
    if (std::count(c.dims.lhs_contracting.begin(), c.dims.lhs_contracting.end(), i) == 0)
      out_dims.push_back(c.lhs[i]);
  for (size_t i = 0; i < c.rhs.size(); ++i)
    if (std::count(c.dims.rhs_contracting.begin(), c.dims.rhs_contracting.end(), i) == 0)
      out_dims.push_back(c.rhs[i]);
  if (c.residual) y = y + b.Parameter("r", DType::kF32, Shape(out_dims));
  b.Output("y", y);
  ir::Graph graph = b.Build().value();
  std::unique_ptr<runtime::Executable> exe = runtime::MakeCpuBackend()->Compile(graph).value();
  std::string kiln_impl;
  for (int i = 0; i < exe->num_thunks(); ++i) kiln_impl += exe->thunk(i).name();

  std::mt19937 rng(42);
  Tensor at = Random(c.lhs, rng), bt = Random(c.rhs, rng);
  Tensor rt = Random(out_dims, rng);
  Tensor yk(DType::kF32, Shape(out_dims)), yp(DType::kF32, Shape{c.M, c.N}),
      ys(DType::kF32, Shape{c.M, c.N});

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  dnnl::memory::desc amd({c.M, c.K}, dt::f32,
                         c.trans_a ? dnnl::memory::dims{1, c.M} : dnnl::memory::dims{c.K, 1});
  dnnl::memory::desc bmd({c.K, c.N}, dt::f32,
                         c.trans_b ? dnnl::memory::dims{1, c.K} : dnnl::memory::dims{c.N, 1});
  dnnl::memory::desc cmd({c.M, c.N}, dt::f32, dnnl::memory::dims{c.N, 1});
  dnnl::primitive_attr attr;
  if (c.residual) {
    dnnl::post_ops ops;
    ops.append_binary(dnnl::algorithm::binary_add, cmd);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bmd, cmd), attr, eng);
  dnnl::matmul prim(pd);
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, dnnl::memory(amd, eng, at.raw_data())},
      {DNNL_ARG_WEIGHTS, dnnl::memory(bmd, eng, bt.raw_data())},
      {DNNL_ARG_DST, dnnl::memory(cmd, eng, yp.raw_data())}};
  if (c.residual)
    args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] =
        dnnl::memory(cmd, eng, rt.raw_data());

  std::vector<const Tensor*> inputs = {&at, &bt};
  if (c.residual) inputs.push_back(&rt);
  auto run_kiln = [&] { KILN_CHECK_OK(exe->RunInto(inputs, {&yk})); };
  auto run_primitive = [&] {
    prim.execute(stream, args);
    stream.wait();
  };
  float* ysp = static_cast<float*>(ys.raw_data());
  auto run_sgemm = [&] {
    if (c.residual) std::memcpy(ysp, rt.raw_data(), ys.byte_size());
    dnnl::sgemm(c.trans_a ? 'T' : 'N', c.trans_b ? 'T' : 'N', c.M, c.N, c.K, 1.f,
                static_cast<const float*>(at.raw_data()), c.trans_a ? c.M : c.K,
                static_cast<const float*>(bt.raw_data()), c.trans_b ? c.K : c.N,
                c.residual ? 1.f : 0.f, ysp, c.N);
  };
  for (int i = 0; i < warmup; ++i) {
    run_kiln();
    run_primitive();
    run_sgemm();
  }
  std::vector<double> tk, tp, ts;
  for (int i = 0; i < reps; ++i) {
    double t0 = Seconds();
    run_kiln();
    double t1 = Seconds();
    run_primitive();
    double t2 = Seconds();
    run_sgemm();
    double t3 = Seconds();
    tk.push_back(t1 - t0);
    tp.push_back(t2 - t1);
    ts.push_back(t3 - t2);
  }
  float diff = 0;
  const float* pk = static_cast<const float*>(yk.raw_data());
  for (int64_t i = 0; i < c.M * c.N; ++i) diff = std::max(diff, std::abs(pk[i] - ysp[i]));
  double flops = 2.0 * c.M * c.N * c.K;
  return {flops / Median(tk) * 1e-9, flops / Median(tp) * 1e-9,
          flops / Median(ts) * 1e-9, kiln_impl,
          pd.impl_info_str(),        diff};
}

int RunGpt(int reps, const std::string& only) {
  std::printf("GPT-2-small train-step matmuls (f32), median of %d alternating runs after warmup\n",
              reps);
  std::printf("%-22s %-18s %9s %11s %9s %7s %9s  %s\n", "case", "M x K x N", "kiln", "primitive",
              "sgemm", "ratio", "max|diff|", "kiln thunk / primitive impl");
  for (const GptCase& c : GptCases()) {
    if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
    GptResult r = BenchGpt(c, reps, /*warmup=*/2);
    std::string mkn = std::to_string(c.M) + "x" + std::to_string(c.K) + "x" + std::to_string(c.N);
    std::printf("%-22s %-18s %9.1f %11.1f %9.1f %7.3f %9.2g  %s / %s\n", c.name, mkn.c_str(),
                r.kiln, r.primitive, r.sgemm, r.kiln / std::max(r.primitive, r.sgemm), r.max_diff,
                r.kiln_impl.c_str(), r.primitive_impl.c_str());
    std::fflush(stdout);
  }
  return 0;
}

// One serving matmul y = relu?(x[M,K] . W[K,N] + b?) with W (and b) bound constant.
struct PackedCase {
  int64_t M, K, N;
  bool bias_relu;
};

struct PackedResult {
  double bound, unbound, primitive;  // GFLOP/s
  std::string bound_impl, primitive_impl;
  float max_diff;  // bound Kiln vs the primitive, max |a - b| / max(1, |b|)
};

PackedResult BenchPacked(const PackedCase& c, int reps, int warmup) {
  using dt = dnnl::memory::data_type;
  ir::Builder b("packed_matmul");
  ir::Value x = b.Parameter("x", DType::kF32, Shape{c.M, c.K});
  ir::Value w = b.Parameter("w", DType::kF32, Shape{c.K, c.N});
  ir::Value bias = b.Parameter("b", DType::kF32, Shape{c.N});
  ir::Value y = ir::MatMul(x, w);
  if (c.bias_relu) y = ir::Relu(y + ir::BroadcastInDim(bias, Shape{c.M, c.N}, {1}));
  b.Output("y", y);
  ir::Graph graph = b.Build().value();
  auto backend = runtime::MakeCpuBackend();
  std::unique_ptr<runtime::Executable> bound = backend->Compile(graph).value();
  std::unique_ptr<runtime::Executable> unbound = backend->Compile(graph).value();

  std::mt19937 rng(42);
  Tensor xt = Random({c.M, c.K}, rng), wt = Random({c.K, c.N}, rng), bt = Random({c.N}, rng);
  KILN_CHECK_OK(bound->BindConstantParameters({{1, wt}, {2, bt}}));
  std::string bound_impl;
  for (int i = 0; i < bound->num_thunks(); ++i) {
    if (!bound_impl.empty()) bound_impl += "; ";
    bound_impl += bound->thunk(i).name();
  }
  Tensor yb(DType::kF32, Shape{c.M, c.N}), yu(DType::kF32, Shape{c.M, c.N}),
      yp(DType::kF32, Shape{c.M, c.N});

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  dnnl::memory::desc xmd({c.M, c.K}, dt::f32, dnnl::memory::format_tag::ab);
  dnnl::memory::desc wmd({c.K, c.N}, dt::f32, dnnl::memory::format_tag::ab);
  dnnl::memory::desc bmd({1, c.N}, dt::f32, dnnl::memory::format_tag::ab);
  dnnl::memory::desc ymd({c.M, c.N}, dt::f32, dnnl::memory::format_tag::ab);
  dnnl::primitive_attr attr;
  if (c.bias_relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd =
      c.bias_relu ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(xmd, wmd, bmd, ymd), attr, eng)
                  : dnnl::matmul::primitive_desc(dnnl::matmul::desc(xmd, wmd, ymd), attr, eng);
  dnnl::matmul prim(pd);
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, dnnl::memory(xmd, eng, xt.raw_data())},
      {DNNL_ARG_WEIGHTS, dnnl::memory(wmd, eng, wt.raw_data())},
      {DNNL_ARG_DST, dnnl::memory(ymd, eng, yp.raw_data())}};
  if (c.bias_relu) args[DNNL_ARG_BIAS] = dnnl::memory(bmd, eng, bt.raw_data());

  auto run_bound = [&] { KILN_CHECK_OK(bound->RunInto({&xt, &wt, &bt}, {&yb})); };
  auto run_unbound = [&] { KILN_CHECK_OK(unbound->RunInto({&xt, &wt, &bt}, {&yu})); };
  auto run_primitive = [&] {
    prim.execute(stream, args);
    stream.wait();
  };
  for (int i = 0; i < warmup; ++i) {
    run_bound();
    run_primitive();
    run_unbound();
  }
  std::vector<double> tb, tp, tu;
  for (int i = 0; i < reps; ++i) {
    double t0 = Seconds();
    run_bound();
    double t1 = Seconds();
    run_primitive();
    double t2 = Seconds();
    run_unbound();
    double t3 = Seconds();
    tb.push_back(t1 - t0);
    tp.push_back(t2 - t1);
    tu.push_back(t3 - t2);
  }
  float diff = 0;
  const float* pb = static_cast<const float*>(yb.raw_data());
  const float* pp = static_cast<const float*>(yp.raw_data());
  for (int64_t i = 0; i < c.M * c.N; ++i)
    diff = std::max(diff, std::abs(pb[i] - pp[i]) / std::max(1.f, std::abs(pp[i])));
  const double flops = 2.0 * c.M * c.N * c.K;
  return {flops / Median(tb) * 1e-9, flops / Median(tu) * 1e-9,
          flops / Median(tp) * 1e-9, bound_impl,
          pd.impl_info_str(),        diff};
}

int RunPacked(int threads, int reps, const std::string& only) {
  // The FMA peak of the ISA the kernels run at (AVX2 below avx512; best of many short runs).
  const bench::FmaIsa fma =
      ActiveCpuIsa() >= CpuIsa::kAvx512
          ? bench::FmaIsa::kAvx512
          : (ActiveCpuIsa() >= CpuIsa::kAvx2 ? bench::FmaIsa::kAvx2 : bench::FmaIsa::kScalar);
  const bench::FmaPeak peak = bench::MeasureFmaPeak(threads, fma);
  std::printf("FMA peak (%s, %d threads): %.1f GFLOP/s\n", bench::FmaIsaName(peak.isa).c_str(),
              threads, peak.gflop_per_s);
  std::printf(
      "bound-weight matmuls (f32), %d threads, median of %d alternating runs after warmup\n",
      threads, reps);
  std::printf("%-24s %11s %11s %11s %7s %9s  %s\n", "case", "kiln bound", "oneDNN", "kiln unbnd",
              "ratio", "max|rel|", "kiln bound thunk / oneDNN impl");
  for (const PackedCase& c : std::vector<PackedCase>{{256, 1024, 1024, true},
                                                     {64, 1024, 1024, false},
                                                     {64, 1024, 1024, true},
                                                     {256, 1024, 1024, false},
                                                     {33, 100, 130, true},
                                                     {512, 3072, 768, false},
                                                     {256, 3072, 768, false},
                                                     {512, 1024, 1024, false},
                                                     {1024, 1024, 1024, false},
                                                     {512, 768, 3072, false},
                                                     {128, 768, 3072, false}}) {
    std::string name = std::to_string(c.M) + "x" + std::to_string(c.K) + "x" + std::to_string(c.N) +
                       (c.bias_relu ? "+bias+relu" : "");
    if (!only.empty() && name.find(only) == std::string::npos) continue;
    PackedResult r = BenchPacked(c, reps, /*warmup=*/5);
    std::printf("%-24s %11.1f %11.1f %11.1f %7.3f %9.2g  %s / %s\n", name.c_str(), r.bound,
                r.primitive, r.unbound, r.bound / r.primitive, r.max_diff, r.bound_impl.c_str(),
                r.primitive_impl.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  // Our processes never return memory to the OS mid-run (page faults cost ~10 us on these VMs).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  int threads = 2, reps = 30;
  int64_t size = 1024;
  std::string shapes, only;
  bool reps_set = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--threads=", 0) == 0)
      threads = std::atoi(a.c_str() + 10);
    else if (a.rfind("--size=", 0) == 0)
      size = std::atoll(a.c_str() + 7);
    else if (a.rfind("--reps=", 0) == 0)
      reps = std::max(3, std::atoi(a.c_str() + 7)), reps_set = true;
    else if (a.rfind("--shapes=", 0) == 0)
      shapes = a.substr(9);
    else if (a.rfind("--only=", 0) == 0)
      only = a.substr(7);
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads=2] [--size=1024] [--reps=30] [--shapes=gpt2|packed] "
                   "[--only=S]\n",
                   argv[0]);
      return 2;
    }
  }
  omp_set_num_threads(threads);
  // KILN_CPU_ISA caps Kiln's and oneDNN's ISA level, as in the kiln CLI (docs/cli.md).
  if (const char* v = std::getenv("KILN_CPU_ISA"); v != nullptr) {
    if (absl::Status s = kiln::ApplyCpuIsaSetting(v, /*strict=*/true); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  std::printf("cpu isa: %s\n", kiln::runtime::CpuIsaDescription().c_str());
  if (shapes == "gpt2") return kiln::RunGpt(reps_set ? reps : 7, only);
  if (shapes == "packed") return kiln::RunPacked(threads, reps_set ? reps : 100, only);
  if (!shapes.empty()) {
    std::fprintf(stderr, "--shapes: gpt2 or packed\n");
    return 2;
  }
  std::printf("matmul %lldx%lldx%lld, %d threads, median of %d alternating runs after warmup\n",
              static_cast<long long>(size), static_cast<long long>(size),
              static_cast<long long>(size), threads, reps);
  std::printf("%-6s %14s %16s %7s  %-9s %s\n", "dtype", "kiln GFLOP/s", "oneDNN GFLOP/s", "ratio",
              "same bits", "oneDNN impl");
  for (kiln::DType dt : {kiln::DType::kF32, kiln::DType::kBF16}) {
    if (dt == kiln::DType::kBF16 && !kiln::runtime::OneDnnHasBf16()) {
      std::printf("%-6s oneDNN has no bf16 matmul at %s (below avx512_core)\n", "bf16",
                  kiln::runtime::OneDnnIsaName().c_str());
      continue;
    }
    kiln::Result r = kiln::Bench(dt, size, reps, /*warmup=*/5);
    std::printf("%-6s %14.1f %16.1f %7.3f  %-9s %s\n", std::string(kiln::DTypeName(dt)).c_str(),
                r.kiln_gflops, r.onednn_gflops, r.kiln_gflops / r.onednn_gflops,
                r.identical ? "yes" : "no", r.impl.c_str());
  }
  return 0;
}
