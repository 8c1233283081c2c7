#include "kiln/tensor/dtype.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kiln/tensor/tensor.h"

namespace kiln {
namespace {

TEST(DTypeTest, NamesRoundTrip) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    EXPECT_EQ(DTypeFromName(DTypeName(t)), t);
    EXPECT_EQ(DTypeFromSafetensorsName(SafetensorsName(t)), t);
  }
  EXPECT_FALSE(DTypeFromName("f128").has_value());
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

TEST(DTypeTest, F16MatchesKnownEncodings) {
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(1e6f), 0x7c00);
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  for (int b = 0; b < 0x7c00; b += 7) EXPECT_EQ(FloatToF16(F16ToFloat(b)), b);
}

TEST(DTypeTest, F8RoundTripsEveryCode) {
  for (int b = 0; b < 256; ++b) {
    float f = F8E4M3ToFloat(static_cast<uint8_t>(b));
    if (!std::isnan(f)) EXPECT_EQ(FloatToF8E4M3(f), b) << b;
    float g = F8E5M2ToFloat(static_cast<uint8_t>(b));
    if (!std::isnan(g)) EXPECT_EQ(FloatToF8E5M2(g), b) << b;
  }
  EXPECT_EQ(F8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(FloatToF8E4M3(1e6f), 0x7e);
  EXPECT_EQ(F8E5M2ToFloat(0x7b), 57344.0f);
}

TEST(DTypeTest, IntegerStoresSaturateAndTruncate) {
  Tensor t(DType::kS8, Shape{3});
  t.SetDouble(0, 300.0);
  t.SetDouble(1, -2.7);
  t.SetDouble(2, NAN);
  EXPECT_EQ(t.data<int8_t>()[0], 127);
  EXPECT_EQ(t.data<int8_t>()[1], -2);
  EXPECT_EQ(t.data<int8_t>()[2], 0);
}

TEST(TensorTest, AlignedZeroFilledAndClone) {
  Tensor t(DType::kF32, Shape{5, 3});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kTensorAlignment, 0u);
  EXPECT_EQ(t.GetDouble(14), 0.0);
  Tensor u = t;
  u.data<float>()[0] = 2.0f;
  EXPECT_EQ(t.data<float>()[0], 2.0f);  // shared storage
  Tensor c = t.Clone();
  c.data<float>()[0] = 3.0f;
  EXPECT_EQ(t.data<float>()[0], 2.0f);
  EXPECT_EQ(t.TypeString(), "f32[5,3]");
}

}  // namespace
}  // namespace kiln
