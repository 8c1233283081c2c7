#include "kiln/tensor/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/fault_injection_env.h"
#include "kiln/base/mem_env.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/kiln_st_" + std::to_string(::getpid()) + "_" + name;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string U64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file from raw header text and data bytes, as another tool would produce it.
std::string Assemble(const std::string& header, const std::string& data) {
  return U64(header.size()) + header + data;
}

// A tensor of `dtype` whose bytes are a deterministic pattern (any bit pattern is a valid value
// for the round trip, which compares bytes).
Tensor Pattern(DType dtype, Shape shape, int seed) {
  Tensor t(dtype, std::move(shape));
  uint8_t* p = t.data<uint8_t>();
  for (int64_t i = 0; i < t.byte_size(); ++i) p[i] = static_cast<uint8_t>(i * 37 + seed * 11 + 5);
  if (dtype == DType::kBool)
    for (int64_t i = 0; i < t.num_elements(); ++i) p[i] &= 1;
  return t;
}

absl::Status ParseStatus(const std::string& bytes) {
  return ParseSafetensors(bytes, nullptr, "test.safetensors").status();
}

// A data-loss error that mentions the source and `what`.
void ExpectCorrupt(const std::string& bytes, const std::string& what) {
  absl::Status s = ParseStatus(bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("test.safetensors")) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(what)) << s;
}

TEST(SafetensorsTest, RoundTripsEveryDTypeScalarsAndEmptyTensors) {
  std::vector<std::pair<std::string, Tensor>> in;
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    std::string name(DTypeName(t));
    in.emplace_back(name + ".matrix", Pattern(t, Shape{3, 5}, i));
    in.emplace_back(name + ".scalar", Pattern(t, Shape{}, i + 100));
    in.emplace_back(name + ".empty", Pattern(t, Shape{0, 4}, 0));
    in.emplace_back(name + ".odd", Pattern(t, Shape{1, 7, 1}, i + 7));
  }
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "42"}, {"", "empty key"}};
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, in, meta).ok());
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0) << "temporary file left behind";

  std::map<std::string, std::string> meta_out;
  absl::StatusOr<std::map<std::string, Tensor>> out = ReadSafetensors(path, &meta_out);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(meta_out, meta);
  ASSERT_EQ(out->size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(out->count(name)) << name;
    EXPECT_TRUE(out->at(name).BitwiseEquals(t)) << name << " " << out->at(name).TypeString();
  }

  // The in-memory path agrees with the file path, byte for byte.
  absl::StatusOr<std::string> bytes = SerializeSafetensors(in, meta);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, ReadFileBytes(path));
  absl::StatusOr<std::map<std::string, Tensor>> parsed = ParseSafetensors(*bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const auto& [name, t] : in) EXPECT_TRUE(parsed->at(name).BitwiseEquals(t)) << name;
  std::remove(path.c_str());
}

TEST(SafetensorsTest, WritesTheReferenceLayout) {
  // Same bytes as the Rust reference's serializer for this input: fields dtype, shape,
  // data_offsets in that order, no whitespace.
  Tensor t = Tensor::FromVector<float>(Shape{1, 2, 3}, {0, 1, 2, 3, 4, 5});
  absl::StatusOr<std::string> bytes = SerializeSafetensors({{"attn.0", t}});
  ASSERT_TRUE(bytes.ok());
  const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header.size(), 64u);
  std::string data(24, '\0');
  std::memcpy(data.data(), t.raw_data(), 24);
  EXPECT_EQ(*bytes, Assemble(header, data));
}

