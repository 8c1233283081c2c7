#include "kiln/data/pipeline.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"
#include "kiln/data/import/csv_import.h"
#include "kiln/data/import_util.h"
#include "kiln/data/record_io.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::data {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kN = 103;

// x[i] = {i, i + 0.5, -i}, y[i] = i: every row names its example.
Dataset MakeData(int64_t n = kN) {
  Dataset d;
  d.features = Tensor(DType::kF32, Shape{n, 3});
  d.labels = Tensor(DType::kS32, Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    d.features.data<float>()[3 * i] = static_cast<float>(i);
    d.features.data<float>()[3 * i + 1] = static_cast<float>(i) + 0.5f;
    d.features.data<float>()[3 * i + 2] = -static_cast<float>(i);
    d.labels.data<int32_t>()[i] = static_cast<int32_t>(i);
  }
  d.num_classes = n;
  return d;
}

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = NewMemEnv();
    ASSERT_TRUE(env_->CreateDir("/d").ok());
    Dataset d = MakeData();
    auto bytes = SerializeSafetensors({{"x", d.features}, {"y", d.labels}});
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(WriteStringToFile(env_.get(), *bytes, "/d/all.safetensors").ok());
    auto paths = WriteRecordShards(d, "/d/shards", 4, env_.get());
    ASSERT_TRUE(paths.ok()) << paths.status();
    ASSERT_EQ(paths->size(), 4u);
  }

  std::unique_ptr<InputPipeline> Make(PipelineConfig c) {
    auto p = InputPipeline::Create(c, env_.get());
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // The labels of the next `n` batches (each row's example index; -1 for padding), checking that
  // features agree with labels.
  std::vector<std::vector<int32_t>> Take(InputPipeline& p, int n) {
    std::vector<std::vector<int32_t>> out;
    Tensor x(p.feature_type().dtype, p.feature_type().shape);
    Tensor y(p.label_type().dtype, p.label_type().shape);
    for (int b = 0; b < n; ++b) {
      absl::Status s = p.Next(x, y);
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) break;
      std::vector<int32_t> labels(y.data<int32_t>(), y.data<int32_t>() + y.num_elements());
      for (size_t r = 0; r < labels.size(); ++r) {
        const float want = labels[r] < 0 ? 0.0f : static_cast<float>(labels[r]);
        EXPECT_EQ(x.data<float>()[3 * r], want);
        EXPECT_EQ(x.data<float>()[3 * r + 2], -want);
      }
      out.push_back(labels);
    }
    return out;
  }

  std::unique_ptr<MemEnv> env_;
};

PipelineConfig Config(const std::string& source, int64_t batch = 10) {
  PipelineConfig c;
  c.source = source;
  c.batch_size = batch;
  c.shuffle = true;
  c.seed = 7;
  return c;
}

std::vector<int32_t> Flatten(const std::vector<std::vector<int32_t>>& batches) {
  std::vector<int32_t> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

TEST_F(PipelineTest, TypesAreLocked) {
  auto p = Make(Config("safetensors:/d/all.safetensors"));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->feature_type().ToString(), "f32[10,3]");
  EXPECT_EQ(p->label_type().ToString(), "s32[10]");
  auto r = Make(Config("records:/d/shards"));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->feature_type(), p->feature_type());
  EXPECT_EQ(r->label_type(), p->label_type());
  Tensor bad_x(DType::kF32, Shape{9, 3}), y(DType::kS32, Shape{10});
  absl::Status s = p->Next(bad_x, y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("f32[10,3]"));
}

TEST_F(PipelineTest, DeterministicBySeed) {
  for (const char* src : {"safetensors:/d/all.safetensors", "records:/d/shards"}) {
    auto a = Make(Config(src));
    auto b = Make(Config(src));
    PipelineConfig other = Config(src);
    other.seed = 8;
    auto c = Make(other);
    auto ta = Take(*a, 25), tb = Take(*b, 25), tc = Take(*c, 25);
    EXPECT_EQ(ta, tb) << src;
    EXPECT_NE(ta, tc) << src;
  }
  // Arrays and records of the same data give the same batches.
  EXPECT_EQ(Take(*Make(Config("safetensors:/d/all.safetensors")), 12),
            Take(*Make(Config("records:/d/shards")), 12));
}

