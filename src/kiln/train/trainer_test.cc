#include "kiln/train/trainer.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "gtest/gtest.h"
#include "kiln/base/fault_injection_env.h"
#include "kiln/base/mem_env.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/train/event_writer.h"
#include "tests/support/temp_dir.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;

// A run directory that does not exist yet, inside a temp folder removed when the test exits.
std::string TempDir(const std::string& name) {
  return kiln::test_support::MakeTempDir("kiln_trainer_test_" + name) + "/run";
}

constexpr char kCsv[] = KILN_SOURCE_DIR "/examples/data/digits.csv.gz";
constexpr char kPipeline[] = "digits:" KILN_SOURCE_DIR "/examples/data/digits.csv.gz";

TrainConfig SmallConfig(const std::string& out, const std::string& source = kCsv) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(
      "model: {kind: mlp, hidden: [16]}\n"
      "data: {source: SOURCE, batch_size: 32, seed: 3}\n"
      "optimizer: {kind: adamw, lr: 0.05, weight_decay: 0.01, clip_norm: 1.0}\n"
      "schedule: {kind: cosine, warmup_steps: 3, min_lr: 0.001}\n"
      "steps: 30\neval_every: 10\ncheckpoint_every: 5\nlog_every: 5\n",
      "test", {"output_dir=" + out, "data.source=" + source});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// A tiny GPT on the GPL-3 text (Debian base-files) with byte-level tokens; dropout on, so the
// resumed run must also restore the dropout RNG position.
constexpr char kText[] = "/usr/share/common-licenses/GPL-3";