TEST(SafetensorsTest, PadsHeaderWithSpacesAndKeepsInsertionOrder) {
  Tensor a = Tensor::FromVector<int32_t>(Shape{2}, {1, 2});
  Tensor b = Tensor::FromVector<float>(Shape{}, {3.5f});
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors({{"zeta", a}, {"alpha", b}}, {{"k", "v"}});
  ASSERT_TRUE(bytes.ok());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>((*bytes)[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes->size(), 8 + n + 12);
  const std::string header = bytes->substr(8, n);
  EXPECT_EQ(header,
            std::string(R"({"__metadata__":{"k":"v"},"zeta":{"dtype":"I32","shape":[2],)"
                        R"("data_offsets":[0,8]},"alpha":{"dtype":"F32","shape":[],)"
                        R"("data_offsets":[8,12]}})") +
                "     ");  // 123 bytes of JSON + 5 spaces
}

TEST(SafetensorsTest, ReadsAHandBuiltFile) {
  // Written the way other tools write: offsets not in header order, extra whitespace, an unknown
  // field, a BOOL byte of 2 (read as true).
  const std::string header =
      R"({ "b": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]},)"
      R"( "a": {"shape": [2], "dtype": "F32", "data_offsets": [8, 16], "extra": 1},)"
      R"( "m": {"dtype": "BOOL", "shape": [3], "data_offsets": [16, 19]},)"
      R"( "h": {"dtype": "BF16", "shape": [1, 1], "data_offsets": [19, 21]},)"
      R"( "__metadata__": {"format": "pt"}}  )";
  std::string data;
  data += std::string("\x07\0\0\0\0\0\0\0", 8);        // int64 7
  data += std::string("\0\0\x80\x3f\0\0\x20\xc0", 8);  // 1.0f, -2.5f
  data += std::string("\x01\x00\x02", 3);
  data += std::string("\xc0\x3f", 2);  // bf16 1.5
  std::map<std::string, std::string> meta;
  const std::string path = TempPath("handbuilt.safetensors");
  WriteFileBytes(path, Assemble(header, data));
  absl::StatusOr<std::map<std::string, Tensor>> out = ReadSafetensors(path, &meta);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_EQ(out->at("b").TypeString(), "s64[]");
  EXPECT_EQ(out->at("b").data<int64_t>()[0], 7);
  EXPECT_EQ(out->at("a").TypeString(), "f32[2]");
  EXPECT_EQ(out->at("a").ToDoubles(), (std::vector<double>{1.0, -2.5}));
  EXPECT_EQ(out->at("m").ToDoubles(), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(out->at("m").data<uint8_t>()[2], 1);
  EXPECT_EQ(out->at("h").ToDoubles(), (std::vector<double>{1.5}));

  absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(path);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->entries.size(), 4u);
  EXPECT_EQ(h->entries[0].name, "b");  // data-offset order
  EXPECT_EQ(h->entries[3].name, "h");
  EXPECT_EQ(h->data_start, 8 + header.size());
  EXPECT_EQ(h->data_size, 21u);
  std::remove(path.c_str());
}

TEST(SafetensorsTest, EmptyFileWithNoTensors) {
  ASSERT_TRUE(ParseSafetensors(Assemble("{}", "")).ok());
  ASSERT_TRUE(ParseSafetensors(Assemble(R"({"__metadata__":null})", "")).ok());
  absl::StatusOr<std::string> bytes = SerializeSafetensors({});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, Assemble("{}      ", ""));
}

TEST(SafetensorsTest, RejectsShortAndTruncatedInput) {
  ExpectCorrupt("", "shorter than the 8-byte header length");
  ExpectCorrupt("\x02\0\0", "shorter than the 8-byte header length");
  ExpectCorrupt(U64(100) + "{}", "runs past the end");
  ExpectCorrupt(U64(~0ull), "exceeds the limit");
  ExpectCorrupt(U64(kSafetensorsMaxHeaderBytes + 1) + "{}", "exceeds the limit");
  // Data cut short.
  const std::string header = R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  ExpectCorrupt(Assemble(header, std::string(10, '\0')), "past the end of the data buffer");

  // Every truncation of a valid file is an error, never a crash or a partial success.
  absl::StatusOr<std::string> full = SerializeSafetensors(
      {{"w", Pattern(DType::kF32, Shape{3, 3}, 1)}, {"b", Pattern(DType::kS8, Shape{5}, 2)}});
  ASSERT_TRUE(full.ok());
  for (size_t n = 0; n < full->size(); ++n) {
    absl::Status s = ParseStatus(full->substr(0, n));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "length " << n << ": " << s;
  }
}