TEST_F(PipelineTest, EpochRollover) {
  auto p = Make(Config("safetensors:/d/all.safetensors"));
  EXPECT_EQ(p->batches_per_epoch(), 10);  // 103 / 10, remainder dropped
  EXPECT_EQ(p->examples_per_epoch(), kN);
  auto e0 = Flatten(Take(*p, 10));
  EXPECT_EQ(p->epoch(), 1);
  EXPECT_EQ(p->examples_seen(), 100);
  auto e1 = Flatten(Take(*p, 10));
  EXPECT_EQ(p->epoch(), 2);
  EXPECT_EQ(std::set<int32_t>(e0.begin(), e0.end()).size(), 100u);  // no repeats in an epoch
  EXPECT_EQ(std::set<int32_t>(e1.begin(), e1.end()).size(), 100u);
  EXPECT_NE(e0, e1);  // a fresh order each epoch
  std::vector<int32_t> sorted0 = e0;
  std::sort(sorted0.begin(), sorted0.end());
  EXPECT_NE(e0, sorted0);  // actually shuffled
}

TEST_F(PipelineTest, NoShuffleIsSourceOrder) {
  PipelineConfig c = Config("records:/d/shards/data-*.tfrecord", 8);
  c.shuffle = false;
  c.remainder = "pad";
  auto p = Make(c);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->batches_per_epoch(), 13);
  auto all = Flatten(Take(*p, 13));
  ASSERT_EQ(all.size(), 104u);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(all[i], i);  // shards concatenate to the original order
  EXPECT_EQ(all[103], -1);
}

TEST_F(PipelineTest, RemainderDropAndPad) {
  PipelineConfig c = Config("safetensors:/d/all.safetensors");
  c.remainder = "pad";
  c.prefetch = 0;
  auto p = Make(c);
  EXPECT_EQ(p->batches_per_epoch(), 11);
  auto batches = Take(*p, 11);
  auto all = Flatten(batches);
  std::set<int32_t> real;
  for (int32_t v : all)
    if (v >= 0) real.insert(v);
  EXPECT_EQ(real.size(), static_cast<size_t>(kN));  // every example exactly once
  EXPECT_EQ(std::count(all.begin(), all.end(), -1), 7);
  // The padding is the tail of the last batch (Take checked its features are zero).
  for (int r = 3; r < 10; ++r) EXPECT_EQ(batches[10][r], -1);
  EXPECT_EQ(p->last_real_examples(), 3);
  EXPECT_EQ(p->examples_seen(), kN);
  EXPECT_EQ(p->epoch(), 1);

  c.remainder = "drop";
  auto d = Make(c);
  auto dropped = Flatten(Take(*d, 10));
  EXPECT_EQ(std::count(dropped.begin(), dropped.end(), -1), 0);
  EXPECT_EQ(d->epoch(), 1);

  c.batch_size = 200;
  EXPECT_EQ(InputPipeline::Create(c, env_.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.remainder = "pad";
  auto big = Make(c);
  auto one = Take(*big, 1)[0];
  EXPECT_EQ(std::count(one.begin(), one.end(), -1), 200 - kN);
}

TEST_F(PipelineTest, ShardingPartitionsTheData) {
  for (const char* src : {"safetensors:/d/all.safetensors", "records:/d/shards"}) {
    std::vector<int32_t> seen;
    for (int s = 0; s < 3; ++s) {
      PipelineConfig c = Config(src, 5);
      c.remainder = "pad";
      c.num_shards = 3;
      c.shard_index = s;
      auto p = Make(c);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(p->examples_per_epoch(), (kN - s + 2) / 3);
      for (int32_t v : Flatten(Take(*p, p->batches_per_epoch()))) {
        if (v < 0) continue;
        EXPECT_EQ(v % 3, s);
        seen.push_back(v);
      }
    }
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen.size(), static_cast<size_t>(kN)) << src;
    for (int i = 0; i < kN; ++i) EXPECT_EQ(seen[i], i);
  }
}

TEST_F(PipelineTest, HeldOutSplitIsDisjoint) {
  PipelineConfig c = Config("safetensors:/d/all.safetensors", 4);
  c.remainder = "pad";
  c.held_out_fraction = 0.25;
  auto train = Make(c);
  c.split = "held_out";
  auto held = Make(c);
  ASSERT_NE(train, nullptr);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(train->examples_per_epoch() + held->examples_per_epoch(), kN);
  EXPECT_GT(held->examples_per_epoch(), 10);
  EXPECT_LT(held->examples_per_epoch(), 45);
  std::set<int32_t> a, b;
  for (int32_t v : Flatten(Take(*train, train->batches_per_epoch())))
    if (v >= 0) a.insert(v);
  for (int32_t v : Flatten(Take(*held, held->batches_per_epoch())))
    if (v >= 0) b.insert(v);
  for (int32_t v : b) EXPECT_EQ(a.count(v), 0u);
  EXPECT_EQ(a.size() + b.size(), static_cast<size_t>(kN));
}

TEST_F(PipelineTest, ShuffleBufferIsAPermutationKeepingLocality) {
  PipelineConfig c = Config("records:/d/shards", 1);
  c.shuffle_buffer = 1;  // one slot: pure shard-order shuffle, records in file order
  auto p = Make(c);
  auto order = Flatten(Take(*p, kN));
  std::vector<int32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < kN; ++i) ASSERT_EQ(sorted[i], i);
  int breaks = 0;
  for (int i = 1; i < kN; ++i) breaks += order[i] != order[i - 1] + 1;
  EXPECT_LE(breaks, 3);  // 4 files in some order, each read front to back
  // Each epoch starts at the start of some file (0, 25, 51 or 77), and the file order changes.
  std::set<int32_t> starts = {order[0]};
  for (int e = 1; e < 6; ++e) starts.insert(Take(*p, kN)[0][0]);
  for (int32_t s : starts) EXPECT_TRUE(s == 0 || s == 25 || s == 51 || s == 77) << s;
  EXPECT_GE(starts.size(), 2u);

  c.shuffle_buffer = 16;
  auto q = Make(c);
  auto e0 = Flatten(Take(*q, kN)), e1 = Flatten(Take(*q, kN));
  EXPECT_NE(e0, e1);
  for (auto* e : {&e0, &e1}) {
    std::vector<int32_t> s = *e;
    std::sort(s.begin(), s.end());
    for (int i = 0; i < kN; ++i) ASSERT_EQ(s[i], i);
  }
}

