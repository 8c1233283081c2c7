#include "kiln/train/init_from.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/train/run_dir.h"
#include "kiln/train/trainer.h"
#include "tests/support/temp_dir.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;

constexpr char kCsv[] = KILN_SOURCE_DIR "/examples/data/digits.csv.gz";

TrainConfig Config(const std::string& out, std::vector<std::string> sets = {}) {
  sets.push_back("output_dir=" + out);
  sets.push_back(std::string("data.source=") + kCsv);
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(
      "model: {kind: mlp, hidden: [16]}\n"
      "data: {source: SOURCE, batch_size: 32, seed: 3}\n"
      "optimizer: {kind: adamw, lr: 0.05}\n"
      "steps: 12\nlog_every: 4\n",
      "test", sets);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// A finished 12-step run in a fresh temp folder: the checkpoint a warm start reads.
std::string TrainedRun(runtime::Backend& cpu, const std::string& name) {
  const std::string dir = kiln::test_support::MakeTempDir("kiln_init_from_" + name) + "/run";
  auto t = Trainer::Create(Config(dir), {.backend = &cpu});
  EXPECT_TRUE(t.ok()) << t.status();
  auto r = (*t)->Run();
  EXPECT_TRUE(r.ok()) << r.status();
  return CleanPath(dir);  // as the checkpoint paths in messages spell it
}

std::string NewDir(const std::string& name) {
  return kiln::test_support::MakeTempDir("kiln_init_from_" + name) + "/run";
}

TEST(InitFromTest, GlobMatchesAsFnmatch) {
  EXPECT_TRUE(GlobMatch("*", "fc0/weight"));
  EXPECT_TRUE(GlobMatch("fc0/*", "fc0/weight"));
  EXPECT_FALSE(GlobMatch("fc1/*", "fc0/weight"));
  EXPECT_TRUE(GlobMatch("*/bias", "blocks/0/mlp/bias"));
  EXPECT_TRUE(GlobMatch("fc?/bias", "fc1/bias"));
  EXPECT_FALSE(GlobMatch("fc?/bias", "fc12/bias"));
}

TEST(InitFromTest, RenameMapsTheLongestModelPrefix) {
  std::map<std::string, std::string> rename = {{"encoder/", "backbone/"},
                                               {"encoder/blk0/", "backbone/first/"}};
  EXPECT_EQ(CheckpointNameFor("backbone/x", rename), "encoder/x");
  EXPECT_EQ(CheckpointNameFor("backbone/first/w", rename), "encoder/blk0/w");
  EXPECT_EQ(CheckpointNameFor("head/w", rename), "head/w");
}

TEST(InitFromTest, ConfigParsesRoundTripsAndHashesOnlyWhenSet) {
  const std::string out = "/tmp/unused";
  TrainConfig plain = Config(out);
  TrainConfig warm = Config(out, {"init_from.checkpoint=/runs/day1"});
  EXPECT_EQ(warm.init_from.checkpoint, "/runs/day1");
  EXPECT_EQ(warm.init_from.include, std::vector<std::string>{"*"});
  EXPECT_NE(ConfigHash(plain), ConfigHash(warm));
  // Unset, the section does not enter the hash: a default InitFromConfig hashes as before.
  TrainConfig other = plain;
  other.init_from.exclude = {"fc1/*"};
  EXPECT_EQ(ConfigHash(plain), ConfigHash(other));

  absl::StatusOr<TrainConfig> full = ParseTrainConfig(
      "model: {kind: mlp}\ndata: {source: x.csv}\n"
      "init_from:\n  checkpoint: /runs/a\n  include: ['backbone/*', 'fc0/*']\n"
      "  exclude: [head/*]\n  rename: {'encoder/': 'backbone/'}\n",
      "t");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->init_from.include.size(), 2u);
  EXPECT_EQ(full->init_from.exclude, std::vector<std::string>{"head/*"});
  EXPECT_EQ(full->init_from.rename.at("encoder/"), "backbone/");
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(ConfigToYaml(*full), "back");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << ConfigToYaml(*full);
  EXPECT_EQ(ConfigToYaml(*back), ConfigToYaml(*full));
  EXPECT_EQ(ConfigHash(*back), ConfigHash(*full));

  absl::StatusOr<TrainConfig> bad = ParseTrainConfig(
      "model: {kind: mlp}\ndata: {source: x.csv}\ninit_from: {chekpoint: a}\n", "t");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "init_from.chekpoint: unknown key"))
      << bad.status();
  bad = ParseTrainConfig(
      "model: {kind: mlp}\ndata: {source: x.csv}\ninit_from: {checkpoint: a, include: []}\n", "t");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "init_from.include")) << bad.status();
  bad = ParseTrainConfig(
      "model: {kind: mlp}\ndata: {source: x.csv}\ninit_from: {checkpoint: a, include: 3}\n", "t");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "a list of strings")) << bad.status();
}

