// Small-batch int8 matmul over pre-packed constant s8 weights (qgemv.cc): y[M, N] =
// f32(int32 sum_k x[m, k] * W[k, n]) * scale[n], for M up to kQGemvMaxRows, when W is fixed for
// the executable's life (a parameter bound by Executable::BindConstantParameters or a constant):
// quantized_dot at serving batch sizes.
//
// At batch 1 the product is one pass over W, so its speed is the rate W streams from memory, and
// oneDNN's int8 matmul spent more time on its per-call setup than on the bytes. Here W is packed
// once (Thunk::PrepareConstants) into panels of 16 columns, each panel ceil(K / 4) blocks of
// 16 x 4 bytes (the 4 consecutive k of one column adjacent, the operand layout of AVX-512 VNNI's
// vpdpbusd), zero-padded in K and N. vpdpbusd multiplies unsigned by signed bytes, so x is biased
// to u8 (x + 128) and the accumulators start at -128 * sum_k W[k, n] (computed at packing), which
// makes the int32 sum exact: (x + 128) * w - 128 * w = x * w, and int32 wrap-around cancels the
// same way the reference's int32 conversion does. The epilogue converts the int32 sum to f32
// (round to nearest even, as static_cast) and multiplies by the channel's scale once: the
// reference kernel's two roundings, so the results agree bit for bit.
//
// The kernel is compiled for AVX-512 VNNI with a target attribute and chosen at lowering from the
// process's ISA level (never -march=native). Where M exceeds kQGemvMaxRows or W is not constant
// (training-style runs, or a buffer other than the packed one), the thunk runs `fallback`
// (oneDNN's int8 matmul) and keeps nothing. Without VNNI neither runs: quantized_dot takes the
// exact widening GEMM (quantized_exact.h), as oneDNN's int8 is not exact there.
//
//   QGemvSpec spec = {...};
//   std::unique_ptr<Thunk> t = MakeQGemvThunk(spec, std::move(onednn_thunk));
#ifndef KILN_RUNTIME_CPU_INTERNAL_QGEMV_H_
#define KILN_RUNTIME_CPU_INTERNAL_QGEMV_H_

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/runtime/executable.h"

namespace kiln::runtime::cpu {

// Most rows the packed path runs (all in one pass over W); above it the product is compute-bound
// and oneDNN's blocked brgemm kernel wins.
inline constexpr int64_t kQGemvMaxRows = 8;

// Whether this cpu runs the packed kernel (AVX-512 F/BW/VNNI), so MakeQGemvThunk is worth it.
bool QGemvSupported();

struct QGemvSpec {
  int x = -1, w = -1, scale = -1, out = -1;  // nodes: s8 [M, K], s8 [K, N], f32 [N], f32 [M, N]
  int64_t M = 0, K = 0, N = 0;
  std::string name;  // the thunk's name when the packed path runs
};

// A thunk that runs the packed kernel once W is bound constant, and `fallback` (the same
// computation through oneDNN) otherwise. Requires QGemvSupported() and 1 <= M <= kQGemvMaxRows.
std::unique_ptr<Thunk> MakeQGemvThunk(const QGemvSpec& spec, std::unique_ptr<Thunk> fallback);

}  // namespace kiln::runtime::cpu

#endif  // KILN_RUNTIME_CPU_INTERNAL_QGEMV_H_
