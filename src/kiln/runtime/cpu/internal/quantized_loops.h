// The int8 ops' loops on the cpu backend (quantized_loops.cc): quantize, the quantize that writes
// a convolution's NHWC source directly, and the per-channel scaling of a convolution's NHWC int32
// sums (converted to f32) into NCHW. SSE2 (the x86-64 baseline), the quantizing ones in AVX-512
// where the cpu has it (a run-time check); bit for bit the reference kernels' formulas:
// q = clamp(rint(x / scale), -127, 127) with NaN -> 0, y = sum * scale.
//
//   QuantizeNchwToNhwc(x, y, 0.02f, batch, channels, h * w);
#ifndef KILN_RUNTIME_CPU_INTERNAL_QUANTIZED_LOOPS_H_
#define KILN_RUNTIME_CPU_INTERNAL_QUANTIZED_LOOPS_H_

#include <cstdint>

namespace kiln::runtime::cpu {

// "avx512" or "sse2": what the quantizing loops run on this cpu (for thunk names).
const char* QuantizeLoopIsa();

// y[i] = q(x[i]) for i in [b, e), on the calling thread. `baseline`: the SSE2 code even where
// AVX-512 is there (tests compare the two).
void QuantizeRange(const float* x, int8_t* y, float scale, int64_t b, int64_t e,
                   bool baseline = false);

// y[n, p, c] = q(x[n, c, p]) (p: the hw spatial positions): NCHW f32 to NHWC s8, 16 x 16 tiles
// quantized and transposed in registers. Parallel over the batch.
void QuantizeNchwToNhwc(const float* x, int8_t* y, float scale, int64_t batch, int64_t channels,
                        int64_t hw, bool baseline = false);

// y[n, c, p] = acc[n, p, c] * scale[c]: the scales and the NHWC -> NCHW relayout in one pass,
// 4 x 4 tiles transposed in registers. Parallel over the batch.
void ScaleNhwcToNchw(const float* acc, const float* scale, float* y, int64_t batch,
                     int64_t channels, int64_t hw);

}  // namespace kiln::runtime::cpu

#endif  // KILN_RUNTIME_CPU_INTERNAL_QUANTIZED_LOOPS_H_
