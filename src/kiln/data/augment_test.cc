#include "kiln/data/augment.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"
#include "kiln/data/pipeline.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::data {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// A 1 x 3 x 4 image with pixel (i, j) = 10 i + j + 1 (no pixel is 0, so padding shows).
std::vector<float> Image() {
  std::vector<float> x(12);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) x[i * 4 + j] = static_cast<float>(10 * i + j + 1);
  return x;
}

AugmentConfig Layout() {
  AugmentConfig c;
  c.channels = 1;
  c.height = 3;
  c.width = 4;
  return c;
}

TEST(AugmenterTest, CropShiftsInZeroPaddingAndFlipMirrors) {
  AugmentConfig c = Layout();
  c.random_crop = true;
  c.padding = 1;
  c.flip_horizontal = true;
  auto a = Augmenter::Create(c, 12);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<float> scratch(12);
  // Find draws of each kind among the first examples and check the pixels they give.
  bool saw_shift = false, saw_flip = false;
  std::set<int64_t> offsets;
  for (int64_t idx = 0; idx < 200; ++idx) {
    const Augmenter::Draw d = a->DrawFor(7, 2, idx);
    ASSERT_GE(d.dy, 0);
    ASSERT_LE(d.dy, 2);
    ASSERT_GE(d.dx, 0);
    ASSERT_LE(d.dx, 2);
    offsets.insert(d.dy * 3 + d.dx);
    std::vector<float> x = Image();
    a->ApplyTrain(x.data(), 7, 2, idx, scratch.data());
    // Expected: out(i, j) = padded(i + dy, j' + dx), j' = flip ? 3 - j : j.
    const std::vector<float> src = Image();
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 4; ++j) {
        const int sy = i + static_cast<int>(d.dy) - 1;
        const int sx = (d.flip ? 3 - j : j) + static_cast<int>(d.dx) - 1;
        const float want = sy >= 0 && sy < 3 && sx >= 0 && sx < 4 ? src[sy * 4 + sx] : 0.0f;
        ASSERT_EQ(x[i * 4 + j], want) << "example " << idx << " pixel " << i << "," << j;
      }
    }
    saw_shift |= d.dy != 1 || d.dx != 1;
    saw_flip |= d.flip;
  }
  EXPECT_TRUE(saw_shift);
  EXPECT_TRUE(saw_flip);
  EXPECT_EQ(offsets.size(), 9u);  // every offset of [0, 2]^2 drawn
  // One concrete case by hand: dy = dx = 0 (shifted down-right by one), no flip.
  std::vector<float> x = Image();
  Augmenter::Draw d;
  for (int64_t idx = 0;; ++idx) {
    d = a->DrawFor(7, 2, idx);
    if (d.dy == 0 && d.dx == 0 && !d.flip) {
      a->ApplyTrain(x.data(), 7, 2, idx, scratch.data());
      break;
    }
  }
  EXPECT_THAT(x, ElementsAreArray({0.f, 0.f, 0.f, 0.f, 0.f, 1.f, 2.f, 3.f, 0.f, 11.f, 12.f, 13.f}));
}

TEST(AugmenterTest, DrawsAreAFunctionOfSeedEpochAndIndex) {
  AugmentConfig c = Layout();
  c.random_crop = true;
  c.padding = 2;
  c.flip_horizontal = true;
  auto a = Augmenter::Create(c, 12);
  ASSERT_TRUE(a.ok());
  auto key = [&](uint64_t seed, int64_t epoch, int64_t i) {
    Augmenter::Draw d = a->DrawFor(seed, epoch, i);
    return d.dy * 100 + d.dx * 10 + (d.flip ? 1 : 0);
  };
  int differ_epoch = 0, differ_seed = 0;
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(key(1, 3, i), key(1, 3, i));
    differ_epoch += key(1, 3, i) != key(1, 4, i);
    differ_seed += key(1, 3, i) != key(2, 3, i);
  }
  EXPECT_GT(differ_epoch, 32);  // 50 possible draws: most differ
  EXPECT_GT(differ_seed, 32);
}

TEST(AugmenterTest, NormalizeIsTorchvisionsFormulaAndEvalIsCentreCropOnly) {
  AugmentConfig c;
  c.channels = 2;
  c.height = 2;
  c.width = 2;
  c.random_crop = true;
  c.padding = 3;
  c.flip_horizontal = true;
  c.mean = {0.5, -1.25};
  c.std = {0.3, 2.0};
  auto a = Augmenter::Create(c, 8);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, scratch(8);
  a->ApplyEval(x.data(), scratch.data());
  std::vector<float> want(8);
  for (int k = 0; k < 8; ++k) {
    const float v = static_cast<float>(k + 1);
    want[k] = k < 4 ? (v - 0.5f) / 0.3f : (v - -1.25f) / 2.0f;  // f32, as (x - mean) / std
  }
  EXPECT_THAT(x, ElementsAreArray(want));
}

