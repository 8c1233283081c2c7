#include "kiln/base/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kiln::crc32c {
namespace {

uint32_t Str(const std::string& s) { return Value(s.data(), s.size()); }

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(Crc32cTest, StandardVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the usual check value.
  EXPECT_EQ(Str("123456789"), 0xe3069283u);
  EXPECT_EQ(Str(""), 0u);
  EXPECT_EQ(Str("a"), 0xc1d04330u);
  EXPECT_EQ(Str(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(Str(std::string(32, '\xff')), 0x62a8ab43u);
  std::string inc(32, '\0'), dec(32, '\0');
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Str(inc), 0x46dd794eu);
  EXPECT_EQ(Str(dec), 0x113fdb5cu);
  // An iSCSI read command PDU (RFC 3720 B.4).
  const uint8_t pdu[48] = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                           0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
                           0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
                           0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(Value(pdu, sizeof(pdu)), 0xd9963a56u);
}

TEST(Crc32cTest, BothImplementationsGiveTheStandardVectors) {
  const std::string s = "123456789";
  EXPECT_EQ(internal::ExtendPortable(0, s.data(), s.size()), 0xe3069283u);
  if (HardwareAccelerated()) {
    EXPECT_EQ(internal::ExtendSse42(0, s.data(), s.size()), 0xe3069283u);
  }
}

TEST(Crc32cTest, ImplementationsAgreeOnRandomDataAtEveryAlignmentAndLength) {
  if (!HardwareAccelerated()) GTEST_SKIP() << "CPU lacks SSE4.2";
  const std::string data = RandomBytes(4096 + 64, 7);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t off = rng() % 64;
    const size_t len = (trial < 300) ? trial : rng() % 4096;
    const uint32_t seed = (trial % 3 == 0) ? 0 : rng();
    ASSERT_EQ(internal::ExtendPortable(seed, data.data() + off, len),
              internal::ExtendSse42(seed, data.data() + off, len))
        << "offset " << off << " length " << len;
  }
}

TEST(Crc32cTest, ExtendEqualsValueOfConcatenation) {
  const std::string data = RandomBytes(1000, 3);
  const uint32_t whole = Str(data);
  for (size_t split = 0; split <= data.size(); split += 37) {
    const uint32_t a = Value(data.data(), split);
    EXPECT_EQ(Extend(a, data.data() + split, data.size() - split), whole) << split;
    EXPECT_EQ(internal::ExtendPortable(internal::ExtendPortable(0, data.data(), split),
                                       data.data() + split, data.size() - split),
              whole);
  }
  EXPECT_EQ(Extend(Str("hello "), "world", 5), Str("hello world"));
}

TEST(Crc32cTest, CombineEqualsValueOfConcatenation) {
  const std::string data = RandomBytes(5000, 5);
  const uint32_t whole = Str(data);
  for (size_t split :
       {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{999}, size_t{4999}, size_t{5000}}) {
    const uint32_t a = Value(data.data(), split);
    const uint32_t b = Value(data.data() + split, data.size() - split);
    EXPECT_EQ(Combine(a, b, data.size() - split), whole) << split;
  }
  // Three pieces, as a shard's CRC is built from its header and tensors.
  const uint32_t a = Value(data.data(), 100), b = Value(data.data() + 100, 2000),
                 c = Value(data.data() + 2100, 2900);
  EXPECT_EQ(Combine(Combine(a, b, 2000), c, 2900), whole);
  // A long run of zeros (len_b beyond 32 bits of bit-length exercises the high table entries).
  std::vector<char> zeros(1 << 20, 0);
  const uint32_t z = Value(zeros.data(), zeros.size());
  EXPECT_EQ(Combine(Str("x"), z, zeros.size()), Extend(Str("x"), zeros.data(), zeros.size()));
}

TEST(Crc32cTest, ValueDiffersForDifferentData) {
  EXPECT_NE(Str("a"), Str("foo"));
  std::string s = RandomBytes(256, 9);
  const uint32_t before = Str(s);
  s[100] ^= 1;
  EXPECT_NE(Str(s), before);
}

TEST(Crc32cTest, MaskUnmaskRoundTrip) {
  const uint32_t crc = Str("foo");
  EXPECT_NE(crc, Mask(crc));
  EXPECT_NE(crc, Mask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Unmask(Mask(Mask(crc)))));
  std::mt19937 rng(1);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t v = rng();
    ASSERT_EQ(Unmask(Mask(v)), v);
  }
  // The TFRecord form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
  EXPECT_EQ(Mask(0x12345678u), ((0x12345678u >> 15) | (0x12345678u << 17)) + 0xa282ead8u);
}

}  // namespace
}  // namespace kiln::crc32c
