// Test helpers shared by the thread and MPI communicator tests: deterministic per-rank inputs and
// a scalar oracle for the reductions (the rank order and rounding of communicator.h, written
// independently of the kernels in reduce.cc).
#ifndef KILN_DIST_INTERNAL_ORACLE_H_
#define KILN_DIST_INTERNAL_ORACLE_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/tensor.h"

namespace kiln::dist::internal {

// Rank r's input: deterministic values of `dtype` (s32 includes values near the int32 limits so
// that sums wrap).
inline Tensor Input(DType dtype, int64_t count, int rank) {
  std::mt19937 gen(1234 + 77 * rank);
  Tensor t(dtype, Shape{count});
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kS32) {
      int32_t v = static_cast<int32_t>(gen() % 2001) - 1000;
      if (i % 97 == 0) v = 2147483000 - static_cast<int32_t>(gen() % 100);
      t.data<int32_t>()[i] = v;
    } else {
      t.SetDouble(i, std::uniform_real_distribution<double>(-100.0, 100.0)(gen));
    }
  }
  return t;
}

// The scalar oracle: element i reduced over ranks 0..n-1 in order (f32 accumulation for bf16,
// two's complement wrap for s32), mean divided once, bf16 rounded once.
inline void OracleElement(const std::vector<Tensor>& in, int64_t i, ReduceOp op, void* out,
                          int64_t j) {
  const int n = static_cast<int>(in.size());
  const DType dtype = in[0].dtype();
  if (dtype == DType::kS32) {
    uint32_t sum = 0;
    int32_t mx = in[0].data<int32_t>()[i];
    for (int r = 0; r < n; ++r) {
      int32_t x = in[r].data<int32_t>()[i];
      sum += static_cast<uint32_t>(x);
      if (x > mx) mx = x;
    }
    int32_t s = static_cast<int32_t>(sum);
    static_cast<int32_t*>(out)[j] = op == ReduceOp::kMax ? mx : op == ReduceOp::kMean ? s / n : s;
    return;
  }
  auto load = [&](int r) {
    return dtype == DType::kBF16 ? Bf16ToFloat(in[r].data<uint16_t>()[i]) : in[r].data<float>()[i];
  };
  float acc = load(0);
  for (int r = 1; r < n; ++r) acc = op == ReduceOp::kMax ? std::max(acc, load(r)) : acc + load(r);
  if (op == ReduceOp::kMean) acc = acc / static_cast<float>(n);
  if (dtype == DType::kBF16)
    static_cast<uint16_t*>(out)[j] = FloatToBf16(acc);
  else
    static_cast<float*>(out)[j] = acc;
}

}  // namespace kiln::dist::internal

#endif  // KILN_DIST_INTERNAL_ORACLE_H_
