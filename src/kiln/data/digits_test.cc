#include "kiln/data/digits.h"

#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"
#include "kiln/data/dataset.h"

namespace kiln::data {
namespace {

using ::testing::HasSubstr;

// 3 features in [0, 4], 3 classes: small enough to write by hand.
LabeledCsvOptions Tiny() { return LabeledCsvOptions{3, 3, 4.0}; }

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

void WriteGzip(const std::string& path, const std::string& contents) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, contents.data(), contents.size()), static_cast<int>(contents.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
}

TEST(ParseLabeledCsv, ParsesScalesAndSkipsBlankLines) {
  auto ds = ParseLabeledCsv("0,2,4,1\r\n\n 1, 3 ,0,2\n4,4,4,0\n\n", "t.csv", Tiny());
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->num_features(), 3);
  EXPECT_EQ(ds->num_classes, 3);
  EXPECT_EQ(ds->features.TypeString(), "f32[3,3]");
  EXPECT_EQ(ds->labels.TypeString(), "s32[3]");
  EXPECT_FLOAT_EQ(ds->features.data<float>()[1], 0.5f);
  EXPECT_FLOAT_EQ(ds->features.data<float>()[2], 1.0f);
  EXPECT_FLOAT_EQ(ds->features.data<float>()[4], 0.75f);
  EXPECT_EQ(ds->labels.data<int32_t>()[0], 1);
  EXPECT_EQ(ds->labels.data<int32_t>()[1], 2);
  EXPECT_EQ(ds->labels.data<int32_t>()[2], 0);
}

struct BadCase {
  const char* text;
  const char* message;
};

TEST(ParseLabeledCsv, MalformedRowsNameFileLineAndProblem) {
  const BadCase cases[] = {
      {"0,1,2,1\n0,1,2\n", "t.csv:2: expected 4 columns (3 features, then the label), got 3"},
      {"0,1,2,1,0\n", "t.csv:1: expected 4 columns (3 features, then the label), got 5"},
      {"0,1,2,1\n\n0,x,2,1\n", "t.csv:3: column 2: 'x' is not a number"},
      {"0,,2,1\n", "t.csv:1: column 2: '' is not a number"},
      {"0,1,2abc,1\n", "t.csv:1: column 3: '2abc' is not a number"},
      {"0,1,5,1\n", "t.csv:1: column 3: value 5 is outside [0, 4]"},
      {"-1,1,2,1\n", "t.csv:1: column 1: value -1 is outside [0, 4]"},
      {"0,1,2,nan\n", "t.csv:1: column 4 (label): 'nan' is not an integer"},
      {"0,1,2,1.5\n", "t.csv:1: column 4 (label): '1.5' is not an integer"},
      {"0,1,2,3\n", "t.csv:1: label 3 is outside [0, 3)"},
      {"0,1,2,-1\n", "t.csv:1: label -1 is outside [0, 3)"},
      {"\n  \n", "t.csv: no data rows"},
      {"", "t.csv: no data rows"},
  };
  for (const BadCase& c : cases) {
    auto ds = ParseLabeledCsv(c.text, "t.csv", Tiny());
    ASSERT_FALSE(ds.ok()) << c.text;
    EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(std::string(ds.status().message()), c.message) << c.text;
  }
}

TEST(LoadLabeledCsv, ReadsPlainAndGzipIdentically) {
  const std::string text = "0,1,2,1\n4,3,2,0\n";
  const std::string plain = TempPath("tiny.csv"), gz = TempPath("tiny.csv.gz");
  WriteFile(plain, text);
  WriteGzip(gz, text);
  auto a = LoadLabeledCsv(plain, Tiny());
  auto b = LoadLabeledCsv(gz, Tiny());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(a->features.BitwiseEquals(b->features));
  EXPECT_TRUE(a->labels.BitwiseEquals(b->labels));
}

TEST(LoadLabeledCsv, ErrorsNameTheFile) {
  const std::string missing = TempPath("does_not_exist.csv.gz");
  auto ds = LoadLabeledCsv(missing, Tiny());
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr(missing));

  const std::string bad = TempPath("bad_row.csv.gz");
  WriteGzip(bad, "0,1,2,1\n0,1,2,1\n0,1\n");
  ds = LoadLabeledCsv(bad, Tiny());
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr(bad + ":3: expected 4 columns"));
}

TEST(LoadLabeledCsv, TruncatedGzipIsDataLoss) {
  std::string text;
  for (int i = 0; i < 2000; ++i)
    text += std::to_string(i % 5) + ",1,2," + std::to_string(i % 3) + "\n";
  const std::string full = TempPath("full.csv.gz");
  WriteGzip(full, text);
  std::ifstream in(full, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 40u);
  const std::string cut = TempPath("cut.csv.gz");
  WriteFile(cut, bytes.substr(0, bytes.size() / 2));
  auto ds = LoadLabeledCsv(cut, Tiny());
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr(cut));
}

