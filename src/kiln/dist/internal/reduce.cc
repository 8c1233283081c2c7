#include "kiln/dist/internal/reduce.h"

#include <algorithm>
#include <cstring>

#include "kiln/base/isa_dispatch.h"

namespace kiln::dist::internal {
namespace {

// Elements reduced per block: the accumulator stays in L1 while every rank's block is added.
constexpr int64_t kBlock = 1024;

// int32 sums wrap (two's complement) without signed-overflow UB.
inline int32_t WrapAdd(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}

// The element loops, compiled once per ISA level (base/isa_dispatch.h: the process's capped
// level picks one) and vectorized (-fvect-cost-model=dynamic in CMakeLists.txt).
KILN_ALWAYS_INLINE inline void Combine2Body(float* __restrict acc, const float* __restrict a,
                                            const float* __restrict b, int64_t len, bool max) {
  if (max) {
    for (int64_t i = 0; i < len; ++i) acc[i] = b[i] > a[i] ? b[i] : a[i];
  } else {
    for (int64_t i = 0; i < len; ++i) acc[i] = a[i] + b[i];
  }
}

KILN_ALWAYS_INLINE inline void CombineIntoBody(float* __restrict acc, const float* __restrict x,
                                               int64_t len, bool max) {
  if (max) {
    for (int64_t i = 0; i < len; ++i) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
  } else {
    for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] + x[i];
  }
}

KILN_ALWAYS_INLINE inline void DivideBlockBody(float* __restrict acc, int64_t len, float d) {
  for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] / d;
}

KILN_ISA_VARIANTS(void, Combine2,
                  (float* __restrict acc, const float* __restrict a, const float* __restrict b,
                   int64_t len, bool max),
                  (acc, a, b, len, max))
KILN_ISA_VARIANTS(void, CombineInto,
                  (float* __restrict acc, const float* __restrict x, int64_t len, bool max),
                  (acc, x, len, max))
KILN_ISA_VARIANTS(void, DivideBlock, (float* __restrict acc, int64_t len, float d), (acc, len, d))

// acc = the rank-order reduction of the block [at, at + len) of every input (f32 or bf16).
void ReduceF32Block(const void* const* inputs, int n, int64_t at, int64_t len, DType dtype,
                    ReduceOp op, float* acc) {
  const bool max = op == ReduceOp::kMax;
  float tmp[2][kBlock];
  auto load = [&](int r, int slot) -> const float* {
    if (dtype != DType::kBF16) return static_cast<const float*>(inputs[r]) + at;
    Bf16ToF32(static_cast<const uint16_t*>(inputs[r]) + at, tmp[slot], len);
    return tmp[slot];
  };
  if (n == 1) {
    std::memcpy(acc, load(0, 0), len * sizeof(float));
  } else {
    Combine2(acc, load(0, 0), load(1, 1), len, max);  // x[0] + x[1], then + x[2], ...
    for (int r = 2; r < n; ++r) CombineInto(acc, load(r, 0), len, max);
  }
  if (op == ReduceOp::kMean) DivideBlock(acc, len, static_cast<float>(n));
}

void ReduceS32Block(const void* const* inputs, int n, int64_t at, int64_t len, ReduceOp op,
                    int32_t* out) {
  int32_t acc[kBlock];
  for (int r = 0; r < n; ++r) {
    const int32_t* x = static_cast<const int32_t*>(inputs[r]) + at;
    for (int64_t i = 0; i < len; ++i) {
      if (r == 0)
        acc[i] = x[i];
      else
        acc[i] = op == ReduceOp::kMax ? std::max(acc[i], x[i]) : WrapAdd(acc[i], x[i]);
    }
  }
  for (int64_t i = 0; i < len; ++i) out[i] = op == ReduceOp::kMean ? acc[i] / n : acc[i];
}

}  // namespace

bool IsReducible(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kS32;
}

void ReduceRankOrder(const void* const* inputs, int n, int64_t offset, int64_t count, DType dtype,
                     ReduceOp op, void* out) {
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t len = std::min(kBlock, count - b);
    const int64_t at = offset + b;
    if (dtype == DType::kS32) {
      ReduceS32Block(inputs, n, at, len, op, static_cast<int32_t*>(out) + b);
    } else if (dtype == DType::kBF16) {
      float acc[kBlock];
      ReduceF32Block(inputs, n, at, len, dtype, op, acc);
      F32ToBf16(acc, static_cast<uint16_t*>(out) + b, len);
    } else {
      // Through a local block, so that `out` may be one of the inputs.
      float acc[kBlock];
      ReduceF32Block(inputs, n, at, len, dtype, op, acc);
      std::memcpy(static_cast<float*>(out) + b, acc, len * sizeof(float));
    }
  }
}

void DivideInPlace(void* data, int64_t count, DType dtype, int n) {
  if (dtype == DType::kS32) {
    int32_t* x = static_cast<int32_t*>(data);
    for (int64_t i = 0; i < count; ++i) x[i] /= n;
    return;
  }
  float* x = static_cast<float*>(data);
  const float d = static_cast<float>(n);
  for (int64_t i = 0; i < count; ++i) x[i] = x[i] / d;
}

KILN_ALWAYS_INLINE inline void Bf16ToF32Body(const uint16_t* __restrict in, float* __restrict out,
                                             int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(&out[i], &bits, sizeof(float));
  }
}

// FloatToBf16 (tensor/dtype.cc) inlined, bit for bit: NaN stays a quiet NaN, others round to
// nearest even.
KILN_ALWAYS_INLINE inline void F32ToBf16Body(const float* __restrict in, uint16_t* __restrict out,
                                             int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t u;
    std::memcpy(&u, &in[i], sizeof(u));
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    out[i] = static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
  }
}

KILN_ISA_VARIANTS(void, Bf16ToF32,
                  (const uint16_t* __restrict in, float* __restrict out, int64_t count),
                  (in, out, count))
KILN_ISA_VARIANTS(void, F32ToBf16,
                  (const float* __restrict in, uint16_t* __restrict out, int64_t count),
                  (in, out, count))

}  // namespace kiln::dist::internal
