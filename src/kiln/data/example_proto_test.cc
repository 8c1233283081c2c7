#include "kiln/data/example_proto.h"

#include <cmath>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace kiln::data {
namespace {

std::string Hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    if (!out.empty()) out += ' ';
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::string Unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size() + 1; i += 3) {
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// Every expected encoding below is worked out by hand from the protobuf encoding spec
// (tag = field << 3 | wire type; lengths and int64 as base-128 varints; floats fixed32 LE).
TEST(ExampleProto, EmptyExample) {
  EXPECT_EQ(Hex(EncodeExample(Example{})), "0a 00");
  absl::StatusOr<Example> back = DecodeExample("");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->features.empty());
}

TEST(ExampleProto, Int64ByteExact) {
  Example ex;
  ex.features["a"] = Feature::Int64s({1});
  EXPECT_EQ(Hex(EncodeExample(ex)), "0a 0c 0a 0a 0a 01 61 12 05 1a 03 0a 01 01");
  ex.features["a"] = Feature::Int64s({300, -1});
  // 300 = ac 02; -1 = ten bytes ff..ff 01; packed payload 12 (0x0c) bytes.
  EXPECT_EQ(Hex(EncodeExample(ex)),
            "0a 17 0a 15 0a 01 61 12 10 1a 0e 0a 0c ac 02 ff ff ff ff ff ff ff ff ff 01");
}

TEST(ExampleProto, FloatAndBytesByteExact) {
  Example ex;
  ex.features["f"] = Feature::Floats({1.0f});
  EXPECT_EQ(Hex(EncodeExample(ex)), "0a 0f 0a 0d 0a 01 66 12 08 12 06 0a 04 00 00 80 3f");
  Example eb;
  eb.features["b"] = Feature::Bytes({"xy", ""});
  EXPECT_EQ(Hex(EncodeExample(eb)), "0a 0f 0a 0d 0a 01 62 12 08 0a 06 0a 02 78 79 0a 00");
}

TEST(ExampleProto, EmptyListsAndKeysSorted) {
  Example ex;
  ex.features["z"] = Feature::Floats({});
  ex.features["a"] = Feature{};  // no oneof member: an empty Feature message
  // entry a: 0a 01 61 12 00; entry z: 0a 01 7a 12 02 12 00
  EXPECT_EQ(Hex(EncodeExample(ex)), "0a 10 0a 05 0a 01 61 12 00 0a 07 0a 01 7a 12 02 12 00");
  absl::StatusOr<Example> back = DecodeExample(EncodeExample(ex));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, ex);
}

TEST(ExampleProto, ReadsUnpackedAndUnknownFields) {
  // Example{ unknown field 2 = varint 5; features{ "a": int64_list unpacked [1, 2] (08 01 08 02),
  // "f": an unknown fixed64 field 7 (39 + 8 bytes), then float_list unpacked [1.0] (0d + 4) } }.
  const std::string bytes = Unhex(
      "10 05 0a 24 0a 0b 0a 01 61 12 06 1a 04 08 01 08 02 0a 15 0a 01 66 12 10 39 00 00 00 00 00 "
      "00 00 00 12 05 0d 00 00 80 3f");
  absl::StatusOr<Example> ex = DecodeExample(bytes);
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->features["a"], Feature::Int64s({1, 2}));
  EXPECT_EQ(ex->features["f"], Feature::Floats({1.0f}));
}

TEST(ExampleProto, MergesRepeatedMessagesAndOneofReplacement) {
  // Feature "a": bytes_list ["x"], then int64_list [5]: the int64 member replaces the bytes one.
  // Key "a" appears again in a second Features message: the last value wins.
  std::string bytes = Unhex(
      "0a 0e 0a 0c 0a 01 61 12 07 0a 03 0a 01 78 1a 00"
      " 0a 0c 0a 0a 0a 01 61 12 05 1a 03 0a 01 05");
  absl::StatusOr<Example> ex = DecodeExample(bytes);
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->features.size(), 1u);
  EXPECT_EQ(ex->features["a"], Feature::Int64s({5}));
  // Two int64_list fields in one Feature append.
  ex = DecodeExample(Unhex("0a 0e 0a 0c 0a 01 61 12 07 1a 02 08 07 1a 01 08"));
  EXPECT_FALSE(ex.ok());  // the last list is truncated
  ex = DecodeExample(Unhex("0a 0f 0a 0d 0a 01 61 12 08 1a 02 08 07 1a 02 08 09"));
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->features["a"], Feature::Int64s({7, 9}));
}

