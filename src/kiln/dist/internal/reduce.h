// Element-wise reduction kernels shared by the communicators: the fixed rank order of
// communicator.h (acc = x[0]; acc = acc + x[1]; ...), f32 accumulation for bf16, wrap-around s32.
#ifndef KILN_DIST_INTERNAL_REDUCE_H_
#define KILN_DIST_INTERNAL_REDUCE_H_

#include <cstdint>

#include "kiln/dist/communicator.h"
#include "kiln/tensor/dtype.h"

namespace kiln::dist::internal {

// f32, bf16, s32: the dtypes AllReduce and ReduceScatter take.
bool IsReducible(DType dtype);

// out[i] = reduce over r = 0..n-1, in that order, of inputs[r][offset + i], for i < count; mean
// divides once at the end and bf16 rounds once at the end. `out` may be one of the inputs at
// the same position (out == inputs[r] + offset): each block of 1024 elements is reduced into a
// local accumulator and written after every input's block has been read.
void ReduceRankOrder(const void* const* inputs, int n, int64_t offset, int64_t count, DType dtype,
                     ReduceOp op, void* out);

// data[i] /= n (f32 division; s32 truncating toward zero), for a sum computed elsewhere.
void DivideInPlace(void* data, int64_t count, DType dtype, int n);

void Bf16ToF32(const uint16_t* in, float* out, int64_t count);
// Round to nearest even, once.
void F32ToBf16(const float* in, uint16_t* out, int64_t count);

}  // namespace kiln::dist::internal

#endif  // KILN_DIST_INTERNAL_REDUCE_H_
