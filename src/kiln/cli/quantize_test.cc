// `kiln quantize`: the command on a small MLP artifact written here (report fields, the
// gate refusing and writing nothing, the int8 artifact running under `kiln predict`).
#include <unistd.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/cpu_isa.h"
#include "kiln/cli/internal/test_util.h"
#include "kiln/cli/predict_cmd.h"
#include "kiln/cli/quantize_cmd.h"
#include "kiln/compiler/artifact.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/params.h"
#include "kiln/runtime/cpu/isa.h"
#include "kiln/runtime/reference/reference_backend.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kFeatures = 6, kClasses = 3, kBatch = 4;

// This process's folder under TempDir(): the ISA variants of this test run at once under ctest -j.
const std::string& Dir() {
  static const std::string dir = "kiln_quantize_test_" + std::to_string(::getpid());
  return dir;
}

// A small MLP artifact with initial weights, and CSV rows labelled with its own f32 predictions
// (so the f32 accuracy is 100%).
class QuantizeCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/" + Dir();
    fs::remove_all(root_);
    fs::create_directories(root_);
    art_ = root_ + "/art";
    nn::MlpClassifier model({.in_features = kFeatures, .hidden = {16}, .num_classes = kClasses});
    absl::StatusOr<nn::ParamStore> params = nn::InitParams(model.Params(), 3);
    ASSERT_TRUE(params.ok()) << params.status();
    std::map<std::string, Tensor> weights;
    for (int i = 0; i < params->size(); ++i) weights[params->names()[i]] = params->value(i);
    absl::StatusOr<ir::Graph> g = model.PredictGraph(kBatch);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(compiler::WriteArtifact(art_, *g, weights).ok());
    // 40 rows: x from a fixed pattern, label = the f32 model's argmax.
    const int64_t n = 40;
    absl::StatusOr<ir::Graph> all = model.PredictGraph(n);
    ASSERT_TRUE(all.ok());
    std::vector<float> flat;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < kFeatures; ++j)
        flat.push_back(static_cast<float>(((r * 7 + j * 3) % 11) - 5) / 2.f);
    auto exe = runtime::MakeReferenceBackend()->Compile(*all);
    ASSERT_TRUE(exe.ok()) << exe.status();
    std::map<std::string, Tensor> in = weights;
    in["x"] = Tensor::FromVector<float>(Shape{n, kFeatures}, flat);
    auto out = (*exe)->RunNamed(in);
    ASSERT_TRUE(out.ok()) << out.status();
    std::string csv;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < kFeatures; ++j) csv += std::to_string(flat[r * kFeatures + j]) + ",";
      csv += std::to_string(out->at("prediction").data<int32_t>()[r]) + "\n";
    }
    data_ = WriteTemp(Dir() + "/rows.csv", csv);
  }
  void TearDown() override { fs::remove_all(root_); }

  QuantizeOptions Options(double budget) const {
    QuantizeOptions o;
    o.artifact = art_;
    o.calibration = data_;
    o.calibration_rows = 24;  // rows 25-40 are held out
    o.out = root_ + "/int8";
    o.budget = budget;
    o.latency_runs = 3;
    return o;
  }

  std::string root_, art_, data_;
};

