// The recommender through the trainer on a generated click log: AUC and recall@K in the
// evaluation and the metrics, the model-vs-data checks, and the config keys.
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kiln/data/import/click_log.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/train/trainer.h"
#include "tests/support/temp_dir.h"

namespace kiln::train {
namespace {

// A 40-user, 50-item log of 12,000 impressions (day 1, seed 5), once per test binary.
const std::string& ClickDir() {
  static const std::string* dir = [] {
    auto* d = new std::string(kiln::test_support::MakeTempDir("kiln_ranking_eval") + "/clicks");
    data::ClickLogOptions o{
        .out_dir = *d, .users = 40, .items = 50, .events = 12000, .seed = 5, .shards = 2};
    auto s = data::GenerateClickLog(Env::Default(), o);
    EXPECT_TRUE(s.ok()) << s.status();
    return d;
  }();
  return *dir;
}

absl::StatusOr<TrainConfig> Config(const std::string& out, std::vector<std::string> sets = {}) {
  sets.push_back("output_dir=" + out);
  sets.push_back("data.source=dataset:" + ClickDir());
  return ParseTrainConfig(
      "model: {kind: recommender, tables: [40, 50], embed_dim: 8, bottom: [8], top: [16]}\n"
      "data: {source: SOURCE, batch_size: 128}\n"
      "optimizer: {kind: adamw, lr: 0.02}\n"
      "steps: 300\neval_every: 150\nlog_every: 100\neval_recall_k: 5\n",
      "test", sets);
}

TEST(RankingEvalTest, TrainsAndReportsAucAndRecall) {
  auto cpu = runtime::MakeCpuBackend();
  const std::string out = kiln::test_support::MakeTempDir("kiln_ranking_run") + "/run";
  auto c = Config(out);
  ASSERT_TRUE(c.ok()) << c.status();
  auto t = Trainer::Create(*c, {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = (*t)->Run();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->final_eval.has_value());
  const EvalResult& e = *r->final_eval;
  EXPECT_GT(e.auc, 0.65);  // the generator's Bayes AUC is about 0.83
  EXPECT_LE(e.auc, 1.0);
  EXPECT_EQ(e.recall_k, 5);
  EXPECT_GT(e.recall_at_k, 0.0);
  EXPECT_LE(e.recall_at_k, 1.0);
  std::ifstream m(out + "/metrics.jsonl");
  std::string line, all;
  while (std::getline(m, line)) all += line + "\n";
  EXPECT_TRUE(absl::StrContains(all, "\"eval/auc\"")) << all;
  EXPECT_TRUE(absl::StrContains(all, "\"eval/recall_at_5\"")) << all;

  // kiln eval's path: the run loaded back, evaluated again, the same numbers.
  auto loaded = LoadRun(*c, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto held = OpenTrainData(*c, false, /*with_train=*/false);
  ASSERT_TRUE(held.ok()) << held.status();
  auto ev = Evaluator::Create(*cpu, *loaded->model, *held);
  ASSERT_TRUE(ev.ok()) << ev.status();
  (*ev)->set_recall_k(5);
  auto again = (*ev)->Run(loaded->params, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_DOUBLE_EQ(again->auc, e.auc);
  EXPECT_DOUBLE_EQ(again->recall_at_k, e.recall_at_k);
}

TEST(RankingEvalTest, TablesMustCoverTheDataAndAreRequired) {
  auto cpu = runtime::MakeCpuBackend();
  auto c = Config(kiln::test_support::MakeTempDir("kiln_ranking_small") + "/run",
                  {"model.tables=[40,20]"});
  ASSERT_TRUE(c.ok()) << c.status();
  auto t = Trainer::Create(*c, {.backend = cpu.get()});
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(),
                                "model.tables[1] is 20 rows but sparse feature 1 of the data has "
                                "50 ids (set model.tables to [40, 50])"))
      << t.status();
  c = Config(kiln::test_support::MakeTempDir("kiln_ranking_one") + "/run", {"model.tables=[40]"});
  ASSERT_TRUE(c.ok());
  t = Trainer::Create(*c, {.backend = cpu.get()});
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "lists 1 tables but the data has 2"))
      << t.status();
  c = Config("/tmp/unused", {"model.tables=[]"});
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "model.tables: needs the rows"))
      << c.status();
  c = Config("/tmp/unused", {"model.interaction=cross"});
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "'cross' is not one of dot, concat"))
      << c.status();
  // The recommender keys and eval_recall_k at its default leave other kinds' hashes alone.
  auto mlp = ParseTrainConfig("model: {kind: mlp}\ndata: {source: x.csv}\n", "t");
  auto mlp2 =
      ParseTrainConfig("model: {kind: mlp, tables: [3], top: [4]}\ndata: {source: x.csv}\n", "t");
  ASSERT_TRUE(mlp.ok() && mlp2.ok());
  EXPECT_EQ(ConfigHash(*mlp), ConfigHash(*mlp2));
  auto back = ParseTrainConfig(ConfigToYaml(*Config("/tmp/unused")), "back");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model.tables, (std::vector<int64_t>{40, 50}));
  EXPECT_EQ(back->eval_recall_k, 5);
}

}  // namespace
}  // namespace kiln::train