TEST_F(PipelineTest, SaveRestoreReproducesTheFollowingBatches) {
  for (const char* src : {"safetensors:/d/all.safetensors", "records:/d/shards"}) {
    for (int64_t buffer : {0, 7}) {
      for (int prefetch : {0, 1, 3}) {
        for (const char* rem : {"drop", "pad"}) {
          PipelineConfig c = Config(src);
          c.shuffle_buffer = buffer;
          c.prefetch = prefetch;
          c.remainder = rem;
          SCOPED_TRACE(absl::StrCat(src, " buffer=", buffer, " prefetch=", prefetch, " ", rem));
          auto ref = Take(*Make(c), 36);
          for (int k : {0, 1, 9, 10, 11, 23}) {
            auto a = Make(c);
            auto head = Take(*a, k);
            const std::string state = a->SaveState();
            const int64_t saved_epoch = a->epoch();
            EXPECT_EQ(saved_epoch, k / a->batches_per_epoch());
            // The saved pipeline itself continues correctly (prefetched batches not lost)...
            auto a_tail = Take(*a, 6);
            // ...and so does a fresh one restored from the state.
            PipelineConfig c2 = c;
            c2.prefetch = prefetch == 0 ? 2 : 0;  // prefetch is not part of the state
            auto b = Make(c2);
            Take(*b, 3);  // wherever it was, Restore moves it
            ASSERT_TRUE(b->RestoreState(state).ok()) << state;
            EXPECT_EQ(b->epoch(), saved_epoch);
            auto b_tail = Take(*b, 6);
            for (int i = 0; i < 6; ++i) {
              EXPECT_EQ(a_tail[i], ref[k + i]) << "k=" << k << " i=" << i;
              EXPECT_EQ(b_tail[i], ref[k + i]) << "k=" << k << " i=" << i;
            }
          }
        }
      }
    }
  }
}