std::string Gzipped(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  WriteGzip(path, text);
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(LoadLabeledCsv, ReadsThroughTheEnvGzippedConcatenatedOrPlain) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ASSERT_TRUE(env->CreateDir("/d").ok());
  const std::string first = "0,2,4,1\n", second = "4,4,4,0\n";
  // Two gzip members back to back read as their texts concatenated (gzip(1) semantics).
  ASSERT_TRUE(WriteStringToFile(env.get(), Gzipped("m1.gz", first) + Gzipped("m2.gz", second),
                                "/d/two.csv.gz")
                  .ok());
  ASSERT_TRUE(WriteStringToFile(env.get(), first + second, "/d/plain.csv").ok());
  auto gz = LoadLabeledCsv("/d/two.csv.gz", Tiny(), env.get());
  auto plain = LoadLabeledCsv("/d/plain.csv", Tiny(), env.get());
  ASSERT_TRUE(gz.ok()) << gz.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(gz->size(), 2);
  EXPECT_TRUE(gz->features.BitwiseEquals(plain->features));
  EXPECT_TRUE(gz->labels.BitwiseEquals(plain->labels));

  const std::string whole = Gzipped("whole.gz", first + second + first);
  ASSERT_TRUE(
      WriteStringToFile(env.get(), whole.substr(0, whole.size() - 6), "/d/cut.csv.gz").ok());
  auto cut = LoadLabeledCsv("/d/cut.csv.gz", Tiny(), env.get());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("/d/cut.csv.gz"));
  std::string flipped = whole;
  flipped[12] ^= 0x55;  // inside the deflate data
  ASSERT_TRUE(WriteStringToFile(env.get(), flipped, "/d/bad.csv.gz").ok());
  EXPECT_EQ(LoadLabeledCsv("/d/bad.csv.gz", Tiny(), env.get()).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(LoadLabeledCsv("/d/none.csv", Tiny(), env.get()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(LoadDigitsCsv, RealDigitsFile) {
  auto ds = LoadDigitsCsv(std::string(KILN_SOURCE_DIR) + "/examples/data/digits.csv.gz");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->features.TypeString(), "f32[1797,64]");
  EXPECT_EQ(ds->num_classes, 10);
  std::set<int32_t> classes(ds->labels.data<int32_t>(), ds->labels.data<int32_t>() + 1797);
  EXPECT_EQ(classes.size(), 10u);
  // First row of sklearn's digits: 0,0,5,13,9,1,... label 0.
  EXPECT_FLOAT_EQ(ds->features.data<float>()[2], 5.0f / 16);
  EXPECT_EQ(ds->labels.data<int32_t>()[0], 0);
}

Dataset Numbered(int64_t n) {
  // Row i has feature value i and label i % 3, so rows can be traced through shuffles.
  Dataset ds;
  ds.num_classes = 3;
  ds.features = Tensor(DType::kF32, Shape{n, 2});
  ds.labels = Tensor(DType::kS32, Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    ds.features.data<float>()[2 * i] = static_cast<float>(i);
    ds.features.data<float>()[2 * i + 1] = static_cast<float>(-i);
    ds.labels.data<int32_t>()[i] = static_cast<int32_t>(i % 3);
  }
  return ds;
}

std::vector<int64_t> Rows(const Dataset& ds) {
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < ds.size(); ++i) rows.push_back(ds.features.data<float>()[2 * i]);
  return rows;
}

TEST(SplitDataset, DeterministicBySeedAndAPartition) {
  Dataset all = Numbered(100);
  auto a = SplitDataset(all, 0.2, 7);
  auto b = SplitDataset(all, 0.2, 7);
  auto c = SplitDataset(all, 0.2, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->held_out.size(), 20);
  EXPECT_EQ(a->train.size(), 80);
  EXPECT_EQ(Rows(a->held_out), Rows(b->held_out));
  EXPECT_EQ(Rows(a->train), Rows(b->train));
  EXPECT_NE(Rows(a->held_out), Rows(c->held_out));
  // Every row lands in exactly one part, with its label.
  std::set<int64_t> seen;
  for (const Dataset* part : {&a->train, &a->held_out}) {
    std::vector<int64_t> rows = Rows(*part);
    for (int64_t i = 0; i < part->size(); ++i) {
      EXPECT_TRUE(seen.insert(rows[i]).second);
      EXPECT_EQ(part->labels.data<int32_t>()[i], rows[i] % 3);
      EXPECT_EQ(part->features.data<float>()[2 * i + 1], -rows[i]);
    }
  }
  EXPECT_EQ(seen.size(), 100u);
  // Shuffled, not a prefix.
  EXPECT_NE(Rows(a->held_out), std::vector<int64_t>({0,  1,  2,  3,  4,  5,  6,  7,  8,  9,
                                                     10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
}

TEST(SplitDataset, RejectsFractionsThatEmptyAPart) {
  Dataset all = Numbered(10);
  EXPECT_FALSE(SplitDataset(all, 0.0, 1).ok());
  EXPECT_FALSE(SplitDataset(all, 1.0, 1).ok());
  EXPECT_FALSE(SplitDataset(all, 0.01, 1).ok());
  EXPECT_FALSE(SplitDataset(all, 0.99, 1).ok());
}

TEST(Permutation, KnownSequenceForSeed) {
  // Pins the shuffle so data order cannot silently change across platforms or refactors.
  std::mt19937_64 rng(42);
  EXPECT_EQ(Permutation(8, rng), std::vector<int64_t>({7, 0, 5, 1, 2, 4, 3, 6}));
}

TEST(SplitExampleIndices, IsSplitDatasetsSplitAsRowIndices) {
  Dataset all = Numbered(10);
  auto idx = SplitExampleIndices(all.size(), 0.3, 7);
  ASSERT_TRUE(idx.ok()) << idx.status();
  auto split = SplitDataset(all, 0.3, 7);
  ASSERT_TRUE(split.ok());
  ASSERT_EQ(idx->held_out.size(), 3u);
  ASSERT_EQ(idx->train.size(), 7u);
  for (size_t i = 0; i < idx->held_out.size(); ++i)
    EXPECT_EQ(split->held_out.features.data<float>()[2 * i], idx->held_out[i]);
  for (size_t i = 0; i < idx->train.size(); ++i)
    EXPECT_EQ(split->train.features.data<float>()[2 * i], idx->train[i]);
  EXPECT_EQ(SplitExampleIndices(10, 0.0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitExampleIndices(10, 0.99, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::data
