// Per-language held-out perplexity of a GPT trained on a multilingual `tokens:` dataset: the
// metrics a run writes, the padded last batch counted exactly (checked against an evaluation at
// batch 1, which needs no padding), the languages' weighted mean against the overall loss, and
// bit-identical resume on the tokens: source.
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "gtest/gtest.h"
#include "kiln/data/import/text_import.h"
#include "kiln/data/token_dataset.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/train/evaluator.h"
#include "kiln/train/trainer.h"
#include "tests/support/temp_dir.h"

namespace kiln::train {
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

// en (regular text), ru and zh folders imported with --language-from-dir.
std::string ImportCorpus(const std::string& tmp) {
  Env* env = Env::Default();
  const std::vector<std::pair<std::string, std::string>> langs = {
      {"en", Words({"the", "house", "street", "time", "of", "and"}, 1, 300)},
      {"ru", Words({"дом", "улица", "время", "хорошо", "и"}, 2, 200)},
      {"zh", Words({"爱", "房子", "街道", "好", "时间"}, 3, 150)}};
  data::TextImportOptions o;
  for (const auto& [name, text] : langs) {
    const std::string d = JoinPath(tmp, name);
    EXPECT_TRUE(env->CreateDir(d).ok());
    EXPECT_TRUE(WriteStringToFile(env, text, JoinPath(d, "f")).ok());
    o.corpus.push_back(d);
  }
  o.language_from_dir = true;
  o.out_dir = JoinPath(tmp, "tokens");
  o.vocab_size = 64;
  o.seq_len = 8;
  o.doc_separator = "%";
  o.shards = 2;
  o.held_out = 0.15;
  absl::StatusOr<data::ImportSummary> s = data::ImportText(env, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return o.out_dir;
}

TrainConfig Config(const std::string& dataset, const std::string& out, int64_t batch = 4) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(
      "model: {kind: gpt, n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 0, dropout: 0.1}\n"
      "data: {source: SOURCE, seq_len: 8, batch_size: 4, seed: 3}\n"
      "optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01, clip_norm: 1.0}\n"
      "schedule: {kind: cosine, warmup_steps: 3, min_lr: 0.001}\n"
      "steps: 30\neval_every: 15\neval_batches: 0\ncheckpoint_every: 5\nlog_every: 5\n",
      "test",
      {"output_dir=" + out, "data.source=tokens:" + dataset,
       "data.batch_size=" + std::to_string(batch)});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(LanguageEval, PerLanguagePerplexityIsExactAndWritten) {
  const std::string tmp = test_support::MakeTempDir("language_eval");
  const std::string dataset = ImportCorpus(tmp);
  absl::StatusOr<data::TokenDatasetInfo> info = data::ReadTokenDataset(Env::Default(), dataset);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->languages.size(), 3u);
  const std::string out = JoinPath(tmp, "run");
  auto cpu = runtime::MakeCpuBackend();
  auto t = Trainer::Create(Config(dataset, out), {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = (*t)->Run();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->final_eval.has_value());
  const EvalResult& e = *r->final_eval;
  ASSERT_EQ(e.languages.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const LanguageEval& l = e.languages[i];
    EXPECT_EQ(l.language, info->languages[i].name);
    EXPECT_EQ(l.examples, info->languages[i].held_out_examples);  // every window, no padding
    EXPECT_NEAR(l.perplexity, std::exp(l.loss), 1e-9 * l.perplexity);
    EXPECT_GT(l.perplexity, 1.0);
    EXPECT_LT(l.perplexity, 64.0);  // trained: below uniform over the vocabulary
  }
  // metrics.jsonl has each language's perplexity at both evaluations.
  std::ifstream m(out + "/metrics.jsonl");
  std::string line;
  int with_languages = 0;
  while (std::getline(m, line)) {
    if (line.find("\"eval/en/perplexity\"") != std::string::npos &&
        line.find("\"eval/ru/perplexity\"") != std::string::npos &&
        line.find("\"eval/zh/perplexity\"") != std::string::npos) {
      ++with_languages;
    }
  }
  EXPECT_EQ(with_languages, 2);  // steps 15 and 30

  // The same weights evaluated at batch 1 (no padding, no dropped remainder): the padded
  // per-language results match, and the languages' mean weighted by windows is the overall loss.
  TrainConfig c1 = Config(dataset, out, /*batch=*/1);
  absl::StatusOr<TrainData> held = OpenTrainData(c1, /*language_model=*/true, false);
  ASSERT_TRUE(held.ok()) << held.status();
  LoadOptions lo;
  lo.shape = &held->shape;
  absl::StatusOr<LoadedRun> run = LoadRun(c1, lo);
  ASSERT_TRUE(run.ok()) << run.status();
  auto ev = Evaluator::Create(*cpu, *run->model, *held);
  ASSERT_TRUE(ev.ok()) << ev.status();
  absl::StatusOr<EvalResult> e1 = (*ev)->Run(run->params, 0);
  ASSERT_TRUE(e1.ok()) << e1.status();
  double weighted = 0;
  int64_t n = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(e1->languages[i].loss, e.languages[i].loss, 1e-5) << e.languages[i].language;
    EXPECT_NEAR(e1->languages[i].accuracy, e.languages[i].accuracy, 1e-9);
    weighted += e1->languages[i].loss * e1->languages[i].examples;
    n += e1->languages[i].examples;
  }
  EXPECT_EQ(n, e1->examples);
  EXPECT_NEAR(weighted / n, e1->loss, 1e-5);
}

TEST(LanguageEval, TokensSourceResumesBitIdentically) {
  const std::string tmp = test_support::MakeTempDir("language_eval_resume");
  const std::string dataset = ImportCorpus(tmp);
  auto cpu = runtime::MakeCpuBackend();
  const std::string a = JoinPath(tmp, "straight"), b = JoinPath(tmp, "resumed");
  auto t1 = Trainer::Create(Config(dataset, a), {.backend = cpu.get()});
  ASSERT_TRUE(t1.ok()) << t1.status();
  auto straight = (*t1)->Run();
  ASSERT_TRUE(straight.ok()) << straight.status();
  auto t2 = Trainer::Create(Config(dataset, b), {.backend = cpu.get(), .stop_after_steps = 12});
  ASSERT_TRUE(t2.ok());
  auto first = (*t2)->Run();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->preempted);
  t2->reset();
  auto t3 = Trainer::Create(Config(dataset, b), {.backend = cpu.get()});
  ASSERT_TRUE(t3.ok()) << t3.status();
  EXPECT_EQ((*t3)->start_step(), 12);
  auto second = (*t3)->Run();
  ASSERT_TRUE(second.ok()) << second.status();
  std::vector<float> resumed = first->losses;
  resumed.insert(resumed.end(), second->losses.begin(), second->losses.end());
  ASSERT_EQ(resumed.size(), straight->losses.size());
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(std::memcmp(&resumed[i], &straight->losses[i], sizeof(float)), 0) << "step " << i + 1;
  }
  ASSERT_TRUE(second->final_eval && straight->final_eval);
  for (size_t i = 0; i < straight->final_eval->languages.size(); ++i) {
    EXPECT_EQ(second->final_eval->languages[i].loss, straight->final_eval->languages[i].loss);
  }
}

TEST(LanguageEval, VocabularyMismatchIsAnError) {
  const std::string tmp = test_support::MakeTempDir("language_eval_vocab");
  const std::string dataset = ImportCorpus(tmp);
  TrainConfig c = Config(dataset, JoinPath(tmp, "run"));
  c.model.vocab_size = 300;
  auto cpu = runtime::MakeCpuBackend();
  absl::Status st = Trainer::Create(c, {.backend = cpu.get()}).status();
  EXPECT_NE(st.message().find("model.vocab_size: 300 does not match the tokenizer"),
            std::string::npos)
      << st;
}

}  // namespace
}  // namespace kiln::train
