#include "kiln/train/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/status.h"
#include "kiln/data/digits.h"
#include "kiln/data/pipeline.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/opcode.h"
#include "kiln/nn/gpt.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/optim.h"
#include "kiln/nn/params.h"
#include "kiln/nn/vision.h"
#include "kiln/train/divergence.h"

namespace kiln::train {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

volatile sig_atomic_t g_stop_signal = 0;

// The eval metrics written to metrics.jsonl / TensorBoard (perplexity for language models).
std::map<std::string, double> EvalScalars(const EvalResult& e) {
  std::map<std::string, double> m = {{"eval/loss", e.loss}, {"eval/accuracy", e.accuracy}};
  if (e.perplexity > 0) m["eval/perplexity"] = e.perplexity;
  return m;
}
std::string PerplexityText(const EvalResult& e) {
  return e.perplexity > 0 ? absl::StrFormat(" perplexity %.2f", e.perplexity) : std::string();
}

void OnStopSignal(int sig) {
  if (g_stop_signal) {
    // Second signal: fall back to the default action (terminate now).
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_stop_signal = sig;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Writes `text` to `path` via a temp file and rename.
absl::Status WriteFileAtomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
    f << text;
    if (!f.flush()) return absl::DataLossError(absl::StrCat("short write to ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, ": ", ec.message()));
  return absl::OkStatus();
}

std::string GitCommit() {
  FILE* p = popen("git rev-parse HEAD 2>/dev/null", "r");
  if (p == nullptr) return "";
  char buf[128] = {0};
  std::string out;
  if (fgets(buf, sizeof(buf), p) != nullptr) out = buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.size() == 40 ? out : "";
}

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return absl::StrFormat("%.0fs", s);
  if (s < 3600)
    return absl::StrFormat("%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  return absl::StrFormat("%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
}

}  // namespace

void InstallPreemptionHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}
bool PreemptionRequested() { return g_stop_signal != 0; }
void ClearPreemptionRequest() { g_stop_signal = 0; }

// Where training batches come from; its State() goes into every checkpoint.
class Trainer::Batcher {
 public:
  virtual ~Batcher() = default;
  virtual absl::Status Next(Tensor& x, Tensor& y) = 0;
  virtual nlohmann::json State() const = 0;
  virtual absl::Status Restore(const nlohmann::json& state) = 0;
  virtual int64_t epoch() const = 0;
};

// The held-out batches of one evaluation, in a fixed order.
class Trainer::EvalData {
 public:
  virtual ~EvalData() = default;
  virtual absl::Status Reset() = 0;
  virtual int64_t batches() const = 0;
  virtual absl::Status Next(Tensor& x, Tensor& y) = 0;
};

namespace {

// Fixed-shape batches over an in-memory dataset. The order of epoch e is a pure function of
// (seed, e): a Fisher-Yates permutation from mt19937_64(SplitMix64(seed ^ SplitMix64(e))), or
// source order when shuffle is off. State = (epoch, position in that order).
class CsvBatcher final : public Trainer::Batcher {
 public:
  CsvBatcher(const data::Dataset& ds, int64_t batch, bool shuffle, uint64_t seed, bool wrap)
      : ds_(ds), batch_(batch), shuffle_(shuffle), seed_(seed), wrap_(wrap) {
    Reorder();
  }

  absl::Status Next(Tensor& x, Tensor& y) override {
    const int64_t n = ds_.size(), f = ds_.num_features();
    if (!wrap_ && position_ + batch_ > n) Advance();
    const float* src = ds_.features.data<float>();
    const int32_t* lab = ds_.labels.data<int32_t>();
    float* dx = x.data<float>();
    int32_t* dy = y.data<int32_t>();
    for (int64_t i = 0; i < batch_; ++i) {
      if (position_ >= n) Advance();
      int64_t r = order_[position_++];
      std::copy(src + r * f, src + (r + 1) * f, dx + i * f);
      dy[i] = lab[r];
    }
    return absl::OkStatus();
  }

  nlohmann::json State() const override { return {{"epoch", epoch_}, {"position", position_}}; }
  absl::Status Restore(const nlohmann::json& j) override {
    try {
      epoch_ = j.at("epoch").get<int64_t>();
      position_ = j.at("position").get<int64_t>();
    } catch (const std::exception& e) {
      return absl::DataLossError(absl::StrCat("bad data iterator state in checkpoint: ", e.what()));
    }
    if (epoch_ < 0 || position_ < 0 || position_ > ds_.size()) {
      return absl::DataLossError("data iterator state out of range in checkpoint");
    }
    Reorder();
    return absl::OkStatus();
  }
  int64_t epoch() const override { return epoch_; }

 private:
  void Advance() {
    ++epoch_;
    position_ = 0;
    Reorder();
  }
  void Reorder() {
    const int64_t n = ds_.size();
    if (shuffle_) {
      std::mt19937_64 rng(SplitMix64(seed_ ^ SplitMix64(static_cast<uint64_t>(epoch_))));
      order_ = data::Permutation(n, rng);
    } else {
      order_.resize(n);
      for (int64_t i = 0; i < n; ++i) order_[i] = i;
    }
  }

  const data::Dataset& ds_;
  int64_t batch_;
  bool shuffle_;
  uint64_t seed_;
  bool wrap_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0, position_ = 0;
};

class CsvEvalData final : public Trainer::EvalData {
 public:
  CsvEvalData(const data::Dataset& ds, int64_t batch) : ds_(ds), batch_(batch) {}
  absl::Status Reset() override {
    next_ = 0;
    return absl::OkStatus();
  }
  int64_t batches() const override { return ds_.size() / batch_; }
  absl::Status Next(Tensor& x, Tensor& y) override {
    const int64_t f = ds_.num_features(), b = next_++;
    std::copy(ds_.features.data<float>() + b * batch_ * f,
              ds_.features.data<float>() + (b + 1) * batch_ * f, x.data<float>());
    std::copy(ds_.labels.data<int32_t>() + b * batch_,
              ds_.labels.data<int32_t>() + (b + 1) * batch_, y.data<int32_t>());
    return absl::OkStatus();
  }

 private:
  const data::Dataset& ds_;
  int64_t batch_;
  int64_t next_ = 0;
};

// data/pipeline.h behind the same interfaces: its SaveState() string is the checkpointed state.
class PipelineBatcher final : public Trainer::Batcher {
 public:
  explicit PipelineBatcher(std::unique_ptr<data::InputPipeline> p) : p_(std::move(p)) {}
  absl::Status Next(Tensor& x, Tensor& y) override { return p_->Next(x, y); }
  nlohmann::json State() const override { return {{"pipeline", p_->SaveState()}}; }
  absl::Status Restore(const nlohmann::json& j) override {
    if (!j.is_object() || !j.contains("pipeline") || !j["pipeline"].is_string()) {
      return absl::DataLossError(
          "checkpoint has no input-pipeline state (was it written with a CSV data.source?)");
    }
    return p_->RestoreState(j["pipeline"].get<std::string>());
  }
  int64_t epoch() const override { return p_->epoch(); }

 private:
  std::unique_ptr<data::InputPipeline> p_;
};

class PipelineEvalData final : public Trainer::EvalData {
 public:
  explicit PipelineEvalData(std::unique_ptr<data::InputPipeline> p)
      : p_(std::move(p)), start_(p_->SaveState()) {}
  absl::Status Reset() override { return p_->RestoreState(start_); }
  int64_t batches() const override { return p_->batches_per_epoch(); }
  absl::Status Next(Tensor& x, Tensor& y) override { return p_->Next(x, y); }

 private:
  std::unique_ptr<data::InputPipeline> p_;
  std::string start_;
};

bool IsPipelineSource(const std::string& s) {
  return s.rfind("digits:", 0) == 0 || s.rfind("records:", 0) == 0 ||
         s.rfind("safetensors:", 0) == 0 || s.rfind("text:", 0) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<nn::Model>> BuildModel(const ModelConfig& m, int64_t features,
                                                      int64_t classes) {
  std::unique_ptr<nn::Model> model;
  if (m.kind == "mlp") {
    model = std::make_unique<nn::MlpClassifier>(
        nn::MlpOptions{.in_features = features, .hidden = m.hidden, .num_classes = classes});
  } else if (m.kind == "cnn" || m.kind == "vit") {
    if (m.channels * m.height * m.width != features) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.channels * model.height * model.width = ", m.channels * m.height * m.width,
          " but the data has ", features, " features per example"));
    }
    if (m.kind == "cnn") {
      model = std::make_unique<nn::ResNetCnn>(
          nn::ResNetOptions{.in_channels = m.channels,
                            .height = m.height,
                            .width = m.width,
                            .num_classes = classes,
                            .widths = m.widths,
                            .blocks_per_stage = m.blocks_per_stage});
    } else {
      model = std::make_unique<nn::VisionTransformer>(nn::VitOptions{.in_channels = m.channels,
                                                                     .height = m.height,
                                                                     .width = m.width,
                                                                     .patch = m.patch,
                                                                     .dim = m.dim,
                                                                     .depth = m.depth,
                                                                     .heads = m.heads,
                                                                     .mlp_ratio = m.mlp_ratio,
                                                                     .num_classes = classes,
                                                                     .dropout = m.dropout});
    }
  } else if (m.kind == "gpt") {
    // features = the sequence length, classes = the vocabulary.
    model = std::make_unique<nn::Gpt>(nn::GptConfig{.vocab_size = classes,
                                                    .context = m.n_ctx > 0 ? m.n_ctx : features,
                                                    .dim = m.n_embd,
                                                    .layers = m.n_layer,
                                                    .heads = m.n_head,
                                                    .seq_len = features,
                                                    .dropout = m.dropout});
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.kind: '", m.kind, "' is not trainable here; allowed: mlp, cnn, vit, gpt"));
  }
  absl::Status s = model->Validate();
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("model: ", s.message()));
  return model;
}