TrainConfig GptConfig(const std::string& out) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(
      "model: {kind: gpt, n_layer: 1, n_head: 2, n_embd: 16, dropout: 0.1}\n"
      "data: {source: SOURCE, seq_len: 16, batch_size: 4, seed: 3, held_out_fraction: 0.05}\n"
      "optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01, clip_norm: 1.0}\n"
      "schedule: {kind: cosine, warmup_steps: 3, min_lr: 0.001}\n"
      "steps: 30\neval_every: 10\neval_batches: 2\ncheckpoint_every: 5\nlog_every: 5\n",
      "test", {"output_dir=" + out, std::string("data.source=text:") + kText});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(TrainerTest, TrainsWritesOutputsAndEvaluates) {
  std::string out = TempDir("basic");
  auto cpu = runtime::MakeCpuBackend();
  auto t = Trainer::Create(SmallConfig(out), {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = (*t)->Run();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->final_step, 30);
  EXPECT_FALSE(r->preempted);
  ASSERT_EQ(r->losses.size(), 30u);
  EXPECT_LT(r->losses.back(), r->losses.front());
  ASSERT_TRUE(r->final_eval.has_value());
  EXPECT_GT(r->final_eval->accuracy, 0.5);
  EXPECT_TRUE(fs::exists(out + "/config.yaml"));
  EXPECT_TRUE(fs::exists(out + "/run.json"));
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_30/manifest.json"));
  std::ifstream m(out + "/metrics.jsonl");
  std::string line;
  int lines = 0;
  bool saw_eval = false;
  while (std::getline(m, line)) {
    ++lines;
    auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("step"));
    if (j.contains("eval/accuracy")) saw_eval = true;
  }
  EXPECT_GE(lines, 6);
  EXPECT_TRUE(saw_eval);
  bool events = false;
  for (auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events = true;
  EXPECT_TRUE(events);
  fs::remove_all(out);
}

// N steps straight vs K steps, stop, resume (new Trainer from the checkpoint) to N: same loss at
// every step and bitwise-equal final parameters and optimizer state.
void CheckStopAndResumeIsBitIdentical(const std::function<TrainConfig(const std::string&)>& make) {
  auto cpu = runtime::MakeCpuBackend();
  std::string a = TempDir("straight"), b = TempDir("resumed");
  auto t1 = Trainer::Create(make(a), {.backend = cpu.get()});
  ASSERT_TRUE(t1.ok()) << t1.status();
  auto straight = (*t1)->Run();
  ASSERT_TRUE(straight.ok()) << straight.status();

  // Stop after 12 steps (not a checkpoint_every multiple: the stop writes its own checkpoint).
  auto t2 = Trainer::Create(make(b), {.backend = cpu.get(), .stop_after_steps = 12});
  ASSERT_TRUE(t2.ok()) << t2.status();
  auto first = (*t2)->Run();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->preempted);
  EXPECT_EQ(first->final_step, 12);
  EXPECT_TRUE(fs::exists(b + "/checkpoints/step_12/manifest.json"));
  t2->reset();

  auto t3 = Trainer::Create(make(b), {.backend = cpu.get()});
  ASSERT_TRUE(t3.ok()) << t3.status();
  EXPECT_EQ((*t3)->start_step(), 12);
  auto second = (*t3)->Run();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->final_step, 30);

  std::vector<float> resumed = first->losses;
  resumed.insert(resumed.end(), second->losses.begin(), second->losses.end());
  ASSERT_EQ(resumed.size(), straight->losses.size());
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(std::memcmp(&resumed[i], &straight->losses[i], sizeof(float)), 0)
        << "step " << i + 1 << ": " << resumed[i] << " vs " << straight->losses[i];
  }
  const nn::ParamStore& p1 = (*t1)->train_step().params();
  const nn::ParamStore& p3 = (*t3)->train_step().params();
  ASSERT_EQ(p1.size(), p3.size());
  for (int i = 0; i < p1.size(); ++i) {
    EXPECT_TRUE(p1.value(i).BitwiseEquals(p3.value(i))) << p1.names()[i];
  }
  const nn::ParamStore& s1 = (*t1)->train_step().optimizer_state();
  const nn::ParamStore& s3 = (*t3)->train_step().optimizer_state();
  for (int i = 0; i < s1.size(); ++i) {
    EXPECT_TRUE(s1.value(i).BitwiseEquals(s3.value(i))) << s1.names()[i];
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(TrainerTest, StopAndResumeIsBitIdentical) {
  CheckStopAndResumeIsBitIdentical([](const std::string& out) { return SmallConfig(out); });
}

// The same through data/pipeline.h (prefetch thread on; its state string is checkpointed).
TEST(TrainerTest, StopAndResumeIsBitIdenticalWithInputPipeline) {
  CheckStopAndResumeIsBitIdentical(
      [](const std::string& out) { return SmallConfig(out, kPipeline); });
}

// A GPT on a text: source (token windows, dropout RNG, AdamW state) resumes bit for bit.
TEST(TrainerTest, GptStopAndResumeIsBitIdentical) {
  if (!fs::exists(kText)) GTEST_SKIP() << "no " << kText;
  CheckStopAndResumeIsBitIdentical(GptConfig);
}

TEST(TrainerTest, GptTrainsOnTextAndReportsPerplexity) {
  if (!fs::exists(kText)) GTEST_SKIP() << "no " << kText;
  std::string out = TempDir("gpt");
  auto cpu = runtime::MakeCpuBackend();
  TrainConfig c = GptConfig(out);
  c.model.dropout = 0;
  auto t = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = (*t)->Run();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->losses.size(), 30u);
  // Byte-level: uniform over 256 tokens is ln 256 = 5.55 at the start.
  EXPECT_NEAR(r->losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(r->losses.back(), r->losses.front() - 1.0);
  ASSERT_TRUE(r->final_eval.has_value());
  EXPECT_EQ(r->final_eval->examples, 8);  // eval_batches 2 of 4 sequences
  EXPECT_NEAR(r->final_eval->perplexity, std::exp(r->final_eval->loss), 1e-9);
  EXPECT_GT(r->final_eval->accuracy, 0.05);  // next-token accuracy over all positions
  EXPECT_GT(r->tokens_per_second, 0);
  EXPECT_NEAR(r->tokens_per_second, 16 * r->examples_per_second, 1e-6 * r->tokens_per_second);
  std::ifstream m(out + "/metrics.jsonl");
  std::string line;
  bool saw_ppl = false, saw_tok = false;
  while (std::getline(m, line)) {
    auto j = nlohmann::json::parse(line);
    saw_ppl |= j.contains("eval/perplexity");
    saw_tok |= j.contains("tokens_per_second");
  }
  EXPECT_TRUE(saw_ppl);
  EXPECT_TRUE(saw_tok);
  // The checkpoint holds Hugging Face GPT-2 names.
  bool wte = false;
  for (const std::string& n : (*t)->train_step().params().names())
    wte |= n == "transformer.wte.weight";
  EXPECT_TRUE(wte);
  fs::remove_all(out);
}

TEST(TrainerTest, PipelineSourceTrainsAndEvaluates) {
  std::string out = TempDir("pipeline");
  auto cpu = runtime::MakeCpuBackend();
  auto t = Trainer::Create(SmallConfig(out, kPipeline), {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = (*t)->Run();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->final_eval.has_value());
  EXPECT_GT(r->final_eval->accuracy, 0.5);
  EXPECT_GT(r->final_eval->examples, 200);
  fs::remove_all(out);
}

TEST(TrainerTest, RemainderModesMatchTheSource) {
  auto cpu = runtime::MakeCpuBackend();
  TrainConfig c = SmallConfig(TempDir("modes"));
  c.data.remainder = "pad";
  auto t = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("data.remainder"), std::string::npos);
  c.data.source = kPipeline;
  c.data.remainder = "wrap";
  t = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("data.remainder"), std::string::npos);
}

