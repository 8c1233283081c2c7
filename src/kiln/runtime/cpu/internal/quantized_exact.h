// quantized_dot and quantized_conv2d on Kiln's exact widening int8 GEMM (internal/qgemm.h), for
// CPUs where oneDNN's int8 kernels are not exact (OneDnnHasExactInt8() false: AVX-512 without
// VNNI, AVX2, SSE4.1). quantized.cc lowers to these there, and to oneDNN / the VNNI gemv on
// AVX-512 VNNI and above; both give the reference backend's bits.
//
//   quantized_dot: the weights packed into s8 panels (at binding when bound constant, else on
//     the first run and again only when their bytes change), the activations widened to s16 per
//     run, every M, parallel over row chunks x panel chunks.
//   quantized_conv2d: the filter widened to s16 rows once (same packing rule), the NCHW s8 input
//     turned into B panels by an im2col per (group, column chunk) task in per-thread scratch,
//     rows = the group's output channels, so the result is written NCHW with its channel scale.
//
//   LowerResult t = LowerQuantizedDotExact(n, lc);  // after checking !OneDnnHasExactInt8()
#ifndef KILN_RUNTIME_CPU_INTERNAL_QUANTIZED_EXACT_H_
#define KILN_RUNTIME_CPU_INTERNAL_QUANTIZED_EXACT_H_

#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {

LowerResult LowerQuantizedDotExact(const ir::Node& n, LowerContext& lc);
LowerResult LowerQuantizedConvExact(const ir::Node& n, LowerContext& lc);

}  // namespace kiln::runtime::cpu

#endif  // KILN_RUNTIME_CPU_INTERNAL_QUANTIZED_EXACT_H_
