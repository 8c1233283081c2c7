// Helpers shared by the cpu backend's tests that write IR programs as text (gemv_test,
// prepack_test, layout_test).
#ifndef KILN_RUNTIME_CPU_TEST_UTIL_H_
#define KILN_RUNTIME_CPU_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::runtime::testing {

// An f32 tensor of uniform values in [-1, 1) from `seed`.
inline Tensor Random(Shape s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tensor t(DType::kF32, std::move(s));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// "f32[2,3]": an f32 type in IR text.
inline std::string Dims(const std::vector<int64_t>& d) {
  std::string s = "f32[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace kiln::runtime::testing

#endif  // KILN_RUNTIME_CPU_TEST_UTIL_H_
