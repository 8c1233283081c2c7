#include "kiln/data/dataset_reader.h"

#include <png.h>

#include <string>

#include "gtest/gtest.h"
#include "kiln/base/env.h"
#include "kiln/data/import/csv_import.h"
#include "kiln/data/import/image_codec.h"
#include "kiln/data/import/image_import.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

TEST(RecordSource, BatchesOfImportedImagesAndCsv) {
  Env* env = Env::Default();
  const std::string tmp = test_support::MakeTempDir("record_source_test");
  const std::string src = JoinPath(tmp, "src");
  for (int label = 0; label < 2; ++label) {
    const std::string d = JoinPath(src, label ? "b" : "a");
    ASSERT_TRUE(env->CreateDir(d).ok());
    for (int i = 0; i < 3; ++i) {
      // A 2x2 gray image of value 10*i + 100*label.
      PngSpec spec{2, 2, PNG_COLOR_TYPE_GRAY, 8,
                   std::string(4, static_cast<char>(10 * i + 100 * label))};
      ASSERT_TRUE(
          WriteStringToFile(env, *EncodePng(spec), JoinPath(d, std::to_string(i) + ".png")).ok());
    }
  }
  ImageImportOptions o;
  o.src_dir = src;
  o.out_dir = JoinPath(tmp, "img");
  o.height = o.width = 2;
  o.channels = 1;
  o.resize = "fit";
  o.shards = 2;
  o.held_out = 0;
  ASSERT_TRUE(ImportImages(env, o).ok());
  absl::StatusOr<std::unique_ptr<DatasetReader>> ds = DatasetReader::Open(env, o.out_dir, "train");
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->size(), 6);
  absl::StatusOr<ExampleBatch> b = (*ds)->ReadBatch({0, 1, 2, 3, 4, 5}, 3);
  ASSERT_TRUE(b.ok()) << b.status();
  const Tensor& img = b->tensors.at("image");
  const Tensor& label = b->tensors.at("label");
  EXPECT_EQ(img.shape().ToString(), "[6,2,2,1]");
  EXPECT_EQ(label.shape().ToString(), "[6]");
  EXPECT_EQ(b->tensors.count("path"), 0u);
  int seen[2] = {0, 0};
  for (int r = 0; r < 6; ++r) {
    const int64_t l = label.data<int64_t>()[r];
    const uint8_t v = img.data<uint8_t>()[r * 4];
    EXPECT_EQ(v / 100, l);  // the pixel value says which folder it came from
    ++seen[l];
  }
  EXPECT_EQ(seen[0], 3);
  EXPECT_EQ(seen[1], 3);
  EXPECT_EQ((*ds)->ReadBatch({6}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(DatasetReader::Open(env, o.out_dir, "held_out").status().code(),
            absl::StatusCode::kNotFound);

  // A damaged record: DataLoss naming the shard and the record's offset at Open.
  const std::string shard = JoinPath(o.out_dir, "train-00001-of-00002.tfrecord");
  std::string bytes = *ReadFileToString(env, shard);
  bytes[20] ^= 4;
  ASSERT_TRUE(WriteStringToFile(env, bytes, shard).ok());
  absl::Status st = DatasetReader::Open(env, o.out_dir, "train").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("train-00001-of-00002.tfrecord"), std::string::npos) << st;
  EXPECT_NE(st.message().find("offset 0"), std::string::npos) << st;

  // CSV: float and int64 columns stack as f32 [B] and s64 [B].
  const std::string csv = JoinPath(tmp, "t.csv"), schema = JoinPath(tmp, "s.yaml");
  ASSERT_TRUE(WriteStringToFile(env, "x,y\n1.5,a\n2.5,b\n", csv).ok());
  ASSERT_TRUE(
      WriteStringToFile(env, "label: y\ncolumns: {x: numeric, y: categorical}\n", schema).ok());
  CsvImportOptions c{csv, schema, JoinPath(tmp, "csv"), 1, 0.0, 0, 1};
  ASSERT_TRUE(ImportCsv(env, c).ok());
  absl::StatusOr<std::unique_ptr<DatasetReader>> cs = DatasetReader::Open(env, c.out_dir, "");
  ASSERT_TRUE(cs.ok()) << cs.status();
  absl::StatusOr<ExampleBatch> cb = (*cs)->ReadBatch({0, 1});
  ASSERT_TRUE(cb.ok()) << cb.status();
  const float x0 = cb->tensors.at("x").data<float>()[0];
  const int64_t y0 = cb->tensors.at("y").data<int64_t>()[0];
  EXPECT_EQ(y0, x0 == 1.5f ? 0 : 1);
  EXPECT_EQ(cb->tensors.at("x").dtype(), DType::kF32);
}

}  // namespace
}  // namespace kiln::data