TEST_F(QuantizeCommandTest, WritesTheArtifactAndReportWithinBudget) {
  std::ostringstream printed;
  absl::StatusOr<QuantizeResult> r = RunQuantize(Options(100.0), printed);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->accepted);
  const nlohmann::json& j = r->report;
  EXPECT_EQ(j["metric"], "accuracy");
  EXPECT_EQ(j["f32"].get<double>(), 100.0);
  EXPECT_EQ(j["calibration_examples"], 24);
  EXPECT_EQ(j["eval_examples"], 16);
  EXPECT_EQ(j["layers"].size(), 2u);
  EXPECT_EQ(j["method"], "minmax");
  EXPECT_GT(j["latency_ms"]["f32_median"].get<double>(), 0);
  EXPECT_GT(j["latency_ms"]["int8_median"].get<double>(), 0);
  EXPECT_LT(j["weight_bytes"]["int8"].get<int64_t>(), j["weight_bytes"]["f32"].get<int64_t>());
  EXPECT_THAT(printed.str(), HasSubstr("accuracy: f32 100.00%"));
  // The int8 kernels that ran at this process's ISA level (KILN_CPU_ISA in CTest's isa variants).
  EXPECT_EQ(j["cpu"]["isa"], CpuIsaName(ActiveCpuIsa()));
  EXPECT_EQ(j["cpu"]["int8_exact_in_onednn"].get<bool>(), runtime::OneDnnHasExactInt8());
  EXPECT_THAT(printed.str(), HasSubstr(runtime::OneDnnHasExactInt8()
                                           ? "int8 kernels: oneDNN's int8"
                                           : "int8 kernels: Kiln's exact widening GEMM"));
  ASSERT_TRUE(fs::exists(root_ + "/int8/quantize.json"));
  absl::StatusOr<compiler::Artifact> a = compiler::LoadArtifact(root_ + "/int8");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(ir::PrintGraph(a->program), HasSubstr("quantized_dot"));
  EXPECT_EQ(a->weights.at("fc0/weight.int8").dtype(), DType::kS8);
  EXPECT_EQ(a->metadata.at("quantized"), "int8");
  // `kiln predict` runs it unchanged (inputs: the 6 features, without the label column).
  std::string rows;
  for (int r = 0; r < 5; ++r) rows += "1,2,3,-1,-2,0.5\n";
  PredictOptions p;
  p.artifact = root_ + "/int8";
  p.input = WriteTemp(Dir() + "/in.csv", rows);
  std::ostringstream pout;
  absl::StatusOr<PredictResult> pr = RunPredict(p, pout);
  ASSERT_TRUE(pr.ok()) << pr.status();
  EXPECT_EQ(pr->examples, 5);
}

TEST_F(QuantizeCommandTest, RefusesPastTheBudgetAndWritesNothing) {
  std::ostringstream printed;
  absl::StatusOr<QuantizeResult> r = RunQuantize(Options(-1.0), printed);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->accepted);
  EXPECT_FALSE(fs::exists(root_ + "/int8"));
  // Through the command: exit 1 and both numbers.
  KilnResult k = Kiln({"quantize", art_, "--calibration", data_, "--calibration-rows", "24",
                       "--out", root_ + "/int8", "--budget", "-1", "--latency-runs", "2"});
  EXPECT_EQ(k.code, 1);
  EXPECT_THAT(k.err, HasSubstr("refused: the accuracy drop of"));
  EXPECT_THAT(k.err, HasSubstr("f32 100.0000"));
  EXPECT_FALSE(fs::exists(root_ + "/int8"));
}

TEST_F(QuantizeCommandTest, PercentileCalibrationAndBadInput) {
  QuantizeOptions o = Options(100.0);
  o.method = "percentile";
  o.percentile = 50;
  std::ostringstream printed;
  absl::StatusOr<QuantizeResult> r = RunQuantize(o, printed);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->report["percentile"], 50.0);
  // Clipping at the median of |x| gives a smaller scale than min-max.
  QuantizeOptions m = Options(100.0);
  m.out = root_ + "/int8_minmax";
  absl::StatusOr<QuantizeResult> rm = RunQuantize(m, printed);
  ASSERT_TRUE(rm.ok()) << rm.status();
  EXPECT_LT(r->report["layers"][0]["activation_scale"].get<double>(),
            rm->report["layers"][0]["activation_scale"].get<double>());
  // An existing --out, a short CSV row, all rows calibrating with no --eval.
  EXPECT_THAT(RunQuantize(m, printed).status().message(), HasSubstr("exists"));
  QuantizeOptions bad = Options(1.0);
  bad.out = root_ + "/never";
  bad.calibration = WriteTemp(Dir() + "/bad.csv", "1,2,3,4,5,6,0\n1,2,3\n");
  EXPECT_THAT(RunQuantize(bad, printed).status().message(),
              HasSubstr("bad.csv:2: expected 7 columns"));
  QuantizeOptions all = Options(1.0);
  all.out = root_ + "/never";
  all.calibration_rows = 0;
  EXPECT_THAT(RunQuantize(all, printed).status().message(), HasSubstr("pass --eval"));
  EXPECT_FALSE(fs::exists(root_ + "/never"));
}

