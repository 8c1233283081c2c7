// kiln::predict on logits = x . w at batch 4 (reference backend): the classifier over an exported
// artifact (probabilities of a ragged tail), calibration (max |x| per site), the metric of two
// equal programs (no drop, with and without labels), the latency runs, the median, the study list.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/compiler/artifact.h"
#include "kiln/compiler/passes/quantize_int8.h"
#include "kiln/ir/builder.h"
#include "kiln/predict/classifier.h"
#include "kiln/predict/quantize_eval.h"
#include "kiln/predict/studies.h"
#include "kiln/runtime/reference/reference_backend.h"
#include "tests/support/temp_dir.h"

namespace kiln::predict {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kBatch = 4, kFeatures = 3, kClasses = 2;

ir::Graph LogitsGraph() {
  ir::Builder b("linear");
  ir::Value w = b.Parameter("w", DType::kF32, {kFeatures, kClasses});
  ir::Value x = b.Parameter("x", DType::kF32, {kBatch, kFeatures});
  b.Output("logits", ir::MatMul(x, w));
  absl::StatusOr<ir::Graph> g = b.Build();
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

// w: class 0 scores feature 0, class 1 feature 1.
std::map<std::string, Tensor> Weights() {
  return {{"w", Tensor::FromVector<float>({kFeatures, kClasses}, {1, 0, 0, 1, 0, 0})}};
}

// n examples: row r is (2, 0, -r) for even r, (0, 2, -r) for odd: labelled r % 2, its argmax.
Examples MakeExamples(int64_t n, bool labels) {
  Examples ex;
  ex.n = n;
  std::vector<float> v;
  for (int64_t r = 0; r < n; ++r) {
    v.push_back(static_cast<float>(r % 2 == 0 ? 2 : 0));
    v.push_back(static_cast<float>(r % 2 == 0 ? 0 : 2));
    v.push_back(static_cast<float>(-r));
    if (labels) ex.labels.push_back(r % 2);
  }
  ex.inputs["x"] = Tensor::FromVector<float>({n, kFeatures}, v);
  return ex;
}

TEST(Classifier, ClassifiesARaggedTailOfAnArtifact) {
  const std::string dir = test_support::MakeTempDir("predict_test") + "/art";
  ASSERT_TRUE(compiler::WriteArtifact(dir, LogitsGraph(), Weights()).ok());
  absl::StatusOr<std::unique_ptr<Classifier>> m =
      Classifier::OpenArtifact(dir, runtime::MakeReferenceBackend());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->batch(), kBatch);
  EXPECT_EQ((*m)->features(), kFeatures);
  EXPECT_EQ((*m)->classes(), kClasses);
  const Examples ex = MakeExamples(5, false);
  std::vector<const float*> rows;
  for (int64_t r = 0; r < 5; ++r) rows.push_back(ex.inputs.at("x").data<float>() + r * kFeatures);
  absl::StatusOr<std::vector<std::vector<double>>> p = (*m)->Classify(rows);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 5u);
  for (int64_t r = 0; r < 5; ++r) {
    const std::vector<double>& q = (*p)[r];
    ASSERT_EQ(q.size(), 2u);
    EXPECT_NEAR(q[0] + q[1], 1.0, 1e-12);
    // Logits (2, 0) or (0, 2): softmax 1 / (1 + e^-2) for the right class.
    EXPECT_NEAR(q[r % 2], 1 / (1 + std::exp(-2.0)), 1e-6) << "row " << r;
  }
  EXPECT_THAT(Classifier::OpenArtifact(dir + "_missing", runtime::MakeReferenceBackend())
                  .status()
                  .message(),
              HasSubstr("loading artifact"));
}

TEST(QuantizeEval, CalibrationTakesMaxAbsPerSite) {
  const ir::Graph g = LogitsGraph();
  const std::vector<compiler::Int8Site> sites = compiler::FindInt8Sites(g, {"w"});
  ASSERT_EQ(sites.size(), 1u);
  std::unique_ptr<runtime::Backend> backend = runtime::MakeReferenceBackend();
  std::vector<double> absmax;
  // Rows 0..5: |x| at most 5 (the third feature of row 5); 6 rows: one full batch and a tail.
  absl::StatusOr<std::vector<float>> scales =
      Calibrate(*backend, g, Weights(), sites, MakeExamples(6, false), {}, &absmax);
  ASSERT_TRUE(scales.ok()) << scales.status();
  EXPECT_EQ(absmax, std::vector<double>{5.0});
  EXPECT_EQ(*scales, std::vector<float>{compiler::SymmetricScale(5.0)});
}

TEST(QuantizeEval, EqualProgramsDropNothing) {
  std::unique_ptr<runtime::Backend> backend = runtime::MakeReferenceBackend();
  absl::StatusOr<std::unique_ptr<CompiledProgram>> a =
      CompileProgram(*backend, LogitsGraph(), Weights());
  absl::StatusOr<std::unique_ptr<CompiledProgram>> b =
      CompileProgram(*backend, LogitsGraph(), Weights());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->batch(), kBatch);
  absl::StatusOr<Metric> acc = CompareMetric(**a, **b, MakeExamples(7, true));
  ASSERT_TRUE(acc.ok()) << acc.status();
  EXPECT_EQ(acc->name, "accuracy");
  EXPECT_EQ(acc->f32, 100.0);
  EXPECT_EQ(acc->drop, 0.0);
  absl::StatusOr<Metric> mse = CompareMetric(**a, **b, MakeExamples(7, false));
  ASSERT_TRUE(mse.ok()) << mse.status();
  EXPECT_EQ(mse->name, "relative_mse");
  EXPECT_EQ(mse->drop, 0.0);
  absl::StatusOr<Latency> l = MeasureLatency(**a, **b, MakeExamples(7, false), 2);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->f32_ms.size(), 2u);
  EXPECT_EQ(l->int8_ms.size(), 2u);
  EXPECT_EQ(SliceExamples(MakeExamples(7, true), 2, 5).labels, (std::vector<int64_t>{0, 1, 0}));
}

TEST(QuantizeEval, Median) {
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({}), 0);
}

TEST(Studies, ListsFilesSortedWithoutHiddenOnes) {
  const std::string root = test_support::MakeTempDir("predict_studies");
  fs::create_directories(root + "/b");
  fs::create_directories(root + "/.cache");
  for (const char* f : {"b/2.dcm", "a.dcm", ".hidden", ".cache/x.dcm"})
    std::ofstream(root + "/" + f) << "x";
  absl::StatusOr<std::vector<std::string>> files = ListStudies(root);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{"a.dcm", "b/2.dcm"}));
  EXPECT_THAT(ListStudies(root + "/none").status().message(), HasSubstr("is not a folder"));
}

}  // namespace
}  // namespace kiln::predict