TEST(SafetensorsTest, RejectsBadJson) {
  ExpectCorrupt(Assemble("{\"a\":", ""), "not valid JSON");
  ExpectCorrupt(Assemble("not json", ""), "not valid JSON");
  ExpectCorrupt(Assemble(std::string("{}\0\0", 4), ""), "not valid JSON");  // NUL padding
  ExpectCorrupt(Assemble("[1,2]", ""), "not an object");
  ExpectCorrupt(Assemble("\"str\"", ""), "not an object");
  ExpectCorrupt(Assemble("{\"\xff\":1}", ""), "not valid JSON");  // invalid UTF-8
  ExpectCorrupt(Assemble(std::string(5000, '[') + std::string(5000, ']'), ""), "not an object");
}

TEST(SafetensorsTest, RejectsBadEntries) {
  auto entry = [](const std::string& body, const std::string& data = std::string(8, '\0')) {
    return Assemble("{\"t\":" + body + "}", data);
  };
  ExpectCorrupt(entry("3"), "tensor 't' is not a JSON object");
  ExpectCorrupt(entry(R"({"shape":[2],"data_offsets":[0,8]})"), "has no dtype");
  ExpectCorrupt(entry(R"({"dtype":5,"shape":[2],"data_offsets":[0,8]})"), "dtype that is not");
  ExpectCorrupt(entry(R"({"dtype":"F128","shape":[2],"data_offsets":[0,8]})"),
                "unsupported dtype 'F128'");
  ExpectCorrupt(entry(R"({"dtype":"U16","shape":[4],"data_offsets":[0,8]})"),
                "unsupported dtype 'U16'");
  ExpectCorrupt(entry(R"({"dtype":"F32","data_offsets":[0,8]})"), "has no shape");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"), "not an array");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
                "invalid dimension -2");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"),
                "invalid dimension");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})"),
                "invalid dimension");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]})"),
                "invalid dimension");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
                "overflows int64");
  ExpectCorrupt(entry(R"({"dtype":"F64","shape":[1152921504606846976],"data_offsets":[0,8]})"),
                "byte size that overflows");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[2]})"), "has no data_offsets");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"), "invalid data_offsets");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,9]})"),
                "invalid data_offsets");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[-1,8]})"),
                "invalid data_offsets");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[2],"data_offsets":{"a":0}})"),
                "invalid data_offsets");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"), "begin > end");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"),
                "past the end of the data buffer");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
                "holds 8 bytes but F32[3] needs 12");
  ExpectCorrupt(entry(R"({"dtype":"F32","shape":[2,0],"data_offsets":[0,8]})"),
                "holds 8 bytes but F32[2,0] needs 0");
}

TEST(SafetensorsTest, RejectsBadMetadata) {
  ExpectCorrupt(Assemble(R"({"__metadata__":[1]})", ""), "__metadata__ is not a JSON object");
  ExpectCorrupt(Assemble(R"({"__metadata__":{"a":1}})", ""),
                "__metadata__ value for 'a' is not a string");
}

TEST(SafetensorsTest, RejectsOverlapsGapsAndDuplicates) {
  const std::string f4 = R"({"dtype":"F32","shape":[1],"data_offsets":)";
  ExpectCorrupt(Assemble("{\"a\":" + f4 + "[0,4]},\"b\":" + f4 + "[2,6]}}", std::string(6, 0)),
                "overlap");
  ExpectCorrupt(Assemble("{\"a\":" + f4 + "[0,4]},\"b\":" + f4 + "[0,4]}}", std::string(4, 0)),
                "overlap");
  ExpectCorrupt(Assemble("{\"a\":" + f4 + "[0,4]},\"b\":" + f4 + "[6,10]}}", std::string(10, 0)),
                "data bytes [4, 6) belong to no tensor");
  ExpectCorrupt(Assemble("{\"a\":" + f4 + "[4,8]}}", std::string(8, 0)),
                "data bytes [0, 4) belong to no tensor");
  ExpectCorrupt(Assemble("{\"a\":" + f4 + "[0,4]}}", std::string(7, 0)),
                "data bytes [4, 7) belong to no tensor");
  ExpectCorrupt(Assemble("{}", "x"), "data bytes [0, 1) belong to no tensor");
  ExpectCorrupt(Assemble("{\"a\":" + f4 + "[0,4]},\"a\":" + f4 + "[4,8]}}", std::string(8, 0)),
                "names 'a' more than once");
  ExpectCorrupt(Assemble(R"({"a":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                         std::string(4, 0)),
                "names 'dtype' more than once");
  // Zero-size tensors may share an offset with anything.
  const std::string z = R"({"dtype":"F32","shape":[0],"data_offsets":)";
  EXPECT_TRUE(
      ParseStatus(Assemble("{\"a\":" + f4 + "[0,4]},\"e\":" + z + "[4,4]},\"f\":" + z + "[0,0]}}",
                           std::string(4, 0)))
          .ok());
}

TEST(SafetensorsTest, RandomHeaderCorruptionNeverCrashes) {
  absl::StatusOr<std::string> good =
      SerializeSafetensors({{"weight", Pattern(DType::kF32, Shape{4, 3}, 1)},
                            {"bias", Pattern(DType::kBF16, Shape{3}, 2)},
                            {"step", Pattern(DType::kS64, Shape{}, 3)}},
                           {{"note", "x"}});
  ASSERT_TRUE(good.ok());
  std::mt19937 rng(1234);
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bad = *good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      size_t pos = rng() % bad.size();
      bad[pos] = static_cast<char>(rng() & 0xff);
    }
    absl::StatusOr<std::map<std::string, Tensor>> r = ParseSafetensors(bad);
    if (r.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    }
  }
  EXPECT_GT(ok, 0);  // flips inside the data buffer stay valid
}