nn::OptimizerConfig BuildOptimizerConfig(const TrainConfig& c) {
  nn::OptimizerConfig o;
  if (c.optimizer.kind == "adamw") {
    o.kind = nn::OptimizerKind::kAdamW;
    o.adamw.beta1 = c.optimizer.betas[0];
    o.adamw.beta2 = c.optimizer.betas[1];
    o.adamw.eps = c.optimizer.eps;
    o.adamw.weight_decay = c.optimizer.weight_decay;
  } else {
    o.kind = nn::OptimizerKind::kSgd;
    o.sgd.momentum = c.optimizer.momentum;
    o.sgd.weight_decay = c.optimizer.weight_decay;
  }
  o.clip_norm = c.optimizer.clip_norm;
  o.schedule.lr = c.optimizer.lr;
  o.schedule.warmup_steps = c.schedule.warmup_steps;
  o.schedule.total_steps = c.steps;
  o.schedule.min_lr = c.schedule.min_lr;
  o.schedule.kind = c.schedule.kind == "cosine"          ? nn::ScheduleKind::kCosine
                    : c.schedule.kind == "linear_warmup" ? nn::ScheduleKind::kLinear
                                                         : nn::ScheduleKind::kConstant;
  return o;
}

Trainer::~Trainer() {
  if (ckpt_ != nullptr) ckpt_->Wait().IgnoreError();
  if (metrics_ != nullptr) metrics_->Close().IgnoreError();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                         TrainerOptions options) {
  KILN_RETURN_IF_ERROR(ValidateTrainConfig(config));
  if (options.backend == nullptr)
    return absl::InvalidArgumentError("TrainerOptions.backend is null");
  std::unique_ptr<Trainer> t(new Trainer());
  t->config_ = config;
  t->options_ = std::move(options);
  t->hash_ = ConfigHash(config);
  const TrainConfig& c = t->config_;
  const bool ro = t->options_.read_only;

  // ---- The run directory: one trainer, one run (run_dir.h) ----
  bool move_aside = false;
  if (!ro) {
    KILN_ASSIGN_OR_RETURN(t->lock_, RunDirLock::Acquire(c.output_dir));
    KILN_ASSIGN_OR_RETURN(PreviousRun prev, InspectRunDir(c.output_dir));
    if (!t->options_.resume && prev.exists) {
      if (!t->options_.replace) return FreshStartRefusal(c.output_dir, prev);
      move_aside = true;
    }
    t->run_id_ = t->options_.resume && !prev.run_id.empty() ? prev.run_id : NewRunId();
  } else if (t->options_.restore_path.empty()) {
    t->run_id_ = ReadRunJsonId(c.output_dir);  // "": a run from before run ids; no filtering
  }

  // ---- Data ----
  int64_t features = 0, num_classes = c.data.num_classes;
  std::vector<int64_t> x_dims;
  const bool lm = c.model.kind == "gpt";  // a language model: tokens -> next tokens
  if (IsPipelineSource(c.data.source)) {
    if (c.data.remainder == "wrap") {
      return absl::InvalidArgumentError(
          "data.remainder: 'wrap' needs a CSV data.source; the input pipeline allows drop, pad");
    }
    data::PipelineConfig pc;
    pc.source = c.data.source;
    pc.seq_len = c.data.seq_len;
    pc.batch_size = c.data.batch_size;
    pc.shuffle = c.data.shuffle;
    pc.seed = c.data.seed;
    pc.shuffle_buffer = c.data.shuffle_buffer;
    pc.remainder = c.data.remainder;
    pc.prefetch = c.data.prefetch;
    pc.held_out_fraction = c.data.held_out_fraction;
    pc.split = "train";
    pc.split_seed = c.data.seed;
    absl::StatusOr<std::unique_ptr<data::InputPipeline>> train = data::InputPipeline::Create(pc);
    if (!train.ok()) return Annotate(train.status(), "data.source");
    const data::TensorSpec& ft = (*train)->feature_type();
    const data::TensorSpec& lt = (*train)->label_type();
    if (lm) {
      if (ft.dtype != DType::kS32 || lt.dtype != DType::kS32 || ft.shape.rank() != 2 ||
          !(ft == lt)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.source: model.kind gpt needs s32 [batch, seq] tokens and next-token targets; "
            "the source gives x ",
            ft.ToString(), " and y ", lt.ToString()));
      }
    } else if (ft.dtype != DType::kF32 || lt.dtype != DType::kS32 || lt.shape.rank() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.source: classifier models need f32 features and s32 [batch] labels; the source "
          "gives x ",
          ft.ToString(), " and y ", lt.ToString()));
    }
    x_dims = ft.shape.dims();
    features = ft.shape.num_elements() / c.data.batch_size;
    pc.split = "held_out";
    pc.shuffle = false;
    pc.prefetch = 0;
    pc.remainder = "drop";
    absl::StatusOr<std::unique_ptr<data::InputPipeline>> held = data::InputPipeline::Create(pc);
    if (held.ok() && (*held)->examples_per_epoch() < c.data.batch_size &&
        (*held)->examples_per_epoch() > 0) {
      pc.batch_size = (*held)->examples_per_epoch();
      held = data::InputPipeline::Create(pc);
    }
    if (!held.ok()) return Annotate(held.status(), "data.source (held-out split)");
    t->eval_batch_ = pc.batch_size;
    t->batcher_ = std::make_unique<PipelineBatcher>(*std::move(train));
    t->eval_data_ = std::make_unique<PipelineEvalData>(*std::move(held));
    if (lm) {
      num_classes = c.model.vocab_size;
    } else if (num_classes == 0) {
      if (c.data.source.rfind("digits:", 0) != 0) {
        return absl::InvalidArgumentError(
            "data.num_classes: required for records:/safetensors: sources (0 means infer, which "
            "only the digits layout can)");
      }
      num_classes = 10;
    }
  } else {
    if (c.data.remainder == "pad") {
      return absl::InvalidArgumentError(
          "data.remainder: 'pad' needs an input-pipeline source (digits:, records:, "
          "safetensors:); a plain CSV path allows drop, wrap");
    }
    absl::StatusOr<data::Dataset> loaded = data::LoadDigitsCsv(c.data.source);
    if (!loaded.ok()) return Annotate(loaded.status(), "data.source");
    KILN_ASSIGN_OR_RETURN(t->split_,
                          data::SplitDataset(*loaded, c.data.held_out_fraction, c.data.seed));
    if (c.data.batch_size > t->split_.train.size()) {
      return absl::InvalidArgumentError(absl::StrCat("data.batch_size: ", c.data.batch_size,
                                                     " is larger than the training split (",
                                                     t->split_.train.size(), " examples)"));
    }
    features = loaded->num_features();
    if (num_classes == 0) num_classes = loaded->num_classes;
    x_dims = {c.data.batch_size, features};
    t->batcher_ = std::make_unique<CsvBatcher>(t->split_.train, c.data.batch_size, c.data.shuffle,
                                               c.data.seed, c.data.remainder == "wrap");
    t->eval_batch_ = std::min<int64_t>(c.data.batch_size, t->split_.held_out.size());
    t->eval_data_ = std::make_unique<CsvEvalData>(t->split_.held_out, t->eval_batch_);
  }
  const DType x_dtype = lm ? DType::kS32 : DType::kF32;
  t->x_ = Tensor(x_dtype, Shape(x_dims));
  t->x_flat_ = t->x_.Reshaped(Shape{c.data.batch_size, features});  // shares storage
  t->y_ = lm ? Tensor(DType::kS32, Shape{c.data.batch_size, features})
             : Tensor(DType::kS32, Shape{c.data.batch_size});
  std::vector<int64_t> eval_dims = x_dims;
  eval_dims[0] = t->eval_batch_;
  t->eval_x_ = Tensor(x_dtype, Shape(eval_dims));
  t->eval_y_ = lm ? Tensor(DType::kS32, Shape{t->eval_batch_, features})
                  : Tensor(DType::kS32, Shape{t->eval_batch_});
  t->tokens_per_example_ = lm ? features : 0;

  // ---- Model and compiled step ----
  KILN_ASSIGN_OR_RETURN(t->model_, BuildModel(c.model, features, num_classes));
  KILN_ASSIGN_OR_RETURN(ir::Graph loss, t->model_->TrainLossGraph(c.data.batch_size));
  KILN_ASSIGN_OR_RETURN(nn::ParamStore params, nn::InitParams(t->model_->Params(), c.seed));
  nn::TrainStepOptions step_opts;
  step_opts.optimizer = BuildOptimizerConfig(c);
  step_opts.rng_seed = c.seed;
  KILN_ASSIGN_OR_RETURN(step_opts.precision, compiler::ParsePrecisionPolicy(c.precision));
  // Compile events land in the trace of a profiled run (the profiler is off otherwise).
  if (t->options_.profile_steps.has_value()) t->profiler_.set_enabled(true);
  {
    auto scope = t->profiler_.Scope("compile", "train_step");
    KILN_ASSIGN_OR_RETURN(
        t->step_, nn::TrainStep::Create(*t->options_.backend, loss, std::move(params), step_opts));
  }
  t->compile_seconds_ = t->step_->compile_seconds();
  for (const std::string& name : t->step_->data_inputs()) {
    if (name != "x" && name != "labels" && name != "tokens" && name != "targets") {
      return absl::InternalError(absl::StrCat("unexpected data input '", name, "' of the model"));
    }
  }
  {
    auto start = Clock::now();
    auto scope = t->profiler_.Scope("compile", "eval_graphs");
    KILN_ASSIGN_OR_RETURN(ir::Graph eloss, t->model_->LossGraph(t->eval_batch_));
    KILN_ASSIGN_OR_RETURN(ir::Graph epred, t->model_->PredictGraph(t->eval_batch_));
    KILN_ASSIGN_OR_RETURN(t->eval_loss_, t->options_.backend->Compile(eloss));
    KILN_ASSIGN_OR_RETURN(t->eval_predict_, t->options_.backend->Compile(epred));
    t->compile_seconds_ += Seconds(Clock::now() - start);
  }
  t->profiler_.set_enabled(false);

  // ---- Output directory ----
  if (move_aside) {
    KILN_ASSIGN_OR_RETURN(std::string aside, MoveRunAside(c.output_dir));
    t->notes_.push_back(absl::StrCat("--no-resume --replace: moved the earlier run to ", aside,
                                     " (delete it yourself once you no longer need it)"));
  }
  if (!ro) KILN_RETURN_IF_ERROR(WriteFileAtomic(c.output_dir + "/config.yaml", ConfigToYaml(c)));
  CheckpointOptions copts;
  copts.keep_last = c.keep_last;
  copts.keep_every = c.keep_every;
  copts.run_id = t->run_id_;
  copts.read_only = ro;
  std::string ckpt_root = c.output_dir + "/checkpoints";
  int64_t restore_step = t->options_.restore_step;
  if (ro && !t->options_.restore_path.empty()) {
    std::filesystem::path p = std::filesystem::path(t->options_.restore_path).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    restore_step = ParseCheckpointDirName(p.filename().string());
    if (restore_step < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint directory ", t->options_.restore_path, " is not named step_<N>"));
    }
    ckpt_root = p.parent_path().empty() ? "." : p.parent_path().string();
  }
  KILN_ASSIGN_OR_RETURN(t->ckpt_, CheckpointManager::Open(ckpt_root, copts));
  for (const std::string& n : t->ckpt_->open_notes()) t->notes_.push_back(n);

  // ---- Resume ----
  if (t->options_.resume) {
    absl::StatusOr<Checkpoint> ck =
        restore_step >= 0 ? t->ckpt_->Restore(restore_step) : t->ckpt_->RestoreLatest();
    if (ck.ok()) {
      for (const std::string& n : ck->notes) t->notes_.push_back(n);
      nn::ParamStore p, s;
      auto fill = [&](const nn::ParamStore& like, nn::ParamStore* out) -> absl::Status {
        for (const std::string& name : like.names()) {
          auto it = ck->tensors.find(name);
          if (it == ck->tensors.end()) {
            return absl::DataLossError(absl::StrCat("checkpoint ", ck->path, " has no tensor '",
                                                    name, "' (was the model changed?)"));
          }
          KILN_RETURN_IF_ERROR(out->Add(name, it->second));
        }
        return absl::OkStatus();
      };
      KILN_RETURN_IF_ERROR(fill(t->step_->params(), &p));
      KILN_RETURN_IF_ERROR(fill(t->step_->optimizer_state(), &s));
      KILN_RETURN_IF_ERROR(
          Annotate(t->step_->Restore(p, s, ck->step), absl::StrCat("restoring ", ck->path)));
      if (ck->metadata.contains("data")) {
        KILN_RETURN_IF_ERROR(t->batcher_->Restore(ck->metadata["data"]));
      }
      std::string old_hash = ck->metadata.value("config_hash", std::string());
      if (old_hash != t->hash_) {
        t->notes_.push_back(absl::StrCat("note: config hash changed since ", ck->path, " (",
                                         old_hash, " -> ", t->hash_, ")"));
      }
      t->start_step_ = ck->step;
      t->last_saved_step_ = ck->step;
      t->restored_from_ = ck->path;
      if (!ro) {
        t->notes_.push_back(absl::StrCat("resumed from ", ck->path, " (step ", ck->step, ")"));
      }
    } else if (!absl::IsNotFound(ck.status()) || restore_step >= 0 || ro) {
      return ck.status();
    }
  }

  if (ro) return t;

  // ---- Metrics ----
  std::vector<std::unique_ptr<MetricsSink>> sinks;
  KILN_ASSIGN_OR_RETURN(sinks.emplace_back(),
                        JsonlSink::Create(c.output_dir + "/metrics.jsonl", /*append=*/true));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<TensorBoardSink> tb, TensorBoardSink::Create(c.output_dir));
  // After a resume from step S: TensorBoard drops the points past S that the killed run wrote
  // (docs/formats.md "TensorBoard event files").
  if (t->start_step_ > 0) KILN_RETURN_IF_ERROR(tb->writer().AddSessionStart(t->start_step_));
  sinks.push_back(std::move(tb));
  t->metrics_ = std::make_unique<MultiSink>(std::move(sinks));

  // ---- Run info ----
  nlohmann::json info =
      t->options_.run_info.is_object() ? t->options_.run_info : nlohmann::json::object();
  info["config_hash"] = t->hash_;
  info["run_id"] = t->run_id_;
  std::string commit = GitCommit();
  if (!commit.empty()) info["git_commit"] = commit;
  info["backend"] = t->options_.backend->name();
  info["model"] = t->model_->Describe();
  info["parameters"] = t->step_->params().num_elements();
  info["start_step"] = t->start_step_;
  info["compile_seconds"] = t->compile_seconds_;
  info["precision"] = c.precision;
  info["pid"] = static_cast<int64_t>(getpid());
  KILN_RETURN_IF_ERROR(WriteFileAtomic(c.output_dir + "/run.json", info.dump(2) + "\n"));

  NamedTensors like;
  for (int i = 0; i < t->step_->params().size(); ++i)
    like.emplace_back(t->step_->params().names()[i], t->step_->params().value(i));
  for (int i = 0; i < t->step_->optimizer_state().size(); ++i)
    like.emplace_back(t->step_->optimizer_state().names()[i], t->step_->optimizer_state().value(i));
  t->ckpt_->ReserveStaging(like);
  return t;
}

