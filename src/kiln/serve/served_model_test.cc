#include "kiln/serve/served_model.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/serve/internal/test_model.h"
#include "kiln/serve/rebatch.h"
#include "tests/support/temp_dir.h"

namespace kiln::serve {
namespace {

// The artifact run directly at its own batch size, one example padded to 2 rows.
std::vector<float> DirectLogits(runtime::Backend* backend, const compiler::Artifact& a,
                                const std::vector<float>& row) {
  auto exe = backend->Compile(a.program);
  EXPECT_TRUE(exe.ok()) << exe.status();
  Tensor x(DType::kF32, Shape{2, 4});
  for (int j = 0; j < 4; ++j) x.SetDouble(j, row[j]);
  auto args = a.BindInputs({{"x", x}});
  EXPECT_TRUE(args.ok()) << args.status();
  auto outs = (*exe)->Run(*args);
  EXPECT_TRUE(outs.ok()) << outs.status();
  std::vector<float> l;
  for (int j = 0; j < 3; ++j) l.push_back(static_cast<float>((*outs)[0].GetDouble(j)));
  return l;
}

TEST(ServedModelTest, BatchesAtCompiledSizesAndMatchesTheArtifact) {
  const std::string dir = test_support::MakeTempDir("served_model_test") + "/mlp";
  ASSERT_TRUE(testing::WriteTestMlp(dir).ok());
  auto backend = runtime::MakeCpuBackend();
  BatchingConfig c;
  c.max_batch_size = 8;
  c.preferred_batch_sizes = {1, 4};
  c.max_queue_delay_us = 3000;
  c.instances = 2;
  auto m = ServedModel::Load(dir, "mlp", "1", c, backend.get());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->compiled_sizes(), (std::vector<int64_t>{1, 2, 4, 8}));  // 2: the artifact's
  EXPECT_EQ((*m)->artifact_batch(), 2);
  std::mutex mu;
  std::vector<BatchStats> stats;
  (*m)->set_batch_observer([&](const BatchStats& s) {
    std::lock_guard<std::mutex> lock(mu);
    stats.push_back(s);
  });

