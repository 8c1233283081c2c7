// One served model version: a `kiln export` artifact compiled ahead of time at every batch size
// its batching config names (the preferred sizes and the max) and at the artifact's own batch
// size when that is no more than the max, once per instance, checked and
// warmed up before it is ready, behind a DynamicBatcher. A batch of R rows runs on the smallest
// compiled size >= R, padded with zero rows; nothing compiles at request time.
//
//   auto backend = runtime::MakeCpuBackend();
//   KILN_ASSIGN_OR_RETURN(auto m, ServedModel::Load("/models/mlp/1", "mlp", "1", config,
//                                                   backend.get()));
//   auto r = std::make_unique<BatchRequest>();
//   r->rows = 1;  r->inputs = {x};          // runtime inputs in signature order, [rows, ...]
//   r->done = [](absl::Status s, std::unique_ptr<BatchRequest> r) { ... r->outputs ... };
//   KILN_RETURN_IF_ERROR(m->Submit(std::move(r)));
//
// The artifact's runtime inputs and outputs must all have the same leading (batch) dimension.
// An artifact that records an input normalization (manifest metadata "input_normalization",
// input_normalization.h: a model trained with data.augment.normalize) has it applied to the
// real rows of every batch of that input, on the worker, before the batch runs: requests send
// raw inputs, as to `kiln predict`.
#ifndef KILN_SERVE_SERVED_MODEL_H_
#define KILN_SERVE_SERVED_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/compiler/artifact.h"
#include "kiln/runtime/executable.h"
#include "kiln/serve/batcher.h"
#include "kiln/serve/fixed_batch_runner.h"
#include "kiln/serve/input_normalization.h"

namespace kiln::serve {

// What a batch cost, for metrics.
struct BatchStats {
  int64_t rows = 0;    // real rows
  int64_t padded = 0;  // the compiled size it ran at
  int64_t compute_us = 0;
};

class ServedModel {
 public:
  // Loads, compiles (instances x batch sizes) and warms up. Errors name the artifact directory
  // and what failed. `backend` and `clock` (null: real) must outlive the model.
  static absl::StatusOr<std::unique_ptr<ServedModel>> Load(
      const std::string& dir, const std::string& name, const std::string& version,
      const BatchingConfig& config, runtime::Backend* backend, Clock* clock = nullptr);
  ~ServedModel();

  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const std::string& dir() const { return dir_; }
  // Runtime inputs and outputs, their leading dimension the artifact's batch size.
  const std::vector<compiler::TensorSpec>& inputs() const { return inputs_; }
  const std::vector<compiler::TensorSpec>& outputs() const { return outputs_; }
  int64_t artifact_batch() const { return artifact_batch_; }
  const std::vector<int64_t>& compiled_sizes() const { return sizes_; }
  const BatchingConfig& config() const { return batcher_->config(); }
  // The artifact's input normalization (nullopt: none), applied to every batch.
  const std::optional<InputNormalization>& normalization() const { return normalization_; }
  int64_t queue_depth() const { return batcher_->queue_depth(); }

  // Queues a request whose inputs are [rows, ...] in inputs() order (the caller checks shapes
  // and dtypes); see DynamicBatcher::Enqueue.
  absl::Status Submit(std::unique_ptr<BatchRequest> request);
  // Batches go out at once from now on (draining); see DynamicBatcher::Flush.
  void Flush() { batcher_->Flush(); }
  // Stops accepting and finishes what is queued.
  void Stop();
  // Called after every batch, on the worker thread.
  void set_batch_observer(std::function<void(const BatchStats&)> f) { observer_ = std::move(f); }

 private:
  struct Slot {  // one compiled size on one instance
    int64_t size = 0;
    std::unique_ptr<runtime::Executable> exe;
    // Runs exe on the padded batch buffers it owns (every parameter bound; fixed_batch_runner.h).
    std::optional<FixedBatchRunner> runner;
  };
  ServedModel() = default;
  absl::Status Compile(const compiler::Artifact& a, runtime::Backend* backend);
  absl::Status CheckRebatched(const compiler::Artifact& a, runtime::Backend* backend);
  absl::Status RunBatch(int instance, std::vector<BatchRequest*>& batch, int64_t rows);

  std::string dir_, name_, version_;
  std::vector<compiler::TensorSpec> inputs_, outputs_;
  int64_t artifact_batch_ = 0;
  std::vector<int64_t> sizes_;
  std::vector<std::vector<Slot>> slots_;  // [instance][size index]
  std::optional<InputNormalization> normalization_;
  int normalized_input_ = -1;  // its index in inputs_
  std::function<void(const BatchStats&)> observer_;
  Clock* clock_ = nullptr;  // the batcher's: BatchStats::compute_us
  std::unique_ptr<DynamicBatcher> batcher_;
};

}  // namespace kiln::serve

#endif  // KILN_SERVE_SERVED_MODEL_H_
