// `kiln predict` on a small MLP artifact written here (no training needed): CSV and safetensors
// in and out, batching with a padded last batch, and the errors a user meets.
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/cli/app.h"
#include "kiln/cli/input_normalization.h"
#include "kiln/cli/internal/test_util.h"
#include "kiln/cli/predict_cmd.h"
#include "kiln/compiler/artifact.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/params.h"
#include "kiln/runtime/reference/reference_backend.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kFeatures = 4, kClasses = 3, kBatch = 2;

// Five examples: two full batches of 2 and one padded.
const std::vector<std::vector<float>> kRows = {{0.5f, -1.0f, 2.0f, 0.25f},
                                               {1.0f, 1.0f, 1.0f, 1.0f},
                                               {-0.5f, 0.0f, 3.5f, -2.0f},
                                               {0.0f, 0.0f, 0.0f, 0.0f},
                                               {2.0f, -3.0f, 0.125f, 1.5f}};

class PredictTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/kiln_predict_artifact";
    fs::remove_all(dir_);
    nn::MlpClassifier model({.in_features = kFeatures, .hidden = {5}, .num_classes = kClasses});
    absl::StatusOr<nn::ParamStore> params = nn::InitParams(model.Params(), 7);
    ASSERT_TRUE(params.ok()) << params.status();
    for (int i = 0; i < params->size(); ++i) weights_[params->names()[i]] = params->value(i);
    absl::StatusOr<ir::Graph> g = model.PredictGraph(kBatch);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(compiler::WriteArtifact(dir_, *g, weights_).ok());

    // What the model computes for all five rows at once, on the reference backend.
    absl::StatusOr<ir::Graph> all = model.PredictGraph(kRows.size());
    ASSERT_TRUE(all.ok());
    auto exe = runtime::MakeReferenceBackend()->Compile(*all);
    ASSERT_TRUE(exe.ok()) << exe.status();
    std::map<std::string, Tensor> in = weights_;
    in["x"] = X();
    auto out = (*exe)->RunNamed(in);
    ASSERT_TRUE(out.ok()) << out.status();
    logits_ = out->at("logits");
    prediction_ = out->at("prediction");
  }

  static Tensor X() {
    std::vector<float> flat;
    for (const auto& r : kRows) flat.insert(flat.end(), r.begin(), r.end());
    return Tensor::FromVector<float>(Shape{static_cast<int64_t>(kRows.size()), kFeatures}, flat);
  }

  static std::string Csv(const std::string& header = "") {
    std::string s = header;
    for (const auto& r : kRows) {
      for (size_t j = 0; j < r.size(); ++j) s += (j ? "," : "") + std::to_string(r[j]);
      s += "\n";
    }
    return s;
  }

  absl::StatusOr<PredictResult> Predict(const std::string& input, const std::string& output = "",
                                        std::string* printed = nullptr) {
    PredictOptions o;
    o.artifact = dir_;
    o.input = input;
    o.output = output;
    o.backend = "reference";
    std::ostringstream out;
    absl::StatusOr<PredictResult> r = RunPredict(o, out);
    if (printed) *printed = out.str();
    return r;
  }

  // The printed CSV matches what the model computes, row for row.
  void ExpectCsvMatches(const std::string& csv) {
    std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), kRows.size() + 1);
    EXPECT_EQ(lines[0], "logits_0,logits_1,logits_2,prediction");
    for (size_t r = 0; r < kRows.size(); ++r) {
      std::vector<std::string> f = absl::StrSplit(lines[r + 1], ',');
      ASSERT_EQ(f.size(), kClasses + 1) << lines[r + 1];
      for (int c = 0; c < kClasses; ++c)
        EXPECT_EQ(std::stof(f[c]), logits_.data<float>()[r * kClasses + c]) << r << "," << c;
      EXPECT_EQ(std::stoi(f[kClasses]), prediction_.data<int32_t>()[r]);
    }
  }

  std::string dir_;
  std::map<std::string, Tensor> weights_;
  Tensor logits_, prediction_;
};

TEST_F(PredictTest, CsvRowsInBatchesPrintCsv) {
  std::string printed;
  absl::StatusOr<PredictResult> r = Predict(WriteTemp("rows.csv", Csv()), "", &printed);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->examples, 5);
  EXPECT_EQ(r->batches, 3);  // 2 + 2 + 1 padded
  ExpectCsvMatches(printed);

  // A header line and blank lines are skipped.
  r = Predict(WriteTemp("rows_header.csv", "\n" + Csv("a,b,c,d\n") + "\n\n"), "", &printed);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectCsvMatches(printed);
}

