// The tokens: source: a text import read by the input pipeline (train / held_out split, one
// language's held-out shard, per-host shards) and data::OpenTrainData's checks against the model.
#include "kiln/data/token_dataset.h"

#include <random>
#include <set>

#include "gtest/gtest.h"
#include "kiln/data/import/csv_import.h"
#include "kiln/data/import/text_import.h"
#include "kiln/data/pipeline.h"
#include "kiln/data/shard_io.h"
#include "kiln/data/train_data.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

std::string Words(const std::vector<std::string>& words, uint64_t seed, int docs) {
  std::mt19937_64 rng(seed);
  std::string out;
  for (int d = 0; d < docs; ++d) {
    const int n = 4 + static_cast<int>(rng() % 8);
    for (int w = 0; w < n; ++w) out += (w ? " " : "") + words[rng() % words.size()];
    out += ".\n%\n";
  }
  return out;
}

// A two-language import (en, ru) in DIR/out; returns DIR/out.
std::string Import(const std::string& tmp) {
  Env* env = Env::Default();
  const std::string en = JoinPath(tmp, "en"), ru = JoinPath(tmp, "ru");
  EXPECT_TRUE(env->CreateDir(en).ok());
  EXPECT_TRUE(env->CreateDir(ru).ok());
  EXPECT_TRUE(WriteStringToFile(env, Words({"the", "house", "street", "time", "of"}, 1, 200),
                                JoinPath(en, "a"))
                  .ok());
  EXPECT_TRUE(
      WriteStringToFile(env, Words({"дом", "улица", "время", "хорошо"}, 2, 100), JoinPath(ru, "b"))
          .ok());
  TextImportOptions o;
  o.corpus = {en, ru};
  o.language_from_dir = true;
  o.out_dir = JoinPath(tmp, "out");
  o.vocab_size = 60;
  o.seq_len = 8;
  o.doc_separator = "%";
  o.shards = 2;
  o.held_out = 0.2;
  absl::StatusOr<ImportSummary> s = ImportText(env, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return o.out_dir;
}

std::vector<std::vector<int32_t>> Drain(InputPipeline& p) {
  std::vector<std::vector<int32_t>> rows;
  Tensor x(p.feature_type().dtype, p.feature_type().shape);
  Tensor y(p.label_type().dtype, p.label_type().shape);
  const int64_t b = p.feature_type().shape[0], l = p.feature_type().shape[1];
  for (int64_t i = 0; i < p.batches_per_epoch(); ++i) {
    EXPECT_TRUE(p.Next(x, y).ok());
    for (int64_t r = 0; r < b; ++r) {
      std::vector<int32_t> row(x.data<int32_t>() + r * l, x.data<int32_t>() + (r + 1) * l);
      // Targets are the inputs shifted by one.
      for (int64_t k = 0; k + 1 < l; ++k) EXPECT_EQ(y.data<int32_t>()[r * l + k], row[k + 1]);
      rows.push_back(row);
    }
  }
  return rows;
}

TEST(TokenSource, ReadsSplitsLanguagesAndShards) {
  const std::string dir = Import(test_support::MakeTempDir("token_source"));
  absl::StatusOr<TokenDatasetInfo> t = ReadTokenDataset(Env::Default(), dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->seq_len, 8);
  EXPECT_LE(t->vocab_size, 60);
  ASSERT_EQ(t->languages.size(), 2u);
  EXPECT_EQ(t->languages[0].name, "en");
  EXPECT_EQ(t->languages[0].held_out_begin, 0);
  EXPECT_EQ(t->languages[1].held_out_begin, t->languages[0].held_out_examples);

  PipelineConfig pc;
  pc.source = "tokens:" + dir;
  pc.batch_size = 1;
  pc.shuffle = false;
  pc.prefetch = 0;
  pc.split = "held_out";
  auto all = InputPipeline::Create(pc);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)->feature_type().ToString(), "s32[1,8]");
  const auto held = Drain(**all);
  ASSERT_EQ(static_cast<int64_t>(held.size()),
            t->languages[0].held_out_examples + t->languages[1].held_out_examples);
  // Each language's examples are its contiguous slice of the held_out split.
  for (const TokenLanguage& l : t->languages) {
    pc.language = l.name;
    auto one = InputPipeline::Create(pc);
    ASSERT_TRUE(one.ok()) << one.status();
    const auto rows = Drain(**one);
    ASSERT_EQ(static_cast<int64_t>(rows.size()), l.held_out_examples);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i], held[l.held_out_begin + i]);
  }
  pc.language = "fr";
  absl::Status st = InputPipeline::Create(pc).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("it has en, ru"), std::string::npos) << st;
  pc.language = "";

  // Per-host shards: two hosts' train examples partition the split.
  pc.split = "train";
  std::multiset<std::vector<int32_t>> both;
  int64_t total = 0;
  for (int shard = 0; shard < 2; ++shard) {
    pc.shard_index = shard;
    pc.num_shards = 2;
    auto p = InputPipeline::Create(pc);
    ASSERT_TRUE(p.ok()) << p.status();
    for (auto& r : Drain(**p)) both.insert(r);
    total += (*p)->examples_per_epoch();
  }
  pc.num_shards = 1;
  pc.shard_index = 0;
  auto whole = InputPipeline::Create(pc);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(total, (*whole)->examples_per_epoch());
  const auto w = Drain(**whole);
  EXPECT_EQ(both, std::multiset<std::vector<int32_t>>(w.begin(), w.end()));

  // Exact resume: a restored pipeline continues with the saved one's next batches.
  pc.batch_size = 4;
  pc.shuffle = true;
  pc.prefetch = 2;
  auto a = InputPipeline::Create(pc);
  auto b = InputPipeline::Create(pc);
  ASSERT_TRUE(a.ok() && b.ok());
  const TensorSpec& ft = (*a)->feature_type();
  Tensor x(ft.dtype, ft.shape), y(ft.dtype, ft.shape), x2(ft.dtype, ft.shape),
      y2(ft.dtype, ft.shape);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*a)->Next(x, y).ok());
  ASSERT_TRUE((*b)->RestoreState((*a)->SaveState()).ok());
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE((*a)->Next(x, y).ok());
    ASSERT_TRUE((*b)->Next(x2, y2).ok());
    EXPECT_TRUE(x.BitwiseEquals(x2)) << "batch " << i;
  }
}

