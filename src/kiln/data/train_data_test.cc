// data::OpenTrainData, and the csv: pipeline source behind a plain CSV path, checked against an
// independent model of the trainer's CSV batcher that the pipeline replaced: the same split, the
// same batches in the same order, the same epoch numbers, and its checkpoint states restore.
#include "kiln/data/train_data.h"

#include <unistd.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/hash.h"
#include "kiln/data/dataset.h"
#include "kiln/data/pipeline.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 131;

// A digits-layout CSV whose row i carries i in its first two pixels (i / 17, i % 17), so every
// batch row names its example.
std::string WriteCsv() {
  const std::string path = kiln::test_support::MakeTempDir("source_test") + "/digits.csv";
  std::string text;
  for (int64_t i = 0; i < kRows; ++i) {
    text += std::to_string(i / 17) + "," + std::to_string(i % 17);
    for (int k = 2; k < 64; ++k) text += ",0";
    text += "," + std::to_string(i % 10) + "\n";
  }
  EXPECT_TRUE(WriteStringToFile(Env::Default(), text, path).ok());
  return path;
}

int64_t RowId(const Tensor& x, int64_t r) {
  const float* p = x.data<float>() + r * 64;
  return std::lround(p[0] * 16) * 17 + std::lround(p[1] * 16);
}

// The trainer's CSV batcher as it was: the training rows of SplitDataset(seed); epoch e's order
// a Fisher-Yates permutation from mt19937_64(SplitMix64(seed ^ SplitMix64(e))) (source order
// without shuffle); drop: a batch that does not fit starts the next epoch; wrap: it runs on into
// the next epoch's order. State = (epoch, position in that order).
struct OldCsvBatcher {
  std::vector<int64_t> rows, order;
  int64_t batch;
  bool shuffle, wrap;
  uint64_t seed;
  int64_t epoch = 0, position = 0;

  OldCsvBatcher(int64_t batch, bool shuffle, bool wrap, uint64_t seed, double fraction)
      : batch(batch), shuffle(shuffle), wrap(wrap), seed(seed) {
    rows = SplitExampleIndices(kRows, fraction, seed).value().train;
    Reorder();
  }
  void Reorder() {
    order = rows;
    if (!shuffle) return;
    std::mt19937_64 rng(SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(epoch))));
    std::vector<int64_t> p = Permutation(static_cast<int64_t>(rows.size()), rng);
    for (size_t k = 0; k < p.size(); ++k) order[k] = rows[p[k]];
  }
  void Advance() {
    ++epoch;
    position = 0;
    Reorder();
  }
  std::vector<int64_t> Next() {
    const int64_t n = static_cast<int64_t>(rows.size());
    if (!wrap && position + batch > n) Advance();
    std::vector<int64_t> out;
    for (int64_t i = 0; i < batch; ++i) {
      if (position >= n) Advance();
      out.push_back(order[position++]);
    }
    return out;
  }
};

TrainDataConfig Csv(const std::string& path, int64_t batch, bool shuffle, const std::string& rem) {
  TrainDataConfig c;
  c.source = path;
  c.batch_size = batch;
  c.shuffle = shuffle;
  c.seed = 5;
  c.held_out_fraction = 0.25;
  c.remainder = rem;
  return c;
}

std::vector<int64_t> Ids(const Tensor& x) {
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < x.shape()[0]; ++r) ids.push_back(RowId(x, r));
  return ids;
}

TEST(OpenTrainData, PlainCsvPathGivesTheOldBatcherBatchesAndEpochs) {
  const std::string path = WriteCsv();
  for (bool shuffle : {true, false}) {
    for (const char* rem : {"drop", "wrap"}) {
      SCOPED_TRACE(std::string(rem) + (shuffle ? " shuffled" : " in order"));
      TrainDataConfig c = Csv(path, 7, shuffle, rem);
      auto s = OpenTrainData(c, /*with_train=*/true);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(s->shape.features, 64);
      EXPECT_EQ(s->shape.num_classes, 10);
      EXPECT_EQ(s->train_examples, 98);  // 131 - round(0.25 * 131)
      OldCsvBatcher old(7, shuffle, std::string(rem) == "wrap", c.seed, c.held_out_fraction);
      Tensor x = MakeInputTensor(s->shape, 7), y = MakeTargetTensor(s->shape, 7);
      for (int b = 0; b < 60; ++b) {  // 4+ epochs; 98 % 7 == 0, so wrap meets every boundary
        ASSERT_TRUE(s->train->Next(x, y).ok());
        ASSERT_EQ(Ids(x), old.Next()) << "batch " << b;
        ASSERT_EQ(s->train->epoch(), old.epoch) << "batch " << b;
        for (int64_t r = 0; r < 7; ++r) EXPECT_EQ(y.data<int32_t>()[r], RowId(x, r) % 10);
      }
    }
  }
}