TEST_F(PredictTest, SafetensorsInAndOut) {
  const std::string in = ::testing::TempDir() + "/x.safetensors";
  ASSERT_TRUE(WriteSafetensors(in, {{"x", X()}}).ok());
  const std::string out = ::testing::TempDir() + "/y.safetensors";
  std::string printed;
  absl::StatusOr<PredictResult> r = Predict(in, out, &printed);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(printed, HasSubstr("predicted 5 examples in 3 runs of batch 2; wrote logits "
                                 "f32[5,3], prediction s32[5] to " +
                                 out));
  auto y = ReadSafetensors(out);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(y->at("logits").BitwiseEquals(logits_));
  EXPECT_TRUE(y->at("prediction").BitwiseEquals(prediction_));

  // CSV in, CSV file out.
  const std::string csv_out = ::testing::TempDir() + "/y.csv";
  ASSERT_TRUE(Predict(WriteTemp("rows2.csv", Csv()), csv_out).ok());
  ExpectCsvMatches(ReadFile(csv_out));
}

// An artifact of a model trained with data.augment.normalize records it; predict applies it to
// the raw inputs exactly as the training pipeline did (and not with --no-normalize).
TEST_F(PredictTest, AppliesTheRecordedInputNormalization) {
  InputNormalization nz{.input = "x", .channels = 2, .height = 1, .width = 2};
  nz.mean = {0.5, -1.0};
  nz.std = {2.0, 0.25};
  Tensor normalized = X().Clone();
  ASSERT_TRUE(nz.Apply(normalized).ok());
  // Row 0 is {0.5, -1 | 2, 0.25}: channel 0 (v - 0.5) / 2, channel 1 (v + 1) / 0.25.
  EXPECT_EQ(normalized.data<float>()[0], 0.0f);
  EXPECT_EQ(normalized.data<float>()[1], -0.75f);
  EXPECT_EQ(normalized.data<float>()[2], 12.0f);
  EXPECT_EQ(normalized.data<float>()[3], 5.0f);

  nn::MlpClassifier model({.in_features = kFeatures, .hidden = {5}, .num_classes = kClasses});
  absl::StatusOr<ir::Graph> g = model.PredictGraph(kBatch);
  ASSERT_TRUE(g.ok());
  const std::string dir = ::testing::TempDir() + "/kiln_predict_normalized";
  fs::remove_all(dir);
  compiler::ArtifactOptions ao;
  ao.metadata[kInputNormalizationKey] = nz.ToJson();
  ASSERT_TRUE(compiler::WriteArtifact(dir, *g, weights_, ao).ok());
  absl::StatusOr<ir::Graph> all = model.PredictGraph(kRows.size());
  ASSERT_TRUE(all.ok());
  auto exe = runtime::MakeReferenceBackend()->Compile(*all);
  ASSERT_TRUE(exe.ok());
  std::map<std::string, Tensor> in = weights_;
  in["x"] = normalized;
  auto want = (*exe)->RunNamed(in);
  ASSERT_TRUE(want.ok()) << want.status();

  const std::string raw = ::testing::TempDir() + "/raw.safetensors";
  ASSERT_TRUE(WriteSafetensors(raw, {{"x", X()}}).ok());
  PredictOptions o;
  o.artifact = dir;
  o.input = raw;
  o.output = ::testing::TempDir() + "/normalized_out.safetensors";
  o.backend = "reference";
  std::ostringstream printed;
  absl::StatusOr<PredictResult> r = RunPredict(o, printed);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->normalized);
  EXPECT_THAT(printed.str(), HasSubstr("inputs normalized as in training"));
  auto y = ReadSafetensors(o.output);
  ASSERT_TRUE(y.ok());
  EXPECT_TRUE(y->at("logits").BitwiseEquals(want->at("logits")));
  // CSV rows are normalized the same way.
  o.input = WriteTemp("raw_rows.csv", Csv());
  ASSERT_TRUE(RunPredict(o, printed).ok());
  y = ReadSafetensors(o.output);
  ASSERT_TRUE(y.ok());
  EXPECT_TRUE(y->at("logits").BitwiseEquals(want->at("logits")));
  // Inputs that come normalized already.
  o.input = raw;
  o.no_normalize = true;
  r = RunPredict(o, printed);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->normalized);
  y = ReadSafetensors(o.output);
  ASSERT_TRUE(y.ok());
  EXPECT_TRUE(y->at("logits").BitwiseEquals(logits_));

  // A model trained with the normalization gives it at export (what kiln export records).
  train::TrainConfig config;
  config.model.channels = 2;
  config.model.height = 1;
  config.model.width = 2;
  EXPECT_FALSE(InputNormalizationOf(config, "x").has_value());
  config.data.augment.mean = nz.mean;
  config.data.augment.std = nz.std;
  std::optional<InputNormalization> from_config = InputNormalizationOf(config, "x");
  ASSERT_TRUE(from_config.has_value());
  EXPECT_EQ(from_config->ToJson(), nz.ToJson());

  // A malformed record, or one that does not fit the input, is an error naming the key.
  for (const std::string& bad :
       {std::string("{\"layout\": \"chw\"}"), std::string("[1]"),
        std::string(R"({"input": "x", "layout": "chw", "shape": [3, 1, 2], "mean": [0, 0, 0],
                        "std": [1, 1, 1]})"),
        std::string(R"({"input": "x", "layout": "chw", "shape": [2, 1, 2], "mean": [0, 0],
                        "std": [1, 0]})"),
        std::string(R"({"input": "w", "layout": "chw", "shape": [2, 1, 2], "mean": [0, 0],
                        "std": [1, 1]})")}) {
    SCOPED_TRACE(bad);
    fs::remove_all(dir);
    ao.metadata[kInputNormalizationKey] = bad;
    ASSERT_TRUE(compiler::WriteArtifact(dir, *g, weights_, ao).ok());
    o.no_normalize = false;
    r = RunPredict(o, printed);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("input_normalization"));
  }
}