TEST(TrainerTest, FallsBackPastCorruptCheckpoint) {
  auto cpu = runtime::MakeCpuBackend();
  std::string out = TempDir("corrupt");
  TrainConfig c = SmallConfig(out);
  c.steps = 10;
  c.eval_every = 0;
  auto t = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Run().ok());
  t->reset();
  // Damage the newest checkpoint's first shard.
  for (auto& e : fs::directory_iterator(out + "/checkpoints/step_10")) {
    if (e.path().extension() == ".safetensors") {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-4, std::ios::end);
      f.write("XXXX", 4);
    }
  }
  c.steps = 12;
  auto t2 = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ((*t2)->start_step(), 5);
  fs::remove_all(out);
}

// docs/formats.md: after a resume from step S the event file starts with session_log START at S,
// so TensorBoard drops what the killed run logged past S.
TEST(TrainerTest, AResumeWritesSessionStartToTheNewEventFile) {
  auto cpu = runtime::MakeCpuBackend();
  std::string out = TempDir("session");
  TrainConfig c = SmallConfig(out);
  c.eval_every = 0;
  auto t = Trainer::Create(c, {.backend = cpu.get(), .stop_after_steps = 7});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Run().ok());
  t->reset();
  auto t2 = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_TRUE(t2.ok()) << t2.status();
  ASSERT_TRUE((*t2)->Run().ok());
  t2->reset();
  int starts = 0;
  for (auto& e : fs::directory_iterator(out)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) != 0) continue;
    auto events = ReadEventFile(e.path().string());
    ASSERT_TRUE(events.ok()) << events.status();
    for (const Event& ev : *events) {
      if (ev.has_session_log) {
        EXPECT_EQ(ev.session_status, SessionStatus::kStart);
        EXPECT_EQ(ev.step, 7);
        ++starts;
      }
    }
  }
  EXPECT_EQ(starts, 1);  // only the resumed process's file
  fs::remove_all(out);
}

// Issue 13 case 4: divergence stops the run with an error and never commits non-finite numbers.
TEST(TrainerTest, DivergenceStopsAndNeverCommitsANonFiniteCheckpoint) {
  auto cpu = runtime::MakeCpuBackend();
  std::string out = TempDir("diverge");
  TrainConfig c = SmallConfig(out);
  c.optimizer.lr = 1e30;
  c.optimizer.clip_norm = 0;
  c.schedule.kind = "constant";
  c.checkpoint_every = 1;
  auto t = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = (*t)->Run();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(std::string(r.status().message()).find("training diverged at step"), std::string::npos)
      << r.status();
  EXPECT_NE(std::string(r.status().message()).find("try a smaller optimizer.lr (now 1e+30"),
            std::string::npos);
  t->reset();
  auto mgr = CheckpointManager::Open(out + "/checkpoints");
  ASSERT_TRUE(mgr.ok());
  absl::StatusOr<std::vector<int64_t>> steps = (*mgr)->Steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_FALSE(steps->empty());  // step 1 (finite) is committed before the NaNs start
  for (int64_t step : *steps) {
    auto ck = (*mgr)->Restore(step);
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    for (const auto& [name, tensor] : ck->tensors) {
      if (tensor.dtype() != DType::kF32) continue;
      for (int64_t i = 0; i < tensor.num_elements(); ++i) {
        ASSERT_TRUE(std::isfinite(tensor.data<float>()[i])) << "step " << step << " " << name;
      }
    }
  }
  fs::remove_all(out);
}

