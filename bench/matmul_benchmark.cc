// 1024x1024x1024 matmul in f32 and bf16: a Kiln Executable (a dot_general graph compiled by the
// cpu backend, run with the allocation-free RunInto) against the bare oneDNN matmul primitive on
// the same data, alternating run by run, medians after warmup (DESIGN.md §5). Prints GFLOP/s for
// both and the ratio Kiln / oneDNN (1.00 = no overhead).
//
//   matmul_benchmark [--threads=2] [--size=1024] [--reps=30]
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

#include "kiln/base/status.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln {
namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  // Our processes never return memory to the OS mid-run (page faults cost ~10 us on these VMs).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  int threads = 2, reps = 30;
  int64_t size = 1024;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--threads=", 0) == 0)
      threads = std::atoi(a.c_str() + 10);
    else if (a.rfind("--size=", 0) == 0)
      size = std::atoll(a.c_str() + 7);
    else if (a.rfind("--reps=", 0) == 0)
      reps = std::max(20, std::atoi(a.c_str() + 7));
    else {
      std::fprintf(stderr, "usage: %s [--threads=2] [--size=1024] [--reps=30]\n", argv[0]);
      return 2;
    }
  }
  omp_set_num_threads(threads);
  std::printf("matmul %lldx%lldx%lld, %d threads, median of %d alternating runs after warmup\n",
              static_cast<long long>(size), static_cast<long long>(size),
              static_cast<long long>(size), threads, reps);
  std::printf("%-6s %14s %16s %7s  %-9s %s\n", "dtype", "kiln GFLOP/s", "oneDNN GFLOP/s", "ratio",
              "same bits", "oneDNN impl");
  for (kiln::DType dt : {kiln::DType::kF32, kiln::DType::kBF16}) {
    kiln::Result r = kiln::Bench(dt, size, reps, /*warmup=*/5);
    std::printf("%-6s %14.1f %16.1f %7.3f  %-9s %s\n", std::string(kiln::DTypeName(dt)).c_str(),
                r.kiln_gflops, r.onednn_gflops, r.kiln_gflops / r.onednn_gflops,
                r.identical ? "yes" : "no", r.impl.c_str());
  }
  return 0;
}
