// Test helpers for the reference backend tests: build a graph with the Builder, compile it on the
// reference backend and run it, then compare with exact or near-exact expected values.
//
//   Builder b;
//   Value x = b.Parameter("x", DType::kF64, {3});
//   b.Output("y", Exp(x));
//   std::vector<Tensor> out = RunRef(b, {F64({3}, {0, 1, 2})});
//   ExpectValues(out[0], {1, M_E, M_E * M_E}, 1e-15);
#ifndef KILN_RUNTIME_REFERENCE_REFERENCE_TEST_UTIL_H_
#define KILN_RUNTIME_REFERENCE_REFERENCE_TEST_UTIL_H_

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::runtime::testing {

inline Tensor Make(DType t, Shape s, const std::vector<double>& v) {
  return Tensor::FromDoubles(t, std::move(s), v);
}
inline Tensor F64(Shape s, const std::vector<double>& v) {
  return Make(DType::kF64, std::move(s), v);
}
inline Tensor F32(Shape s, const std::vector<double>& v) {
  return Make(DType::kF32, std::move(s), v);
}

// Compiles the builder's graph on the reference backend and runs it; fails the test on any error.
inline std::vector<Tensor> RunRef(ir::Builder& b, const std::vector<Tensor>& inputs) {
  absl::StatusOr<ir::Graph> g = b.Build();
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return {};
  auto exe = MakeReferenceBackend()->Compile(*g);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  auto outs = (*exe)->Run(inputs);
  EXPECT_TRUE(outs.ok()) << outs.status();
  if (!outs.ok()) return {};
  return *outs;
}

// Element-by-element comparison; NaN matches NaN. tol = 0 means bit-exact values.
inline void ExpectValues(const Tensor& t, const std::vector<double>& want, double tol = 0) {
  ASSERT_EQ(t.num_elements(), static_cast<int64_t>(want.size())) << t.TypeString();
  for (size_t i = 0; i < want.size(); ++i) {
    double got = t.GetDouble(static_cast<int64_t>(i));
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got)) << "element " << i << " of " << t.TypeString() << ": " << got;
    } else if (tol == 0) {
      EXPECT_EQ(got, want[i]) << "element " << i << " of " << t.TypeString();
    } else {
      EXPECT_NEAR(got, want[i], tol) << "element " << i << " of " << t.TypeString();
    }
  }
}

}  // namespace kiln::runtime::testing

#endif  // KILN_RUNTIME_REFERENCE_REFERENCE_TEST_UTIL_H_