TEST(TrainerTest, AFreshStartOnAnEarlierRunIsRefusedUnlessReplacing) {
  auto cpu = runtime::MakeCpuBackend();
  std::string out = TempDir("fresh");
  TrainConfig c = SmallConfig(out);
  c.steps = 5;
  c.eval_every = 0;
  {
    auto t = Trainer::Create(c, {.backend = cpu.get()});
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE((*t)->Run().ok());
  }
  auto refused = Trainer::Create(c, {.backend = cpu.get(), .resume = false});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  auto replaced = Trainer::Create(c, {.backend = cpu.get(), .resume = false, .replace = true});
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ((*replaced)->start_step(), 0);
  EXPECT_EQ((*replaced)->run_id().size(), 16u);
  // While it lives, it holds the folder.
  auto second = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(std::string(second.status().message()).find("in use by another kiln train"),
            std::string::npos);
  fs::remove_all(out);
}

// Issue 9: the run directory goes through Env, so a trainer can die (every write failing from
// then on, as a killed process) at each write in turn: config.yaml, run.json, every file,
// rename and sync of a checkpoint commit, the metrics. After the power loss that follows, a
// resume on the same folder trains to the end with the same losses as an uninterrupted run.
TEST(TrainerTest, DiesAtEveryWriteOfACommitOrRunJsonAndResumesToTheSameLosses) {
  auto cpu = runtime::MakeCpuBackend();
  TrainConfig c = SmallConfig("/run");
  c.steps = 4;
  c.checkpoint_every = 2;
  c.eval_every = 0;
  c.eval_batches = 1;
  c.log_every = 4;
  int64_t writes = 0;
  std::vector<float> want;
  {
    std::unique_ptr<MemEnv> mem = NewMemEnv();
    FaultInjectionEnv env(mem.get());
    auto t = Trainer::Create(c, {.backend = cpu.get(), .env = &env});
    ASSERT_TRUE(t.ok()) << t.status();
    auto r = (*t)->Run();
    ASSERT_TRUE(r.ok()) << r.status();
    want = r->losses;
    t->reset();
    writes = env.mutation_count();
    EXPECT_TRUE(env.FileExists("/run/run.json"));
    EXPECT_TRUE(env.FileExists("/run/checkpoints/step_4/manifest.json"));
  }
  ASSERT_EQ(want.size(), 4u);
  ASSERT_GT(writes, 20);
  int failed_runs = 0;
  for (int64_t n = 0; n < writes; ++n) {
    SCOPED_TRACE("dies at write " + std::to_string(n) + " of " + std::to_string(writes));
    std::unique_ptr<MemEnv> mem = NewMemEnv();
    FaultInjectionEnv env(mem.get());
    env.FailAfter(n);
    {
      auto t = Trainer::Create(c, {.backend = cpu.get(), .env = &env});
      if (t.ok()) {
        absl::StatusOr<TrainResult> r = (*t)->Run();
        if (!r.ok()) ++failed_runs;
      } else {
        ++failed_runs;
      }
    }
    ASSERT_TRUE(env.SimulateCrash().ok());
    auto t = Trainer::Create(c, {.backend = cpu.get(), .env = &env});
    ASSERT_TRUE(t.ok()) << t.status();
    const int64_t start = (*t)->start_step();
    auto r = (*t)->Run();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->final_step, 4);
    ASSERT_EQ(start + static_cast<int64_t>(r->losses.size()), 4);
    for (size_t i = 0; i < r->losses.size(); ++i) {
      EXPECT_EQ(std::memcmp(&r->losses[i], &want[start + i], sizeof(float)), 0)
          << "step " << start + i + 1 << ": " << r->losses[i] << " vs " << want[start + i];
    }
  }
  EXPECT_GT(failed_runs, writes / 2);  // the injected deaths were seen as errors
}

TEST(TrainerTest, CountsMatmulFlops) {
  auto cpu = runtime::MakeCpuBackend();
  std::string out = TempDir("flops");
  TrainConfig c = SmallConfig(out);
  auto t = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_TRUE(t.ok());
  // MLP 64-16-10, batch 32: forward 2*32*(64*16+16*10), backward twice that (dW and dX, minus the
  // first layer's dX, which autodiff may or may not prune): 3x forward at most.
  double fwd = 2.0 * 32 * (64 * 16 + 16 * 10);
  double flops = CountMatmulFlops((*t)->train_step().train_step_graph());
  EXPECT_GE(flops, 2 * fwd);
  EXPECT_LE(flops, 3 * fwd);
  fs::remove_all(out);
}