TEST_F(PredictTest, BadCsvNamesFileLineAndColumn) {
  const std::string wide = WriteTemp("wide.csv", "1,2,3,4\n1,2,3,4,5\n");
  absl::Status s = Predict(wide).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr(wide + ":2: expected 4 columns (x: 4 f32 values per example), got 5"));

  const std::string word = WriteTemp("word.csv", "# pixels\n1,2,3,4\n1,2,abc,4\n");
  s = Predict(word).status();
  EXPECT_THAT(s.message(),
              HasSubstr(word + ":3: column 3: 'abc' is not a number (it feeds x element 2, f32)"));

  EXPECT_THAT(Predict(WriteTemp("empty.csv", "a,b\n\n")).status().message(),
              HasSubstr("no data rows"));
  EXPECT_THAT(Predict(::testing::TempDir() + "/missing.csv").status().message(),
              HasSubstr("missing.csv"));
}

TEST_F(PredictTest, BadTensorsSayWhatTheArtifactTakes) {
  auto write = [](const std::string& name, std::vector<std::pair<std::string, Tensor>> t) {
    std::string path = ::testing::TempDir() + "/" + name;
    EXPECT_TRUE(WriteSafetensors(path, t).ok());
    return path;
  };
  absl::Status s = Predict(write("wrong_name.safetensors", {{"input", X()}})).status();
  EXPECT_THAT(s.message(), HasSubstr("tensor 'input' is not an input of the artifact (its "
                                     "inputs: x: f32[2,4])"));
  s = Predict(write("weight.safetensors", {{"x", X()}, {"fc0/weight", weights_.at("fc0/weight")}}))
          .status();
  EXPECT_THAT(s.message(), HasSubstr("tensor 'fc0/weight' is one of the artifact's weights"));
  s = Predict(write("wrong_shape.safetensors", {{"x", Tensor(DType::kF32, Shape{5, 3})}})).status();
  EXPECT_THAT(s.message(), HasSubstr("tensor 'x' is f32[5,3], expected [N,4] (N examples of x: "
                                     "f32[2,4])"));
  s = Predict(write("wrong_dtype.safetensors", {{"x", Tensor(DType::kS32, Shape{5, 4})}})).status();
  EXPECT_THAT(s.message(), HasSubstr("tensor 'x' is s32[5,4], the artifact takes x: f32[2,4]"));
  // Exactly the artifact's shape is one batch.
  absl::StatusOr<PredictResult> one =
      Predict(write("exact.safetensors", {{"x", Tensor(DType::kF32, Shape{2, 4})}}));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->batches, 1);
}

TEST_F(PredictTest, RefusesToOverwriteItsInputOrTheArtifact) {
  const std::string in = WriteTemp("keep.csv", Csv());
  EXPECT_THAT(Predict(in, in).status().message(), HasSubstr("is the --input file"));
  EXPECT_EQ(ReadFile(in), Csv());
  EXPECT_THAT(Predict(in, dir_ + "/out.csv").status().message(), HasSubstr("inside the artifact"));
  EXPECT_THAT(Predict(in, ::testing::TempDir() + "/out.txt").status().message(),
              HasSubstr("expected a file ending in .csv or .safetensors"));
  EXPECT_THAT(Predict(::testing::TempDir() + "/x.npy").status().message(),
              HasSubstr("expected a .safetensors file"));
}

TEST_F(PredictTest, ThroughTheCommandLine) {
  const std::string in = WriteTemp("cli.csv", Csv());
  std::ostringstream out, err;
  int rc = RunKiln({"kiln", "predict", dir_, "--input", in, "--backend", "reference"}, out, err);
  EXPECT_EQ(rc, 0) << err.str();
  ExpectCsvMatches(out.str());

  std::ostringstream out2, err2;
  rc = RunKiln({"kiln", "predict", "/nonexistent/artifact", "--input", in}, out2, err2);
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(err2.str(), HasSubstr("kiln predict: loading artifact /nonexistent/artifact: "));
}

}  // namespace
}  // namespace kiln::cli
