// An image classifier to run offline (kiln::predict, the layer beside kiln::serve that runs
// exported programs and runs on examples; the cli wires it): an exported artifact, or a run
// directory's newest checkpoint compiled here, taking one f32 [batch, features] input and giving
// "logits" f32 [batch, classes]. Rows run through serve::FixedBatchRunner (whole batches, the
// last one zero-padded) and come back as softmax probabilities. `kiln predict --input-dir` uses it
// (studies.h).
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<Classifier> m,
//                         Classifier::OpenArtifact("/tmp/cnn", runtime::MakeCpuBackend()));
//   std::vector<const float*> rows = ...;   // each m->features() floats, normalized
//   KILN_ASSIGN_OR_RETURN(std::vector<std::vector<double>> p, m->Classify(rows));
#ifndef KILN_PREDICT_CLASSIFIER_H_
#define KILN_PREDICT_CLASSIFIER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/runtime/executable.h"
#include "kiln/serve/fixed_batch_runner.h"
#include "kiln/serve/input_normalization.h"
#include "kiln/train/config.h"

namespace kiln::predict {

class Classifier {
 public:
  // An artifact from `kiln export` (its batch; its recorded input normalization). Errors name
  // the directory and what does not fit.
  static absl::StatusOr<std::unique_ptr<Classifier>> OpenArtifact(
      const std::string& dir, std::unique_ptr<runtime::Backend> backend);
  // The newest checkpoint of the run `config` describes, its predict graph compiled at `batch`;
  // `normalization`: the run's data.augment.normalize (cli/input_normalization.h), if any.
  static absl::StatusOr<std::unique_ptr<Classifier>> OpenRun(
      const train::TrainConfig& config, int64_t batch, std::unique_ptr<runtime::Backend> backend,
      std::optional<serve::InputNormalization> normalization);

  int64_t batch() const { return runner_->batch(); }
  int64_t features() const { return features_; }
  int64_t classes() const { return classes_; }
  // The training pipeline's data.augment.normalize, which the caller applies to each row before
  // Classify (after the dataset's own normalization); nullopt when it trained without one.
  const std::optional<serve::InputNormalization>& normalization() const { return norm_; }

  // Softmax probabilities of each row (features() floats), in order, batch() rows per run.
  absl::StatusOr<std::vector<std::vector<double>>> Classify(const std::vector<const float*>& rows);

 private:
  Classifier() = default;

  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<runtime::Executable> exe_;
  std::optional<serve::FixedBatchRunner> runner_;  // over exe_
  std::optional<serve::InputNormalization> norm_;
  size_t logits_ = 0;
  int64_t features_ = 0, classes_ = 0;
};

}  // namespace kiln::predict

#endif  // KILN_PREDICT_CLASSIFIER_H_
