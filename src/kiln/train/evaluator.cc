#include "kiln/train/evaluator.h"

#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/autodiff/graph_copy.h"
#include "kiln/base/memory.h"
#include "kiln/base/status.h"
#include "kiln/data/click_metrics.h"
#include "kiln/ir/builder.h"
#include "kiln/nn/recommender.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/model_registry.h"
#include "kiln/train/run_dir.h"

namespace kiln::train {

std::string RankingText(const EvalResult& e) {
  std::string text;
  if (e.auc >= 0) absl::StrAppend(&text, absl::StrFormat(" auc %.4f", e.auc));
  if (e.recall_at_k >= 0) {
    absl::StrAppend(&text, absl::StrFormat(" recall@%d %.4f", e.recall_k, e.recall_at_k));
  }
  return text;
}

absl::StatusOr<ir::Graph> BuildEvalGraph(const nn::Model& model, int64_t batch, bool language_model,
                                         bool with_score) {
  KILN_ASSIGN_OR_RETURN(ir::Graph predict, model.PredictGraph(batch));
  int logits_node = -1, prediction_node = -1;
  for (const ir::Output& o : predict.outputs()) {
    if (o.name == "logits") logits_node = o.node;
    if (o.name == "prediction") prediction_node = o.node;
  }
  if (logits_node < 0 || prediction_node < 0) {
    return absl::InternalError(absl::StrCat("predict graph '", predict.name(),
                                            "' lacks a \"logits\" or \"prediction\" output"));
  }
  ir::Builder b(absl::StrCat(predict.name(), "_eval"));
  KILN_ASSIGN_OR_RETURN(autodiff::ValueMap map, autodiff::CopyGraph(predict, b));
  const ir::Value logits = map[logits_node];
  const ir::Value prediction = map[prediction_node];
  // The loss graphs' loss: the mean over examples (and positions) of the sparse cross-entropy,
  // in f32 whatever the compute dtype.
  const ir::Value labels =
      b.Parameter(language_model ? "targets" : "labels", DType::kS32, prediction.shape());
  std::vector<int64_t> dims(static_cast<size_t>(prediction.rank()));
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
  ir::Value loss = ir::Mean(ir::SparseCrossEntropy(logits, labels), dims);
  if (loss.valid() && loss.dtype() != DType::kF32) loss = ir::Convert(loss, DType::kF32);
  b.Output("loss", loss);
  b.Output("prediction", prediction);
  if (with_score) {
    const int64_t n = logits.shape()[0];
    ir::Value l = logits.dtype() == DType::kF32 ? logits : ir::Convert(logits, DType::kF32);
    ir::Value score =
        ir::Reshape(ir::Slice(l, {0, 1}, {n, 2}) - ir::Slice(l, {0, 0}, {n, 1}), Shape{n});
    b.Output("score", score);
  }
  return b.Build();
}

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(runtime::Backend& backend,
                                                             const nn::Model& model,
                                                             TrainData& data) {
  std::unique_ptr<Evaluator> e(new Evaluator());
  e->shape_ = data.shape;
  e->data_ = std::move(data.held_out);
  e->languages_ = std::move(data.held_out_by_language);
  const int64_t batch = e->shape_.eval_batch;
  KILN_RETURN_IF_ERROR(CheckModelFitsData(model, e->shape_));
  e->scored_ = !e->shape_.language_model && e->shape_.num_classes == 2;
  e->ranked_ = e->scored_ && dynamic_cast<const nn::Recommender*>(&model) != nullptr;
  KILN_ASSIGN_OR_RETURN(ir::Graph graph,
                        BuildEvalGraph(model, batch, e->shape_.language_model, e->scored_));
  KILN_ASSIGN_OR_RETURN(e->exe_, backend.Compile(graph));
  for (const nn::ParamSpec& spec : model.Params()) e->param_names_.push_back(spec.name);
  const ir::Graph& g = e->exe_->graph();
  if (g.parameters().size() != e->param_names_.size() + 2 ||
      g.outputs().size() != (e->scored_ ? 3u : 2u)) {
    return absl::InternalError(absl::StrCat("evaluation graph '", g.name(), "' has ",
                                            g.parameters().size(), " inputs and ",
                                            g.outputs().size(), " outputs"));
  }
  e->x_ = MakeInputTensor(e->shape_, batch);
  e->y_ = MakeTargetTensor(e->shape_, batch);
  e->loss_ = Tensor(DType::kF32, Shape{});
  const ir::Type& pt = g.node(g.outputs()[1].node).type();
  e->prediction_ = Tensor(pt.dtype, pt.shape);
  if (e->scored_) e->score_ = Tensor(DType::kF32, Shape{batch});
  return e;
}

int64_t HoistedBytes(const runtime::Executable& exe) {
  int64_t bytes = 0;
  for (int id : exe.plan().hoisted) bytes += AlignUp(exe.graph().node(id).type().byte_size());
  return bytes;
}

int64_t Evaluator::resident_bytes() const {
  return exe_->plan().arena_bytes + HoistedBytes(*exe_) + x_.byte_size() + y_.byte_size() +
         loss_.byte_size() + prediction_.byte_size() + (scored_ ? score_.byte_size() : 0);
}

absl::StatusOr<EvalResult> Evaluator::Run(const nn::ParamStore& p, int64_t max_batches) {
  KILN_RETURN_IF_ERROR(data_->Reset());
  int64_t batches = data_->batches();
  if (max_batches > 0) batches = std::min(batches, max_batches);
  const int64_t batch = shape_.eval_batch;
  const int64_t f = x_.num_elements() / batch;
  const bool lm = shape_.language_model;
  // The store's tensors themselves (the executable checks each dtype and shape), then the batch.
  const Tensor x_flat = lm ? x_ : x_.Reshaped(Shape{batch, f});  // shares x_'s storage
  std::vector<const Tensor*> in;
  last_params_.clear();
  for (const std::string& name : param_names_) {
    const Tensor* t = p.Find(name);
    if (t == nullptr) return absl::InvalidArgumentError("evaluation: no parameter '" + name + "'");
    in.push_back(t);
    last_params_.push_back(t->raw_data());
  }
  in.push_back(&x_flat);
  in.push_back(&y_);
  scores_.clear();
  labels_.clear();
  users_.clear();
  KILN_ASSIGN_OR_RETURN(Sums all, RunData(*data_, in, batches, /*collect_scores=*/scored_));
  EvalResult r;
  r.examples = all.examples;
  if (all.batches > 0) {
    // Whole batches (the held-out split drops its remainder): the mean of the batch means.
    r.loss = all.batch_mean_sum / all.batches;
    r.accuracy = static_cast<double>(all.correct) / all.positions;
    if (lm) r.perplexity = std::exp(r.loss);
  }
  if (scored_) r.auc = data::Auc(scores_, labels_).value_or(-1.0);
  if (ranked_) {
    r.recall_k = recall_k_;
    r.recall_at_k = data::RecallAtK(users_, scores_, labels_, recall_k_).value_or(-1.0);
  }
  for (data::LanguageEvalData& l : languages_) {
    KILN_RETURN_IF_ERROR(l.data->Reset());
    KILN_ASSIGN_OR_RETURN(Sums s, RunData(*l.data, in,
                                          max_batches > 0 ? std::min(max_batches, l.data->batches())
                                                          : l.data->batches()));
    LanguageEval le;
    le.language = l.language;
    le.examples = s.examples;
    if (s.positions > 0) {
      le.loss = s.loss / s.positions;
      le.accuracy = static_cast<double>(s.correct) / s.positions;
      le.perplexity = std::exp(le.loss);
    }
    r.languages.push_back(std::move(le));
  }
  return r;
}

absl::StatusOr<Evaluator::Sums> Evaluator::RunData(EvalData& data, std::vector<const Tensor*>& in,
                                                   int64_t batches, bool collect_scores) {
  std::vector<Tensor*> out = {&loss_, &prediction_};
  if (scored_) out.push_back(&score_);
  const int64_t batch = shape_.eval_batch;
  const int64_t f = x_.num_elements() / batch;
  // Predictions per batch: one per example, or one per token for a language model.
  const int64_t per_batch = y_.num_elements();
  const int64_t per_example = per_batch / batch;
  Sums s;
  for (int64_t b = 0; b < batches; ++b) {
    KILN_RETURN_IF_ERROR(data.Next(x_, y_));
    KILN_RETURN_IF_ERROR(exe_->RunInto(in, out));
    // The loss is the mean over the whole batch; padded rows (labels -1) add 0 to it.
    const int64_t real = data.last_real_examples() >= 0 ? data.last_real_examples() : batch;
    s.loss += loss_.GetDouble(0) * static_cast<double>(per_batch);
    s.batch_mean_sum += loss_.GetDouble(0);
    ++s.batches;
    s.positions += real * per_example;
    s.examples += real;
    for (int64_t i = 0; i < per_batch; ++i) {
      if (static_cast<int64_t>(prediction_.GetDouble(i)) == y_.data<int32_t>()[i]) ++s.correct;
    }
    if (collect_scores) {
      const float* sc = score_.data<float>();
      const float* xs = x_.data<float>();
      for (int64_t i = 0; i < batch; ++i) {
        const int label = y_.data<int32_t>()[i];
        if (label < 0) continue;  // a padded row
        scores_.push_back(sc[i]);
        labels_.push_back(label);
        if (ranked_) users_.push_back(static_cast<int64_t>(xs[i * f]));
      }
    }
  }
  return s;
}

std::map<std::string, double> LanguageScalars(const EvalResult& e) {
  std::map<std::string, double> m;
  for (const LanguageEval& l : e.languages) {
    m["eval/" + l.language + "/loss"] = l.loss;
    m["eval/" + l.language + "/accuracy"] = l.accuracy;
    m["eval/" + l.language + "/perplexity"] = l.perplexity;
  }
  return m;
}

std::string LanguagePerplexityText(const EvalResult& e) {
  if (e.languages.empty()) return "";
  std::string out = " held-out perplexity by language:";
  for (size_t i = 0; i < e.languages.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : " ", e.languages[i].language, " ",
                    absl::StrFormat("%.2f", e.languages[i].perplexity));
  }
  return out;
}