TEST_F(PipelineTest, StateJsonContents) {
  PipelineConfig c = Config("records:/d/shards");
  auto p = Make(c);
  Take(*p, 12);
  const std::string s = p->SaveState();
  EXPECT_THAT(s, HasSubstr("\"epoch\":1"));
  EXPECT_THAT(s, HasSubstr("\"batch_in_epoch\":2"));
  EXPECT_THAT(s, HasSubstr("\"examples_seen\":120"));
  EXPECT_THAT(s, HasSubstr("\"next_record\""));
  EXPECT_THAT(s, HasSubstr("/d/shards/data-0000"));
  EXPECT_LT(s.size(), 1024u);

  PipelineConfig other = c;
  other.seed = 99;
  auto q = Make(other);
  absl::Status st = q->RestoreState(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("seed"));
  auto arrays = Make(Config("safetensors:/d/all.safetensors"));
  st = arrays->RestoreState(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("different data"));
  EXPECT_EQ(p->RestoreState("{not json").code(), absl::StatusCode::kInvalidArgument);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"epoch\":1", "\"epoch\":\"1\""},
           {"\"epoch\":1", "\"epoch\":-1"},
           {"\"batch_in_epoch\":2", "\"batch_in_epoch\":10"},
           {"\"fingerprint\":", "\"fingerprint\":7,\"x\":"}}) {
    std::string broken = s;
    broken.replace(broken.find(from), from.size(), to);
    EXPECT_EQ(p->RestoreState(broken).code(), absl::StatusCode::kInvalidArgument) << broken;
  }
  // A failed restore leaves the pipeline where it was.
  EXPECT_EQ(p->epoch(), 1);
  EXPECT_EQ(p->RestoreState("{\"format\":\"x\"}").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PipelineTest, RecordShardRoundTrip) {
  Dataset d = MakeData(10);
  auto paths = WriteRecordShards(d, "/rt", 3, env_.get());
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_EQ((*paths)[0], "/rt/data-00000-of-00003.tfrecord");
  // Shard k holds the contiguous rows [k*10/3, (k+1)*10/3); each record is one example.
  std::vector<size_t> counts;
  for (const auto& path : *paths) {
    auto recs = ReadAllRecords(env_.get(), path);
    ASSERT_TRUE(recs.ok());
    counts.push_back(recs->size());
    Tensor x, y;
    ASSERT_TRUE(ParseExample((*recs)[0], path, &x, &y).ok());
    EXPECT_EQ(x.TypeString(), "f32[3]");
    EXPECT_EQ(y.TypeString(), "s32[]");
  }
  EXPECT_EQ(counts, (std::vector<size_t>{3, 3, 4}));
  PipelineConfig c = Config("records:/rt", 10);
  c.shuffle = false;
  auto p = Make(c);
  Tensor x(DType::kF32, Shape{10, 3}), y(DType::kS32, Shape{10});
  ASSERT_TRUE(p->Next(x, y).ok());
  EXPECT_TRUE(x.BitwiseEquals(d.features));
  EXPECT_TRUE(y.BitwiseEquals(d.labels));
}

TEST_F(PipelineTest, CorruptRecordIsDataLossNamingTheFile) {
  const std::string path = "/d/shards/data-00002-of-00004.tfrecord";
  auto bytes = ReadFileToString(env_.get(), path);
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[bad.size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteStringToFile(env_.get(), bad, path).ok());
  auto p = InputPipeline::Create(Config("records:/d/shards"), env_.get());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(p.status().message(), HasSubstr("data-00002-of-00004.tfrecord"));
  EXPECT_THAT(p.status().message(), HasSubstr("offset"));

  // Truncated shard: DataLoss too.
  ASSERT_TRUE(WriteStringToFile(env_.get(), bytes->substr(0, bytes->size() - 5), path).ok());
  p = InputPipeline::Create(Config("records:/d/shards"), env_.get());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(p.status().message(), HasSubstr("truncated"));
}

TEST_F(PipelineTest, BadPayloadFoundWhileReading) {
  // Valid framing, garbage payload in record 3: Create indexes fine, Next reports it.
  Dataset d = MakeData(8);
  std::string file;
  for (int i = 0; i < 8; ++i) {
    Tensor x(DType::kF32, Shape{3}), y(DType::kS32, Shape{});
    y.data<int32_t>()[0] = i;
    auto rec = SerializeExample(x, y);
    ASSERT_TRUE(rec.ok());
    file += FrameRecord(i == 3 ? std::string("garbage!") : *rec);
  }
  ASSERT_TRUE(env_->CreateDir("/bad").ok());
  ASSERT_TRUE(WriteStringToFile(env_.get(), file, "/bad/x.tfrecord").ok());
  PipelineConfig c = Config("records:/bad", 2);
  c.shuffle = false;
  auto p = Make(c);
  ASSERT_NE(p, nullptr);
  Tensor x(DType::kF32, Shape{2, 3}), y(DType::kS32, Shape{2});
  EXPECT_TRUE(p->Next(x, y).ok());
  absl::Status s = p->Next(x, y);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("/bad/x.tfrecord record at offset"));
  EXPECT_EQ(p->Next(x, y).code(), absl::StatusCode::kDataLoss);  // sticky
}

// The bytes of the next `n` batches.
std::vector<std::string> Bytes(InputPipeline& p, int n) {
  std::vector<std::string> out;
  Tensor x(p.feature_type().dtype, p.feature_type().shape);
  Tensor y(p.label_type().dtype, p.label_type().shape);
  for (int b = 0; b < n; ++b) {
    absl::Status s = p.Next(x, y);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    out.push_back(std::string(static_cast<const char*>(x.raw_data()), x.byte_size()) +
                  std::string(static_cast<const char*>(y.raw_data()), y.byte_size()));
  }
  return out;
}