// Attention counts both of its products: QK^T (2·B·H·Sq·Sk·D) and PV (2·B·H·Sq·Sk·Dv).
TEST(TrainerTest, CountsAttentionFlops) {
  ir::Builder b("attn");
  ir::Value q = b.Parameter("q", DType::kF32, {2, 3, 5, 8});
  ir::Value k = b.Parameter("k", DType::kF32, {2, 3, 7, 8});
  ir::Value v = b.Parameter("v", DType::kF32, {2, 3, 7, 4});
  b.Output("o", ir::Attention(q, k, v, /*causal=*/true));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_DOUBLE_EQ(CountMatmulFlops(*g), 2.0 * 6 * 5 * 7 * 8 + 2.0 * 6 * 5 * 7 * 4);
}

// --profile-steps: the summary names a verdict, the largest kernels with their shapes, and the
// memory breakdown; trace.json carries the breakdown in its otherData.
TEST(TrainerTest, ProfileSummaryHasVerdictKernelsAndMemoryBreakdown) {
  auto cpu = runtime::MakeCpuBackend();
  std::string out = TempDir("profile");
  TrainConfig c = SmallConfig(out);
  c.steps = 6;
  c.eval_every = 0;
  std::ostringstream log;
  TrainerOptions opts{.backend = cpu.get(), .log = &log};
  opts.profile_steps = std::make_pair(int64_t{3}, int64_t{5});
  auto t = Trainer::Create(c, opts);
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = (*t)->Run();
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string text = log.str();
  EXPECT_NE(text.find("profile of 2 steps"), std::string::npos) << text;
  EXPECT_NE(text.find("\nverdict: "), std::string::npos) << text;
  EXPECT_NE(text.find("shares of the step: matmul/conv "), std::string::npos) << text;
  EXPECT_NE(text.find("largest matmul/conv kernels (per step):"), std::string::npos) << text;
  EXPECT_NE(text.find("f32[32,64] x f32[64,16] -> f32[32,16]"), std::string::npos) << text;
  // MLP 64-16-10: 1210 f32 parameters, one resident set; adamw keeps two moments per parameter.
  EXPECT_NE(text.find("memory (MiB): parameters 0.0, gradients 0.0 (inside the arena), "
                      "optimizer state 0.0, arena "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(", evaluation "), std::string::npos) << text;
  EXPECT_NE(text.find(", checkpoint staging 0.0, other "), std::string::npos)
      << text;  // none ahead
  EXPECT_NE(text.find("; peak RSS "), std::string::npos) << text;
  std::ifstream f(out + "/trace.json");
  std::stringstream trace;
  trace << f.rdbuf();
  for (const char* key :
       {"\"memory_mib/parameters\":", "\"memory_mib/gradients\":",
        "\"memory_mib/optimizer_state\":", "\"memory_mib/arena\":", "\"memory_mib/constants\":",
        "\"memory_mib/evaluation\":", "\"memory_mib/checkpoint_staging\":", "\"memory_mib/other\":",
        "\"memory_mib/peak_rss\":", "\"verdict\":"}) {
    EXPECT_NE(trace.str().find(key), std::string::npos) << key;
  }
  fs::remove_all(out);
}

// The evaluator holds no weights: it reads the TrainStep's parameter tensors themselves, and its
// one graph returns only the loss and the predictions (the logits stay in its arena).
TEST(TrainerTest, EvaluationReadsTheTrainStepsParametersInPlace) {
  auto cpu = runtime::MakeCpuBackend();
  TrainConfig c = GptConfig(TempDir("eval_in_place"));
  c.steps = 5;
  auto t = Trainer::Create(c, {.backend = cpu.get()});
  ASSERT_TRUE(t.ok()) << t.status();
  const Evaluator& e = (*t)->evaluator();
  const ir::Graph& g = e.executable().graph();
  ASSERT_EQ(g.outputs().size(), 2u);
  EXPECT_EQ(g.outputs()[0].name, "loss");
  EXPECT_EQ(g.outputs()[1].name, "prediction");
  EXPECT_TRUE(e.last_parameter_data().empty());
  auto before = (*t)->Evaluate(1);
  ASSERT_TRUE(before.ok()) << before.status();
  const nn::ParamStore& p = (*t)->train_step().params();
  const std::vector<nn::ParamSpec> specs = (*t)->model().Params();
  ASSERT_EQ(e.last_parameter_data().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor* live = p.Find(specs[i].name);
    ASSERT_NE(live, nullptr) << specs[i].name;
    EXPECT_EQ(e.last_parameter_data()[i], live->raw_data()) << specs[i].name;
  }
  // Besides its arena it keeps only the batch and the outputs.
  EXPECT_EQ(e.resident_bytes() - e.executable().plan().arena_bytes - HoistedBytes(e.executable()),
            2 * 4 * 16 * 4 + 4 + 4 * 16 * 4);  // tokens, targets, loss, predictions
  auto r = (*t)->Run();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->final_eval.has_value());
  EXPECT_NE(r->final_eval->loss, before->loss);  // the trained weights, read where they live
}