TEST(AugmenterTest, BadConfigsNameTheKey) {
  AugmentConfig c = Layout();
  c.flip_horizontal = true;
  EXPECT_THAT(Augmenter::Create(c, 13).status().message(),
              HasSubstr("the examples have 13 features but the image layout 1x3x4"));
  c.mean = {0.5, 0.5};
  c.std = {1, 1};
  EXPECT_THAT(Augmenter::Create(c, 12).status().message(),
              HasSubstr("data.augment.normalize: mean and std need one value per channel (1)"));
  c.mean = {0.5};
  c.std = {0};
  EXPECT_THAT(Augmenter::Create(c, 12).status().message(), HasSubstr("std must be finite and > 0"));
}

// The pipeline applies the draws of (seed, epoch, global index) on its producing thread: rows
// match a hand-applied Augmenter, a restored pipeline (with another prefetch depth) repeats them,
// and the held-out split gets the eval transform.
class AugmentedPipelineTest : public ::testing::Test {
 protected:
  static constexpr int64_t kN = 60;
  void SetUp() override {
    env_ = NewMemEnv();
    Tensor x(DType::kF32, Shape{kN, 12});
    Tensor y(DType::kS32, Shape{kN});
    for (int64_t i = 0; i < kN; ++i) {
      const std::vector<float> img = Image();
      for (int k = 0; k < 12; ++k) x.data<float>()[i * 12 + k] = img[k] + 100.0f * i;
      y.data<int32_t>()[i] = static_cast<int32_t>(i);  // each row names its example
    }
    auto bytes = SerializeSafetensors({{"x", x}, {"y", y}});
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(WriteStringToFile(env_.get(), *bytes, "/imgs.safetensors").ok());
    cfg_.source = "safetensors:/imgs.safetensors";
    cfg_.batch_size = 8;
    cfg_.seed = 5;
    cfg_.held_out_fraction = 0.2;
    cfg_.augment = Layout();
    cfg_.augment.random_crop = true;
    cfg_.augment.padding = 1;
    cfg_.augment.flip_horizontal = true;
    cfg_.augment.mean = {3.0};
    cfg_.augment.std = {2.0};
  }
  std::vector<float> Expected(int64_t index, int64_t epoch, bool eval) {
    auto a = Augmenter::Create(cfg_.augment, 12);
    std::vector<float> x = Image(), scratch(12);
    for (float& v : x) v += 100.0f * index;
    if (eval) {
      a->ApplyEval(x.data(), scratch.data());
    } else {
      a->ApplyTrain(x.data(), cfg_.seed, epoch, index, scratch.data());
    }
    return x;
  }
  std::unique_ptr<Env> env_;
  PipelineConfig cfg_;
};

TEST_F(AugmentedPipelineTest, RowsAreTheDrawsOfTheirExampleAndResumeRepeatsThem) {
  // (prefetch, workers): every row is its example's draw whichever thread augmented it.
  for (auto [prefetch, workers] :
       std::vector<std::pair<int, int>>{{0, 1}, {2, 1}, {kAutoPrefetch, 1}, {2, 2}, {1, 4}}) {
    SCOPED_TRACE(absl::StrCat("prefetch ", prefetch, " workers ", workers));
    PipelineConfig c = cfg_;
    c.prefetch = prefetch;
    c.workers = workers;
    auto p = InputPipeline::Create(c, env_.get());
    ASSERT_TRUE(p.ok()) << p.status();
    Tensor x(DType::kF32, (*p)->feature_type().shape), y(DType::kS32, (*p)->label_type().shape);
    const int64_t bpe = (*p)->batches_per_epoch();
    std::vector<std::vector<float>> later;
    std::string state;
    for (int64_t b = 0; b < 3 * bpe; ++b) {
      const int64_t epoch = b / bpe;
      ASSERT_TRUE((*p)->Next(x, y).ok());
      for (int64_t r = 0; r < 8; ++r) {
        const int64_t idx = y.data<int32_t>()[r];
        std::vector<float> row(x.data<float>() + r * 12, x.data<float>() + (r + 1) * 12);
        ASSERT_EQ(row, Expected(idx, epoch, false)) << "batch " << b << " row " << r;
        if (b > bpe + 1) later.push_back(row);
      }
      if (b == bpe + 1) state = (*p)->SaveState();
    }
    // Restored into a pipeline with another prefetch setting: the same augmented rows.
    PipelineConfig c2 = cfg_;
    c2.prefetch = prefetch == 0 ? kAutoPrefetch : 0;
    auto q = InputPipeline::Create(c2, env_.get());
    ASSERT_TRUE(q.ok());
    ASSERT_TRUE((*q)->RestoreState(state).ok());
    size_t k = 0;
    for (int64_t b = bpe + 2; b < 3 * bpe; ++b) {
      ASSERT_TRUE((*q)->Next(x, y).ok());
      for (int64_t r = 0; r < 8; ++r, ++k) {
        std::vector<float> row(x.data<float>() + r * 12, x.data<float>() + (r + 1) * 12);
        ASSERT_EQ(row, later[k]);
      }
    }
  }
}