TEST(ExampleProto, MalformedInputsAreDataLossWithOffsets) {
  struct Case {
    const char* hex;
    const char* message;
  };
  const Case cases[] = {
      {"0a 05 0a", "length-delimited field past its end at byte 1"},
      {"0b", "unsupported wire type 3 at byte 0"},
      {"02", "invalid field number at byte 0"},
      {"10 ff", "truncated varint at byte 1"},
      {"10 ff ff ff ff ff ff ff ff ff 7f", "varint longer than 64 bits at byte 1"},
      {"0a 0a 0a 08 0a 01 66 12 03 12 01 0a", "truncated varint at byte 12"},
      {"0a 0c 0a 0a 0a 01 66 12 05 12 03 0a 01 00",
       "packed float_list not a multiple of 4 bytes at byte 13"},
      {"0a 02 08 01", "feature map entry not length-delimited at byte 2"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Example> ex = DecodeExample(Unhex(c.hex));
    ASSERT_FALSE(ex.ok()) << c.hex;
    EXPECT_EQ(ex.status().code(), absl::StatusCode::kDataLoss) << c.hex;
    EXPECT_NE(ex.status().message().find(c.message), std::string::npos)
        << c.hex << ": " << ex.status().message();
  }
}

Example RandomExample(std::mt19937_64& rng) {
  Example ex;
  const int n = static_cast<int>(rng() % 5);
  for (int i = 0; i < n; ++i) {
    std::string key(rng() % 6, 'k');
    for (char& ch : key) ch = static_cast<char>('a' + rng() % 26);
    Feature f;
    const int len = static_cast<int>(rng() % 40);
    switch (rng() % 4) {
      case 0:
        break;
      case 1:
        f.kind = Feature::Kind::kBytes;
        for (int j = 0; j < len % 4; ++j) f.bytes_list.push_back(std::string(rng() % 200, 'x'));
        break;
      case 2:
        f.kind = Feature::Kind::kFloat;
        for (int j = 0; j < len; ++j) f.float_list.push_back(static_cast<float>(rng() % 1000) / 7);
        break;
      default:
        f.kind = Feature::Kind::kInt64;
        for (int j = 0; j < len; ++j)
          f.int64_list.push_back(static_cast<int64_t>(rng()) >> (rng() % 64));
        break;
    }
    ex.features[key] = f;
  }
  return ex;
}

TEST(ExampleProto, RandomRoundTripsAndTruncationsNeverCrash) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    Example ex = RandomExample(rng);
    const std::string bytes = EncodeExample(ex);
    absl::StatusOr<Example> back = DecodeExample(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(*back, ex);
    EXPECT_EQ(EncodeExample(*back), bytes);
    // Every proper prefix of a non-empty encoding cuts the outer length-delimited field.
    for (size_t cut = 0; cut < bytes.size(); cut += 1 + rng() % 7) {
      absl::StatusOr<Example> t = DecodeExample(std::string_view(bytes).substr(0, cut));
      if (cut > 0) {
        EXPECT_FALSE(t.ok()) << "prefix " << cut;
        EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
      }
    }
    // Random byte damage: any result is fine as long as it is OK or DataLoss.
    std::string damaged = bytes;
    for (int k = 0; k < 3 && !damaged.empty(); ++k)
      damaged[rng() % damaged.size()] = static_cast<char>(rng());
    absl::StatusOr<Example> d = DecodeExample(damaged);
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
    }
  }
}

}  // namespace
}  // namespace kiln::data
