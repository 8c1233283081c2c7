// Small-batch f32 matmul over pre-packed constant weights (gemv.cc): out[M,N] = residual +
// act(x[M,K] . W[K,N] + bias), for M up to kGemvMaxRows, when W is fixed for the executable's life
// (a constant, or a parameter bound by Executable::BindConstantParameters).
//
// At batch 1 a matmul is a pass over the weights, so its speed is the rate at which the weights
// stream from memory. oneDNN's matmul on a plain row-major W copies W into its blocked layout on
// every call (a read and a write of all of W before the product reads it again), which is where
// the time went (17 GB/s of weight traffic on the 1024-wide MLP). Here W is packed once, when it
// is bound, into panels of 16 columns, each panel K x 16 contiguous floats (the last one padded
// with zeros), so the kernel reads every weight once, in order, and keeps 4 panels' accumulators
// of up to 4 rows in vector registers; the epilogue (bias, relu, residual) is applied in
// registers before the one store. Panels are split across the OpenMP threads. The kernel is
// compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the baseline, picked at load time (GCC
// target_clones), never -march=native.
//
// Staleness: the pack is derived in PrepareConstants, which the executable calls on every
// BindConstantParameters; the executable refuses a run whose bound parameters are not the bound
// tensors, and the thunk also falls back when the weight buffer it is handed is not the one it
// packed or is no longer marked constant. Without a binding (training, where weights change
// every step) the thunk runs the ordinary oneDNN matmul (`fallback`) and keeps nothing.
//
//   GemvSpec spec = ...;   // from matmul.cc's plan of the dot_general
//   std::unique_ptr<Thunk> t = MakeGemvThunk(spec, std::move(onednn_thunk));
#ifndef KILN_RUNTIME_CPU_INTERNAL_GEMV_H_
#define KILN_RUNTIME_CPU_INTERNAL_GEMV_H_

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/runtime/executable.h"

namespace kiln::runtime::cpu {

// Most rows the gemv kernel runs; above it the matmul is compute-bound: at AVX2 the same thunk
// runs the blocked sgemm over the same pack (internal/sgemm.h), elsewhere oneDNN's kernels.
inline constexpr int64_t kGemvMaxRows = 8;

struct GemvSpec {
  int lhs = -1, rhs = -1, out = -1;  // nodes: x, W, the buffer written
  int64_t M = 0, K = 0, N = 0;
  int64_t x_row_stride = 0, x_col_stride = 1;  // x[m, k] = lhs[m * row + k * col]
  int64_t w_k_stride = 0, w_n_stride = 1;      // W[k, n] = rhs[k * k_stride + n * n_stride]
  int bias = -1;                               // node of the [N] bias, or -1
  bool relu = false;
  int residual = -1;  // node of the plain [M, N] residual, or -1
  std::string name;   // the thunk's name when the packed path runs
  // Above kGemvMaxRows: also when the weight is not constant (a training step's, or a forward
  // pass whose weights are inputs), pack it on every run and run PackedSgemm, where that beats
  // the fallback (matmul.cc: at AVX2, where the fallback is oneDNN's gemm:jit).
  bool pack_per_run = false;
  std::string per_run_name;  // the thunk's name then
};

// A thunk that runs the packed kernel (the gemv up to kGemvMaxRows rows, PackedSgemm above) once
// its weight is bound constant, and `fallback` (the same computation through oneDNN) otherwise;
// with `pack_per_run`, PackedSgemm over a weight packed on each run instead of the fallback.
std::unique_ptr<Thunk> MakeGemvThunk(const GemvSpec& spec, std::unique_ptr<Thunk> fallback);

}  // namespace kiln::runtime::cpu

#endif  // KILN_RUNTIME_CPU_INTERNAL_GEMV_H_