TEST_F(AugmentedPipelineTest, HeldOutGetsTheEvalTransform) {
  PipelineConfig c = cfg_;
  c.split = "held_out";
  c.shuffle = false;
  c.prefetch = 0;
  c.batch_size = 2;
  auto p = InputPipeline::Create(c, env_.get());
  ASSERT_TRUE(p.ok()) << p.status();
  Tensor x(DType::kF32, (*p)->feature_type().shape), y(DType::kS32, (*p)->label_type().shape);
  for (int b = 0; b < 3; ++b) {
    ASSERT_TRUE((*p)->Next(x, y).ok());
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<float> row(x.data<float>() + r * 12, x.data<float>() + (r + 1) * 12);
      EXPECT_EQ(row, Expected(y.data<int32_t>()[r], 0, true));
    }
  }
  // A state saved without augmentation does not restore into an augmented pipeline.
  PipelineConfig plain = cfg_;
  plain.augment = AugmentConfig();
  auto q = InputPipeline::Create(plain, env_.get());
  ASSERT_TRUE(q.ok());
  auto r = InputPipeline::Create(cfg_, env_.get());
  ASSERT_TRUE(r.ok());
  EXPECT_THAT((*r)->RestoreState((*q)->SaveState()).message(), HasSubstr("data.augment"));
}

TEST_F(AugmentedPipelineTest, AutoPrefetchMeasuresAndKeepsTheBatches) {
  PipelineConfig c = cfg_;
  c.augment = AugmentConfig();
  c.prefetch = kAutoPrefetch;
  auto p = InputPipeline::Create(c, env_.get());
  ASSERT_TRUE(p.ok());
  c.prefetch = 0;
  auto q = InputPipeline::Create(c, env_.get());
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*p)->prefetch_depth(), 2);
  EXPECT_EQ((*q)->prefetch_depth(), 0);
  Tensor x(DType::kF32, (*p)->feature_type().shape), y(DType::kS32, (*p)->label_type().shape);
  Tensor x2 = x, y2 = y;
  for (int b = 0; b < 40; ++b) {
    ASSERT_TRUE((*p)->Next(x, y).ok());
    ASSERT_TRUE((*q)->Next(x2, y2).ok());
    ASSERT_EQ(std::string(static_cast<const char*>(x.raw_data()), x.byte_size()),
              std::string(static_cast<const char*>(x2.raw_data()), x2.byte_size()));
    std::this_thread::sleep_for(std::chrono::microseconds(500));  // the "step"
  }
  EXPECT_GE((*p)->prefetch_depth(), 2);
  EXPECT_LE((*p)->prefetch_depth(), 16);
  EXPECT_GE((*p)->mean_step_seconds(), 400e-6);
  EXPECT_GT((*p)->mean_produce_seconds(), 0);
  PipelineConfig bad = cfg_;
  bad.prefetch = -2;
  EXPECT_THAT(InputPipeline::Create(bad, env_.get()).status().message(),
              HasSubstr("data.prefetch must be auto or in [0, 1024]"));
}

TEST(AutoPrefetchDepthTest, CoversTheSlowestBatchAtTheStepsPaceAndNeverShrinks) {
  // 10 ms steps, a 35 ms batch in the window: 1 + ceil(3.5) = 5 batches.
  EXPECT_EQ(AutoPrefetchDepth(2, 16, 0.035, 0.004, 0.010, 0.0), 5);
  // Fast production, no waiting: stays.
  EXPECT_EQ(AutoPrefetchDepth(3, 16, 0.002, 0.001, 0.010, 0.0), 3);
  // Waited 5% although production keeps up on average: one more.
  EXPECT_EQ(AutoPrefetchDepth(3, 16, 0.002, 0.001, 0.010, 0.05), 4);
  // Production slower than the step on average: depth cannot help beyond covering the slowest.
  EXPECT_EQ(AutoPrefetchDepth(2, 16, 0.012, 0.011, 0.010, 0.3), 3);
  // Capped, and never below the current depth.
  EXPECT_EQ(AutoPrefetchDepth(2, 6, 1.0, 0.5, 0.001, 0.9), 6);
  EXPECT_EQ(AutoPrefetchDepth(7, 16, 0.0, 0.0, 0.010, 0.0), 7);
  EXPECT_EQ(AutoPrefetchDepth(4, 16, 0.5, 0.5, 0.0, 0.0), 4);  // no step measured
}

}  // namespace
}  // namespace kiln::data
