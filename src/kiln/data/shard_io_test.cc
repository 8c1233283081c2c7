#include "kiln/data/shard_io.h"

#include <string>

#include "gtest/gtest.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/import_util.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

Example MakeExample(int i) {
  Example ex;
  ex.features["x"] = Feature::Floats({static_cast<float>(i), 0.5f});
  ex.features["label"] = Feature::Int64s({i % 3});
  return ex;
}

ShardEntry WriteShard(Env* env, const std::string& dir, const std::string& name, int n) {
  auto w = ShardWriter::Create(env, dir, name);
  EXPECT_TRUE(w.ok()) << w.status();
  for (int i = 0; i < n; ++i) EXPECT_TRUE((*w)->Write(EncodeExample(MakeExample(i))).ok());
  absl::StatusOr<ShardEntry> e = (*w)->Finish();
  EXPECT_TRUE(e.ok()) << e.status();
  return *e;
}

TEST(ShardIo, WriterIsTfRecordFramingAndChecksumIsOfTheWholeFile) {
  Env* env = Env::Default();
  const std::string dir = test_support::MakeTempDir("shard_io_test");
  ShardEntry e = WriteShard(env, dir, ShardFileName("train", 0, 1), 5);
  EXPECT_EQ(e.file, "train-00000-of-00001.tfrecord");
  EXPECT_EQ(e.examples, 5);
  std::string expected;
  for (int i = 0; i < 5; ++i) expected += FrameRecord(EncodeExample(MakeExample(i)));
  absl::StatusOr<std::string> bytes = ReadFileToString(env, JoinPath(dir, e.file));
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, expected);
  absl::StatusOr<FileChecksum> c = ChecksumFile(env, JoinPath(dir, e.file));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->bytes, expected.size());
  EXPECT_EQ(c->crc32c, e.crc32c);
  EXPECT_FALSE(env->FileExists(JoinPath(dir, ".train-00000-of-00001.tfrecord.partial")));

  auto r = ExampleReader::Open(env, JoinPath(dir, e.file));
  ASSERT_TRUE(r.ok());
  Example ex;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<bool> got = (*r)->Next(&ex);
    ASSERT_TRUE(got.ok() && *got) << got.status();
    EXPECT_EQ(ex, MakeExample(i));
  }
  absl::StatusOr<bool> end = (*r)->Next(&ex);
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(*end);
}

TEST(ShardIo, ManifestRoundTripAndVerification) {
  Env* env = Env::Default();
  const std::string dir = test_support::MakeTempDir("shard_io_test");
  DatasetManifest m;
  m.kind = "csv";
  m.features = {{"x", "float32", {2}, "two numbers"}, {"label", "int64", {}, ""}};
  m.label_feature = "label";
  m.label_vocabulary = {"a", "b", "c"};
  m.vocabularies["color"] = {"blue", "red"};
  ChannelStats st(2);
  const float v[] = {1, 2, 3, 4};
  st.Add(v, 4);
  m.statistics["x"] = st.Summary();
  m.source_fingerprint = "0123456789abcdef";
  m.source_files = 1;
  m.source_bytes = 99;
  for (int k = 0; k < 2; ++k) {
    ShardEntry e = WriteShard(env, dir, ShardFileName("train", k, 2), 3 + k);
    e.split = "train";
    m.shards.push_back(e);
  }
  ASSERT_TRUE(WriteManifest(env, dir, m).ok());
  absl::StatusOr<DatasetManifest> back = ReadManifest(env, dir);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
  EXPECT_EQ(back->SplitExamples().at("train"), 7);
  EXPECT_EQ(back->statistics["x"]["mean"][0], 2.0);
  EXPECT_EQ(back->statistics["x"]["std"][1], 1.0);
  EXPECT_TRUE(VerifyShards(env, dir, *back).ok());

  // One flipped byte in the second shard: DataLoss naming that shard.
  const std::string path = JoinPath(dir, m.shards[1].file);
  std::string bytes = *ReadFileToString(env, path);
  bytes[20] ^= 1;
  ASSERT_TRUE(WriteStringToFile(env, bytes, path).ok());
  absl::Status s = VerifyShards(env, dir, *back);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("train-00001-of-00002.tfrecord"), std::string::npos) << s;
  // Reading it: DataLoss naming the shard and the record's offset (0).
  auto r = ExampleReader::Open(env, path);
  ASSERT_TRUE(r.ok());
  Example ex;
  absl::StatusOr<bool> got = (*r)->Next(&ex);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("train-00001-of-00002.tfrecord"), std::string::npos);
  EXPECT_NE(got.status().message().find("offset 0"), std::string::npos) << got.status();

  // A truncated shard is DataLoss too, at the offset of the cut record.
  const std::string first = JoinPath(dir, m.shards[0].file);
  std::string whole = *ReadFileToString(env, first);
  const size_t one = FrameRecord(EncodeExample(MakeExample(0))).size();
  ASSERT_TRUE(WriteStringToFile(env, whole.substr(0, one + 5), first).ok());
  r = ExampleReader::Open(env, first);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(*(*r)->Next(&ex));
  got = (*r)->Next(&ex);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("offset " + std::to_string(one)), std::string::npos)
      << got.status();
}