TEST_F(PipelineTest, AnyWorkerCountGivesTheSameBatches) {
  for (const char* src : {"safetensors:/d/all.safetensors", "records:/d/shards"}) {
    for (int64_t buffer : {0, 7}) {
      for (const char* rem : {"drop", "pad"}) {
        PipelineConfig c = Config(src);
        c.shuffle_buffer = buffer;
        c.remainder = rem;
        c.prefetch = 0;
        const std::vector<std::string> ref = Bytes(*Make(c), 33);  // 3+ epochs, caller-produced
        for (int prefetch : {1, 3, kAutoPrefetch}) {
          for (int workers : {1, 2, 4}) {
            SCOPED_TRACE(absl::StrCat(src, " buffer=", buffer, " ", rem, " prefetch=", prefetch,
                                      " workers=", workers));
            c.prefetch = prefetch;
            c.workers = workers;
            auto p = Make(c);
            EXPECT_EQ(p->workers(), workers);
            EXPECT_EQ(Bytes(*p, 33), ref);
            if (prefetch > 0) EXPECT_EQ(p->prefetch_depth(), prefetch);  // not counting workers
          }
        }
      }
    }
  }
  PipelineConfig c = Config("records:/d/shards");
  c.workers = kAutoWorkers;
  EXPECT_EQ(Make(c)->workers(), AutoWorkers());
  EXPECT_GE(AutoWorkers(), 1);
  EXPECT_LE(AutoWorkers(), 8);
  c.prefetch = 0;
  EXPECT_EQ(Make(c)->workers(), 0);  // the caller produces
  for (int bad : {0, -2, 65}) {
    c.workers = bad;
    EXPECT_THAT(InputPipeline::Create(c, env_.get()).status().message(),
                HasSubstr("data.workers must be auto or in [1, 64]"));
  }
}

TEST_F(PipelineTest, ResumeMidEpochAcrossWorkerCounts) {
  PipelineConfig c = Config("records:/d/shards");
  c.shuffle_buffer = 7;
  c.prefetch = 0;
  const std::vector<std::string> ref = Bytes(*Make(c), 30);
  for (int k : {4, 10, 13}) {  // mid-epoch (10 batches per epoch), at an epoch's start, past it
    SCOPED_TRACE(k);
    c.prefetch = 3;
    c.workers = 4;
    auto a = Make(c);
    EXPECT_EQ(Bytes(*a, k), std::vector<std::string>(ref.begin(), ref.begin() + k));
    const std::string state = a->SaveState();
    // The saved pipeline continues (the batches its workers had ready are not lost)...
    EXPECT_EQ(Bytes(*a, 8), std::vector<std::string>(ref.begin() + k, ref.begin() + k + 8));
    // ...and a pipeline with other workers, moved elsewhere first, restores to the same batches.
    for (int workers : {1, 2}) {
      c.workers = workers;
      c.prefetch = 2;
      auto b = Make(c);
      Bytes(*b, 5);
      ASSERT_TRUE(b->RestoreState(state).ok());
      EXPECT_EQ(Bytes(*b, 8), std::vector<std::string>(ref.begin() + k, ref.begin() + k + 8));
    }
  }
}

TEST_F(PipelineTest, ErrorInAWorkerNamesTheRecordAndDoesNotHang) {
  // 40 examples, batches of 4 in source order; record 17's payload is garbage behind valid
  // framing, so Create indexes it and the worker producing batch 4 (records 16..19) fails.
  std::string file;
  for (int i = 0; i < 40; ++i) {
    Tensor x(DType::kF32, Shape{3}), y(DType::kS32, Shape{});
    y.data<int32_t>()[0] = i;
    auto rec = SerializeExample(x, y);
    ASSERT_TRUE(rec.ok());
    file += FrameRecord(i == 17 ? std::string("not a safetensors blob") : *rec);
  }
  ASSERT_TRUE(env_->CreateDir("/bad").ok());
  ASSERT_TRUE(WriteStringToFile(env_.get(), file, "/bad/x.tfrecord").ok());
  for (int workers : {1, 2, 4}) {
    for (int prefetch : {1, 4, kAutoPrefetch}) {
      SCOPED_TRACE(absl::StrCat("workers=", workers, " prefetch=", prefetch));
      PipelineConfig c = Config("records:/bad", 4);
      c.shuffle = false;
      c.workers = workers;
      c.prefetch = prefetch;
      auto p = Make(c);
      ASSERT_NE(p, nullptr);
      Tensor x(DType::kF32, Shape{4, 3}), y(DType::kS32, Shape{4});
      for (int b = 0; b < 4; ++b) {
        ASSERT_TRUE(p->Next(x, y).ok()) << "batch " << b;
        EXPECT_EQ(y.data<int32_t>()[0], 4 * b);
      }
      absl::Status s = p->Next(x, y);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(s.message(), HasSubstr("/bad/x.tfrecord record at offset"));
      EXPECT_EQ(p->Next(x, y).message(), s.message());  // sticky
      // A restore to the start clears it and reads the good batches again.
      const std::string start = Make(c)->SaveState();
      ASSERT_TRUE(p->RestoreState(start).ok());
      ASSERT_TRUE(p->Next(x, y).ok());
      EXPECT_EQ(y.data<int32_t>()[0], 0);
    }  // destroying the pipeline stops its workers (a hang would time the test out)
  }
  // A shard damaged after Create indexed it: the CRC check while reading names the record.
  PipelineConfig c = Config("records:/d/shards");
  c.shuffle = false;
  c.workers = 4;
  c.prefetch = 1;
  auto p = Make(c);
  ASSERT_NE(p, nullptr);
  const std::string path = "/d/shards/data-00003-of-00004.tfrecord";
  auto bytes = ReadFileToString(env_.get(), path);
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  // In the middle of the shard (about example 90, batch 9). The 4 batches in flight before the
  // first Next read only shards 0 and 1, so no worker has opened this one yet.
  bad[bad.size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteStringToFile(env_.get(), bad, path).ok());
  Tensor x(DType::kF32, Shape{10, 3}), y(DType::kS32, Shape{10});
  absl::Status s;
  for (int b = 0; b < 10 && s.ok(); ++b) s = p->Next(x, y);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("data-00003-of-00004.tfrecord record at offset"));
}

