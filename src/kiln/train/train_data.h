// The data a trainer reads, behind two small interfaces: training batches (checkpointable
// position) and the held-out batches of one evaluation. A `data.source` is either a plain CSV
// file (held in memory, split once) or an input-pipeline source (digits:, records:,
// safetensors:, text:; data/pipeline.h).
//
//   KILN_ASSIGN_OR_RETURN(TrainData d, OpenTrainData(config, /*language_model=*/false,
//                                                    /*with_train=*/true));
//   KILN_RETURN_IF_ERROR(d.train->Next(x, y));     // x: d.shape.x_dims, y: [batch] labels
//
// `with_train = false` opens only the held-out split (kiln eval); the shapes are the same.
#ifndef KILN_TRAIN_TRAIN_DATA_H_
#define KILN_TRAIN_TRAIN_DATA_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/tensor/tensor.h"
#include "kiln/train/config.h"
#include "nlohmann/json.hpp"

namespace kiln::train {

// Where training batches come from; its State() goes into every checkpoint.
class Batcher {
 public:
  virtual ~Batcher() = default;
  virtual absl::Status Next(Tensor& x, Tensor& y) = 0;
  virtual nlohmann::json State() const = 0;
  virtual absl::Status Restore(const nlohmann::json& state) = 0;
  virtual int64_t epoch() const = 0;
};

// The held-out batches of one evaluation, in a fixed order.
class EvalData {
 public:
  virtual ~EvalData() = default;
  virtual absl::Status Reset() = 0;
  virtual int64_t batches() const = 0;
  virtual absl::Status Next(Tensor& x, Tensor& y) = 0;
};

struct DataShape {
  std::vector<int64_t> x_dims;  // one training batch of inputs: [batch, ...]
  int64_t features = 0;         // per example (language models: the sequence length)
  int64_t num_classes = 0;      // language models: the vocabulary size
  int64_t eval_batch = 0;       // examples per held-out batch
  bool language_model = false;  // s32 tokens -> s32 next tokens; else f32 features -> s32 labels
};

struct TrainData {
  std::unique_ptr<Batcher> train;  // null when opened without it
  std::unique_ptr<EvalData> held_out;
  DataShape shape;
};

absl::StatusOr<TrainData> OpenTrainData(const TrainConfig& config, bool language_model,
                                        bool with_train);

// x / y tensors shaped for `shape` with `batch` examples (training: config.data.batch_size).
Tensor MakeInputTensor(const DataShape& shape, int64_t batch);
Tensor MakeTargetTensor(const DataShape& shape, int64_t batch);

}  // namespace kiln::train

#endif  // KILN_TRAIN_TRAIN_DATA_H_
