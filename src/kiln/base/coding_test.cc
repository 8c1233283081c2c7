#include "kiln/base/coding.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(Coding, FixedWidthIsLittleEndian) {
  std::string s;
  PutFixed16(&s, 0x0102);
  PutFixed32(&s, 0x03040506u);
  PutFixed64(&s, 0x0708090a0b0c0d0eull);
  EXPECT_EQ(s, std::string("\x02\x01\x06\x05\x04\x03\x0e\x0d\x0c\x0b\x0a\x09\x08\x07", 14));
  EXPECT_EQ(DecodeFixed16(s.data()), 0x0102);
  EXPECT_EQ(DecodeFixed32(s.data() + 2), 0x03040506u);
  EXPECT_EQ(DecodeFixed64(s.data() + 6), 0x0708090a0b0c0d0eull);
}

TEST(Coding, FixedWidthRoundTripsExtremes) {
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0x80}, uint64_t{0xff}, uint64_t{1} << 63,
                     std::numeric_limits<uint64_t>::max()}) {
    char b[8];
    EncodeFixed64(b, v);
    EXPECT_EQ(DecodeFixed64(b), v);
    EncodeFixed32(b, static_cast<uint32_t>(v));
    EXPECT_EQ(DecodeFixed32(b), static_cast<uint32_t>(v));
    EncodeFixed16(b, static_cast<uint16_t>(v));
    EXPECT_EQ(DecodeFixed16(b), static_cast<uint16_t>(v));
  }
}

TEST(Coding, Float32IsItsBitPattern) {
  std::string s;
  PutFloat32(&s, 1.0f);
  EXPECT_EQ(s, std::string("\x00\x00\x80\x3f", 4));
  EXPECT_EQ(DecodeFloat32(s.data()), 1.0f);
  char b[4];
  EncodeFloat32(b, -0.0f);
  EXPECT_TRUE(std::signbit(DecodeFloat32(b)));
  EXPECT_EQ(FloatBits(std::numeric_limits<float>::infinity()), 0x7f800000u);
  EXPECT_EQ(DoubleBits(1.0), 0x3ff0000000000000ull);
  EXPECT_EQ(DoubleFromBits(DoubleBits(-2.5)), -2.5);
}

TEST(Coding, GetFixedChecksBounds) {
  std::string s;
  PutFixed32(&s, 7);
  PutFixed64(&s, 9);
  std::string_view in = s;
  uint32_t a = 0;
  uint64_t b = 0;
  ASSERT_TRUE(GetFixed32(&in, &a));
  EXPECT_EQ(a, 7u);
  std::string_view short_in = in.substr(0, 7);
  EXPECT_FALSE(GetFixed64(&short_in, &b));
  EXPECT_EQ(short_in.size(), 7u);  // unchanged
  ASSERT_TRUE(GetFixed64(&in, &b));
  EXPECT_EQ(b, 9u);
  EXPECT_TRUE(in.empty());
  EXPECT_FALSE(GetFixed32(&in, &a));
}

std::string Varint(uint64_t v) {
  std::string s;
  PutVarint64(&s, v);
  return s;
}

TEST(Coding, VarintEdgeCases) {
  EXPECT_EQ(Varint(0), std::string("\x00", 1));
  EXPECT_EQ(Varint(127), "\x7f");
  EXPECT_EQ(Varint(128), "\x80\x01");
  EXPECT_EQ(Varint(300), "\xac\x02");  // the protobuf encoding guide's example
  EXPECT_EQ(Varint(uint64_t{1} << 63), "\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01");
  EXPECT_EQ(Varint(std::numeric_limits<uint64_t>::max()),
            "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01");
  EXPECT_EQ(VarintLength(0), 1u);
  EXPECT_EQ(VarintLength(127), 1u);
  EXPECT_EQ(VarintLength(128), 2u);
  EXPECT_EQ(VarintLength(uint64_t{1} << 63), 10u);
}

TEST(Coding, VarintRoundTrips) {
  std::vector<uint64_t> values = {0,
                                  1,
                                  127,
                                  128,
                                  255,
                                  300,
                                  16383,
                                  16384,
                                  (uint64_t{1} << 32) - 1,
                                  uint64_t{1} << 32,
                                  uint64_t{1} << 63,
                                  std::numeric_limits<uint64_t>::max()};
  std::string s;
  for (uint64_t v : values) PutVarint64(&s, v);
  std::string_view in = s;
  for (uint64_t v : values) {
    const size_t before = in.size();
    uint64_t got = 0;
    ASSERT_EQ(ParseVarint64(&in, &got), VarintResult::kOk);
    EXPECT_EQ(got, v);
    EXPECT_EQ(before - in.size(), VarintLength(v));
  }
  EXPECT_TRUE(in.empty());
  char buf[kMaxVarint64Bytes];
  EXPECT_EQ(EncodeVarint64(buf, 300) - buf, 2);
}

TEST(Coding, VarintTruncatedAndOverlongLeaveInputAlone) {
  uint64_t v = 42;
  std::string_view empty;
  EXPECT_EQ(ParseVarint64(&empty, &v), VarintResult::kTruncated);
  std::string_view cut("\x80\x80", 2);
  EXPECT_EQ(ParseVarint64(&cut, &v), VarintResult::kTruncated);
  EXPECT_EQ(cut.size(), 2u);
  EXPECT_EQ(v, 42u);
  EXPECT_FALSE(GetVarint64(&cut, &v));
  const std::string full = Varint(uint64_t{1} << 63);
  std::string_view nine(full.data(), 9);
  EXPECT_EQ(ParseVarint64(&nine, &v), VarintResult::kTruncated);
  std::string_view over("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 10);  // 70 bits
  EXPECT_EQ(ParseVarint64(&over, &v), VarintResult::kOverflow);
  EXPECT_EQ(over.size(), 10u);
  std::string_view eleven("\x80\x80\x80\x80\x80\x80\x80\x80\x80\x81\x01", 11);
  EXPECT_EQ(ParseVarint64(&eleven, &v), VarintResult::kOverflow);
}

}  // namespace
}  // namespace kiln
