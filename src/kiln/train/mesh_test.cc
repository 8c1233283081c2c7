// The mesh, each data rank's share of the global batch, and Trainers on thread communicators
// (no MPI) against one process: same examples, losses within 1e-4, rank 0 alone writes the run,
// every rank resumes from rank 0's checkpoint; ZeRO-1 and its sharded checkpoint.
#include "kiln/train/mesh.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/dist/thread_communicator.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/train/train_data.h"
#include "kiln/train/trainer.h"
#include "tests/support/temp_dir.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(MeshTest, ResolvesDefaultsAndCoordinates) {
  Mesh m = *ResolveMesh({}, 4, 64);
  EXPECT_EQ(m.ranks, 4);
  EXPECT_EQ(m.data, 4);
  EXPECT_EQ(m.model, 1);
  EXPECT_EQ(CoordsOf(m, 3).data, 3);
  EXPECT_EQ(CoordsOf(m, 3).model, 0);
  m = *ResolveMesh({.data = 2, .model = 1}, 2, 64);
  EXPECT_EQ(m.data, 2);
  m = *ResolveMesh({}, 1, 7);
  EXPECT_EQ(m.data, 1);
}

TEST(MeshTest, ErrorsNameWhatIsWrong) {
  auto msg = [](MeshConfig c, int ranks, int64_t batch) {
    return std::string(ResolveMesh(c, ranks, batch).status().message());
  };
  EXPECT_THAT(msg({.data = 3, .model = 1}, 2, 60), HasSubstr("data (3) x model (1)"));
  EXPECT_THAT(msg({.data = 3, .model = 1}, 2, 60), HasSubstr("number of ranks (2)"));
  EXPECT_THAT(msg({}, 2, 63), HasSubstr("data.batch_size (63) must be divisible by mesh.data (2)"));
  absl::StatusOr<Mesh> tp = ResolveMesh({.data = 2, .model = 2}, 4, 64);  // tensor parallel
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(tp->model, 2);
  EXPECT_EQ(CoordsOf(*tp, 3).data, 1);
  EXPECT_EQ(CoordsOf(*tp, 3).model, 1);
  EXPECT_THAT(msg({.data = 0, .model = 3}, 2, 64), HasSubstr("model (3)"));
}

TEST(MeshTest, SliceBatchTakesContiguousRows) {
  Tensor g(DType::kS32, Shape{6, 2});
  for (int i = 0; i < 12; ++i) g.data<int32_t>()[i] = i;
  Tensor l(DType::kS32, Shape{2, 2});
  ASSERT_TRUE(SliceBatch(g, 1, 3, l).ok());
  EXPECT_EQ(l.data<int32_t>()[0], 4);
  EXPECT_EQ(l.data<int32_t>()[3], 7);
  Tensor wrong(DType::kS32, Shape{3, 2});
  EXPECT_THAT(std::string(SliceBatch(g, 0, 3, wrong).message()), HasSubstr("expected s32[2,2]"));
  EXPECT_FALSE(SliceBatch(g, 3, 3, l).ok());
}

constexpr char kCsv[] = KILN_SOURCE_DIR "/examples/data/digits.csv.gz";

TrainConfig Config(const std::string& out, int64_t steps) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(
      "model: {kind: mlp, hidden: [32]}\n"
      "data: {source: SOURCE, batch_size: 32, seed: 5}\n"
      "optimizer: {kind: adamw, lr: 0.02, weight_decay: 0.01, clip_norm: 1.0}\n"
      "steps: 20\neval_every: 0\ncheckpoint_every: 10\nlog_every: 5\n",
      "test",
      {"output_dir=" + out, std::string("data.source=") + kCsv, "steps=" + std::to_string(steps)});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// A data rank's share of every global batch is exactly those rows of the batch a one-process run
