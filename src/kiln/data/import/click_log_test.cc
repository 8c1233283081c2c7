#include "kiln/data/import/click_log.h"

#include <cmath>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"
#include "kiln/data/click_metrics.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/train_data.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

// Hand-computed: positives score {0.9, 0.4, 0.4}, negatives {0.8, 0.4, 0.1}. Pairs (p > n):
// 0.9 beats all 3; each 0.4 beats 0.1 and ties 0.4 (half): 1.5 each. (3 + 1.5 + 1.5) / 9.
TEST(ClickMetrics, AucCountsTiesHalf) {
  EXPECT_DOUBLE_EQ(*Auc({0.9, 0.8, 0.4, 0.4, 0.4, 0.1}, {1, 0, 1, 1, 0, 0}), 6.0 / 9.0);
  EXPECT_DOUBLE_EQ(*Auc({1, 2, 3, 4}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(*Auc({1, 2, 3, 4}, {1, 1, 0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(*Auc({5, 5, 5, 5}, {1, 0, 1, 0}), 0.5);  // a constant score
  EXPECT_FALSE(Auc({1, 2}, {1, 1}).has_value());
  EXPECT_FALSE(Auc({1, 2}, {0}).has_value());
}

// User 7: clicks on the 1st and 3rd of its 4 impressions by score. User 3: one click of 2
// impressions, ranked 1st. User 9: no click, never counted. Users with K or fewer impressions
// are not counted either. K = 1: (1/2 + 1) / 2; K = 2: user 7 alone, 1/2; K = 3: user 7, 2/2.
// Ties at the boundary: user 5 has scores {0.5, 0.5, 0.5} with one click, K = 2: 2/3 expected.
TEST(ClickMetrics, RecallAtKPerUserWithTies) {
  std::vector<int64_t> users = {7, 7, 7, 7, 3, 3, 9, 9};
  std::vector<double> scores = {0.9, 0.8, 0.7, 0.1, 0.6, 0.2, 0.5, 0.4};
  std::vector<int> labels = {1, 0, 1, 0, 1, 0, 0, 0};
  EXPECT_DOUBLE_EQ(*RecallAtK(users, scores, labels, 1), 0.75);
  EXPECT_DOUBLE_EQ(*RecallAtK(users, scores, labels, 2), 0.5);
  EXPECT_DOUBLE_EQ(*RecallAtK(users, scores, labels, 3), 1.0);
  EXPECT_FALSE(RecallAtK(users, scores, labels, 4).has_value());
  EXPECT_DOUBLE_EQ(*RecallAtK({5, 5, 5}, {0.5, 0.5, 0.5}, {0, 1, 0}, 2), 2.0 / 3.0);
  EXPECT_FALSE(RecallAtK({1, 1, 1}, {1, 2, 3}, {0, 0, 0}, 2).has_value());
}

ClickLogOptions Small(const std::string& dir, int64_t day = 1) {
  return {
      .out_dir = dir, .users = 50, .items = 40, .events = 4000, .day = day, .seed = 7, .shards = 2};
}

// Days share the users and items and differ by a drift step; the log is deterministic.
TEST(ClickLog, HiddenModelDriftsByDay) {
  ClickModel d1 = ClickModel::Make(Small("x", 1));
  ClickModel d1b = ClickModel::Make(Small("x", 1));
  ClickModel d2 = ClickModel::Make(Small("x", 2));
  ASSERT_EQ(d1.user.size(), 50u * 8);
  EXPECT_EQ(d1.user, d1b.user);
  double diff = 0, norm = 0, corr = 0, n2 = 0;
  for (size_t i = 0; i < d1.user.size(); ++i) {
    diff += (d2.user[i] - d1.user[i]) * (d2.user[i] - d1.user[i]);
    norm += d1.user[i] * d1.user[i];
    corr += d1.user[i] * d2.user[i];
    n2 += d2.user[i] * d2.user[i];
  }
  EXPECT_GT(diff, 0.0);
  EXPECT_NEAR(std::sqrt(diff / norm), 0.3, 0.06);  // one drift step of 0.3
  EXPECT_GT(corr / std::sqrt(norm * n2), 0.9);     // mostly the same preferences
  EXPECT_EQ(d1.log_price, d2.log_price);           // prices do not drift
}

TEST(ClickLog, WritesADatasetWithItsBayesMetrics) {
  MemEnv env;
  auto s = GenerateClickLog(&env, Small("/day1"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->import.examples, 4000);
  EXPECT_EQ(s->held_out_examples, 800);
  EXPECT_GT(s->click_rate, 0.1);
  EXPECT_LT(s->click_rate, 0.6);
  EXPECT_GT(s->bayes_auc, 0.7);
  EXPECT_LT(s->bayes_auc, 1.0);
  auto m = ReadManifest(&env, "/day1");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kind, "clicks");
  EXPECT_EQ(m->label_feature, "click");
  EXPECT_DOUBLE_EQ(m->extra["bayes"]["auc"].get<double>(), s->bayes_auc);
  EXPECT_EQ(m->extra["tables"], nlohmann::json::array({50, 40}));
  ASSERT_TRUE(VerifyShards(&env, "/day1", *m).ok());
  // The same options give byte-identical shards.
  auto again = GenerateClickLog(&env, Small("/again"));
  ASSERT_TRUE(again.ok());
  auto m2 = ReadManifest(&env, "/again");
  ASSERT_EQ(m2->shards.size(), m->shards.size());
  for (size_t i = 0; i < m->shards.size(); ++i)
    EXPECT_EQ(m2->shards[i].crc32c, m->shards[i].crc32c);

  // Read back as a dataset: source: x = [user, item, price, hour] with the ids exact.
  TrainDataConfig sc;
  sc.source = "dataset:/day1";
  sc.batch_size = 100;
  sc.shuffle = false;
  auto src = OpenTrainData(sc, /*with_train=*/true, &env);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(src->shape.features, 4);
  EXPECT_EQ(src->shape.num_classes, 2);
  EXPECT_EQ(src->shape.categorical_sizes, (std::vector<int64_t>{50, 40}));
  EXPECT_EQ(src->train_examples, 3200);
  Tensor x = MakeInputTensor(src->shape, 100), y = MakeTargetTensor(src->shape, 100);
  ASSERT_TRUE(src->train->Next(x, y).ok());
  for (int64_t i = 0; i < 100; ++i) {
    const float u = x.data<float>()[i * 4], it = x.data<float>()[i * 4 + 1];
    EXPECT_EQ(u, std::floor(u));
    EXPECT_TRUE(u >= 0 && u < 50 && it >= 0 && it < 40) << u << " " << it;
    EXPECT_TRUE(y.data<int32_t>()[i] == 0 || y.data<int32_t>()[i] == 1);
  }

  ClickLogOptions bad = Small("/bad");
  bad.day = 0;
  auto b = GenerateClickLog(&env, bad);
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(absl::StrContains(b.status().message(), "--day")) << b.status();
}

}  // namespace
}  // namespace kiln::data