  auto a = compiler::LoadArtifact(dir);
  ASSERT_TRUE(a.ok());
  std::atomic<int> done{0};
  std::vector<std::vector<float>> rows;
  std::vector<std::vector<float>> got(10);
  for (int i = 0; i < 10; ++i) rows.push_back({0.1f * i, -0.2f * i, 0.3f, 1.0f - 0.1f * i});
  for (int i = 0; i < 10; ++i) {
    auto r = std::make_unique<BatchRequest>();
    r->rows = 1;
    Tensor x(DType::kF32, Shape{1, 4});
    for (int j = 0; j < 4; ++j) x.SetDouble(j, rows[i][j]);
    r->inputs = {x};
    r->done = [&, i](absl::Status s, std::unique_ptr<BatchRequest> r) {
      EXPECT_TRUE(s.ok()) << s;
      ASSERT_EQ(r->outputs.size(), 2u);
      EXPECT_EQ(r->outputs[0].shape(), (Shape{1, 3}));
      EXPECT_EQ(r->outputs[1].dtype(), DType::kS32);
      for (int j = 0; j < 3; ++j) got[i].push_back(static_cast<float>(r->outputs[0].GetDouble(j)));
      done++;
    };
    ASSERT_TRUE((*m)->Submit(std::move(r)).ok());
  }
  for (int k = 0; k < 5000 && done.load() < 10; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(done.load(), 10);
  for (int i = 0; i < 10; ++i) {
    std::vector<float> want = DirectLogits(backend.get(), *a, rows[i]);
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(got[i][j], want[j], 1e-5) << "row " << i;
  }
  std::lock_guard<std::mutex> lock(mu);
  for (const BatchStats& s : stats) {
    EXPECT_TRUE(s.padded == 1 || s.padded == 2 || s.padded == 4 || s.padded == 8) << s.padded;
    EXPECT_GE(s.padded, s.rows);
  }
}

// An artifact that records the training pipeline's input normalization (x as 2 channels of
// 1x2): every batch's real rows are normalized before they run, so a raw row answers what the
// exported program answers for the row normalized by hand, at every compiled size. The request's
// own tensor is left as it was sent.
TEST(ServedModelTest, TheArtifactsInputNormalizationIsAppliedToEveryBatch) {
  const std::string dir = test_support::MakeTempDir("served_model_test") + "/norm";
  const std::vector<float> mean = {0.5f, -1.0f}, stdev = {2.0f, 0.25f};
  ASSERT_TRUE(testing::WriteTestMlp(
                  dir, testing::kTestMlp,
                  {{"input_normalization", R"({"input":"x","layout":"chw","shape":[2,1,2],)"
                                           R"("mean":[0.5,-1],"std":[2,0.25],)"
                                           R"("from":"data.augment.normalize"})"}})
                  .ok());
  auto backend = runtime::MakeCpuBackend();
  BatchingConfig c;
  c.max_batch_size = 8;
  c.preferred_batch_sizes = {1, 4};
  c.max_queue_delay_us = 2000;
  auto m = ServedModel::Load(dir, "norm", "1", c, backend.get());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->normalization().has_value());
  EXPECT_EQ((*m)->normalization()->channels, 2);
  auto a = compiler::LoadArtifact(dir);
  ASSERT_TRUE(a.ok());
  // Requests of 1, 3 and 2 rows (batches padded to 1, 2, 4 or 8).
  std::vector<std::vector<float>> rows;
  for (int i = 0; i < 6; ++i) rows.push_back({0.3f * i, -0.7f + i, 1.5f, 0.2f - 0.4f * i});
  const std::vector<std::pair<int, int>> requests = {{0, 1}, {1, 3}, {4, 2}};  // first, count
  std::atomic<int> done{0};
  std::vector<std::vector<float>> got(rows.size());
  std::vector<Tensor> sent;
  for (const auto& [first, count] : requests) {
    auto r = std::make_unique<BatchRequest>();
    r->rows = count;
    Tensor x(DType::kF32, Shape{count, 4});
    for (int k = 0; k < count; ++k)
      for (int j = 0; j < 4; ++j) x.SetDouble(k * 4 + j, rows[first + k][j]);
    sent.push_back(x);
    r->inputs = {x};
    r->done = [&, first = first, count = count](absl::Status s, std::unique_ptr<BatchRequest> r) {
      EXPECT_TRUE(s.ok()) << s;
      ASSERT_EQ(r->outputs.size(), 2u);
      for (int k = 0; k < count; ++k)
        for (int j = 0; j < 3; ++j)
          got[first + k].push_back(static_cast<float>(r->outputs[0].GetDouble(k * 3 + j)));
      done++;
    };
    ASSERT_TRUE((*m)->Submit(std::move(r)).ok());
  }
  for (int k = 0; k < 5000 && done.load() < 3; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(done.load(), 3);
  bool differs = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<float> normalized(4);
    for (int j = 0; j < 4; ++j) normalized[j] = (rows[i][j] - mean[j / 2]) / stdev[j / 2];
    const std::vector<float> want = DirectLogits(backend.get(), *a, normalized);
    const std::vector<float> raw = DirectLogits(backend.get(), *a, rows[i]);
    ASSERT_EQ(got[i].size(), 3u) << "row " << i;
    for (int j = 0; j < 3; ++j) {
      EXPECT_NEAR(got[i][j], want[j], 1e-5) << "row " << i;
      differs |= std::fabs(raw[j] - want[j]) > 1e-3;
    }
  }
  EXPECT_TRUE(differs) << "the normalization should change the answer";
  // The request tensors are the caller's, unchanged (the batch buffer was normalized).
  EXPECT_FLOAT_EQ(sent[1].data<float>()[1], rows[1][1]);
}

// A malformed or mismatched normalization fails the load naming the model and the key.
TEST(ServedModelTest, ABadInputNormalizationFailsToLoadNamingIt) {
  auto backend = runtime::MakeCpuBackend();
  const std::string root = test_support::MakeTempDir("served_model_test");
  const std::pair<const char*, const char*> cases[] = {
      {R"({"input":"x","layout":"chw","shape":[3,1,2],"mean":[0,0,0],"std":[1,1,1]})",
       "is for 3x1x2 f32 examples, but input 'x' is f32[2,4]"},
      {R"({"input":"x","layout":"chw","shape":[2,1,2],"mean":[0,0],"std":[1,0]})",
       "channel 1: std must be finite and > 0"},
      {R"({"input":"w1","layout":"chw","shape":[4,1,1],"mean":[0,0,0,0],"std":[1,1,1,1]})",
       "names input 'w1', which is not a runtime input"},
      {"[1,2", "is not a JSON object"},
  };
  int k = 0;
  for (const auto& [json, why] : cases) {
    SCOPED_TRACE(json);
    const std::string dir = absl::StrCat(root, "/bad", k++);
    ASSERT_TRUE(
        testing::WriteTestMlp(dir, testing::kTestMlp, {{"input_normalization", json}}).ok());
    auto m = ServedModel::Load(dir, "bad", "2", BatchingConfig{}, backend.get());
    ASSERT_FALSE(m.ok());
    const std::string msg(m.status().message());
    EXPECT_NE(msg.find("model bad version 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("metadata \"input_normalization\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
  }
}

TEST(ServedModelTest, AProgramWithTheBatchBakedInIsRefusedWithTheReason) {
  // The bias is a constant of the batch's shape: rebatching cannot change it.
  std::string text = testing::kTestMlp;
  ir::Graph g = *ir::ParseGraph(text);
  auto r = Rebatch(g, {"x"}, 2, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->node(4).type().shape, (Shape{4, 4}));
  EXPECT_EQ(r->node(12).type().shape, (Shape{4}));
  const std::string baked = R"(graph @g {
  %0 = parameter() {index=0, name="x"} : f32[2,3]
  %1 = constant() {value=[1,2,3,4,5,6]} : f32[2,3]
  %2 = add(%0, %1) : f32[2,3]
  return y=%2
}
)";
  auto bg = ir::ParseGraph(baked);
  ASSERT_TRUE(bg.ok()) << bg.status();
  auto rb = Rebatch(*bg, {"x"}, 2, 4);
  ASSERT_FALSE(rb.ok());
  EXPECT_NE(rb.status().message().find("cannot be rebatched from 2 to 4"), std::string::npos)
      << rb.status();
}

TEST(ServedModelTest, ACorruptArtifactFailsToLoadNamingIt) {
  const std::string dir = test_support::MakeTempDir("served_model_test") + "/bad";
  ASSERT_TRUE(testing::WriteTestMlp(dir).ok());
  {
    FILE* f = fopen((dir + "/weights.safetensors").c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    fseek(f, 100, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
  }
  auto backend = runtime::MakeCpuBackend();
  auto m = ServedModel::Load(dir, "bad", "3", BatchingConfig{}, backend.get());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model bad version 3"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace kiln::serve