TEST(TokenSource, MakeSourceChecksTheModelAgainstTheImport) {
  const std::string dir = Import(test_support::MakeTempDir("token_source_check"));
  const int64_t vocab = ReadTokenDataset(Env::Default(), dir)->vocab_size;
  TrainDataConfig sc;
  sc.source = "tokens:" + dir;
  sc.batch_size = 4;
  sc.language_model = true;
  sc.vocab_size = 0;  // from the dataset
  absl::StatusOr<TrainData> s = OpenTrainData(sc, /*with_train=*/true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->shape.num_classes, vocab);
  EXPECT_EQ(s->shape.features, 8);
  ASSERT_EQ(s->held_out_by_language.size(), 2u);
  EXPECT_EQ(s->held_out_by_language[1].language, "ru");

  sc.vocab_size = vocab + 1;
  absl::Status st = OpenTrainData(sc, true).status();
  EXPECT_NE(st.message().find("model.vocab_size: " + std::to_string(vocab + 1) +
                              " does not match the tokenizer"),
            std::string::npos)
      << st;
  sc.vocab_size = vocab;
  sc.seq_len = 16;
  st = OpenTrainData(sc, true).status();
  EXPECT_NE(st.message().find("data.seq_len: 16 does not match"), std::string::npos) << st;
  sc.seq_len = 8;
  ASSERT_TRUE(OpenTrainData(sc, true).ok());
  sc.language_model = false;
  EXPECT_NE(OpenTrainData(sc, true).status().message().find("needs model.kind gpt"),
            std::string::npos);

  // tokens: on another kind of dataset.
  Env* env = Env::Default();
  const std::string tmp = test_support::MakeTempDir("token_source_csv");
  ASSERT_TRUE(WriteStringToFile(env, "a,b\n1,0\n2,1\n3,0\n4,1\n", JoinPath(tmp, "t.csv")).ok());
  ASSERT_TRUE(WriteStringToFile(env, "label: b\ncolumns: {a: numeric, b: categorical}\n",
                                JoinPath(tmp, "s.yaml"))
                  .ok());
  CsvImportOptions co;
  co.file = JoinPath(tmp, "t.csv");
  co.schema = JoinPath(tmp, "s.yaml");
  co.out_dir = JoinPath(tmp, "csv");
  co.shards = 1;
  co.held_out = 0.25;
  ASSERT_TRUE(ImportCsv(env, co).ok());
  sc.language_model = true;
  sc.source = "tokens:" + co.out_dir;
  st = OpenTrainData(sc, true).status();
  EXPECT_NE(st.message().find("is a dataset of kind 'csv'"), std::string::npos) << st;
}

}  // namespace
}  // namespace kiln::data
