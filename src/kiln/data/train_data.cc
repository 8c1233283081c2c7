#include "kiln/data/train_data.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/pipeline.h"
#include "kiln/data/token_dataset.h"

namespace kiln::data {
namespace {

// An input pipeline behind the Batcher interface: its SaveState() string is the checkpointed
// state. A plain CSV path reports the epoch of the batch just returned (as the trainer's CSV
// batcher always did) and still restores that batcher's {"epoch", "position"} states.
class PipelineBatcher final : public Batcher {
 public:
  PipelineBatcher(std::unique_ptr<InputPipeline> p, bool csv, bool wrap)
      : p_(std::move(p)), csv_(csv), wrap_(wrap) {}
  absl::Status Next(Tensor& x, Tensor& y) override { return p_->Next(x, y); }
  nlohmann::json State() const override { return {{"pipeline", p_->SaveState()}}; }
  absl::Status Restore(const nlohmann::json& j) override {
    if (j.is_object() && j.contains("pipeline") && j["pipeline"].is_string()) {
      return p_->RestoreState(j["pipeline"].get<std::string>());
    }
    if (csv_ && j.is_object() && j.contains("position")) return RestoreCsvState(j);
    return absl::DataLossError(
        "checkpoint has no input-pipeline state (was it written with a CSV data.source?)");
  }
  int64_t epoch() const override { return csv_ ? p_->epoch_of_last_batch() : p_->epoch(); }
  int prefetch_depth() const override { return p_->prefetch_depth(); }
  int workers() const override { return p_->workers(); }
  double mean_produce_seconds() const override { return p_->mean_produce_seconds(); }

 private:
  // {"epoch": E, "position": P}: P examples of epoch E's order were taken. The next batch starts
  // there, or at the next epoch when the rest of E cannot give it (drop) or E is used up (wrap).
  absl::Status RestoreCsvState(const nlohmann::json& j) {
    int64_t e = 0, pos = 0;
    try {
      e = j.at("epoch").get<int64_t>();
      pos = j.at("position").get<int64_t>();
    } catch (const std::exception& ex) {
      return absl::DataLossError(
          absl::StrCat("bad data iterator state in checkpoint: ", ex.what()));
    }
    const int64_t n = p_->examples_per_epoch(), b = p_->feature_type().shape[0];
    if (e < 0 || pos < 0 || pos > n || (!wrap_ && pos % b != 0)) {
      return absl::DataLossError("data iterator state out of range in checkpoint");
    }
    const int64_t seen = e * n + pos;
    if (wrap_ ? pos == n : pos + b > n) {
      ++e;
      pos = 0;
    }
    nlohmann::json state = nlohmann::json::parse(p_->SaveState());
    state["epoch"] = e;
    state["batch_in_epoch"] = pos / b;
    state["position_in_epoch"] = pos;
    state["examples_seen"] = seen;
    return p_->RestoreState(state.dump());
  }

  std::unique_ptr<InputPipeline> p_;
  bool csv_, wrap_;
};

class PipelineEvalData final : public EvalData {
 public:
  explicit PipelineEvalData(std::unique_ptr<InputPipeline> p)
      : p_(std::move(p)), start_(p_->SaveState()) {}
  absl::Status Reset() override { return p_->RestoreState(start_); }
  int64_t batches() const override { return p_->batches_per_epoch(); }
  absl::Status Next(Tensor& x, Tensor& y) override { return p_->Next(x, y); }
  int64_t last_real_examples() const override { return p_->last_real_examples(); }

 private:
  std::unique_ptr<InputPipeline> p_;
  std::string start_;
};

bool IsTokens(const std::string& source) { return source.rfind("tokens:", 0) == 0; }

// tokens: sources: the model's vocabulary and sequence length against the import's (an error
// names the config key and both values); *vocab gets the tokenizer's vocabulary size.
absl::Status CheckTokenDataset(const TrainDataConfig& c, const TokenDatasetInfo& t,
                               const std::string& dir, int64_t* vocab) {
  if (!c.language_model) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.source: ", c.source, " holds token shards: it needs model.kind gpt"));
  }
  if (c.vocab_size != 0 && c.vocab_size != t.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.vocab_size: ", c.vocab_size, " does not match the tokenizer of ", dir, " (",
        t.vocab_size, " ids, dataset.json tokenizer.vocab_size): set model.vocab_size to ",
        t.vocab_size, " or 0 (take it from the dataset)"));
  }
  if (c.seq_len != 0 && c.seq_len != t.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.seq_len: ", c.seq_len, " does not match ", dir, ", imported with --seq-len ",
        t.seq_len, ": set data.seq_len to ", t.seq_len, " or 0 (take it from the dataset)"));
  }
  *vocab = t.vocab_size;
  return absl::OkStatus();
}

