#include "kiln/train/train_data.h"

#include <algorithm>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset.h"
#include "kiln/data/digits.h"
#include "kiln/data/pipeline.h"

namespace kiln::train {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Fixed-shape batches over an in-memory dataset. The order of epoch e is a pure function of
// (seed, e): a Fisher-Yates permutation from mt19937_64(SplitMix64(seed ^ SplitMix64(e))), or
// source order when shuffle is off. State = (epoch, position in that order).
class CsvBatcher final : public Batcher {
 public:
  CsvBatcher(data::Dataset ds, int64_t batch, bool shuffle, uint64_t seed, bool wrap)
      : ds_(std::move(ds)), batch_(batch), shuffle_(shuffle), seed_(seed), wrap_(wrap) {
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

  const data::Dataset ds_;
  int64_t batch_;
  bool shuffle_;
  uint64_t seed_;
  bool wrap_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0, position_ = 0;
};

class CsvEvalData final : public EvalData {
 public:
  CsvEvalData(data::Dataset ds, int64_t batch) : ds_(std::move(ds)), batch_(batch) {}
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
  const data::Dataset ds_;
  int64_t batch_;
  int64_t next_ = 0;
};

// data/pipeline.h behind the same interfaces: its SaveState() string is the checkpointed state.
class PipelineBatcher final : public Batcher {
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

class PipelineEvalData final : public EvalData {
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

absl::Status CheckPipelineTypes(const data::InputPipeline& p, bool lm) {
  const data::TensorSpec& ft = p.feature_type();
  const data::TensorSpec& lt = p.label_type();
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

absl::StatusOr<TrainData> OpenPipeline(const TrainConfig& c, bool lm, bool with_train) {
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
  TrainData d;
  if (with_train) {
    absl::StatusOr<std::unique_ptr<data::InputPipeline>> train = data::InputPipeline::Create(pc);
    if (!train.ok()) return Annotate(train.status(), "data.source");
    KILN_RETURN_IF_ERROR(CheckPipelineTypes(**train, lm));
    d.train = std::make_unique<PipelineBatcher>(*std::move(train));
  }
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
  if (!with_train) KILN_RETURN_IF_ERROR(CheckPipelineTypes(**held, lm));
  const data::TensorSpec& ft = (*held)->feature_type();
  d.shape.x_dims = ft.shape.dims();
  d.shape.x_dims[0] = c.data.batch_size;
  d.shape.features = ft.shape.num_elements() / pc.batch_size;
  d.shape.eval_batch = pc.batch_size;
  d.held_out = std::make_unique<PipelineEvalData>(*std::move(held));
  d.shape.num_classes = c.data.num_classes;
  if (lm) {
    d.shape.num_classes = c.model.vocab_size;
  } else if (d.shape.num_classes == 0) {
    if (c.data.source.rfind("digits:", 0) != 0) {
      return absl::InvalidArgumentError(
          "data.num_classes: required for records:/safetensors: sources (0 means infer, which "
          "only the digits layout can)");
    }
    d.shape.num_classes = 10;
  }
  return d;
}

absl::StatusOr<TrainData> OpenCsv(const TrainConfig& c, bool with_train) {
  if (c.data.remainder == "pad") {
    return absl::InvalidArgumentError(
        "data.remainder: 'pad' needs an input-pipeline source (digits:, records:, "
        "safetensors:); a plain CSV path allows drop, wrap");
  }
  absl::StatusOr<data::Dataset> loaded = data::LoadDigitsCsv(c.data.source);
  if (!loaded.ok()) return Annotate(loaded.status(), "data.source");
  KILN_ASSIGN_OR_RETURN(data::TrainTestSplit split,
                        data::SplitDataset(*loaded, c.data.held_out_fraction, c.data.seed));
  if (c.data.batch_size > split.train.size()) {
    return absl::InvalidArgumentError(absl::StrCat("data.batch_size: ", c.data.batch_size,
                                                   " is larger than the training split (",
                                                   split.train.size(), " examples)"));
  }
  TrainData d;
  d.shape.features = loaded->num_features();
  d.shape.num_classes = c.data.num_classes != 0 ? c.data.num_classes : loaded->num_classes;
  d.shape.x_dims = {c.data.batch_size, d.shape.features};
  d.shape.eval_batch = std::min<int64_t>(c.data.batch_size, split.held_out.size());
  if (with_train) {
    d.train = std::make_unique<CsvBatcher>(std::move(split.train), c.data.batch_size,
                                           c.data.shuffle, c.data.seed, c.data.remainder == "wrap");
  }
  d.held_out = std::make_unique<CsvEvalData>(std::move(split.held_out), d.shape.eval_batch);
  return d;
}

}  // namespace

absl::StatusOr<TrainData> OpenTrainData(const TrainConfig& config, bool language_model,
                                        bool with_train) {
  absl::StatusOr<TrainData> d = IsPipelineSource(config.data.source)
                                    ? OpenPipeline(config, language_model, with_train)
                                    : OpenCsv(config, with_train);
  if (d.ok()) d->shape.language_model = language_model;
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

}  // namespace kiln::train