// The evaluation graph computes what the model's loss and predict graphs compute.
TEST(TrainerTest, EvalGraphMatchesTheLossAndPredictGraphs) {
  auto cpu = runtime::MakeCpuBackend();
  for (bool lm : {false, true}) {
    SCOPED_TRACE(lm ? "gpt" : "mlp");
    TrainConfig c = lm ? GptConfig("unused") : SmallConfig("unused");
    const int64_t features = lm ? c.data.seq_len : 64, classes = lm ? c.model.vocab_size : 10;
    auto model = BuildModel(c.model, features, classes);
    ASSERT_TRUE(model.ok()) << model.status();
    auto params = nn::InitParams((*model)->Params(), 5);
    ASSERT_TRUE(params.ok()) << params.status();
    const int64_t batch = 3;
    auto eval = BuildEvalGraph(**model, batch, lm);
    auto loss = (*model)->LossGraph(batch);
    auto predict = (*model)->PredictGraph(batch);
    ASSERT_TRUE(eval.ok() && loss.ok() && predict.ok()) << eval.status();
    std::map<std::string, Tensor> in;
    for (int i = 0; i < params->size(); ++i) in[params->names()[i]] = params->value(i);
    std::vector<int32_t> labels(static_cast<size_t>(lm ? batch * features : batch));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>((i * 7) % classes);
    const Shape label_shape = lm ? Shape{batch, features} : Shape{batch};
    if (lm) {
      in["tokens"] = Tensor::FromVector<int32_t>(label_shape, labels);
    } else {
      std::vector<float> x(static_cast<size_t>(batch * features));
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i % 13) * 0.1);
      in["x"] = Tensor::FromVector<float>(Shape{batch, features}, x);
    }
    auto pe = cpu->Compile(*predict);
    ASSERT_TRUE(pe.ok()) << pe.status();
    auto pr = (*pe)->RunNamed(in);
    ASSERT_TRUE(pr.ok()) << pr.status();
    in[lm ? "targets" : "labels"] = Tensor::FromVector<int32_t>(label_shape, labels);
    auto le = cpu->Compile(*loss);
    auto ee = cpu->Compile(*eval);
    ASSERT_TRUE(le.ok() && ee.ok());
    auto lr = (*le)->RunNamed(in);
    auto er = (*ee)->RunNamed(in);
    ASSERT_TRUE(lr.ok() && er.ok()) << er.status();
    EXPECT_EQ(er->count("logits"), 0u);
    EXPECT_NEAR(er->at("loss").GetDouble(0), lr->at("loss").GetDouble(0), 1e-5);
    EXPECT_EQ(er->at("prediction").ToDoubles(), pr->at("prediction").ToDoubles());
  }
}

// The asynchronous save's host copy is reserved only when the run will save asynchronously.
TEST(TrainerTest, CheckpointStagingOnlyWhenAnAsyncSaveIsAhead) {
  auto cpu = runtime::MakeCpuBackend();
  struct Case {
    int64_t steps, every;
    bool staged;
  };
  for (const Case& k : {Case{30, 5, true}, Case{5, 5, false}, Case{5, 100, false}, Case{6, 5, true},
                        Case{30, 0, false}}) {
    SCOPED_TRACE(::testing::Message() << "steps " << k.steps << " every " << k.every);
    TrainConfig c = SmallConfig(TempDir("staging"));
    c.steps = k.steps;
    c.checkpoint_every = k.every;
    auto t = Trainer::Create(c, {.backend = cpu.get()});
    ASSERT_TRUE(t.ok()) << t.status();
    int64_t bytes = 0;
    const nn::TrainStep& s = (*t)->train_step();
    for (int i = 0; i < s.params().size(); ++i) bytes += s.params().value(i).byte_size();
    for (int i = 0; i < s.optimizer_state().size(); ++i)
      bytes += s.optimizer_state().value(i).byte_size();
    EXPECT_EQ((*t)->checkpoint_staging_bytes(), k.staged ? bytes : 0);
  }
}

}  // namespace
}  // namespace kiln::train