TEST(SafetensorsTest, ReportsFileErrors) {
  absl::StatusOr<std::map<std::string, Tensor>> r =
      ReadSafetensors(TempPath("does_not_exist.safetensors"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("does_not_exist.safetensors"));

  const std::string path = TempPath("short.safetensors");
  WriteFileBytes(path, "abc");
  r = ReadSafetensors(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(path));
  EXPECT_EQ(ReadSafetensorsHeader(path).status().code(), absl::StatusCode::kDataLoss);
  std::remove(path.c_str());

  EXPECT_EQ(ReadSafetensors(::testing::TempDir()).status().code(),
            absl::StatusCode::kInvalidArgument);  // a directory

  absl::Status w = WriteSafetensors(TempPath("no_such_dir/x.safetensors"), {});
  EXPECT_EQ(w.code(), absl::StatusCode::kNotFound) << w;
  EXPECT_THAT(std::string(w.message()), HasSubstr("no_such_dir/x.safetensors.tmp"));
}

TEST(SafetensorsTest, WriteReplacesAtomically) {
  const std::string path = TempPath("replace.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", Pattern(DType::kF32, Shape{100}, 1)}}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"b", Pattern(DType::kU8, Shape{3}, 2)}}).ok());
  absl::StatusOr<std::map<std::string, Tensor>> r = ReadSafetensors(path);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_TRUE(r->at("b").BitwiseEquals(Pattern(DType::kU8, Shape{3}, 2)));
  // A rejected write leaves the old file alone.
  EXPECT_FALSE(WriteSafetensors(path, {{"", Tensor()}}).ok());
  EXPECT_TRUE(ReadSafetensors(path).ok());
  std::remove(path.c_str());
}