// reads: the rank's own source, sliced, against one source read whole (30 batches: past an
// epoch, so the reshuffle is covered too).
TEST(MeshTest, EachRankReadsItsShareOfTheOneProcessBatches) {
  TrainConfig c = Config("unused", 20);
  absl::StatusOr<TrainData> one = OpenTrainData(c, false, true);
  ASSERT_TRUE(one.ok()) << one.status();
  const int d = 4;
  std::vector<TrainData> ranks;
  for (int r = 0; r < d; ++r) ranks.push_back(*OpenTrainData(c, false, true));
  const int64_t b = c.data.batch_size;
  Tensor x = MakeInputTensor(one->shape, b), y = MakeTargetTensor(one->shape, b);
  Tensor rx = MakeInputTensor(one->shape, b), ry = MakeTargetTensor(one->shape, b);
  Tensor lx = MakeInputTensor(one->shape, b / d), ly = MakeTargetTensor(one->shape, b / d);
  for (int step = 0; step < 60; ++step) {
    ASSERT_TRUE(one->train->Next(x, y).ok());
    for (int r = 0; r < d; ++r) {
      ASSERT_TRUE(ranks[r].train->Next(rx, ry).ok());
      ASSERT_TRUE(SliceBatch(rx, r, d, lx).ok());
      ASSERT_TRUE(SliceBatch(ry, r, d, ly).ok());
      const size_t xrow = lx.byte_size(), yrow = ly.byte_size();
      EXPECT_EQ(0,
                std::memcmp(lx.raw_data(), static_cast<const char*>(x.raw_data()) + r * xrow, xrow))
          << "step " << step << " rank " << r;
      EXPECT_EQ(
          0, std::memcmp(ly.raw_data(), static_cast<const char*>(y.raw_data()) + r * yrow, yrow));
    }
  }
}

struct RankRun {
  absl::StatusOr<TrainResult> result = absl::UnknownError("not run");
  int64_t start_step = -1;
  uint64_t rng_seed = 0;  // the train step's dropout seed
  // Tensor parallel: the whole tensors gathered from the shards after Run (every rank gathers).
  nn::ParamStore full_params, full_state;
};