TEST_F(QuantizeCommandTest, RelativeMseWithoutLabelsAndSafetensorsInput) {
  // No labels: the int8 outputs against the f32 ones.
  QuantizeOptions o = Options(100.0);
  o.labels_column = "none";
  {
    // The same rows without their label column.
    std::string text = ReadFile(data_), out;
    size_t start = 0;
    while (start < text.size()) {
      size_t nl = text.find('\n', start);
      std::string line = text.substr(start, nl - start);
      out += line.substr(0, line.rfind(',')) + "\n";
      start = nl + 1;
    }
    o.calibration = WriteTemp(Dir() + "/nolabels.csv", out);
  }
  std::ostringstream printed;
  absl::StatusOr<QuantizeResult> r = RunQuantize(o, printed);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->report["metric"], "relative_mse");
  EXPECT_EQ(r->report["f32"].get<double>(), 0.0);
  EXPECT_GT(r->report["drop"].get<double>(), 0.0);  // int8 is not bit-identical to f32
  EXPECT_LT(r->report["drop"].get<double>(), 5.0);  // but close: a few percent at most
  EXPECT_THAT(printed.str(), HasSubstr("relative MSE"));

  // safetensors: x [N, 6] and labels [N] (all class 0 here: only the plumbing is checked).
  std::vector<float> x(40 * kFeatures);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) / 4.f - 1.5f;
  const std::string st = ::testing::TempDir() + "/" + Dir() + "/ex.safetensors";
  ASSERT_TRUE(WriteSafetensors(st, {{"x", Tensor::FromVector<float>(Shape{40, kFeatures}, x)},
                                    {"labels", Tensor(DType::kS64, Shape{40})}})
                  .ok());
  QuantizeOptions t = Options(100.0);
  t.calibration = st;
  t.out = root_ + "/int8_st";
  absl::StatusOr<QuantizeResult> rt = RunQuantize(t, printed);
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_EQ(rt->report["metric"], "accuracy");
  EXPECT_EQ(rt->report["eval_examples"], 16);
}

// The note when int8 measured slower: the batch and ratio, and on the cpu backend the ISA level
// and why (no VNNI: the exact widening GEMM); nothing when int8 was faster.
TEST(Int8SpeedNote, NamesTheIsaLevelAndWhy) {
  nlohmann::json r = {{"latency_ms", {{"batch", 32}, {"f32_over_int8", 0.8}}}};
  EXPECT_THAT(Int8SpeedNote(r), HasSubstr("slower than f32 on this machine at batch 32 (1.25x"));
  r["cpu"] = {{"isa", "avx2"},
              {"isa_description", "avx2 (oneDNN avx2), capped from avx512_bf16"},
              {"int8_exact_in_onednn", false}};
  const std::string no_vnni = Int8SpeedNote(r);
  EXPECT_THAT(no_vnni, HasSubstr("runs at avx2 (oneDNN avx2), capped from avx512_bf16, without "
                                 "AVX-512 VNNI"));
  EXPECT_THAT(no_vnni, HasSubstr("widened to 16 bits"));
  r["cpu"]["int8_exact_in_onednn"] = true;
  r["cpu"]["isa_description"] = "avx512_bf16 (oneDNN avx512_core_bf16)";
  EXPECT_THAT(Int8SpeedNote(r), HasSubstr("even with AVX-512 VNNI (this CPU runs at avx512_bf16"));
  r["latency_ms"]["f32_over_int8"] = 1.7;
  EXPECT_EQ(Int8SpeedNote(r), "");
}

}  // namespace
}  // namespace kiln::cli