TEST(OpenTrainData, WrapAcrossUnevenEpochsAndResumeFromPipelineAndOldStates) {
  const std::string path = WriteCsv();
  TrainDataConfig c = Csv(path, 15, true, "wrap");  // 98 % 15 != 0: batches straddle epochs
  auto s = OpenTrainData(c, true);
  ASSERT_TRUE(s.ok()) << s.status();
  OldCsvBatcher old(15, true, true, c.seed, c.held_out_fraction);
  Tensor x = MakeInputTensor(s->shape, 15), y = MakeTargetTensor(s->shape, 15);
  for (int b = 0; b < 23; ++b) {
    ASSERT_TRUE(s->train->Next(x, y).ok());
    ASSERT_EQ(Ids(x), old.Next());
  }
  const nlohmann::json saved = s->train->State();
  const nlohmann::json old_state = {{"epoch", old.epoch}, {"position", old.position}};
  std::vector<std::vector<int64_t>> want;
  for (int b = 0; b < 12; ++b) want.push_back(old.Next());
  for (const nlohmann::json& state : {saved, old_state}) {
    auto resumed = OpenTrainData(c, true);
    ASSERT_TRUE(resumed.ok());
    ASSERT_TRUE(resumed->train->Restore(state).ok()) << state.dump();
    EXPECT_EQ(resumed->train->epoch(), 3);  // 23 * 15 = 345 rows: the last one in epoch 3
    for (int b = 0; b < 12; ++b) {
      ASSERT_TRUE(resumed->train->Next(x, y).ok());
      ASSERT_EQ(Ids(x), want[b]) << state.dump() << " batch " << b;
    }
  }
  auto fresh = OpenTrainData(c, true);
  EXPECT_EQ(fresh->train->Restore({{"epoch", 1}, {"position", 99}}).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(fresh->train->Restore({{"epoch", "x"}, {"position", 1}}).code(),
            absl::StatusCode::kDataLoss);
}

TEST(OpenTrainData, OldDropStatesAtAnEpochsEndResumeAtTheNextEpoch) {
  const std::string path = WriteCsv();
  TrainDataConfig c = Csv(path, 30, true, "drop");  // 3 batches an epoch, 8 rows dropped
  OldCsvBatcher old(30, true, false, c.seed, c.held_out_fraction);
  for (int b = 0; b < 3; ++b) old.Next();
  ASSERT_EQ(old.position, 90);
  auto s = OpenTrainData(c, true);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->train->Restore({{"epoch", old.epoch}, {"position", old.position}}).ok());
  EXPECT_EQ(s->train->epoch(), 0);
  Tensor x = MakeInputTensor(s->shape, 30), y = MakeTargetTensor(s->shape, 30);
  ASSERT_TRUE(s->train->Next(x, y).ok());
  EXPECT_EQ(Ids(x), old.Next());
  EXPECT_EQ(s->train->epoch(), 1);
  EXPECT_EQ(s->train->Restore({{"epoch", 0}, {"position", 31}}).code(),
            absl::StatusCode::kDataLoss);  // not a batch boundary
}

TEST(OpenTrainData, HeldOutIsTheSplitsRowsInItsOrder) {
  const std::string path = WriteCsv();
  TrainDataConfig c = Csv(path, 8, true, "drop");
  auto s = OpenTrainData(c, /*with_train=*/false);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train, nullptr);
  const std::vector<int64_t> held = SplitExampleIndices(kRows, 0.25, c.seed).value().held_out;
  ASSERT_EQ(s->held_out_examples, 33);
  EXPECT_EQ(s->shape.eval_batch, 8);
  EXPECT_EQ(s->held_out->batches(), 4);
  Tensor x = MakeInputTensor(s->shape, 8), y = MakeTargetTensor(s->shape, 8);
  for (int pass = 0; pass < 2; ++pass) {
    ASSERT_TRUE(s->held_out->Reset().ok());
    std::vector<int64_t> got;
    for (int b = 0; b < 4; ++b) {
      ASSERT_TRUE(s->held_out->Next(x, y).ok());
      for (int64_t id : Ids(x)) got.push_back(id);
    }
    EXPECT_EQ(got, std::vector<int64_t>(held.begin(), held.begin() + 32));
  }
  // A batch larger than the held-out split evaluates all of it at once.
  c.batch_size = 50;
  s = OpenTrainData(c, false);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->shape.eval_batch, 33);
  EXPECT_EQ(s->held_out->batches(), 1);
}

TEST(OpenTrainData, ErrorsNameTheKey) {
  const std::string path = WriteCsv();
  TrainDataConfig c = Csv(path, 99, true, "drop");
  EXPECT_THAT(OpenTrainData(c, true).status().message(),
              HasSubstr("data.batch_size: 99 is larger than the training split (98 examples)"));
  c = Csv(path, 8, true, "pad");
  EXPECT_THAT(OpenTrainData(c, true).status().message(), HasSubstr("data.remainder: 'pad'"));
  c.source = "digits:" + path;
  c.remainder = "wrap";
  EXPECT_THAT(OpenTrainData(c, true).status().message(), HasSubstr("data.remainder: 'wrap'"));
  c = Csv("/nonexistent/d.csv", 8, true, "drop");
  auto missing = OpenTrainData(c, true);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("data.source"));
  EXPECT_TRUE(IsPlainCsvPath("data/digits.csv.gz"));
  EXPECT_FALSE(IsPlainCsvPath("records:/x"));
}

// csv: is a pipeline source of its own: a state saved by it does not restore into digits:.
TEST(CsvPipelineSource, StatesDoNotCrossToTheDigitsSource) {
  const std::string path = WriteCsv();
  PipelineConfig pc;
  pc.source = "csv:" + path;
  pc.batch_size = 4;
  pc.held_out_fraction = 0.25;
  auto csv = InputPipeline::Create(pc);
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ((*csv)->source_examples(), kRows);
  pc.source = "digits:" + path;
  auto digits = InputPipeline::Create(pc);
  ASSERT_TRUE(digits.ok()) << digits.status();
  EXPECT_EQ((*digits)->RestoreState((*csv)->SaveState()).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kiln::data
