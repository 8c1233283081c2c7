#include "kiln/dist/internal/reduce.h"

#include <algorithm>
#include <cstring>

namespace kiln::dist::internal {
namespace {

// Elements reduced per block: the accumulator stays in L1 while every rank's block is added.
constexpr int64_t kBlock = 1024;

// int32 sums wrap (two's complement) without signed-overflow UB.
inline int32_t WrapAdd(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}

void ReduceF32Block(const void* const* inputs, int n, int64_t at, int64_t len, DType dtype,
                    ReduceOp op, float* acc) {
  for (int r = 0; r < n; ++r) {
    float tmp[kBlock];
    const float* x;
    if (dtype == DType::kBF16) {
      Bf16ToF32(static_cast<const uint16_t*>(inputs[r]) + at, tmp, len);
      x = tmp;
    } else {
      x = static_cast<const float*>(inputs[r]) + at;
    }
    // One loop per reduction, with no branch inside, so that -O2 vectorizes it.
    if (r == 0) {
      std::memcpy(acc, x, len * sizeof(float));
    } else if (op == ReduceOp::kMax) {
      for (int64_t i = 0; i < len; ++i) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
    } else {
      for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] + x[i];
    }
  }
  if (op == ReduceOp::kMean) {
    const float d = static_cast<float>(n);
    for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] / d;
  }
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

void Bf16ToF32(const uint16_t* in, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(&out[i], &bits, sizeof(float));
  }
}

void F32ToBf16(const float* in, uint16_t* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = FloatToBf16(in[i]);
}

}  // namespace kiln::dist::internal
