// f32 matmul over the packed constant weights of gemv.cc, for batches above kGemvMaxRows
// (sgemm.cc; GemvThunk runs it for 9 to kPackedSgemmMaxRows rows at AVX2): out[M,N] =
// residual + relu?(x[M,K] . W[K,N] + bias), W packed once at bind time into panels of 16 columns,
// [panels][K][16] floats (the last panel padded with zeros).
//
// Why: below AVX-512, oneDNN 2.6's f32 matmul is its `gemm:jit` kernel, which reads plain weights
// and packs them again on every call, and reaches about half the FMA rate of a register-blocked
// kernel (an MLP 1024-1024-1024 at batch 256: 38% of the 2-thread FMA peak against ONNX Runtime's
// 71% on an AVX2 machine). A bound weight is already packed in the gemv's panel layout, which is
// what a GotoBLAS-style kernel wants for its B operand: a K-block of one panel (Kc x 16 floats) is
// contiguous and stays in L1 while it is multiplied with every row of an A block. The kernel:
//
//   for each (row block of Mc rows, group of panels) a thread owns:
//     for each K block of Kc:
//       pack x[rows, K block] into [Mc / R][Kc][R] (per-thread buffer, stays in L2)
//       for each panel: for each R rows: R x 16 accumulators over Kc, added to the output
//   the epilogue (bias, relu, residual) once, in registers, after the last K block
//
// R x 16 is 6 rows x 2 ymm (12 accumulators) at x86-64-v3 and 3 rows x 4 xmm at the baseline
// (whose packed x holds each value as a whole vector: SSE2 cannot broadcast from memory). The
// blocking is BLIS's for Haswell (Kc = 256, up to 168 rows per A block; up to 264 with a 512 KiB
// or larger L2, read from sysfs, sgemm.cc); row blocks x groups of 4
// panels are split between the threads. Each output element is summed in the same order whatever
// the thread count, the L2 size and x's layout, so results are deterministic and do not depend on
// the split. At x86-64-v4 oneDNN's brgemm over its own pre-packed layout runs instead (matmul.cc).
//
//   PackedMatmulArgs a = ...;   // the pack from GemvThunk::PrepareConstants
//   PackedSgemm(a);             // any M >= 1 (matmul.cc: 9 to kPackedSgemmMaxRows)
#ifndef KILN_RUNTIME_CPU_INTERNAL_SGEMM_H_
#define KILN_RUNTIME_CPU_INTERNAL_SGEMM_H_

#include <cstdint>
#include <memory>

#include "kiln/base/isa_dispatch.h"
#include "kiln/base/memory.h"

namespace kiln::runtime::cpu {

// A buffer of at least `floats` floats owned by the calling thread, allocated (and populated) on
// its first use and when a larger one is asked for, kept for the thread's life: no allocation
// per call. `Tag` keeps apart users whose buffers are live at once (the per-run weight pack and
// the sgemm's packed x on the same thread).
template <typename Tag>
float* ThreadScratchFloats(int64_t floats) {
  thread_local std::shared_ptr<uint8_t> mem;
  thread_local int64_t capacity = 0;
  if (floats > capacity) {
    mem =
        AllocatePopulated(AlignUp(floats * static_cast<int64_t>(sizeof(float))), kBufferAlignment);
    capacity = floats;
  }
  return reinterpret_cast<float*>(mem.get());
}

// Columns per packed weight panel (one AVX-512 register of floats, two ymm, four xmm).
inline constexpr int64_t kPackPanel = 16;

// One product over a packed weight. `residual` may be `out` itself (updated in place).
struct PackedMatmulArgs {
  const float* x = nullptr;
  int64_t xs_m = 0, xs_k = 1;       // x[m, k] = x[m * xs_m + k * xs_k]
  const float* pack = nullptr;      // [panels][K][16]
  const float* bias = nullptr;      // [N] or null
  const float* residual = nullptr;  // [M, N] or null, added after the activation
  float* out = nullptr;             // [M, N]
  int64_t M = 0, K = 0, N = 0;
  bool relu = false;
};

// Whether bound weights of matmuls above kGemvMaxRows (and up to kPackedSgemmMaxRows) run
// PackedSgemm at `level`: at x86-64-v3 (avx2), where oneDNN's matmul is gemm:jit on plain
// weights. At v4 oneDNN's brgemm over its own pre-packed layout runs instead, and at the baseline
// (sse41) oneDNN's gemm:jit, which the baseline variant does not clearly beat (sgemm.cc).
bool PackedSgemmRunsAt(KernelLevel level);

// Most rows the packed sgemm is chosen for. oneDNN's gemm:jit re-packs the weight on every call,
// a cost that its M rows share: at 64-256 rows that is what makes it 1.5-1.9x slower than this
// kernel (avx2, 2 threads, K and N of 768-3072), while from 512 rows its kernel's steady state,
// 5-10% above this one's on long K, wins back the packing (0.88-1.0x measured).
inline constexpr int64_t kPackedSgemmMaxRows = 256;

// The blocked product, split over the OpenMP threads; the variant of ActiveKernelLevel().
void PackedSgemm(const PackedMatmulArgs& a);

}  // namespace kiln::runtime::cpu

#endif  // KILN_RUNTIME_CPU_INTERNAL_SGEMM_H_