// The warm-started run holds the earlier run's final weights at step 0 (the excluded head at its
// fresh initialization, the optimizer state zero), says so, and records it in run.json.
TEST(InitFromTest, LoadsSelectedParametersOnlyAtStepZero) {
  auto cpu = runtime::MakeCpuBackend();
  const std::string day1 = TrainedRun(*cpu, "src");
  auto t1 = LoadRun(Config(day1), {});
  ASSERT_TRUE(t1.ok()) << t1.status();
  const nn::ParamStore& trained = t1->params;

  const std::string out = NewDir("dst");
  TrainConfig c = Config(out, {"init_from.checkpoint=" + day1, "init_from.exclude=['fc1/*']"});
  auto fresh = Trainer::Create(Config(NewDir("fresh")), {.backend = cpu.get()});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  auto t = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->start_step(), 0);
  EXPECT_EQ((*t)->train_step().step(), 0);
  const nn::ParamStore& p = (*t)->train_step().params();
  for (const char* name : {"fc0/weight", "fc0/bias"}) {
    EXPECT_TRUE(p.Find(name)->BitwiseEquals(*trained.Find(name))) << name;
  }
  for (const char* name : {"fc1/weight", "fc1/bias"}) {
    EXPECT_TRUE(p.Find(name)->BitwiseEquals(*(*fresh)->train_step().params().Find(name))) << name;
  }
  const nn::ParamStore& s = (*t)->train_step().optimizer_state();
  for (int i = 0; i < s.size(); ++i) {
    const Tensor& v = s.value(i);
    for (int64_t k = 0; k < v.num_elements(); ++k) ASSERT_EQ(v.GetDouble(k), 0.0) << s.names()[i];
  }
  bool said = false;
  for (const std::string& n : (*t)->notes()) {
    if (absl::StrContains(n, "init_from: loaded 2 tensors (1040 parameters) from " + day1 +
                                 "/checkpoints/step_12, left 2 at their initialisation: "
                                 "fc1/weight, fc1/bias")) {
      said = true;
    }
  }
  EXPECT_TRUE(said) << ::testing::PrintToString((*t)->notes());
  nlohmann::json run = ReadRunJson(out);
  ASSERT_TRUE(run.contains("init_from")) << run.dump();
  EXPECT_EQ(run["init_from"]["step"], 12);
  EXPECT_EQ(run["init_from"]["parameters"], 1040);
  EXPECT_EQ(run["init_from"]["left"], nlohmann::json::array({"fc1/weight", "fc1/bias"}));
  auto r = (*t)->Run();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->start_step, 0);
  EXPECT_EQ(r->final_step, 12);

  // A step_N folder names that checkpoint; all parameters by default.
  auto t2 = Trainer::Create(
      Config(NewDir("dst2"), {"init_from.checkpoint=" + day1 + "/checkpoints/step_12"}),
      {.backend = cpu.get()});
  ASSERT_TRUE(t2.ok()) << t2.status();
  for (int i = 0; i < trained.size(); ++i) {
    EXPECT_TRUE(
        (*t2)->train_step().params().Find(trained.names()[i])->BitwiseEquals(trained.value(i)));
  }
}