// Each language's held-out data of a multilingual tokens: source, at `batch` (padded).
absl::Status OpenLanguageHeldOut(const TrainDataConfig& c, const TokenDatasetInfo& t,
                                 PipelineConfig pc, Env* env, TrainData* d) {
  pc.remainder = "pad";
  pc.shrink_batch = false;
  for (const TokenLanguage& l : t.languages) {
    if (l.held_out_examples == 0) continue;  // a language too small for one window
    pc.language = l.name;
    absl::StatusOr<std::unique_ptr<InputPipeline>> p = InputPipeline::Create(pc, env);
    if (!p.ok()) return Annotate(p.status(), "data.source (held-out split of " + l.name + ")");
    d->held_out_by_language.push_back(
        {l.name, std::make_unique<PipelineEvalData>(*std::move(p)), l.held_out_examples});
  }
  return absl::OkStatus();
}

absl::Status CheckPipelineTypes(const InputPipeline& p, bool lm) {
  const TensorSpec& ft = p.feature_type();
  const TensorSpec& lt = p.label_type();
  if (lm) {
    if (ft.dtype != DType::kS32 || lt.dtype != DType::kS32 || ft.shape.rank() != 2 || !(ft == lt)) {
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
  return absl::OkStatus();
}

absl::Status CheckRemainder(const TrainDataConfig& c, bool csv) {
  if (csv && c.remainder == "pad") {
    return absl::InvalidArgumentError(
        "data.remainder: 'pad' needs an input-pipeline source (digits:, records:, "
        "safetensors:); a plain CSV path allows drop, wrap");
  }
  if (!csv && c.remainder == "wrap") {
    return absl::InvalidArgumentError(
        "data.remainder: 'wrap' needs a CSV data.source; the input pipeline allows drop, pad");
  }
  return absl::OkStatus();
}

PipelineConfig TrainPipelineConfig(const TrainDataConfig& c, bool csv) {
  PipelineConfig pc;
  pc.source = csv ? "csv:" + c.source : c.source;
  pc.seq_len = c.seq_len;
  pc.batch_size = c.batch_size;
  pc.shuffle = c.shuffle;
  pc.seed = c.seed;
  pc.shuffle_buffer = csv ? 0 : c.shuffle_buffer;
  pc.remainder = c.remainder;
  pc.prefetch = c.prefetch;
  pc.workers = c.workers;
  pc.augment = c.augment;
  pc.held_out_fraction = c.held_out_fraction;
  pc.split = "train";
  pc.split_seed = c.seed;
  return pc;
}

// The held-out split in a fixed order, whole batches of batch_size (fewer examples: one batch
// of all of them).
PipelineConfig HeldOutPipelineConfig(PipelineConfig pc) {
  pc.split = "held_out";
  pc.shuffle = false;
  pc.prefetch = 0;
  pc.remainder = "drop";
  pc.shrink_batch = true;
  return pc;
}

absl::StatusOr<TrainData> OpenCsv(const TrainDataConfig& c, bool with_train, Env* env) {
  const PipelineConfig pc = TrainPipelineConfig(c, /*csv=*/true);
  absl::StatusOr<std::unique_ptr<InputPipeline>> held =
      InputPipeline::Create(HeldOutPipelineConfig(pc), env);
  if (!held.ok()) return Annotate(held.status(), "data.source");
  TrainData d;
  d.held_out_examples = (*held)->examples_per_epoch();
  const int64_t train_size = (*held)->source_examples() - d.held_out_examples;
  if (c.batch_size > train_size) {
    return absl::InvalidArgumentError(absl::StrCat("data.batch_size: ", c.batch_size,
                                                   " is larger than the training split (",
                                                   train_size, " examples)"));
  }
  if (with_train) {
    absl::StatusOr<std::unique_ptr<InputPipeline>> train = InputPipeline::Create(pc, env);
    if (!train.ok()) return Annotate(train.status(), "data.source");
    d.train_examples = (*train)->examples_per_epoch();
    d.train =
        std::make_unique<PipelineBatcher>(*std::move(train), /*csv=*/true, c.remainder == "wrap");
  }
  d.shape.features =
      (*held)->feature_type().shape.num_elements() / (*held)->feature_type().shape[0];
  d.shape.num_classes = c.num_classes != 0 ? c.num_classes : 10;  // the digits layout's
  d.shape.x_dims = {c.batch_size, d.shape.features};
  d.shape.eval_batch = (*held)->feature_type().shape[0];
  d.held_out = std::make_unique<PipelineEvalData>(*std::move(held));
  return d;
}

absl::StatusOr<TrainData> OpenPipeline(const TrainDataConfig& c, bool with_train, Env* env) {
  const bool lm = c.language_model;
  PipelineConfig pc = TrainPipelineConfig(c, /*csv=*/false);
  TrainData d;
  int64_t token_vocab = 0;
  std::optional<TokenDatasetInfo> tokens;
  if (IsTokens(c.source)) {
    const std::string dir = c.source.substr(7);
    absl::StatusOr<TokenDatasetInfo> t = ReadTokenDataset(env, dir);
    if (!t.ok()) return Annotate(t.status(), "data.source");
    KILN_RETURN_IF_ERROR(CheckTokenDataset(c, *t, dir, &token_vocab));
    tokens = *std::move(t);
  }
  if (with_train) {
    absl::StatusOr<std::unique_ptr<InputPipeline>> train = InputPipeline::Create(pc, env);
    if (!train.ok()) return Annotate(train.status(), "data.source");
    KILN_RETURN_IF_ERROR(CheckPipelineTypes(**train, lm));
    d.train_examples = (*train)->examples_per_epoch();
    d.train = std::make_unique<PipelineBatcher>(*std::move(train), /*csv=*/false, /*wrap=*/false);
  }
  pc = HeldOutPipelineConfig(pc);
  pc.shrink_batch = false;  // a held-out split smaller than a batch is an error here
  absl::StatusOr<std::unique_ptr<InputPipeline>> held = InputPipeline::Create(pc, env);
  if (!held.ok()) return Annotate(held.status(), "data.source (held-out split)");
  if (!with_train) KILN_RETURN_IF_ERROR(CheckPipelineTypes(**held, lm));
  const TensorSpec& ft = (*held)->feature_type();
  d.shape.x_dims = ft.shape.dims();
  d.shape.x_dims[0] = c.batch_size;
  d.shape.features = ft.shape.num_elements() / pc.batch_size;
  d.shape.eval_batch = pc.batch_size;
  d.held_out_examples = (*held)->examples_per_epoch();
  d.held_out = std::make_unique<PipelineEvalData>(*std::move(held));
  if (tokens) KILN_RETURN_IF_ERROR(OpenLanguageHeldOut(c, *tokens, pc, env, &d));
  d.shape.num_classes = c.num_classes;
  if (lm) {
    d.shape.num_classes = token_vocab > 0 ? token_vocab : c.vocab_size;
  } else if (d.shape.num_classes == 0 && c.source.rfind("dataset:", 0) == 0) {
    // An imported dataset names its classes.
    KILN_ASSIGN_OR_RETURN(DatasetManifest m, ReadManifest(env, c.source.substr(8)));
    d.shape.num_classes = static_cast<int64_t>(m.label_vocabulary.size());
    if (d.shape.num_classes == 0) {
      return absl::InvalidArgumentError("data.num_classes: " + c.source +
                                        " has no label vocabulary: set data.num_classes");
    }
  } else if (d.shape.num_classes == 0) {
    if (c.source.rfind("digits:", 0) != 0) {
      return absl::InvalidArgumentError(
          "data.num_classes: required for records:/safetensors: sources (0 means infer, which "
          "only the digits layout can)");
    }
    d.shape.num_classes = 10;
  }
  if (!lm && c.source.rfind("dataset:", 0) == 0) {
    KILN_ASSIGN_OR_RETURN(DatasetManifest m, ReadManifest(env, c.source.substr(8)));
    if (m.kind == "clicks" && m.extra.contains("tables") && m.extra["tables"].is_array()) {
      for (const auto& t : m.extra["tables"]) d.shape.categorical_sizes.push_back(t.get<int64_t>());
    }
  }
  return d;
}

}  // namespace

bool IsPlainCsvPath(const std::string& s) {
  return !(s.rfind("digits:", 0) == 0 || s.rfind("records:", 0) == 0 ||
           s.rfind("dataset:", 0) == 0 || s.rfind("safetensors:", 0) == 0 ||
           s.rfind("text:", 0) == 0 || s.rfind("tokens:", 0) == 0);
}

absl::StatusOr<TrainData> OpenTrainData(const TrainDataConfig& config, bool with_train, Env* env) {
  const bool csv = IsPlainCsvPath(config.source);
  KILN_RETURN_IF_ERROR(CheckRemainder(config, csv));
  absl::StatusOr<TrainData> d =
      csv ? OpenCsv(config, with_train, env) : OpenPipeline(config, with_train, env);
  if (d.ok()) d->shape.language_model = config.language_model;
  return d;
}

Tensor MakeInputTensor(const DataShape& shape, int64_t batch) {
  std::vector<int64_t> dims = shape.x_dims;
  dims[0] = batch;
  return Tensor(shape.language_model ? DType::kS32 : DType::kF32, Shape(dims));
}

Tensor MakeTargetTensor(const DataShape& shape, int64_t batch) {
  return shape.language_model ? Tensor(DType::kS32, Shape{batch, shape.features})
                              : Tensor(DType::kS32, Shape{batch});
}

}  // namespace kiln::data