absl::Status Trainer::Save(bool sync) {
  NamedTensors tensors;
  const nn::ParamStore& p = step_->params();
  const nn::ParamStore& s = step_->optimizer_state();
  // Never commit a diverged state as a result: the run stops instead (Run checks the loss and
  // gradients every step; this catches an update that overflowed the parameters silently).
  if (!AllFinite(p) || !AllFinite(s)) {
    KILN_RETURN_IF_ERROR(ckpt_->Wait());
    return DivergenceError(
        config_, step_->step(), NAN, NAN, 0, /*params_nonfinite=*/true,
        last_saved_step_ > 0 ? absl::StrCat(ckpt_->root(), "/step_", last_saved_step_) : "");
  }
  for (int i = 0; i < p.size(); ++i) tensors.emplace_back(p.names()[i], p.value(i));
  for (int i = 0; i < s.size(); ++i) tensors.emplace_back(s.names()[i], s.value(i));
  nlohmann::json meta = {{"step", step_->step()},
                         {"config_hash", hash_},
                         {"seed", config_.seed},
                         {"rng", {{"seed", config_.seed}, {"step", step_->step()}}},
                         {"data", batcher_->State()}};
  auto scope = profiler_.Scope("checkpoint", sync ? "save" : "save_async");
  if (sync) {
    KILN_RETURN_IF_ERROR(ckpt_->Save(step_->step(), tensors, meta));
  } else {
    KILN_RETURN_IF_ERROR(ckpt_->SaveAsync(step_->step(), tensors, meta));
  }
  last_saved_step_ = step_->step();
  return absl::OkStatus();
}