// `d` Trainers on threads, rank r on communicator r, all with OUTDIR `out`.
std::vector<RankRun> RunRanks(int d, const TrainConfig& c) {
  std::vector<std::unique_ptr<dist::Communicator>> comms = dist::MakeThreadCommunicators(d);
  std::vector<RankRun> runs(d);
  std::vector<std::thread> threads;
  for (int r = 0; r < d; ++r) {
    threads.emplace_back([&, r] {
      auto cpu = runtime::MakeCpuBackend();
      TrainerOptions o;
      o.backend = cpu.get();
      o.comm = comms[r].get();
      o.host = "host" + std::to_string(r);
      absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(c, o);
      if (!t.ok()) {
        runs[r].result = t.status();
        return;
      }
      runs[r].start_step = (*t)->start_step();
      runs[r].rng_seed = (*t)->train_step().options().rng_seed;
      runs[r].result = (*t)->Run();
      if (runs[r].result.ok() && c.mesh.model > 1) {
        absl::StatusOr<nn::ParamStore> p = (*t)->train_step().FullParams();
        absl::StatusOr<nn::ParamStore> s = (*t)->train_step().FullOptimizerState();
        if (!p.ok() || !s.ok()) {
          runs[r].result = !p.ok() ? p.status() : s.status();
          return;
        }
        runs[r].full_params = *std::move(p);
        runs[r].full_state = *std::move(s);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

TEST(DataParallelTrainerTest, TwoRanksTrackOneProcessAndOnlyRankZeroWrites) {
  const std::string root = kiln::test_support::MakeTempDir("kiln_mesh_test");
  auto cpu = runtime::MakeCpuBackend();
  absl::StatusOr<std::unique_ptr<Trainer>> one =
      Trainer::Create(Config(root + "/one", 20), {.backend = cpu.get()});
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<TrainResult> ref = (*one)->Run();
  ASSERT_TRUE(ref.ok()) << ref.status();

  const std::string out = root + "/two";
  std::vector<RankRun> runs = RunRanks(2, Config(out, 20));
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(runs[r].result.ok()) << r << ": " << runs[r].result.status();
  ASSERT_EQ(runs[0].result->losses.size(), 20u);
  EXPECT_EQ(runs[0].result->losses, runs[1].result->losses);  // the global batch's loss, bitwise
  double worst = 0;
  for (size_t s = 0; s < 20; ++s) {
    const double a = ref->losses[s], b = runs[0].result->losses[s];
    worst = std::max(worst, std::abs(a - b) / std::abs(a));
  }
  EXPECT_LT(worst, 1e-4);
  std::cout << "largest relative loss difference over 20 steps: " << worst << "\n";
  std::ifstream f(out + "/run.json");
  nlohmann::json info = nlohmann::json::parse(f);
  EXPECT_EQ(info["mesh"]["data"], 2);
  EXPECT_EQ(info["mesh"]["ranks"], 2);
  ASSERT_EQ(info["ranks"].size(), 2u);
  EXPECT_EQ(info["ranks"][1]["host"], "host1");
  EXPECT_EQ(info["ranks"][1]["data"], 1);
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_20/manifest.json"));

  // Resume to 30 steps: rank 1 starts from rank 0's checkpoint (broadcast), and the ranks agree.
  std::vector<RankRun> more = RunRanks(2, Config(out, 30));
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(more[r].result.ok()) << more[r].result.status();
  EXPECT_EQ(more[0].start_step, 20);
  EXPECT_EQ(more[1].start_step, 20);
  ASSERT_EQ(more[0].result->losses.size(), 10u);
  EXPECT_EQ(more[0].result->losses, more[1].result->losses);
}

// init_from on two ranks: rank 0 loads the checkpoint and broadcasts it, and both ranks join the
// step-0 evaluation (a rank 0 evaluating alone would keep rank 1 waiting in step 1's all-reduce).
// The ranks then train the warm start as one process does.
TEST(DataParallelTrainerTest, AWarmStartReachesEveryRank) {
  const std::string root = kiln::test_support::MakeTempDir("kiln_mesh_init_from");
  auto cpu = runtime::MakeCpuBackend();
  {
    auto src = Trainer::Create(Config(root + "/src", 10), {.backend = cpu.get()});
    ASSERT_TRUE(src.ok()) << src.status();
    ASSERT_TRUE((*src)->Run().ok());
  }
  TrainConfig one_config = Config(root + "/one", 5);
  one_config.init_from.checkpoint = root + "/src";
  auto one = Trainer::Create(one_config, {.backend = cpu.get()});
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<TrainResult> ref = (*one)->Run();
  ASSERT_TRUE(ref.ok()) << ref.status();

  TrainConfig two = Config(root + "/two", 5);
  two.init_from.checkpoint = root + "/src";
  std::vector<RankRun> runs = RunRanks(2, two);
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(runs[r].result.ok()) << r << ": " << runs[r].result.status();
  EXPECT_EQ(runs[0].result->losses, runs[1].result->losses);
  ASSERT_EQ(runs[0].result->losses.size(), 5u);
  for (size_t s = 0; s < 5; ++s) {
    EXPECT_NEAR(runs[0].result->losses[s], ref->losses[s], 1e-4 * std::abs(ref->losses[s]))
        << "step " << s + 1;
  }
  std::ifstream f(root + "/two/run.json");
  EXPECT_TRUE(nlohmann::json::parse(f).contains("init_from"));
}

// ZeRO-1 (optimizer.shard_state) on 2 thread ranks: tracks one process, each rank holds half of
// the AdamW state (run.json), checkpoints are sharded (both ranks' pieces, format version 2),
// and the sharded checkpoint resumes both on the same 2 ranks and in one process, alike.
TEST(DataParallelTrainerTest, ShardStateTracksOneProcessAndItsCheckpointReshards) {
  const std::string root = kiln::test_support::MakeTempDir("kiln_mesh_zero_test");
  auto cpu = runtime::MakeCpuBackend();
  absl::StatusOr<std::unique_ptr<Trainer>> one =
      Trainer::Create(Config(root + "/one", 20), {.backend = cpu.get()});
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<TrainResult> ref = (*one)->Run();
  ASSERT_TRUE(ref.ok()) << ref.status();
  const int64_t whole_state = (*one)->train_step().optimizer_state_bytes();

  const std::string out = root + "/zero";
  TrainConfig c = Config(out, 20);
  c.optimizer.shard_state = true;
  std::vector<RankRun> runs = RunRanks(2, c);
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(runs[r].result.ok()) << r << ": " << runs[r].result.status();
  EXPECT_EQ(runs[0].result->losses, runs[1].result->losses);
  double worst = 0;
  for (size_t s = 0; s < 20; ++s) {
    const double a = ref->losses[s], b = runs[0].result->losses[s];
    worst = std::max(worst, std::abs(a - b) / std::abs(a));
  }
  EXPECT_LT(worst, 1e-4);
  std::cout << "shard_state: largest relative loss difference over 20 steps: " << worst << "\n";
  std::ifstream f(out + "/run.json");
  nlohmann::json info = nlohmann::json::parse(f);
  EXPECT_EQ(info["memory"]["shard_state"], true);
  const int64_t s0 = info["ranks"][0]["optimizer_state_bytes"].get<int64_t>();
  const int64_t s1 = info["ranks"][1]["optimizer_state_bytes"].get<int64_t>();
  EXPECT_EQ(s0 + s1, whole_state);
  EXPECT_LE(s0, whole_state / 2 + 8);  // ceil(P / 2) elements of m and v
  auto reader = CheckpointReader::Open(out + "/checkpoints/step_20");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->sharded());
  EXPECT_EQ((*reader)->ranks(), 2);
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_20/rank-00001-shard-00000-of-00001.safetensors"));

  // Resume to 30 on the same 2 ranks, and (a copy) in one process without shard_state.
  fs::copy(out, root + "/zero_one", fs::copy_options::recursive);
  std::vector<RankRun> more = RunRanks(2, [&] {
    TrainConfig m = Config(out, 30);
    m.optimizer.shard_state = true;
    return m;
  }());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(more[r].result.ok()) << more[r].result.status();
  EXPECT_EQ(more[0].start_step, 20);
  EXPECT_EQ(more[1].start_step, 20);
  absl::StatusOr<std::unique_ptr<Trainer>> solo =
      Trainer::Create(Config(root + "/zero_one", 30), {.backend = cpu.get()});
  ASSERT_TRUE(solo.ok()) << solo.status();
  EXPECT_EQ((*solo)->start_step(), 20);
  absl::StatusOr<TrainResult> cont = (*solo)->Run();
  ASSERT_TRUE(cont.ok()) << cont.status();
  ASSERT_EQ(cont->losses.size(), 10u);
  ASSERT_EQ(more[0].result->losses.size(), 10u);
  for (size_t s = 0; s < 10; ++s) {
    EXPECT_NEAR(more[0].result->losses[s], cont->losses[s], 1e-4 * std::abs(cont->losses[s]));
  }
}

// Dropout: every data rank has its own seed (the same one would draw rank 0's masks again on
// every rank's share); rank 0 keeps the config's, as a one-process run does.
TEST(DataParallelTrainerTest, EachDataRankDrawsItsOwnDropoutMasks) {
  const std::string root = kiln::test_support::MakeTempDir("kiln_mesh_seed_test");
  TrainConfig c = Config(root + "/two", 2);
  std::vector<RankRun> runs = RunRanks(2, c);
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(runs[r].result.ok()) << r << ": " << runs[r].result.status();
  EXPECT_EQ(runs[0].rng_seed, c.seed);
  EXPECT_NE(runs[1].rng_seed, runs[0].rng_seed);
}

TEST(DataParallelTrainerTest, MeshErrorsAreClear) {
  const std::string root = kiln::test_support::MakeTempDir("kiln_mesh_test_err");
  TrainConfig c = Config(root + "/x", 5);
  c.mesh.data = 3;
  std::vector<RankRun> runs = RunRanks(2, c);
  ASSERT_FALSE(runs[0].result.ok());
  EXPECT_THAT(std::string(runs[0].result.status().message()), HasSubstr("number of ranks (2)"));
  c.mesh.data = 0;
  c.data.batch_size = 33;
  runs = RunRanks(2, c);
  EXPECT_THAT(std::string(runs[1].result.status().message()), HasSubstr("divisible"));
  // Tensor parallel needs a model with layouts (the GPT).
  c = Config(root + "/y", 5);
  c.mesh.model = 2;
  runs = RunRanks(2, c);
  ASSERT_FALSE(runs[0].result.ok());
  EXPECT_EQ(runs[0].result.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(runs[0].result.status().message()), HasSubstr("gpt model only"));
}

// Tensor parallel: the GPT example on a {data: 2, model: 2} mesh of thread ranks tracks one
// process, its checkpoint is written in pieces by every rank, a resume continues on every rank,
// and that checkpoint restores into one process.
TrainConfig GptConfig(const std::string& out, int64_t steps, int model,
                      std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"output_dir=" + out,
                                   "steps=" + std::to_string(steps),
                                   "eval_every=5",
                                   "eval_batches=1",
                                   "checkpoint_every=5",
                                   "log_every=1",
                                   "data.batch_size=8",
                                   "data.seq_len=16",
                                   "mesh.model=" + std::to_string(model),
                                   "schedule.warmup_steps=2"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  absl::StatusOr<TrainConfig> c =
      LoadTrainConfig(std::string(KILN_SOURCE_DIR) + "/examples/gpt_text.yaml", sets);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(TensorParallelTrainerTest, MeshTwoByTwoTracksOneProcessAndCheckpointsInPieces) {
  const std::string root = kiln::test_support::MakeTempDir("kiln_mesh_tp_test");
  auto cpu = runtime::MakeCpuBackend();
  absl::StatusOr<std::unique_ptr<Trainer>> one =
      Trainer::Create(GptConfig(root + "/one", 10, 1), {.backend = cpu.get()});
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<TrainResult> ref = (*one)->Run();
  ASSERT_TRUE(ref.ok()) << ref.status();

  const std::string out = root + "/tp";
  std::vector<RankRun> runs = RunRanks(4, GptConfig(out, 10, 2));
  for (int r = 0; r < 4; ++r)
    ASSERT_TRUE(runs[r].result.ok()) << r << ": " << runs[r].result.status();
  ASSERT_EQ(runs[0].result->losses.size(), 10u);
  double worst = 0;
  for (size_t s = 0; s < 10; ++s) {
    EXPECT_EQ(runs[0].result->losses[s], runs[3].result->losses[s]);
    const double a = ref->losses[s], b = runs[0].result->losses[s];
    worst = std::max(worst, std::abs(a - b) / std::abs(a));
  }
  EXPECT_LT(worst, 1e-5);
  std::cout << "largest relative loss difference over 10 steps, {data: 2, model: 2}: " << worst
            << "\n";
  std::ifstream f(out + "/run.json");
  nlohmann::json info = nlohmann::json::parse(f);
  EXPECT_EQ(info["mesh"]["model"], 2);
  EXPECT_EQ(info["ranks"][3]["model"], 1);
  auto reader = CheckpointReader::Open(out + "/checkpoints/step_10");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->sharded());
  EXPECT_EQ((*reader)->ranks(), 4);
  // Every rank wrote shard files of its own (a `3*model` split's pieces, one per group, go to
  // separate files).
  std::vector<int> files(4, 0);
  for (const auto& e : fs::directory_iterator(out + "/checkpoints/step_10")) {
    const std::string name = e.path().filename().string();
    for (int r = 0; r < 4; ++r)
      if (name.rfind("rank-0000" + std::to_string(r) + "-shard-", 0) == 0) ++files[r];
  }
  for (int r = 0; r < 4; ++r) EXPECT_GE(files[r], 3) << "rank " << r;

  // Resume on the same mesh: every rank continues from the checkpoint of pieces.
  std::vector<RankRun> more = RunRanks(4, GptConfig(out, 15, 2));
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(more[r].result.ok()) << more[r].result.status();
  EXPECT_EQ(more[2].start_step, 10);
  ASSERT_EQ(more[0].result->losses.size(), 5u);
  EXPECT_EQ(more[0].result->losses, more[3].result->losses);

  // The tensor-parallel checkpoint restores into one process, which continues the same run.
  absl::StatusOr<std::unique_ptr<Trainer>> solo =
      Trainer::Create(GptConfig(out, 20, 1), {.backend = cpu.get()});
  ASSERT_TRUE(solo.ok()) << solo.status();
  EXPECT_EQ((*solo)->start_step(), 15);
  absl::StatusOr<TrainResult> rest = (*solo)->Run();
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(rest->losses.size(), 5u);
}

TEST(TensorParallelBoxesTest, GroupsAndReplicatedTensors) {
  // [_,3*model] over 2 ranks: a local [4, 6] shard of a [4, 12] tensor holds columns 2..3, 6..7
  // and 10..11 on rank 1 (block 1 of each third).
  absl::StatusOr<ir::Sharding> qkv = ir::ParseSharding("[_,3*model]");
  ASSERT_TRUE(qkv.ok()) << qkv.status();
  Shape whole;
  std::vector<TensorParallelBox> boxes = TensorParallelBoxes(*qkv, Shape{4, 6}, 2, 1, &whole);
  EXPECT_EQ(whole, (Shape{4, 12}));
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0].global.ToString(), "[0:4, 2:4]");
  EXPECT_EQ(boxes[1].global.ToString(), "[0:4, 6:8]");
  EXPECT_EQ(boxes[2].global.ToString(), "[0:4, 10:12]");
  EXPECT_EQ(boxes[2].local.ToString(), "[0:4, 4:6]");
  absl::StatusOr<ir::Sharding> rows = ir::ParseSharding("[model,_]");
  ASSERT_TRUE(rows.ok());
  boxes = TensorParallelBoxes(*rows, Shape{5, 3}, 4, 3, &whole);
  EXPECT_EQ(whole, (Shape{20, 3}));
  ASSERT_EQ(boxes.size(), 1u);
  EXPECT_EQ(boxes[0].global.ToString(), "[15:20, 0:3]");
  boxes = TensorParallelBoxes(ir::Sharding::Replicated(1), Shape{7}, 2, 1, &whole);
  EXPECT_EQ(whole, (Shape{7}));
  ASSERT_EQ(boxes.size(), 1u);
  EXPECT_EQ(boxes[0].global.ToString(), "[0:7]");
}

// Tensor-parallel checkpoints in pieces restore onto other meshes: a {data: 2, model: 2} run's
// step-4 checkpoint holds exactly the whole tensors its shards make, and continues in one process,
// on 2 data-parallel ranks, on {data: 1, model: 2} (4 ranks -> 2); a 2-rank data-parallel
// checkpoint continues on {data: 2, model: 2}. Each continuation tracks the uninterrupted
// one-process run over steps 5-8 within 1e-4 (a constant schedule, so that runs of 4 and 8 steps
// train alike).
TEST(TensorParallelTrainerTest, ItsCheckpointReshardsOntoOtherMeshes) {
  const std::string root = kiln::test_support::MakeTempDir("kiln_mesh_tp_reshard");
  const std::vector<std::string> constant = {"schedule.kind=constant", "schedule.warmup_steps=0",
                                             "checkpoint_every=4", "eval_every=0"};
  auto cpu = runtime::MakeCpuBackend();
  absl::StatusOr<std::unique_ptr<Trainer>> one =
      Trainer::Create(GptConfig(root + "/ref", 8, 1, constant), {.backend = cpu.get()});
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<TrainResult> ref = (*one)->Run();
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(ref->losses.size(), 8u);

  const std::string tp = root + "/tp";
  std::vector<RankRun> runs = RunRanks(4, GptConfig(tp, 4, 2, constant));
  for (int r = 0; r < 4; ++r)
    ASSERT_TRUE(runs[r].result.ok()) << r << ": " << runs[r].result.status();
  // The pieces put together are, bit for bit, the whole tensors the shards make.
  auto got = CheckpointReader::Open(tp + "/checkpoints/step_4");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)->sharded());
  EXPECT_EQ((*got)->ranks(), 4);
  int checked = 0;
  for (const nn::ParamStore* store : {&runs[0].full_params, &runs[0].full_state}) {
    for (int i = 0; i < store->size(); ++i) {
      const Tensor& whole = store->value(i);
      auto b = (*got)->ReadSlice(store->names()[i], TensorSlice::Whole(whole.shape()));
      ASSERT_TRUE(b.ok()) << store->names()[i] << ": " << b.status();
      EXPECT_TRUE(b->BitwiseEquals(whole)) << store->names()[i];
      ++checked;
    }
  }
  EXPECT_EQ(static_cast<size_t>(checked), (*got)->names().size());
  EXPECT_GT(runs[0].full_state.size(), 0);

  auto track = [&](const std::vector<RankRun>& more, const std::string& what) {
    for (size_t r = 0; r < more.size(); ++r)
      ASSERT_TRUE(more[r].result.ok()) << what << " rank " << r << ": " << more[r].result.status();
    EXPECT_EQ(more[0].start_step, 4) << what;
    ASSERT_EQ(more[0].result->losses.size(), 4u) << what;
    double w = 0;
    for (size_t s = 0; s < 4; ++s) {
      const double a = ref->losses[4 + s], b = more[0].result->losses[s];
      w = std::max(w, std::abs(a - b) / std::abs(a));
    }
    EXPECT_LT(w, 1e-4) << what;
    std::cout << what << ": largest relative loss difference vs one process, steps 5-8: " << w
              << "\n";
  };
  for (const char* target : {"to_one", "to_dp2", "to_tp2"})
    fs::copy(tp, root + "/" + target, fs::copy_options::recursive);
  track(RunRanks(1, GptConfig(root + "/to_one", 8, 1, constant)), "{2x2} -> one process");
  track(RunRanks(2, GptConfig(root + "/to_dp2", 8, 1, constant)), "{2x2} -> {data: 2}");
  track(RunRanks(2, GptConfig(root + "/to_tp2", 8, 2, constant)), "{2x2} -> {data: 1, model: 2}");

  const std::string dp = root + "/dp";
  std::vector<RankRun> dp_runs = RunRanks(2, GptConfig(dp, 4, 1, constant));
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(dp_runs[r].result.ok()) << dp_runs[r].result.status();
  track(RunRanks(4, GptConfig(dp, 8, 2, constant)), "{data: 2} -> {2x2}");
}

}  // namespace
}  // namespace kiln::train
