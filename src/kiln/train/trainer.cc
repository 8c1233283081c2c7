#include "kiln/train/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/status.h"
#include "kiln/compiler/passes/float_normalization.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/opcode.h"
#include "kiln/nn/optim.h"
#include "kiln/nn/params.h"
#include "kiln/train/divergence.h"
#include "kiln/train/init_from.h"
#include "kiln/train/profile_analysis.h"

namespace kiln::train {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

volatile sig_atomic_t g_stop_signal = 0;

// The eval metrics written to metrics.jsonl / TensorBoard (perplexity for language models).
std::map<std::string, double> EvalScalars(const EvalResult& e) {
  std::map<std::string, double> m = {{"eval/loss", e.loss}, {"eval/accuracy", e.accuracy}};
  if (e.perplexity > 0) m["eval/perplexity"] = e.perplexity;
  if (e.auc >= 0) m["eval/auc"] = e.auc;
  if (e.recall_at_k >= 0) m[absl::StrCat("eval/recall_at_", e.recall_k)] = e.recall_at_k;
  m.merge(LanguageScalars(e));  // eval/<language>/perplexity, multilingual tokens: sources
  return m;
}
std::string PerplexityText(const EvalResult& e) {
  return (e.perplexity > 0 ? absl::StrFormat(" perplexity %.2f", e.perplexity) : std::string()) +
         RankingText(e);
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
  for (const ParamGroupSection& g : c.optimizer.param_groups)
    o.param_groups.push_back({.match = g.match, .lr_scale = g.lr_scale, .freeze = g.freeze});
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
  KILN_RETURN_IF_ERROR(t->SetUpMesh());
  t->run_dir_ = std::make_unique<RunDirectory>(config.output_dir, t->options_.env);
  bool move_aside = false;
  if (t->chief()) {
    KILN_ASSIGN_OR_RETURN(move_aside, t->ClaimRunDir());
  }
  const ModelKind* kind = FindModelKind(config.model.kind);
  const bool lm = kind != nullptr && kind->language_model;  // tokens -> next tokens
  KILN_ASSIGN_OR_RETURN(t->data_, OpenTrainData(config, lm, /*with_train=*/true));
  KILN_RETURN_IF_ERROR(t->Compile());
  if (t->chief()) {
    KILN_RETURN_IF_ERROR(t->OpenCheckpoints(move_aside));
    if (t->options_.resume) KILN_RETURN_IF_ERROR(t->Resume());
    KILN_RETURN_IF_ERROR(t->InitFrom());
  } else {
    KILN_RETURN_IF_ERROR(t->OpenCheckpointsForShards());
  }
  KILN_RETURN_IF_ERROR(t->OpenMetrics());
  // A run killed after its final checkpoint but before its final evaluation and metrics were
  // written is not complete: Run finishes it.
  if (t->chief()) {
    nlohmann::json previous = ReadRunJson(config.output_dir, t->run_dir_->env());
    if (t->start_step_ > 0 && previous.contains("completed_step") &&
        previous["completed_step"].is_number_integer() &&
        previous["completed_step"].get<int64_t>() == t->start_step_) {
      t->completed_step_ = t->start_step_;
    }
  }
  if (t->mesh_.ranks > 1) {
    KILN_RETURN_IF_ERROR(t->SyncFromChief());
    KILN_RETURN_IF_ERROR(t->GatherRanks());
  }
  if (t->chief()) KILN_RETURN_IF_ERROR(t->WriteRunInfo());
  // The host copy an asynchronous save takes (a set of parameters and optimizer state), only when
  // this run will save asynchronously: the final save is synchronous and needs none.
  // A multi-rank run saves synchronously, in pieces (SaveShards): no host copy.
  if (t->chief() && t->mesh_.ranks == 1 && t->AsyncSaveAhead()) {
    const NamedTensors tensors = t->CheckpointTensors();
    t->ckpt_->ReserveStaging(tensors);
    for (const auto& [name, value] : tensors) t->checkpoint_staging_bytes_ += value.byte_size();
  }
  return t;
}

bool Trainer::AsyncSaveAhead() const {
  const int64_t every = config_.checkpoint_every;
  if (every <= 0 || config_.steps <= 1) return false;
  // MaybeCheckpoint saves asynchronously at the multiples of checkpoint_every below steps.
  const int64_t last = (config_.steps - 1) / every * every;
  return last > start_step_;
}

// The run directory: one trainer, one run (run_dir.h).
absl::StatusOr<bool> Trainer::ClaimRunDir() {
  KILN_RETURN_IF_ERROR(run_dir_->Lock());
  KILN_ASSIGN_OR_RETURN(PreviousRun prev, run_dir_->Inspect());
  bool move_aside = false;
  if (!options_.resume && prev.exists) {
    if (!options_.replace) return FreshStartRefusal(config_.output_dir, prev);
    move_aside = true;
  }
  run_id_ = options_.resume && !prev.run_id.empty() ? prev.run_id : NewRunId();
  return move_aside;
}

// The model, its compiled train step and the evaluator; the batch tensors.
absl::Status Trainer::Compile() {
  const TrainConfig& c = config_;
  const DataShape& shape = data_.shape;
  x_ = MakeInputTensor(shape, c.data.batch_size);
  x_flat_ = x_.Reshaped(Shape{c.data.batch_size, shape.features});  // shares storage
  y_ = MakeTargetTensor(shape, c.data.batch_size);
  KILN_ASSIGN_OR_RETURN(model_, BuildModel(c.model, shape.features, shape.num_classes));
  KILN_RETURN_IF_ERROR(CheckModelFitsData(*model_, shape));
  // Data parallel: the step trains on this rank's share of each global batch.
  const int64_t local_batch = c.data.batch_size / mesh_.data;
  if (mesh_.data > 1) {
    x_local_ = MakeInputTensor(shape, local_batch);
    x_local_flat_ = x_local_.Reshaped(Shape{local_batch, shape.features});
    y_local_ = MakeTargetTensor(shape, local_batch);
  }
  KILN_ASSIGN_OR_RETURN(ir::Graph loss, model_->TrainLossGraph(local_batch));
  KILN_ASSIGN_OR_RETURN(nn::ParamStore params, nn::InitParams(model_->Params(), c.seed));
  nn::TrainStepOptions step_opts;
  if (tensor_parallel()) {
    KILN_RETURN_IF_ERROR(SetUpTensorParallel(step_opts, params));
  } else if (mesh_.data > 1) {
    collectives_ = std::make_unique<dist::CommunicatorCollectives>(*options_.comm);
    step_opts.data_parallel = mesh_.data;
    step_opts.collectives = collectives_.get();
  }
  step_opts.optimizer = BuildOptimizerConfig(c);
  step_opts.shard_state = c.optimizer.shard_state;  // ZeRO-1 (train_step.h)
  step_opts.data_rank = static_cast<int>(coords_.data);
  // Each data rank draws its own dropout masks over its share (one seed would repeat rank 0's
  // pattern on every share); rank 0 keeps the config's seed, so a one-rank run is unchanged.
  step_opts.rng_seed = c.seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(coords_.data);
  KILN_ASSIGN_OR_RETURN(step_opts.precision, compiler::ParsePrecisionPolicy(c.precision));
  // Compile events land in the trace of a profiled run (the profiler is off otherwise).
  if (options_.profile_steps.has_value()) profiler_.set_enabled(true);
  {
    auto scope = profiler_.Scope("compile", "train_step");
    KILN_ASSIGN_OR_RETURN(
        step_, nn::TrainStep::Create(*options_.backend, loss, std::move(params), step_opts));
  }
  compile_seconds_ = step_->compile_seconds();
  for (const std::string& name : step_->data_inputs()) {
    if (name != "x" && name != "labels" && name != "tokens" && name != "targets") {
      return absl::InternalError(absl::StrCat("unexpected data input '", name, "' of the model"));
    }
  }
  {
    auto start = Clock::now();
    auto scope = profiler_.Scope("compile", "eval_graphs");
    KILN_ASSIGN_OR_RETURN(evaluator_, Evaluator::Create(*options_.backend, *model_, data_));
    evaluator_->set_recall_k(c.eval_recall_k);
    compile_seconds_ += Seconds(Clock::now() - start);
  }
  profiler_.set_enabled(false);
  return absl::OkStatus();
}

// Moves an earlier run aside (--no-resume --replace), writes config.yaml, opens checkpoints/.
absl::Status Trainer::OpenCheckpoints(bool move_aside) {
  if (move_aside) {
    KILN_ASSIGN_OR_RETURN(std::string aside, run_dir_->MoveRunAside());
    notes_.push_back(absl::StrCat("--no-resume --replace: moved the earlier run to ", aside,
                                  " (delete it yourself once you no longer need it)"));
  }
  KILN_RETURN_IF_ERROR(run_dir_->WriteConfig(ConfigToYaml(config_)));
  CheckpointOptions copts;
  copts.keep_last = config_.keep_last;
  copts.keep_every = config_.keep_every;
  copts.run_id = run_id_;
  copts.env = run_dir_->env();
  KILN_ASSIGN_OR_RETURN(ckpt_, CheckpointManager::Open(run_dir_->checkpoints_path(), copts));
  for (const std::string& n : ckpt_->open_notes()) notes_.push_back(n);
  return absl::OkStatus();
}

// Restores the newest good checkpoint of this run, if any: parameters, optimizer state, step and
// data position.
absl::Status Trainer::Resume() {
  // Read straight into the train step's buffers: no second set of parameters and optimizer state
  // in memory while resuming. A failed restore fails Create, so partly written buffers are never
  // trained on; NotFound reads nothing.
  // With shard_state the optimizer state is this rank's pieces: RestoreState reads them below.
  const bool zero = step_->shard_state();
  const NamedTensors resident = zero ? ParamTensors() : CheckpointTensors();
  ckpt_->RestoreInto(&resident);
  if (zero) {
    std::set<std::string> state_names(step_->optimizer_state().names().begin(),
                                      step_->optimizer_state().names().end());
    ckpt_->RestoreOnly([state_names](const std::string& n) { return state_names.count(n) == 0; });
  }
  absl::StatusOr<Checkpoint> ck = ckpt_->RestoreLatest();
  ckpt_->RestoreInto(nullptr);
  ckpt_->RestoreOnly(nullptr);
  if (absl::IsNotFound(ck.status())) return absl::OkStatus();
  if (!ck.ok()) return ck.status();
  for (const std::string& n : ck->notes) notes_.push_back(n);
  nn::ParamStore p, s;
  auto fill = [&](const nn::ParamStore& like, nn::ParamStore* out) -> absl::Status {
    for (const std::string& name : like.names()) {
      auto it = ck->tensors.find(name);
      if (it == ck->tensors.end()) {
        return absl::DataLossError(absl::StrCat("checkpoint ", ck->path, " has no tensor '", name,
                                                "' (was the model changed?)"));
      }
      KILN_RETURN_IF_ERROR(out->Add(name, it->second));
    }
    return absl::OkStatus();
  };
  KILN_RETURN_IF_ERROR(fill(tensor_parallel() ? full_params_ : step_->params(), &p));
  if (zero) {
    KILN_ASSIGN_OR_RETURN(s, ReadStatePieces(ck->path));
  } else {
    KILN_RETURN_IF_ERROR(fill(tensor_parallel() ? full_state_ : step_->optimizer_state(), &s));
  }
  KILN_RETURN_IF_ERROR(Annotate(
      tensor_parallel() ? step_->RestoreFull(p, s, ck->step) : step_->Restore(p, s, ck->step),
      absl::StrCat("restoring ", ck->path)));
  if (ck->metadata.contains("data"))
    KILN_RETURN_IF_ERROR(data_.train->Restore(ck->metadata["data"]));
  std::string old_hash = ck->metadata.value("config_hash", std::string());
  if (old_hash != hash_) {
    notes_.push_back(absl::StrCat("note: config hash changed since ", ck->path, " (", old_hash,
                                  " -> ", hash_, ")"));
  }
  start_step_ = ck->step;
  last_saved_step_ = ck->step;
  restored_from_ = ck->path;
  notes_.push_back(absl::StrCat("resumed from ", ck->path, " (step ", ck->step, ")"));
  return absl::OkStatus();
}

absl::Status Trainer::InitFrom() {
  const InitFromConfig& f = config_.init_from;
  if (!restored_from_.empty()) {
    nlohmann::json previous = ReadRunJson(config_.output_dir, run_dir_->env());
    if (previous.is_object() && previous.contains("init_from")) {
      init_from_info_ = previous["init_from"];
    }
    if (!f.checkpoint.empty()) {
      notes_.push_back(absl::StrCat("init_from: ignored (", f.checkpoint,
                                    "): this run resumes from its own checkpoint ",
                                    restored_from_));
    }
    return absl::OkStatus();
  }
  if (f.checkpoint.empty()) return absl::OkStatus();
  // Tensor parallel: checked against and loaded as whole tensors (the other ranks get them in
  // SyncFromChief), and this rank keeps its shards.
  KILN_ASSIGN_OR_RETURN(
      InitFromResult r,
      LoadInitFrom(f, tensor_parallel() ? full_params_ : step_->params(), run_dir_->env()));
  for (const std::string& n : r.notes) notes_.push_back(n);
  // Parameters only: the optimizer state stays zero and the run starts at step 0.
  if (tensor_parallel()) {
    for (int i = 0; i < r.params.size(); ++i) {
      Tensor* to = full_params_.Find(r.params.names()[i]);
      if (to == nullptr || to->byte_size() != r.params.value(i).byte_size())
        return absl::InternalError("init_from: parameter '" + r.params.names()[i] + "' differs");
      std::memcpy(to->raw_data(), r.params.value(i).raw_data(),
                  static_cast<size_t>(to->byte_size()));
    }
    KILN_RETURN_IF_ERROR(Annotate(step_->RestoreFull(full_params_, full_state_, 0),
                                  absl::StrCat("init_from ", r.checkpoint)));
  } else {
    KILN_RETURN_IF_ERROR(Annotate(step_->Restore(r.params, step_->optimizer_state(), 0),
                                  absl::StrCat("init_from ", r.checkpoint)));
  }
  notes_.push_back(r.Summary());
  init_from_info_ = r.ToJson();
  init_from_fresh_ = true;
  return absl::OkStatus();
}

// A warm-started run's starting point: the loaded weights on this run's held-out data, as
// metrics at step 0 (every rank evaluates, as in MaybeEvaluate; rank 0 writes).
absl::Status Trainer::EvaluateInitFrom() {
  if (!init_from_fresh_ || step_->step() != 0) return absl::OkStatus();
  init_from_fresh_ = false;
  KILN_ASSIGN_OR_RETURN(EvalResult e, Evaluate(config_.eval_batches));
  KILN_RETURN_IF_ERROR(WriteMetrics(0, EvalScalars(e)));
  Log(absl::StrFormat("init_from: eval at step 0: loss %.4f%s accuracy %.4f (%d examples)", e.loss,
                      PerplexityText(e), e.accuracy, e.examples));
  return absl::OkStatus();
}

absl::Status Trainer::OpenMetrics() {
  std::vector<std::unique_ptr<MetricsSink>> sinks;
  if (!chief()) {  // rank 0 writes the run's metrics
    metrics_ = std::make_unique<MultiSink>(std::move(sinks));
    return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(sinks.emplace_back(),
                        JsonlSink::Create(run_dir_->env(), run_dir_->metrics_path(),
                                          /*append=*/true));
  EventWriter::Options eo;
  if (options_.env != nullptr) eo.env = options_.env;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<TensorBoardSink> tb,
                        TensorBoardSink::Create(config_.output_dir, eo));
  // After a resume from step S: TensorBoard drops the points past S that the killed run wrote
  // (docs/formats.md "TensorBoard event files").
  if (start_step_ > 0) KILN_RETURN_IF_ERROR(tb->writer().AddSessionStart(start_step_));
  sinks.push_back(std::move(tb));
  metrics_ = std::make_unique<MultiSink>(std::move(sinks));
  return absl::OkStatus();
}

absl::Status Trainer::WriteRunInfo() {
  nlohmann::json info =
      options_.run_info.is_object() ? options_.run_info : nlohmann::json::object();
  info["config_hash"] = hash_;
  info["run_id"] = run_id_;
  info["backend"] = options_.backend->name();
  info["model"] = model_->Describe();
  info["parameters"] = (tensor_parallel() ? full_params_ : step_->params()).num_elements();
  info["start_step"] = start_step_;
  info["compile_seconds"] = compile_seconds_;
  info["precision"] = config_.precision;
  info["pid"] = static_cast<int64_t>(getpid());
  info["mesh"] = {{"data", mesh_.data}, {"model", mesh_.model}, {"ranks", mesh_.ranks}};
  // Per-rank memory of the training state (rank 0's; each rank's optimizer state in "ranks").
  info["memory"] = {{"parameter_bytes", step_->params().num_elements() * 4},
                    {"optimizer_state_bytes", step_->optimizer_state_bytes()},
                    {"shard_state", step_->shard_state()}};
  if (!ranks_info_.is_null()) {
    info["ranks"] = ranks_info_;
  } else {
    info["ranks"] =
        nlohmann::json::array({{{"rank", 0},
                                {"host", options_.host},
                                {"pid", info["pid"]},
                                {"data", 0},
                                {"model", 0},
                                {"optimizer_state_bytes", step_->optimizer_state_bytes()}}});
  }
  if (completed_step_ >= 0) info["completed_step"] = completed_step_;
  if (!init_from_info_.is_null()) info["init_from"] = init_from_info_;
  return run_dir_->WriteRunJson(info);
}

NamedTensors Trainer::ParamTensors() const {
  NamedTensors tensors;
  const nn::ParamStore& p = tensor_parallel() ? full_params_ : step_->params();
  for (int i = 0; i < p.size(); ++i) tensors.emplace_back(p.names()[i], p.value(i));
  return tensors;
}

NamedTensors Trainer::CheckpointTensors() const {
  NamedTensors tensors = ParamTensors();
  if (tensor_parallel()) {  // the whole tensors RefreshFull gathered
    for (int i = 0; i < full_state_.size(); ++i)
      tensors.emplace_back(full_state_.names()[i], full_state_.value(i));
    return tensors;
  }
  const nn::ParamStore& s = step_->optimizer_state();
  const auto& pieces = step_->state_pieces();
  for (int i = 0; i < s.size(); ++i) {
    // One process with shard_state holds each state tensor whole, as a 1-D piece: saved in the
    // tensor's own shape, so that the checkpoint is the same as without shard_state.
    tensors.emplace_back(s.names()[i], s.value(i).Reshaped(pieces[i].whole));
  }
  return tensors;
}

std::string Trainer::LastSavedPath() const {
  return last_saved_step_ > 0 && ckpt_ != nullptr
             ? absl::StrCat(ckpt_->root(), "/step_", last_saved_step_)
             : "";
}

absl::Status Trainer::Save(bool sync) {
  // Never commit a diverged state as a result: the run stops instead (Run checks the loss and
  // gradients every step; this catches an update that overflowed the parameters silently).
  // What this rank holds (tensor parallel: its shards; with shard_state: its state pieces).
  bool finite = AllFinite(step_->params()) && AllFinite(step_->optimizer_state());
  if (sharded_saves()) {  // each rank checks only what it holds: agree
    KILN_ASSIGN_OR_RETURN(bool any_bad, AnyRank(!finite, "agreeing that the state is finite"));
    finite = !any_bad;
  }
  if (!finite) {
    KILN_RETURN_IF_ERROR(ckpt_->Wait());
    return DivergenceError(config_, step_->step(), NAN, NAN, 0, /*params_nonfinite=*/true,
                           LastSavedPath());
  }
  nlohmann::json meta = {
      {"step", step_->step()},
      {"config_hash", hash_},
      {"seed", config_.seed},
      {"rng", {{"seed", config_.seed}, {"step", step_->step()}}},
      {"data", data_.train->State()},
      // What `kiln export` builds the model for, without reading the data.
      {"model_dims",
       {{"features", data_.shape.features}, {"num_classes", data_.shape.num_classes}}}};
  auto scope = profiler_.Scope("checkpoint", sync ? "save" : "save_async");
  if (sharded_saves()) {  // every rank writes its own pieces; synchronous (collectives)
    KILN_RETURN_IF_ERROR(SaveShards(meta));
  } else if (sync) {
    KILN_RETURN_IF_ERROR(ckpt_->Save(step_->step(), CheckpointTensors(), meta));
  } else {
    KILN_RETURN_IF_ERROR(ckpt_->SaveAsync(step_->step(), CheckpointTensors(), meta));
  }
  last_saved_step_ = step_->step();
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Trainer::Evaluate(int64_t max_batches) {
  return evaluator_->Run(tensor_parallel() ? full_params_ : step_->params(), max_batches);
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

// The counters of one Run: throughput windows, the profiled window, divergence patience.
struct Trainer::Loop {
  std::vector<const Tensor*> data;  // the step's data inputs, in its order
  bool profiling = false;
  int64_t prof_a = 0, prof_b = 0, prof_steps = 0;
  double prof_total = 0, prof_input = 0, prof_compute = 0;
  Clock::time_point timed_start;  // after the first step (warm-up excluded from examples/s)
  int64_t timed_steps = 0;
  Clock::time_point last_progress = Clock::now() - std::chrono::seconds(1);
  double window_time = 0;
  int64_t window_steps = 0;
  bool evaluated_last = false;
  int64_t ran = 0;
  int64_t nonfinite_steps = 0;  // in a row
};

absl::StatusOr<TrainResult> Trainer::Run() {
  const TrainConfig& c = config_;
  TrainResult result;
  result.start_step = start_step_;
  result.notes = notes_;
  for (const std::string& n : notes_) Log(n);
  if (start_step_ >= c.steps && completed_step_ == start_step_) {
    Log(absl::StrFormat(
        "run already complete: %s is step %d and steps is %d, so there is nothing to train. To "
        "train further, raise steps (--set steps=N); to evaluate it: kiln eval %s",
        restored_from_, start_step_, c.steps, c.output_dir));
    KILN_RETURN_IF_ERROR(metrics_->Close());
    result.final_step = start_step_;
    result.checkpoint = restored_from_;
    return result;
  }
  if (start_step_ >= c.steps) {
    Log(
        absl::StrFormat("finishing step %d: its checkpoint is committed; writing its final "
                        "evaluation and metrics",
                        start_step_));
  } else {
    Log(absl::StrFormat("model %s, %d parameters; train step compiled in %.2fs; steps %d..%d",
                        model_->Describe(),
                        (tensor_parallel() ? full_params_ : step_->params()).num_elements(),
                        step_->compile_seconds(), start_step_ + 1, c.steps));
    // Where the backend cannot run some bf16 ops, the compiler computed them in f32 between
    // converts (passes/float_normalization.h): say which and why, once.
    const std::vector<compiler::OpCount> f32 =
        compiler::FloatNormalizedOps(step_->executable().graph());
    if (!f32.empty()) {
      const nlohmann::json described = options_.backend->Describe();
      const std::string where = described.contains("isa") ? described["isa"].get<std::string>()
                                                          : options_.backend->name();
      Log(absl::StrCat("precision ", c.precision, " on ", where, ": ",
                       compiler::F32ComputeNote(f32, options_.backend->Traits().bf16_note)));
    }
  }
  KILN_RETURN_IF_ERROR(EvaluateInitFrom());
  Loop loop;
  const bool share = mesh_.data > 1;  // data parallel: this rank's share of each batch
  for (const std::string& name : step_->data_inputs()) {
    const bool x = name == "x" || name == "tokens";
    loop.data.push_back(share ? (x ? &x_local_flat_ : &y_local_) : (x ? &x_flat_ : &y_));
  }
  loop.profiling = options_.profile_steps.has_value();
  if (loop.profiling) {
    loop.prof_a = options_.profile_steps->first;
    loop.prof_b = options_.profile_steps->second;
    // One event per kernel per step, and a few around them: growing the buffer inside the window
    // would fault pages into the kernel times.
    const size_t per_step = static_cast<size_t>(step_->executable().num_thunks()) + 16;
    profiler_.Reserve(per_step * static_cast<size_t>(loop.prof_b - loop.prof_a) + 64);
  }
  while (step_->step() < c.steps) {
    bool stop = stop_.load(std::memory_order_relaxed) || PreemptionRequested();
    // Multi-process: every rank stops after the same step when any rank was asked to.
    if (mesh_.ranks > 1) {
      KILN_ASSIGN_OR_RETURN(stop, AgreeToStop(stop));
    }
    if (stop) {
      result.preempted = true;
      break;
    }
    const int64_t number = step_->step() + 1;  // 1-based, as logged
    KILN_ASSIGN_OR_RETURN(nn::StepMetrics m, Step(number, loop));
    result.losses.push_back(m.loss);
    KILN_RETURN_IF_ERROR(CheckFinite(number, m, loop));
    KILN_RETURN_IF_ERROR(Report(number, m, loop));
    KILN_RETURN_IF_ERROR(MaybeEvaluate(number, loop, result));
    KILN_RETURN_IF_ERROR(MaybeCheckpoint(number));
    if (options_.stop_after_steps > 0 && loop.ran >= options_.stop_after_steps) RequestStop();
  }
  KILN_RETURN_IF_ERROR(Finish(loop, result));
  return result;
}

// One training step: the next batch, the compiled step, the time it took.
absl::StatusOr<nn::StepMetrics> Trainer::Step(int64_t number, Loop& loop) {
  const bool profile_this = loop.profiling && number >= loop.prof_a && number < loop.prof_b;
  if (profile_this != profiler_.enabled()) {
    // Per-kernel events: one complete event per thunk of the step, named as the thunk is
    // (op, node id, implementation), only inside the profiled window.
    runtime::Executable& exe = step_->mutable_executable();
    if (profile_this) {
      exe.set_thunk_observer([this, &exe](int i, int64_t start_ns, int64_t end_ns) {
        profiler_.AddComplete("kernel", exe.thunk(i).name(), start_ns, end_ns);
      });
      // Asynchronous collectives (the data-parallel buckets): one event each on the
      // communication thread's track, from when that thread began it to when it ended, with when
      // the step started it; against the "(wait)" kernels they say how much the step hid.
      if (comm_track_ < 0) comm_track_ = profiler_.NewTrack("communication");
      exe.set_collective_observer([this](const std::string& name, int64_t start_ns,
                                         int64_t begin_ns, int64_t end_ns) {
        profiler_.AddComplete("collective", name, begin_ns, end_ns,
                              {{"started_us", static_cast<double>(start_ns) / 1e3}}, comm_track_);
      });
    } else {
      exe.set_thunk_observer(nullptr);
      exe.set_collective_observer(nullptr);
    }
  }
  profiler_.set_enabled(profile_this);
  auto t0 = Clock::now();
  {
    auto s = profiler_.Scope("input", "next_batch");
    KILN_RETURN_IF_ERROR(data_.train->Next(x_, y_));
    if (mesh_.data > 1) KILN_RETURN_IF_ERROR(TakeShare());
  }
  auto t1 = Clock::now();
  nn::StepMetrics m;
  {
    auto s = profiler_.Scope("compute", "train_step");
    absl::StatusOr<nn::StepMetrics> r = step_->Run(loop.data);
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("step ", number));
    m = *r;
  }
  auto t2 = Clock::now();
  ++loop.ran;
  if (profiler_.enabled()) {
    loop.prof_total += Seconds(t2 - t0);
    loop.prof_input += Seconds(t1 - t0);
    loop.prof_compute += Seconds(t2 - t1);
    ++loop.prof_steps;
    profile_peak_rss_ = PeakRssBytes();  // the breakdown's peak: the window's, not the save's
  }
  if (loop.ran == 1) {
    loop.timed_start = t2;
  } else {
    ++loop.timed_steps;
  }
  loop.window_time += Seconds(t2 - t0);
  ++loop.window_steps;
  loop.evaluated_last = false;
  return m;
}

// Stops the run (divergence.h) after nonfinite_patience non-finite steps in a row, or at once
// when the parameters themselves went non-finite.
absl::Status Trainer::CheckFinite(int64_t number, const nn::StepMetrics& m, Loop& loop) {
  if (std::isfinite(m.loss) && std::isfinite(m.grad_norm)) {
    loop.nonfinite_steps = 0;
    return absl::OkStatus();
  }
  const TrainConfig& c = config_;
  ++loop.nonfinite_steps;
  const bool params_bad = !AllFinite(step_->params());
  Log(absl::StrFormat("warning: non-finite %s at step %d (%d of nonfinite_patience %d)",
                      std::isfinite(m.loss) ? "gradient norm" : "loss", number,
                      loop.nonfinite_steps, c.nonfinite_patience));
  if (!params_bad && loop.nonfinite_steps < c.nonfinite_patience) return absl::OkStatus();
  if (ckpt_ != nullptr) KILN_RETURN_IF_ERROR(ckpt_->Wait());  // it holds a finite earlier state
  KILN_RETURN_IF_ERROR(
      WriteMetrics(number, {{"loss", m.loss}, {"lr", m.lr}, {"grad_norm", m.grad_norm}}));
  KILN_RETURN_IF_ERROR(metrics_->Close());
  return DivergenceError(c, number, m.loss, m.grad_norm, loop.nonfinite_steps, params_bad,
                         LastSavedPath());
}

// Metrics and the log line every log_every steps; the progress line on a terminal.
absl::Status Trainer::Report(int64_t number, const nn::StepMetrics& m, Loop& loop) {
  const TrainConfig& c = config_;
  if (number % c.log_every == 0 || number == c.steps) {
    double ex_s =
        loop.window_time > 0 ? loop.window_steps * c.data.batch_size / loop.window_time : 0;
    std::map<std::string, double> scalars = {
        {"loss", m.loss},
        {"lr", m.lr},
        {"grad_norm", m.grad_norm},
        {"examples_per_second", ex_s},
        {"step_time_ms", 1e3 * loop.window_time / loop.window_steps},
        {"epoch", static_cast<double>(data_.train->epoch())}};
    std::string tok;
    const int64_t tokens = data_.shape.language_model ? data_.shape.features : 0;
    if (tokens > 0) {
      scalars["tokens_per_second"] = ex_s * tokens;
      tok = absl::StrFormat(" (%.0f tokens/s)", ex_s * tokens);
    }
    KILN_RETURN_IF_ERROR(WriteMetrics(number, scalars));
    if (!options_.tty) {
      Log(absl::StrFormat("step %d/%d loss %.4f lr %.3g grad_norm %.3g %.0f ex/s%s", number,
                          c.steps, m.loss, m.lr, m.grad_norm, ex_s, tok));
    }
    loop.window_time = 0;
    loop.window_steps = 0;
  }
  if (options_.tty && Seconds(Clock::now() - loop.last_progress) > 0.1) {
    double elapsed = loop.timed_steps > 0 ? Seconds(Clock::now() - loop.timed_start) : 0;
    double rate = loop.timed_steps > 0 ? loop.timed_steps / elapsed : 0;
    double eta = rate > 0 ? (c.steps - number) / rate : NAN;
    Progress(number, m.loss, rate * c.data.batch_size, eta);
    loop.last_progress = Clock::now();
  }
  return absl::OkStatus();
}

absl::Status Trainer::MaybeEvaluate(int64_t number, Loop& loop, TrainResult& result) {
  const TrainConfig& c = config_;
  // Every rank evaluates (rank 0 alone writes the result): a rank 0 evaluating alone would keep
  // the others waiting in the next collective, past its timeout for a long evaluation.
  if (c.eval_every <= 0 || number % c.eval_every != 0) return absl::OkStatus();
  if (tensor_parallel()) KILN_RETURN_IF_ERROR(RefreshFull());
  auto s = profiler_.Scope("eval", "evaluate");
  KILN_ASSIGN_OR_RETURN(EvalResult e, Evaluate(c.eval_batches));
  KILN_RETURN_IF_ERROR(WriteMetrics(number, EvalScalars(e)));
  Log(absl::StrFormat("eval at step %d: loss %.4f%s accuracy %.4f (%d examples)", number, e.loss,
                      PerplexityText(e), e.accuracy, e.examples));
  if (!e.languages.empty())
    Log(absl::StrCat("eval at step ", number, ":", LanguagePerplexityText(e)));
  result.final_eval = e;
  loop.evaluated_last = true;
  return absl::OkStatus();
}

absl::Status Trainer::MaybeCheckpoint(int64_t number) {
  const TrainConfig& c = config_;
  if (c.checkpoint_every <= 0 || number % c.checkpoint_every != 0 || number >= c.steps) {
    return absl::OkStatus();
  }
  // Sharded saves (any mesh of more than one rank, tensor parallel included): every rank writes
  // its pieces. One process saves the whole tensors.
  if (!chief() && !sharded_saves()) return absl::OkStatus();
  // The step is blocked only for the host copy (and for the previous save, if still writing);
  // the write itself is reported once it has finished, at the next save.
  const SaveInfo previous = ckpt_->last_save_info();
  auto save_start = Clock::now();
  KILN_RETURN_IF_ERROR(Save(/*sync=*/false));
  std::map<std::string, double> ck = {
      {"checkpoint/blocking_ms", 1e3 * Seconds(Clock::now() - save_start)}};
  if (previous.step >= 0) {
    ck["checkpoint/write_ms"] = previous.write_micros / 1e3;
    ck["checkpoint/bytes"] = static_cast<double>(previous.bytes);
  }
  return WriteMetrics(number, ck);
}

// The final checkpoint (synchronous, so "exit 75" / "done" means it is committed), the final
// evaluation, the closing log lines and the profile report.
absl::Status Trainer::Finish(Loop& loop, TrainResult& result) {
  const TrainConfig& c = config_;
  profiler_.set_enabled(false);
  step_->mutable_executable().set_thunk_observer(nullptr);
  step_->mutable_executable().set_collective_observer(nullptr);
  // Tensor parallel: the whole tensors for rank 0's final evaluation (every rank takes part; the
  // condition is the same on every rank). The final save is in pieces, of the shards.
  if (tensor_parallel() && !result.preempted && !loop.evaluated_last)
    KILN_RETURN_IF_ERROR(RefreshFull());
  if (!chief()) {  // rank 0 commits, evaluates and writes the run's files
    // The final sharded save, as rank 0 decides below (both track last_saved_step_).
    if (sharded_saves() && last_saved_step_ != step_->step())
      KILN_RETURN_IF_ERROR(Save(/*sync=*/true));
    result.final_step = step_->step();
    result.checkpoint = absl::StrCat(config_.output_dir, "/checkpoints/step_", step_->step());
    return metrics_->Close();
  }
  if (last_saved_step_ != step_->step() || loop.ran > 0) {
    KILN_RETURN_IF_ERROR(ckpt_->Wait());
    if (last_saved_step_ != step_->step()) KILN_RETURN_IF_ERROR(Save(/*sync=*/true));
  }
  KILN_RETURN_IF_ERROR(ckpt_->Wait());
  result.checkpoint = absl::StrCat(ckpt_->root(), "/step_", step_->step());
  if (!result.preempted && !loop.evaluated_last) {
    KILN_ASSIGN_OR_RETURN(EvalResult e, Evaluate(c.eval_batches));
    KILN_RETURN_IF_ERROR(WriteMetrics(step_->step(), EvalScalars(e)));
    result.final_eval = e;
  }
  KILN_RETURN_IF_ERROR(metrics_->Close());
  result.final_step = step_->step();
  if (!result.preempted && result.final_step >= c.steps) {
    completed_step_ = result.final_step;  // everything of the run is written: say so last
    KILN_RETURN_IF_ERROR(WriteRunInfo());
  }
  const int64_t tokens = data_.shape.language_model ? data_.shape.features : 0;
  if (loop.timed_steps > 0) {
    result.examples_per_second =
        loop.timed_steps * c.data.batch_size / Seconds(Clock::now() - loop.timed_start);
    result.tokens_per_second = result.examples_per_second * tokens;
  }
  if (result.preempted) {
    Log(absl::StrFormat("stopped at step %d: checkpoint committed at %s; rerun to resume (exit %d)",
                        result.final_step, result.checkpoint, kExitPreempted));
  } else {
    std::string ev =
        result.final_eval
            ? absl::StrFormat(", held-out loss %.4f%s accuracy %.4f", result.final_eval->loss,
                              PerplexityText(*result.final_eval), result.final_eval->accuracy)
            : "";
    std::string tok =
        tokens > 0 ? absl::StrFormat(" (%.0f tokens/s)", result.tokens_per_second) : "";
    if (tokens > 0 && !result.losses.empty()) {
      Log(absl::StrFormat("training loss: %.4f at step %d -> %.4f at step %d",
                          result.losses.front(), start_step_ + 1, result.losses.back(),
                          result.final_step));
    }
    Log(absl::StrFormat("done: step %d, %.0f examples/s%s%s; checkpoint %s", result.final_step,
                        result.examples_per_second, tok, ev, result.checkpoint));
    if (result.final_eval && !result.final_eval->languages.empty()) {
      Log(absl::StrCat("final", LanguagePerplexityText(*result.final_eval)));
    }
  }
  if (loop.profiling) {
    KILN_RETURN_IF_ERROR(
        ReportProfile(loop.prof_total, loop.prof_input, loop.prof_compute, loop.prof_steps));
  }
  return absl::OkStatus();
}

}  // namespace kiln::train