TEST(InitFromTest, MismatchesAndMissingTensorsAreClearErrors) {
  auto cpu = runtime::MakeCpuBackend();
  const std::string day1 = TrainedRun(*cpu, "mismatch");
  // Another hidden width: fc0/weight is [64,16] there, [64,24] here.
  auto t =
      Trainer::Create(Config(NewDir("wide"), {"model.hidden=[24]", "init_from.checkpoint=" + day1}),
                      {.backend = cpu.get()});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(t.status().message());
  EXPECT_TRUE(absl::StrContains(m, "tensor 'fc0/weight' is f32[64,16] in checkpoint " + day1 +
                                       "/checkpoints/step_12 but f32[64,24] in the model"))
      << m;
  // Excluding every mismatching tensor is accepted.
  t = Trainer::Create(Config(NewDir("wide2"), {"model.hidden=[24]", "init_from.checkpoint=" + day1,
                                               "init_from.include=['fc1/bias']"}),
                      {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();

  t = Trainer::Create(Config(NewDir("renamed"),
                             {"init_from.checkpoint=" + day1, "init_from.rename={'enc/': 'fc0/'}"}),
                      {.backend = cpu.get()});
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(),
                                "parameter 'fc0/weight' (checkpoint name 'enc/weight') is not in "
                                "checkpoint"))
      << t.status();

  t = Trainer::Create(
      Config(NewDir("none"), {"init_from.checkpoint=" + day1, "init_from.include=['head/*']"}),
      {.backend = cpu.get()});
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "selects no parameter")) << t.status();

  t = Trainer::Create(Config(NewDir("nowhere"), {"init_from.checkpoint=/nonexistent/run"}),
                      {.backend = cpu.get()});
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "/nonexistent/run")) << t.status();
}

// A damaged checkpoint is DataLoss, as on restore (every tensor's CRC is checked).
TEST(InitFromTest, VerifiesTheCheckpoint) {
  auto cpu = runtime::MakeCpuBackend();
  const std::string day1 = TrainedRun(*cpu, "corrupt");
  const std::string step = day1 + "/checkpoints/step_12";
  std::string shard;
  for (const auto& e : fs::directory_iterator(step)) {
    if (e.path().extension() == ".safetensors") shard = e.path().string();
  }
  ASSERT_FALSE(shard.empty());
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x5a');
  }
  auto t = Trainer::Create(Config(NewDir("c"), {"init_from.checkpoint=" + step}),
                           {.backend = cpu.get()});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << t.status();
  EXPECT_TRUE(absl::StrContains(t.status().message(), "init_from.checkpoint")) << t.status();
}

// A run that resumes from its own checkpoint ignores init_from and keeps its first record.
TEST(InitFromTest, AResumedRunIgnoresInitFrom) {
  auto cpu = runtime::MakeCpuBackend();
  const std::string day1 = TrainedRun(*cpu, "resume");
  const std::string out = NewDir("resumed");
  TrainConfig c = Config(out, {"init_from.checkpoint=" + day1});
  {
    auto t = Trainer::Create(c, {.backend = cpu.get(), .stop_after_steps = 5});
    ASSERT_TRUE(t.ok()) << t.status();
    auto r = (*t)->Run();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->preempted);
  }
  auto t = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->start_step(), 5);
  bool said = false;
  for (const std::string& n : (*t)->notes()) {
    said = said || absl::StrContains(n, "init_from: ignored (" + day1 +
                                            "): this run resumes from its own checkpoint");
  }
  EXPECT_TRUE(said) << ::testing::PrintToString((*t)->notes());
  EXPECT_TRUE(ReadRunJson(out).contains("init_from"));
}

}  // namespace
}  // namespace kiln::train
