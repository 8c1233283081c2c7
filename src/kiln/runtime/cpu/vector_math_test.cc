// ExpF32 / TanhF32 / GeluTanhF32 against libm in double precision over their whole f32 range,
// plus the edge values (overflow, underflow, infinities, NaN, in-place use).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Points spread over [lo, hi]: a uniform grid plus every float near 0 and the range ends.
std::vector<float> Points(float lo, float hi, int n) {
  std::vector<float> x;
  for (int i = 0; i <= n; ++i) x.push_back(lo + (hi - lo) * static_cast<float>(i) / n);
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 1e-7f, -1e-7f, 0.624f, 0.625f, -0.625f, lo, hi})
    x.push_back(v);
  return x;
}

// |got - want| in units of the f32 spacing at want.
double Ulps(float got, double want) {
  const double spacing = std::nextafter(static_cast<float>(std::fabs(want)), kInf) -
                         std::fabs(static_cast<float>(want));
  return std::fabs(got - want) / std::max(spacing, 1e-45);
}

TEST(VectorMathTest, ExpWithinFourUlpsOverTheFiniteRange) {
  std::vector<float> x = Points(-87.f, 88.72f, 200000), y(x.size());
  ExpF32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, Ulps(y[i], std::exp(double(x[i]))));
  EXPECT_LE(worst, 4.0);
}

TEST(VectorMathTest, ExpEdges) {
  std::vector<float> x = {
      89.f,  1000.f, kInf, -kInf, -88.f, -1000.f, std::numeric_limits<float>::quiet_NaN(),
      88.7f, 0.f};
  std::vector<float> y(x.size());
  ExpF32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], kInf);
  EXPECT_EQ(y[1], kInf);
  EXPECT_EQ(y[2], kInf);
  EXPECT_EQ(y[3], 0.f);
  EXPECT_LT(y[4], 1e-37f);  // expf is denormal here: flushed to 0 or tiny
  EXPECT_EQ(y[5], 0.f);
  EXPECT_TRUE(std::isnan(y[6]));
  EXPECT_LE(Ulps(y[7], std::exp(double(88.7f))), 4.0);
  EXPECT_EQ(y[8], 1.f);
}

TEST(VectorMathTest, TanhWithinFourUlpsAndOdd) {
  std::vector<float> x = Points(-12.f, 12.f, 200000), y(x.size());
  TanhF32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, Ulps(y[i], std::tanh(double(x[i]))));
    float neg = -x[i], yn;
    TanhF32(&neg, &yn, 1);
    EXPECT_EQ(yn, -y[i]) << x[i];
  }
  EXPECT_LE(worst, 4.0);
  std::vector<float> e = {kInf, -kInf, 100.f, std::numeric_limits<float>::quiet_NaN()};
  TanhF32(e.data(), e.data(), 4);  // in place
  EXPECT_EQ(e[0], 1.f);
  EXPECT_EQ(e[1], -1.f);
  EXPECT_EQ(e[2], 1.f);
  EXPECT_TRUE(std::isnan(e[3]));
}

TEST(VectorMathTest, GeluTanhMatchesItsFormula) {
  std::vector<float> x = Points(-10.f, 10.f, 100000), y(x.size());
  GeluTanhF32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double want =
        0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y[i], want, 2e-7 * std::max(1.0, std::fabs(want))) << x[i];
  }
}

}  // namespace
}  // namespace kiln::runtime::cpu
