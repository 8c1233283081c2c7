#include "kiln/runtime/cpu/machine.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_format.h"
#include "kiln/base/status.h"
#include "kiln/runtime/cpu/internal/common.h"
#include "kiln/runtime/cpu/isa.h"
#include "kiln/tensor/tensor.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln::runtime {

absl::StatusOr<double> BareMatmulSeconds(DType dtype, int64_t n, int reps) {
  EnsureOneDnnIsa();
  dnnl::engine eng;
  dnnl::stream stream;
  dnnl::matmul prim;
  auto ddt = dtype == DType::kF32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
  dnnl::memory::desc md;
  KILN_RETURN_IF_ERROR(cpu::CatchOneDnn(
      absl::StrFormat("oneDNN %s matmul %dx%dx%d", std::string(DTypeName(dtype)), n, n, n), [&] {
        eng = dnnl::engine(dnnl::engine::kind::cpu, 0);
        stream = dnnl::stream(eng);
        md = dnnl::memory::desc({n, n}, ddt, dnnl::memory::format_tag::ab);
        prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, md), eng));
      }));
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> values(n * n);
  for (double& v : values) v = dist(rng);
  Tensor x = Tensor::FromDoubles(dtype, Shape{n, n}, values);
  Tensor w = Tensor::FromDoubles(dtype, Shape{n, n}, values);
  Tensor y(dtype, Shape{n, n});
  // The C API runs it: a status, never an exception.
  dnnl::memory ms(md, eng, x.raw_data()), mw(md, eng, w.raw_data()), mo(md, eng, y.raw_data());
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, ms.get()}, {DNNL_ARG_WEIGHTS, mw.get()}, {DNNL_ARG_DST, mo.get()}};
  std::vector<double> t;
  for (int i = 0; i < reps + 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    dnnl_status_t st = dnnl_primitive_execute(prim.get(), stream.get(), 3, args);
    if (st == dnnl_success) st = dnnl_stream_wait(stream.get());
    if (st != dnnl_success)
      return absl::InternalError(absl::StrFormat("oneDNN %s matmul %d^3 failed (status %d)",
                                                 std::string(DTypeName(dtype)), n,
                                                 static_cast<int>(st)));
    if (i >= 3)
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  size_t m = t.size();
  return m % 2 ? t[m / 2] : 0.5 * (t[m / 2 - 1] + t[m / 2]);
}

absl::StatusOr<MatmulRates> MeasureMatmulRates(int64_t n, int reps) {
  const double flops = 2.0 * n * n * n;
  MatmulRates r;
  r.n = n;
  KILN_ASSIGN_OR_RETURN(double f32, BareMatmulSeconds(DType::kF32, n, reps));
  r.f32 = flops / f32;
  if (!OneDnnHasBf16()) {
    // Not even tried: where oneDNN makes one at all below avx512_core it is its reference kernel.
    r.bf16_computes_in_f32 = true;
    r.bf16_note = kOneDnnNoBf16;
    return r;
  }
  absl::StatusOr<double> bf16 = BareMatmulSeconds(DType::kBF16, n, reps);
  if (!bf16.ok()) {
    r.bf16_computes_in_f32 = true;
    r.bf16_note = std::string(bf16.status().message());
    return r;
  }
  r.bf16 = flops / *bf16;
  return r;
}

std::string Bf16SlowerWarning(const MatmulRates& rates, const std::string& precision) {
  if (rates.bf16_computes_in_f32) {
    return absl::StrFormat(
        "precision %s on this CPU (oneDNN ISA %s): %s, so bf16 matmuls and convolutions compute "
        "in f32 here (bf16 storage, f32 compute, f32 matmul %.0f GFLOP/s): bf16 buys no speed "
        "here, and less memory than where oneDNN has bf16 kernels; set precision: f32 "
        "(docs/compiler.md, 'On CPUs without bf16 kernels')",
        precision, OneDnnIsaName(), rates.bf16_note, rates.f32 * 1e-9);
  }
  if (rates.bf16 >= rates.f32) return "";
  return absl::StrFormat(
      "precision %s on this CPU (oneDNN ISA %s): the bf16 matmul runs at %.0f GFLOP/s, below "
      "f32's %.0f GFLOP/s (%lldx%lld, measured now), so bf16 buys memory, not speed, here; "
      "set precision: f32 for speed (docs/compiler.md, 'What mixed_bf16 buys')",
      precision, OneDnnIsaName(), rates.bf16 * 1e-9, rates.f32 * 1e-9,
      static_cast<long long>(rates.n), static_cast<long long>(rates.n));
}

}  // namespace kiln::runtime