absl::Status Trainer::WriteMetrics(int64_t step, const std::map<std::string, double>& scalars) {
  return metrics_->Write(step, scalars);
}

void Trainer::Log(const std::string& line) {
  if (options_.log == nullptr) return;
  if (progress_line_open_) {
    *options_.log << "\n";
    progress_line_open_ = false;
  }
  *options_.log << line << "\n" << std::flush;
}

void Trainer::Progress(int64_t step, float loss, double ex_per_s, double eta_s) {
  if (options_.log == nullptr) return;
  *options_.log << "\r\033[K"
                << absl::StrFormat("step %d/%d  loss %.4f  %.0f ex/s  ETA %s", step, config_.steps,
                                   loss, ex_per_s, FormatDuration(eta_s))
                << std::flush;
  progress_line_open_ = true;
}

absl::StatusOr<EvalResult> Trainer::Evaluate(int64_t max_batches) {
  KILN_RETURN_IF_ERROR(eval_data_->Reset());
  int64_t batches = eval_data_->batches();
  if (max_batches > 0) batches = std::min(batches, max_batches);
  std::map<std::string, Tensor> in;
  const nn::ParamStore& p = step_->params();
  for (int i = 0; i < p.size(); ++i) in[p.names()[i]] = p.value(i);
  const int64_t f = eval_x_.num_elements() / eval_batch_;
  const bool lm = tokens_per_example_ > 0;
  const char* x_name = lm ? "tokens" : "x";
  const char* y_name = lm ? "targets" : "labels";
  // Predictions per batch: one per example, or one per token for a language model.
  const int64_t per_batch = eval_y_.num_elements();
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t b = 0; b < batches; ++b) {
    KILN_RETURN_IF_ERROR(eval_data_->Next(eval_x_, eval_y_));
    in[x_name] = lm ? eval_x_ : eval_x_.Reshaped(Shape{eval_batch_, f});
    in[y_name] = eval_y_;
    KILN_ASSIGN_OR_RETURN(auto lo, eval_loss_->RunNamed(in));
    loss_sum += lo.at("loss").GetDouble(0);
    in.erase(y_name);
    KILN_ASSIGN_OR_RETURN(auto pr, eval_predict_->RunNamed(in));
    const Tensor& pred = pr.at("prediction");
    for (int64_t i = 0; i < per_batch; ++i) {
      if (static_cast<int64_t>(pred.GetDouble(i)) == eval_y_.data<int32_t>()[i]) ++correct;
    }
  }
  EvalResult r;
  r.examples = batches * eval_batch_;
  if (batches > 0) {
    r.loss = loss_sum / batches;
    r.accuracy = static_cast<double>(correct) / (batches * per_batch);
    if (lm) r.perplexity = std::exp(r.loss);
  }
  return r;
}

