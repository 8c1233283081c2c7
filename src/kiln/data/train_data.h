// data::OpenTrainData: from a trainer's data section, the input it reads: training batches (with a
// checkpointable position) and the held-out batches of one evaluation, both from input pipelines
// (pipeline.h). `source` is a pipeline source (digits:, records:, safetensors:, text:) or a plain
// CSV path (.csv / .csv.gz, digits layout), which reads as the pipeline's csv: source: split,
// ordered and batched as Kiln's trainer always has for a CSV file, so a run on one keeps its
// batches across versions.
//
//   TrainDataConfig sc;
//   sc.source = "examples/data/digits.csv.gz";  // or "records:/data/shards", "text:FILE", ...
//   sc.batch_size = 64;
//   KILN_ASSIGN_OR_RETURN(TrainData s, OpenTrainData(sc, /*with_train=*/true));
//   Tensor x = MakeInputTensor(s.shape, sc.batch_size), y = MakeTargetTensor(s.shape, 64);
//   KILN_RETURN_IF_ERROR(s.train->Next(x, y));     // x: s.shape.x_dims, y: [batch] labels
//   nlohmann::json state = s.train->State();       // into the checkpoint; Restore(state) later
//
// `with_train = false` opens only the held-out split (kiln eval); the shapes are the same.
#ifndef KILN_DATA_TRAIN_DATA_H_
#define KILN_DATA_TRAIN_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/augment.h"
#include "kiln/tensor/tensor.h"
#include "nlohmann/json.hpp"

namespace kiln::data {

// Where training batches come from; its State() goes into every checkpoint.
class Batcher {
 public:
  virtual ~Batcher() = default;
  virtual absl::Status Next(Tensor& x, Tensor& y) = 0;
  virtual nlohmann::json State() const = 0;
  virtual absl::Status Restore(const nlohmann::json& state) = 0;
  virtual int64_t epoch() const = 0;
  // The prefetch queue's depth now (0: none) and the mean time it measured per batch produced
  // (pipeline.h); 0 when unknown.
  virtual int prefetch_depth() const { return 0; }
  virtual double mean_produce_seconds() const { return 0; }
  // Threads producing batches (0: the caller's own, or unknown).
  virtual int workers() const { return 0; }
};

// The held-out batches of one evaluation, in a fixed order.
class EvalData {
 public:
  virtual ~EvalData() = default;
  virtual absl::Status Reset() = 0;
  virtual int64_t batches() const = 0;
  virtual absl::Status Next(Tensor& x, Tensor& y) = 0;
  // Rows of the last batch that are real examples (the rest padding: features 0, labels -1,
  // which the loss ignores); the whole batch unless the data pads its last batch.
  virtual int64_t last_real_examples() const { return -1; }
};

// A multilingual text import's held-out data, one language (tokens: sources): every held-out
// window of that language, the last batch padded.
struct LanguageEvalData {
  std::string language;
  std::unique_ptr<EvalData> data;
  int64_t examples = 0;
};

struct DataShape {
  std::vector<int64_t> x_dims;  // one training batch of inputs: [batch, ...]
  int64_t features = 0;         // per example (language models: the sequence length)
  int64_t num_classes = 0;      // language models: the vocabulary size
  int64_t eval_batch = 0;       // examples per held-out batch
  bool language_model = false;  // s32 tokens -> s32 next tokens; else f32 features -> s32 labels
  // A clicks dataset (data/click_log.h): the rows of each sparse feature's id space, in x's
  // column order (the ids lead each row); empty for other sources.
  std::vector<int64_t> categorical_sizes;
};

struct TrainData {
  std::unique_ptr<Batcher> train;  // null when opened without it
  std::unique_ptr<EvalData> held_out;
  DataShape shape;
  int64_t train_examples = 0;     // per epoch (0 when opened without train)
  int64_t held_out_examples = 0;  // in the held-out split (evaluations use whole batches of it)
  // tokens: sources of a multilingual import (text_import.h): each language's held-out data at
  // the held-out batch shape, for per-language perplexity. Empty otherwise.
  std::vector<LanguageEvalData> held_out_by_language;
};

// A trainer's data section (train::DataConfig) as the data layer needs it.
struct TrainDataConfig {
  std::string source;
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;  // the shuffle seed, and the seed of the train / held-out split
  double held_out_fraction = 0.2;
  // "drop" | "pad" (pipeline sources only) | "wrap" (plain CSV paths only).
  std::string remainder = "drop";
  int64_t shuffle_buffer = 0;  // pipeline sources only: a plain CSV path always permutes fully
  int prefetch = 2;            // kAutoPrefetch (pipeline.h): sized from measured times
  int workers = 1;             // threads producing train batches; kAutoWorkers (pipeline.h)
  // Image augmentation of the features (augment.h): train batches get the random draws, held-out
  // batches the centre crop and normalization.
  AugmentConfig augment;
  int64_t num_classes = 0;  // 0: infer (digits and CSV: 10; required for other classifiers)
  int64_t seq_len = 0;      // text: sources
  // A language model (s32 tokens -> s32 next tokens, num_classes = vocab_size) or a classifier
  // (f32 features -> s32 labels).
  bool language_model = false;
  int64_t vocab_size = 0;
};

// A plain path (no "kind:" prefix of the pipeline's): a CSV file read as csv:PATH.
bool IsPlainCsvPath(const std::string& source);

// Errors name the config key (data.source, data.remainder, data.batch_size, ...).
absl::StatusOr<TrainData> OpenTrainData(const TrainDataConfig& config, bool with_train,
                                        Env* env = Env::Default());

// x / y tensors shaped for `shape` with `batch` examples (training: the config's batch_size).
Tensor MakeInputTensor(const DataShape& shape, int64_t batch);
Tensor MakeTargetTensor(const DataShape& shape, int64_t batch);

}  // namespace kiln::data

#endif  // KILN_DATA_TRAIN_DATA_H_