namespace {

// The checkpoint LoadRun reads: under OUTDIR/checkpoints (this run's only), or a loose step_N.
absl::StatusOr<Checkpoint> RestoreForLoad(const TrainConfig& c, const LoadOptions& o,
                                          std::vector<std::string>* notes) {
  CheckpointOptions copts;
  copts.keep_last = c.keep_last;
  copts.keep_every = c.keep_every;
  copts.read_only = true;
  copts.env = o.env;
  std::string root = JoinPath(c.output_dir, "checkpoints");
  int64_t step = o.restore_step;
  if (o.restore_path.empty()) {
    copts.run_id = ReadRunJsonId(c.output_dir, o.env);  // "": a run from before run ids
  } else {
    const std::string p = CleanPath(o.restore_path);
    step = ParseCheckpointDirName(Basename(p));
    if (step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint directory ", o.restore_path, " is not named step_<N>"));
    }
    root = Dirname(p).empty() ? "." : Dirname(p);
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointManager> ckpt,
                        CheckpointManager::Open(root, copts));
  for (const std::string& n : ckpt->open_notes()) notes->push_back(n);
  // Only the weights come into memory: the optimizer state (nn::OptimizerStateName:
  // "opt/<slot>/<param>", twice the weights under AdamW) is verified and dropped.
  ckpt->RestoreOnly([](const std::string& name) { return !absl::StartsWith(name, "opt/"); });
  absl::StatusOr<Checkpoint> ck = step >= 0 ? ckpt->Restore(step) : ckpt->RestoreLatest();
  if (ck.ok()) {
    for (const std::string& n : ck->notes) notes->push_back(n);
  }
  return ck;
}

// features and classes of the model the checkpoint holds.
absl::StatusOr<std::pair<int64_t, int64_t>> ModelDims(const TrainConfig& c, const LoadOptions& o,
                                                      const Checkpoint& ck, bool lm) {
  if (o.shape != nullptr) return std::make_pair(o.shape->features, o.shape->num_classes);
  const nlohmann::json& m = ck.metadata;
  if (m.is_object() && m.contains("model_dims") && m["model_dims"].is_object()) {
    const nlohmann::json& d = m["model_dims"];
    if (d.value("features", int64_t{0}) > 0 && d.value("num_classes", int64_t{0}) > 0) {
      return std::make_pair(d["features"].get<int64_t>(), d["num_classes"].get<int64_t>());
    }
  }
  if (lm) return std::make_pair(c.data.seq_len, c.model.vocab_size);
  // A checkpoint from before "model_dims": the held-out data says.
  KILN_ASSIGN_OR_RETURN(TrainData held, OpenTrainData(c, lm, /*with_train=*/false));
  return std::make_pair(held.shape.features, held.shape.num_classes);
}

}  // namespace