TEST(ShardIo, MalformedManifestNamesTheKey) {
  Env* env = Env::Default();
  const std::string dir = test_support::MakeTempDir("shard_io_test");
  ASSERT_TRUE(WriteStringToFile(env, "{\"format\":\"kiln.dataset.v1\",\"kind\":\"csv\"}",
                                JoinPath(dir, "dataset.json"))
                  .ok());
  absl::StatusOr<DatasetManifest> m = ReadManifest(env, dir);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(m.status().message().find("missing \"features\""), std::string::npos) << m.status();
  ASSERT_TRUE(WriteStringToFile(env, "{not json", JoinPath(dir, "dataset.json")).ok());
  EXPECT_EQ(ReadManifest(env, dir).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadManifest(env, dir + "/nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(ShardIo, ResumeKeepsOnlyVerifiedShardsOfTheSamePlan) {
  Env* env = Env::Default();
  const std::string dir = test_support::MakeTempDir("shard_io_test");
  ShardEntry e = WriteShard(env, dir, "train-00000-of-00001.tfrecord", 4);
  e.split = "train";
  ASSERT_TRUE(SaveShardState(env, dir, e, "plan-a", {{"k", 1}}).ok());
  auto done = LoadShardState(env, dir, e.file, "plan-a");
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(done->has_value());
  EXPECT_EQ((*done)->entry.crc32c, e.crc32c);
  EXPECT_EQ((*done)->entry.split, "train");
  EXPECT_EQ((*done)->state["k"], 1);
  // Another plan: not kept.
  done = LoadShardState(env, dir, e.file, "plan-b");
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(done->has_value());
  // The file changed after it was finished: not kept.
  const std::string path = JoinPath(dir, e.file);
  std::string bytes = *ReadFileToString(env, path);
  ASSERT_TRUE(WriteStringToFile(env, bytes.substr(0, bytes.size() - 1), path).ok());
  done = LoadShardState(env, dir, e.file, "plan-a");
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(done->has_value());
  // Stale shards of another plan are removed, others left alone.
  ASSERT_TRUE(WriteStringToFile(env, "x", JoinPath(dir, "notes.txt")).ok());
  ASSERT_TRUE(RemoveStaleShards(env, dir, {}).ok());
  EXPECT_FALSE(env->FileExists(path));
  EXPECT_TRUE(env->FileExists(JoinPath(dir, "notes.txt")));
}

TEST(ImportUtil, ParallelForRunsEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    std::vector<int> hits(1000, 0);
    ParallelFor(threads, 1000, [&](int64_t i) { hits[i]++; });
    for (int h : hits) ASSERT_EQ(h, 1);
  }
}

}  // namespace
}  // namespace kiln::data