TEST_F(PipelineTest, RecordOfAnotherTypeIsDataLoss) {
  std::string file;
  for (int i = 0; i < 4; ++i) {
    Tensor x(DType::kF32, Shape{i == 2 ? 4 : 3}), y(DType::kS32, Shape{});
    auto rec = SerializeExample(x, y);
    ASSERT_TRUE(rec.ok());
    file += FrameRecord(*rec);
  }
  ASSERT_TRUE(env_->CreateDir("/mixed").ok());
  ASSERT_TRUE(WriteStringToFile(env_.get(), file, "/mixed/m.tfrecord").ok());
  PipelineConfig c = Config("records:/mixed", 4);
  c.shuffle = false;
  auto p = Make(c);
  ASSERT_NE(p, nullptr);
  Tensor x(DType::kF32, Shape{4, 3}), y(DType::kS32, Shape{4});
  absl::Status s = p->Next(x, y);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("/mixed/m.tfrecord record at offset"));
  EXPECT_THAT(s.message(), HasSubstr("f32[4]"));
}

TEST_F(PipelineTest, ConfigErrorsNameTheKey) {
  PipelineConfig c = Config("safetensors:/d/all.safetensors");
  c.remainder = "wrap";
  auto p = InputPipeline::Create(c, env_.get());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("remainder"));
  c = Config("parquet:/x");
  EXPECT_THAT(InputPipeline::Create(c, env_.get()).status().message(), HasSubstr("parquet"));
  c = Config("records:/d/nothing-*.tfrecord");
  EXPECT_EQ(InputPipeline::Create(c, env_.get()).status().code(), absl::StatusCode::kNotFound);
  c = Config("safetensors:/d/all.safetensors");
  c.shard_index = 3;
  c.num_shards = 3;
  EXPECT_THAT(InputPipeline::Create(c, env_.get()).status().message(), HasSubstr("shard_index"));
}

TEST_F(PipelineTest, DigitsSource) {
  const std::string path = std::string(KILN_SOURCE_DIR) + "/examples/data/digits.csv.gz";
  PipelineConfig c = Config("digits:" + path, 64);
  auto p = InputPipeline::Create(c);
  if (!p.ok() && absl::IsNotFound(p.status())) GTEST_SKIP() << "no " << path;
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->feature_type().ToString(), "f32[64,64]");
  EXPECT_EQ((*p)->examples_per_epoch(), 1797);
  Tensor x(DType::kF32, Shape{64, 64}), y(DType::kS32, Shape{64});
  ASSERT_TRUE((*p)->Next(x, y).ok());
  for (int i = 0; i < 64; ++i) EXPECT_TRUE(y.data<int32_t>()[i] >= 0 && y.data<int32_t>()[i] < 10);
}

// Pseudo-random lowercase letters (an LCG), so every window of a few bytes is distinct.
std::string MakeText(int64_t bytes) {
  std::string t(bytes, ' ');
  uint32_t s = 12345;
  for (int64_t j = 0; j < bytes; ++j) {
    s = s * 1664525u + 1013904223u;
    t[j] = static_cast<char>('a' + (s >> 16) % 26);
  }
  return t;
}

