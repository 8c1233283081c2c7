#include "kiln/runtime/cpu/machine.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_format.h"
#include "kiln/runtime/cpu/isa.h"
#include "kiln/tensor/tensor.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln::runtime {

double BareMatmulSeconds(DType dtype, int64_t n, int reps) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> values(n * n);
  for (double& v : values) v = dist(rng);
  Tensor x = Tensor::FromDoubles(dtype, Shape{n, n}, values);
  Tensor w = Tensor::FromDoubles(dtype, Shape{n, n}, values);
  Tensor y(dtype, Shape{n, n});
  EnsureOneDnnIsa();
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  auto ddt = dtype == DType::kF32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
  dnnl::memory::desc md({n, n}, ddt, dnnl::memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), eng);
  dnnl::matmul prim(pd);
  dnnl::memory ms(md, eng, x.raw_data()), mw(md, eng, w.raw_data()), mo(md, eng, y.raw_data());
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, mo}};
  std::vector<double> t;
  for (int i = 0; i < reps + 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    prim.execute(stream, args);
    stream.wait();
    if (i >= 3)
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  size_t m = t.size();
  return m % 2 ? t[m / 2] : 0.5 * (t[m / 2 - 1] + t[m / 2]);
}

MatmulRates MeasureMatmulRates(int64_t n, int reps) {
  double flops = 2.0 * n * n * n;
  return {.f32 = flops / BareMatmulSeconds(DType::kF32, n, reps),
          .bf16 = flops / BareMatmulSeconds(DType::kBF16, n, reps),
          .n = n};
}

std::string Bf16SlowerWarning(const MatmulRates& rates, const std::string& precision) {
  if (rates.bf16 >= rates.f32) return "";
  return absl::StrFormat(
      "precision %s on this CPU (oneDNN ISA %s): the bf16 matmul runs at %.0f GFLOP/s, below "
      "f32's %.0f GFLOP/s (%lldx%lld, measured now), so bf16 buys memory, not speed, here; "
      "set precision: f32 for speed (docs/compiler.md, 'What mixed_bf16 buys')",
      precision, OneDnnIsaName(), rates.bf16 * 1e-9, rates.f32 * 1e-9,
      static_cast<long long>(rates.n), static_cast<long long>(rates.n));
}

}  // namespace kiln::runtime