TEST(SafetensorsTest, RejectsInvalidWriteRequests) {
  Tensor t(DType::kF32, Shape{2});
  auto code = [](const absl::StatusOr<std::string>& s) { return s.status().code(); };
  EXPECT_EQ(code(SerializeSafetensors({{"a", t}, {"a", t}})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(SerializeSafetensors({{"__metadata__", t}})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(SerializeSafetensors({{"", t}})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(SerializeSafetensors({{"bad\xff", t}})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(SerializeSafetensors({{"a", t}}, {{"k", "bad\xc3"}})),
            absl::StatusCode::kInvalidArgument);
  // Non-ASCII UTF-8 is fine and survives the round trip.
  absl::StatusOr<std::string> b = SerializeSafetensors({{"poids_é", t}});
  ASSERT_TRUE(b.ok());
  absl::StatusOr<std::map<std::string, Tensor>> r = ParseSafetensors(*b);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->count("poids_é"));
}

// Files go through the Env given: an in-memory one here, with nothing on the real disk.
TEST(SafetensorsEnvTest, WriteAndReadThroughAnEnv) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ASSERT_TRUE(env->CreateDir("/w").ok());
  const std::vector<std::pair<std::string, Tensor>> ts = {
      {"a", Pattern(DType::kF32, Shape{3, 2}, 1)}, {"b", Pattern(DType::kU8, Shape{5}, 2)}};
  ASSERT_TRUE(WriteSafetensors("/w/m.safetensors", ts, {{"k", "v"}}, env.get()).ok());
  EXPECT_FALSE(env->FileExists("/w/m.safetensors.tmp"));
  absl::StatusOr<std::string> bytes = ReadFileToString(env.get(), "/w/m.safetensors");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, *SerializeSafetensors(ts, {{"k", "v"}}));
  std::map<std::string, std::string> meta;
  absl::StatusOr<std::map<std::string, Tensor>> back =
      ReadSafetensors("/w/m.safetensors", &meta, env.get());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->at("a").BitwiseEquals(ts[0].second));
  EXPECT_TRUE(back->at("b").BitwiseEquals(ts[1].second));
  EXPECT_EQ(meta["k"], "v");
  absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader("/w/m.safetensors", env.get());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->entries.size(), 2u);
  EXPECT_EQ(h->data_start + h->data_size, bytes->size());
  EXPECT_EQ(ReadSafetensors("/w/none", nullptr, env.get()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadSafetensors("/w", nullptr, env.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsEnvTest, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  std::unique_ptr<MemEnv> mem = NewMemEnv();
  ASSERT_TRUE(mem->CreateDir("/w").ok());
  FaultInjectionEnv env(mem.get());
  const std::vector<std::pair<std::string, Tensor>> old = {{"a", Pattern(DType::kF32, {4}, 1)}};
  ASSERT_TRUE(WriteSafetensors("/w/m.safetensors", old, {}, &env).ok());
  env.FailNth(FaultInjectionEnv::kRename, 0);
  absl::Status s =
      WriteSafetensors("/w/m.safetensors", {{"b", Pattern(DType::kU8, {2}, 3)}}, {}, &env);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("injected fault"));
  EXPECT_FALSE(mem->FileExists("/w/m.safetensors.tmp"));
  absl::StatusOr<std::map<std::string, Tensor>> back =
      ReadSafetensors("/w/m.safetensors", nullptr, mem.get());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->at("a").BitwiseEquals(old[0].second));
}

// The byte codec is what the file functions use: its header is SerializeSafetensors' prefix, and
// it decodes back.
TEST(SafetensorsCodecTest, EncodeAndDecodeTheHeader) {
  const std::vector<std::pair<std::string, Tensor>> ts = {
      {"w", Pattern(DType::kF32, Shape{2, 3}, 1)},
      {"e", Pattern(DType::kS8, Shape{0}, 2)},
      {"b", Pattern(DType::kBF16, Shape{3}, 3)}};
  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  for (const auto& [name, t] : ts) {
    const uint64_t n = static_cast<uint64_t>(t.byte_size());
    entries.push_back({name, t.dtype(), t.shape(), offset, offset + n});
    offset += n;
  }
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(entries, {{"format", "pt"}});
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->size() % 8, 0u);
  const std::string full = *SerializeSafetensors(ts, {{"format", "pt"}});
  EXPECT_EQ(full.substr(0, header->size()), *header);

  absl::StatusOr<uint64_t> n = DecodeSafetensorsHeaderLength(*header, full.size(), "f");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n + 8, header->size());
  absl::StatusOr<SafetensorsHeader> h =
      DecodeSafetensorsHeader(std::string_view(*header).substr(8), 8 + *n, offset, "f");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->entries.size(), 3u);
  EXPECT_EQ(h->entries[1].name, "e");  // in data order
  EXPECT_EQ(h->entries[1].begin, 24u);
  EXPECT_EQ(h->metadata.at("format"), "pt");

  EXPECT_EQ(DecodeSafetensorsHeaderLength("abc", 3, "f").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSafetensorsHeaderLength(U64(100), 50, "f").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSafetensorsHeaderLength(U64(kSafetensorsMaxHeaderBytes + 1), ~uint64_t{0}, "f")
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  entries.push_back(entries[0]);
  EXPECT_EQ(EncodeSafetensorsHeader(entries).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