TEST_F(PipelineTest, TextSourceCutsNonOverlappingWindows) {
  // 10 * 9 + 5 bytes, seq_len 8: 10 chunks of 9 bytes, the last 5 bytes dropped.
  const std::string text = MakeText(95);
  ASSERT_TRUE(WriteStringToFile(env_.get(), text, "/d/t.txt").ok());
  PipelineConfig c = Config("text:/d/t.txt", 4);
  c.seq_len = 8;
  c.shuffle = false;
  auto p = Make(c);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->feature_type().ToString(), "s32[4,8]");
  EXPECT_EQ(p->label_type().ToString(), "s32[4,8]");
  EXPECT_EQ(p->examples_per_epoch(), 10);
  EXPECT_EQ(p->batches_per_epoch(), 2);
  Tensor x(DType::kS32, Shape{4, 8}), y(DType::kS32, Shape{4, 8});
  for (int b = 0; b < 2; ++b) {
    ASSERT_TRUE(p->Next(x, y).ok());
    for (int r = 0; r < 4; ++r) {
      const int64_t start = (b * 4 + r) * 9;
      for (int k = 0; k < 8; ++k) {
        EXPECT_EQ(x.data<int32_t>()[r * 8 + k], static_cast<unsigned char>(text[start + k]));
        EXPECT_EQ(y.data<int32_t>()[r * 8 + k], static_cast<unsigned char>(text[start + k + 1]));
      }
    }
  }
  // Bytes >= 128 are tokens 128..255, not negative.
  ASSERT_TRUE(WriteStringToFile(env_.get(), std::string(9, '\xff'), "/d/hi.txt").ok());
  c = Config("text:/d/hi.txt", 1);
  c.seq_len = 8;
  p = Make(c);
  ASSERT_NE(p, nullptr);
  Tensor hx(DType::kS32, Shape{1, 8}), hy(DType::kS32, Shape{1, 8});
  ASSERT_TRUE(p->Next(hx, hy).ok());
  EXPECT_EQ(hx.data<int32_t>()[0], 255);
  EXPECT_EQ(hy.data<int32_t>()[7], 255);
}

TEST_F(PipelineTest, TextSourceSplitShuffleAndResume) {
  ASSERT_TRUE(WriteStringToFile(env_.get(), MakeText(4000), "/d/t.txt").ok());
  PipelineConfig c = Config("text:/d/t.txt", 8);
  c.seq_len = 15;  // 250 chunks
  c.seed = 5;
  c.held_out_fraction = 0.2;
  c.split_seed = 9;
  auto train = Make(c);
  ASSERT_NE(train, nullptr);
  c.split = "held_out";
  auto held = Make(c);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(train->examples_per_epoch() + held->examples_per_epoch(), 250);
  EXPECT_GT(held->examples_per_epoch(), 20);
  // A chunk is identified by its window's bytes (distinct for this text).
  auto chunk_ids = [](InputPipeline& p, int batches) {
    std::vector<int> ids;
    Tensor x(p.feature_type().dtype, p.feature_type().shape);
    Tensor y(p.label_type().dtype, p.label_type().shape);
    for (int b = 0; b < batches; ++b) {
      EXPECT_TRUE(p.Next(x, y).ok());
      for (int r = 0; r < 8; ++r) {
        std::string w;
        for (int k = 0; k < 15; ++k) w += static_cast<char>(x.data<int32_t>()[r * 15 + k]);
        ids.push_back(static_cast<int>(std::hash<std::string>()(w) % 1000003));
        EXPECT_EQ(y.data<int32_t>()[r * 15], x.data<int32_t>()[r * 15 + 1]);
      }
    }
    return ids;
  };
  const std::string state0 = train->SaveState();
  std::vector<int> first = chunk_ids(*train, 5);
  const std::string state = train->SaveState();
  std::vector<int> rest = chunk_ids(*train, 40);  // crosses into the next epochs
  EXPECT_GT(train->epoch(), 0);

  c.split = "train";
  auto again = Make(c);
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(again->RestoreState(state).ok());
  EXPECT_EQ(chunk_ids(*again, 40), rest);
  ASSERT_TRUE(again->RestoreState(state0).ok());
  EXPECT_EQ(chunk_ids(*again, 5), first);

  // A different seed gives a different order; different text or seq_len refuses the state.
  c.seed = 6;
  auto other = Make(c);
  ASSERT_NE(other, nullptr);
  EXPECT_NE(chunk_ids(*other, 5), first);
  c.seed = 5;
  c.seq_len = 14;
  auto shorter = Make(c);
  ASSERT_NE(shorter, nullptr);
  EXPECT_EQ(shorter->RestoreState(state).code(), absl::StatusCode::kFailedPrecondition);
  std::string edited = MakeText(4000);
  edited[100] = 'Z';
  ASSERT_TRUE(WriteStringToFile(env_.get(), edited, "/d/t2.txt").ok());
  c = Config("text:/d/t2.txt", 8);
  c.seq_len = 15;
  c.seed = 5;
  c.held_out_fraction = 0.2;
  c.split_seed = 9;
  auto changed = Make(c);
  ASSERT_NE(changed, nullptr);
  EXPECT_EQ(changed->RestoreState(state).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(PipelineTest, TextSourceErrors) {
  ASSERT_TRUE(WriteStringToFile(env_.get(), "short", "/d/s.txt").ok());
  PipelineConfig c = Config("text:/d/s.txt", 1);
  auto p = InputPipeline::Create(c, env_.get());  // seq_len missing
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("seq_len"));
  c.seq_len = 8;  // 5 bytes < 9
  p = InputPipeline::Create(c, env_.get());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("no window"));
  c = Config("text:/d/missing.txt", 1);
  c.seq_len = 8;
  EXPECT_EQ(InputPipeline::Create(c, env_.get()).status().code(), absl::StatusCode::kNotFound);
}