absl::StatusOr<TrainResult> Trainer::Run() {
  if (options_.read_only) {
    return absl::FailedPreconditionError("Trainer::Run on a read-only trainer (eval/export)");
  }
  const TrainConfig& c = config_;
  TrainResult result;
  result.start_step = start_step_;
  result.notes = notes_;
  for (const std::string& n : notes_) Log(n);
  if (start_step_ >= c.steps) {
    Log(absl::StrFormat(
        "run already complete: %s is step %d and steps is %d, so there is nothing to train. To "
        "train further, raise steps (--set steps=N); to evaluate it: kiln eval %s",
        restored_from_, start_step_, c.steps, c.output_dir));
    KILN_RETURN_IF_ERROR(metrics_->Close());
    result.final_step = start_step_;
    result.checkpoint = restored_from_;
    return result;
  }

  Log(absl::StrFormat("model %s, %d parameters; train step compiled in %.2fs; steps %d..%d",
                      model_->Describe(), step_->params().num_elements(), step_->compile_seconds(),
                      start_step_ + 1, c.steps));

  std::vector<const Tensor*> data;
  for (const std::string& name : step_->data_inputs()) {
    data.push_back(name == "x" || name == "tokens" ? &x_flat_ : &y_);
  }

  const bool profiling = options_.profile_steps.has_value();
  int64_t prof_a = profiling ? options_.profile_steps->first : 0;
  int64_t prof_b = profiling ? options_.profile_steps->second : 0;
  if (profiling) profiler_.Reserve(size_t{16} * (prof_b - prof_a) + 64);
  double prof_total = 0, prof_input = 0, prof_compute = 0;
  int64_t prof_steps = 0;

  auto run_start = Clock::now();
  Clock::time_point timed_start;  // after the first step (warm-up excluded from examples/s)
  int64_t timed_steps = 0;
  auto last_progress = Clock::now() - std::chrono::seconds(1);
  double window_time = 0;
  int64_t window_steps = 0;
  bool evaluated_last = false;
  int64_t ran = 0;
  int64_t nonfinite_steps = 0;  // in a row

  while (step_->step() < c.steps) {
    if (stop_.load(std::memory_order_relaxed) || PreemptionRequested()) {
      result.preempted = true;
      break;
    }
    const int64_t number = step_->step() + 1;  // 1-based, as logged
    const bool profile_this = profiling && number >= prof_a && number < prof_b;
    if (profile_this != profiler_.enabled()) {
      // Per-kernel events: one complete event per thunk of the step, named as the thunk is
      // (op, node id, implementation), only inside the profiled window.
      runtime::Executable& exe = step_->mutable_executable();
      if (profile_this) {
        exe.set_thunk_observer([this, &exe](int i, int64_t start_ns, int64_t end_ns) {
          profiler_.AddComplete("kernel", exe.thunk(i).name(), start_ns, end_ns);
        });
      } else {
        exe.set_thunk_observer(nullptr);
      }
    }
    profiler_.set_enabled(profile_this);
    auto t0 = Clock::now();
    {
      auto s = profiler_.Scope("input", "next_batch");
      KILN_RETURN_IF_ERROR(batcher_->Next(x_, y_));
    }
    auto t1 = Clock::now();
    nn::StepMetrics m;
    {
      auto s = profiler_.Scope("compute", "train_step");
      absl::StatusOr<nn::StepMetrics> r = step_->Run(data);
      if (!r.ok()) return Annotate(r.status(), absl::StrCat("step ", number));
      m = *r;
    }
    auto t2 = Clock::now();
    ++ran;
    if (profiler_.enabled()) {
      prof_total += Seconds(t2 - t0);
      prof_input += Seconds(t1 - t0);
      prof_compute += Seconds(t2 - t1);
      ++prof_steps;
    }
    result.losses.push_back(m.loss);
    if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm)) {
      ++nonfinite_steps;
      const bool params_bad = !AllFinite(step_->params());
      Log(absl::StrFormat("warning: non-finite %s at step %d (%d of nonfinite_patience %d)",
                          std::isfinite(m.loss) ? "gradient norm" : "loss", number, nonfinite_steps,
                          c.nonfinite_patience));
      if (params_bad || nonfinite_steps >= c.nonfinite_patience) {
        KILN_RETURN_IF_ERROR(ckpt_->Wait());  // an in-flight save holds a finite earlier state
        KILN_RETURN_IF_ERROR(
            WriteMetrics(number, {{"loss", m.loss}, {"lr", m.lr}, {"grad_norm", m.grad_norm}}));
        KILN_RETURN_IF_ERROR(metrics_->Close());
        return DivergenceError(
            c, number, m.loss, m.grad_norm, nonfinite_steps, params_bad,
            last_saved_step_ > 0 ? absl::StrCat(ckpt_->root(), "/step_", last_saved_step_) : "");
      }
    } else {
      nonfinite_steps = 0;
    }
    double step_time = Seconds(t2 - t0);
    if (ran == 1) {
      timed_start = t2;
    } else {
      ++timed_steps;
    }
    window_time += step_time;
    ++window_steps;

    evaluated_last = false;
    if (number % c.log_every == 0 || number == c.steps) {
      double ex_s = window_time > 0 ? window_steps * c.data.batch_size / window_time : 0;
      std::map<std::string, double> scalars = {{"loss", m.loss},
                                               {"lr", m.lr},
                                               {"grad_norm", m.grad_norm},
                                               {"examples_per_second", ex_s},
                                               {"step_time_ms", 1e3 * window_time / window_steps},
                                               {"epoch", static_cast<double>(batcher_->epoch())}};
      std::string tok;
      if (tokens_per_example_ > 0) {
        scalars["tokens_per_second"] = ex_s * tokens_per_example_;
        tok = absl::StrFormat(" (%.0f tokens/s)", ex_s * tokens_per_example_);
      }
      KILN_RETURN_IF_ERROR(WriteMetrics(number, scalars));
      if (!options_.tty) {
        Log(absl::StrFormat("step %d/%d loss %.4f lr %.3g grad_norm %.3g %.0f ex/s%s", number,
                            c.steps, m.loss, m.lr, m.grad_norm, ex_s, tok));
      }
      window_time = 0;
      window_steps = 0;
    }
    if (options_.tty && Seconds(Clock::now() - last_progress) > 0.1) {
      double elapsed = timed_steps > 0 ? Seconds(t2 - timed_start) : 0;
      double rate = timed_steps > 0 ? timed_steps / elapsed : 0;
      double eta = rate > 0 ? (c.steps - number) / rate : NAN;
      Progress(number, m.loss, rate * c.data.batch_size, eta);
      last_progress = Clock::now();
    }
    if (c.eval_every > 0 && number % c.eval_every == 0) {
      auto s = profiler_.Scope("eval", "evaluate");
      KILN_ASSIGN_OR_RETURN(EvalResult e, Evaluate(c.eval_batches));
      KILN_RETURN_IF_ERROR(WriteMetrics(number, EvalScalars(e)));
      Log(absl::StrFormat("eval at step %d: loss %.4f%s accuracy %.4f (%d examples)", number,
                          e.loss, PerplexityText(e), e.accuracy, e.examples));
      result.final_eval = e;
      evaluated_last = true;
    }
    if (c.checkpoint_every > 0 && number % c.checkpoint_every == 0 && number < c.steps) {
      // The step is blocked only for the host copy (and for the previous save, if still
      // writing); the write itself is reported once it has finished, at the next save.
      const SaveInfo previous = ckpt_->last_save_info();
      auto save_start = Clock::now();
      KILN_RETURN_IF_ERROR(Save(/*sync=*/false));
      std::map<std::string, double> ck = {
          {"checkpoint/blocking_ms", 1e3 * Seconds(Clock::now() - save_start)}};
      if (previous.step >= 0) {
        ck["checkpoint/write_ms"] = previous.write_micros / 1e3;
        ck["checkpoint/bytes"] = static_cast<double>(previous.bytes);
      }
      KILN_RETURN_IF_ERROR(WriteMetrics(number, ck));
    }
    if (options_.stop_after_steps > 0 && ran >= options_.stop_after_steps) RequestStop();
  }
  profiler_.set_enabled(false);
  step_->mutable_executable().set_thunk_observer(nullptr);

  // Final checkpoint: synchronous, so "exit 75" / "done" means it is committed.
  if (last_saved_step_ != step_->step() || ran > 0) {
    KILN_RETURN_IF_ERROR(ckpt_->Wait());
    if (last_saved_step_ != step_->step()) KILN_RETURN_IF_ERROR(Save(/*sync=*/true));
  }
  KILN_RETURN_IF_ERROR(ckpt_->Wait());
  result.checkpoint = absl::StrCat(ckpt_->root(), "/step_", step_->step());
  if (!result.preempted && !evaluated_last) {
    KILN_ASSIGN_OR_RETURN(EvalResult e, Evaluate(c.eval_batches));
    KILN_RETURN_IF_ERROR(WriteMetrics(step_->step(), EvalScalars(e)));
    result.final_eval = e;
  }
  KILN_RETURN_IF_ERROR(metrics_->Close());
  result.final_step = step_->step();
  if (timed_steps > 0) {
    result.examples_per_second =
        timed_steps * c.data.batch_size / Seconds(Clock::now() - timed_start);
    result.tokens_per_second = result.examples_per_second * tokens_per_example_;
  }
  (void)run_start;
  if (result.preempted) {
    Log(
        absl::StrFormat("stopped at step %d: checkpoint committed at %s; rerun to resume "
                        "(exit %d)",
                        result.final_step, result.checkpoint, kExitPreempted));
  } else {
    std::string ev =
        result.final_eval
            ? absl::StrFormat(", held-out loss %.4f%s accuracy %.4f", result.final_eval->loss,
                              PerplexityText(*result.final_eval), result.final_eval->accuracy)
            : "";
    std::string tok = tokens_per_example_ > 0
                          ? absl::StrFormat(" (%.0f tokens/s)", result.tokens_per_second)
                          : "";
    if (tokens_per_example_ > 0 && !result.losses.empty()) {
      Log(absl::StrFormat("training loss: %.4f at step %d -> %.4f at step %d",
                          result.losses.front(), start_step_ + 1, result.losses.back(),
                          result.final_step));
    }
    Log(absl::StrFormat("done: step %d, %.0f examples/s%s%s; checkpoint %s", result.final_step,
                        result.examples_per_second, tok, ev, result.checkpoint));
  }
  if (profiling) {
    KILN_RETURN_IF_ERROR(ReportProfile(prof_total, prof_input, prof_compute, prof_steps));
  }
  return result;
}

}  // namespace kiln::train