absl::StatusOr<LoadedRun> LoadRun(const TrainConfig& c, const LoadOptions& o) {
  KILN_RETURN_IF_ERROR(ValidateTrainConfig(c));
  const ModelKind* kind = FindModelKind(c.model.kind);
  LoadedRun run;
  run.language_model = kind != nullptr && kind->language_model;
  KILN_ASSIGN_OR_RETURN(Checkpoint ck, RestoreForLoad(c, o, &run.notes));
  KILN_ASSIGN_OR_RETURN(auto dims, ModelDims(c, o, ck, run.language_model));
  KILN_ASSIGN_OR_RETURN(run.model, BuildModel(c.model, dims.first, dims.second));
  for (const nn::ParamSpec& spec : run.model->Params()) {
    auto it = ck.tensors.find(spec.name);
    if (it == ck.tensors.end()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", ck.path, " has no tensor '", spec.name,
                                              "' (was the model changed?)"));
    }
    if (it->second.dtype() != spec.dtype || !(it->second.shape() == spec.shape)) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", ck.path, ": tensor '", spec.name, "' is ", it->second.shape().ToString(),
          ", the model wants ", spec.shape.ToString(), " (was the model changed?)"));
    }
    KILN_RETURN_IF_ERROR(run.params.Add(spec.name, it->second));
  }
  const std::string hash = ConfigHash(c);
  const std::string old_hash = ck.metadata.value("config_hash", std::string());
  if (old_hash != hash) {
    run.notes.push_back(
        absl::StrCat("config hash changed since ", ck.path, " (", old_hash, " -> ", hash, ")"));
  }
  run.step = ck.step;
  run.restored_from = ck.path;
  return run;
}

}  // namespace kiln::train