// dataset: sources read what `kiln data import` wrote, keeping its split: a CSV import's float
// columns become x, its label y, and the held-out split is the import's.
TEST(DatasetSourceTest, ReadsAnImportedCsvWithItsSplit) {
  MemEnv env;
  std::string csv;
  for (int r = 0; r < 40; ++r)
    absl::StrAppend(&csv, r, ",", 100 + r, ",", r % 3 == 0 ? "b" : "a", "\n");
  ASSERT_TRUE(env.CreateDir("/in").ok());
  ASSERT_TRUE(WriteStringToFile(&env, csv, "/in/rows.csv").ok());
  ASSERT_TRUE(WriteStringToFile(&env,
                                "header: false\nlabel: y\ncolumns:\n  - {name: u, type: numeric}\n"
                                "  - {name: v, type: numeric}\n  - {name: y, type: categorical}\n",
                                "/in/schema.yaml")
                  .ok());
  CsvImportOptions o;
  o.file = "/in/rows.csv";
  o.schema = "/in/schema.yaml";
  o.out_dir = "/ds";
  o.shards = 2;
  o.held_out = 0.25;
  o.threads = 1;
  absl::StatusOr<ImportSummary> s = ImportCsv(&env, o);
  ASSERT_TRUE(s.ok()) << s.status();
  std::set<float> seen;
  const double mean_u = 19.5;  // of 0..39 (population std, as the import's statistics)
  double std_u = 0;
  for (int r = 0; r < 40; ++r) std_u += (r - mean_u) * (r - mean_u) / 40;
  std_u = std::sqrt(std_u);
  for (const char* split : {"train", "held_out"}) {
    PipelineConfig c;
    c.source = "dataset:/ds";
    c.batch_size = 5;
    c.shuffle = false;
    c.prefetch = 0;
    c.split = split;
    auto p = InputPipeline::Create(c, &env);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->examples_per_epoch(), std::string(split) == "train" ? 30 : 10);
    EXPECT_EQ((*p)->feature_type().ToString(), "f32[5,2]");
    EXPECT_EQ((*p)->label_type().ToString(), "s32[5]");
    Tensor x(DType::kF32, Shape{5, 2}), y(DType::kS32, Shape{5});
    for (int64_t b = 0; b < (*p)->batches_per_epoch(); ++b) {
      ASSERT_TRUE((*p)->Next(x, y).ok());
      for (int i = 0; i < 5; ++i) {
        // Columns are z-scored with the import's statistics: u and v = u + 100 have the same
        // std and means 100 apart, so they normalize alike; undo it for the row number.
        const float zu = x.data<float>()[2 * i], zv = x.data<float>()[2 * i + 1];
        EXPECT_NEAR(zu, zv, 1e-5);
        const float u = std::round(zu * std_u + mean_u);
        EXPECT_EQ(y.data<int32_t>()[i], static_cast<int>(u) % 3 == 0 ? 1 : 0) << "row " << u;
        EXPECT_TRUE(seen.insert(u).second) << "row " << u << " in both splits";
      }
    }
  }
  EXPECT_EQ(seen.size(), 40u);
  // Shuffled train batches of the import: the same bytes from 1, 2 and 4 workers.
  PipelineConfig c;
  c.source = "dataset:/ds";
  c.batch_size = 4;
  c.seed = 3;
  c.prefetch = 0;
  auto ref = InputPipeline::Create(c, &env);
  ASSERT_TRUE(ref.ok());
  const std::vector<std::string> want = Bytes(**ref, 20);  // 2+ epochs of 7 batches
  for (int workers : {1, 2, 4}) {
    c.prefetch = 2;
    c.workers = workers;
    auto p = InputPipeline::Create(c, &env);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(Bytes(**p, 20), want) << workers << " workers";
  }
  PipelineConfig bad;
  bad.source = "dataset:/nowhere";
  EXPECT_FALSE(InputPipeline::Create(bad, &env).ok());
}

}  // namespace
}  // namespace kiln::data
