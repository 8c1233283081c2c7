// Held-out evaluation, and loading a finished run for `kiln eval` / `kiln export`: the model and
// its parameters from a checkpoint, without compiling a training step or reading training data.
//
//   KILN_ASSIGN_OR_RETURN(LoadedRun run, LoadRun(config, {.restore_step = 40}));
//   KILN_ASSIGN_OR_RETURN(TrainData held, OpenTrainData(config, run.language_model, false));
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<Evaluator> e,
//                         Evaluator::Create(*backend, *run.model, std::move(held)));
//   KILN_ASSIGN_OR_RETURN(EvalResult r, e->Run(run.params, /*max_batches=*/0));
#ifndef KILN_TRAIN_EVALUATOR_H_
#define KILN_TRAIN_EVALUATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/nn/model.h"
#include "kiln/nn/params.h"
#include "kiln/runtime/executable.h"
#include "kiln/train/config.h"
#include "kiln/train/train_data.h"

namespace kiln::train {

// One language's held-out result (multilingual tokens: sources; data/train_data.h).
struct LanguageEval {
  std::string language;
  double loss = 0;        // mean cross-entropy per token over every held-out window, nats
  double accuracy = 0;    // next-token accuracy
  int64_t examples = 0;   // windows of data.seq_len tokens
  double perplexity = 0;  // exp(loss)
};

struct EvalResult {
  double loss = 0;        // mean cross-entropy (per example; per token for gpt), nats
  double accuracy = 0;    // classifiers: of examples; gpt: next-token accuracy over all positions
  int64_t examples = 0;   // examples (gpt: sequences of data.seq_len tokens)
  double perplexity = 0;  // gpt: exp(loss); 0 for classifiers
  // Two-class classifiers: the exact AUC of the score logits[1] - logits[0] over the evaluated
  // examples (data/click_metrics.h); -1 when not computed or one class is absent.
  double auc = -1;
  // recommender: per-user recall@recall_k over the evaluated impressions (the user is the first
  // id column); -1 when not computed.
  double recall_at_k = -1;
  int64_t recall_k = 0;
  // tokens: sources of a multilingual import: each language's held-out split, in the import's
  // language order, at the same batch shape (its last batch padded, the padding not counted).
  std::vector<LanguageEval> languages;
};

// " auc 0.7712 recall@10 0.4120" for the metrics an EvalResult has ("" for none).
std::string RankingText(const EvalResult& e);
// "eval/<language>/perplexity" (and loss, accuracy) of each language of `e`, the keys a trainer
// writes to metrics.jsonl / TensorBoard beside eval/loss.
std::map<std::string, double> LanguageScalars(const EvalResult& e);
// " held-out perplexity by language: de 41.20, en 35.07, ..." or "" without languages.
std::string LanguagePerplexityText(const EvalResult& e);

// One evaluation graph of a model at the held-out batch size (its predict graph with the loss
// added: outputs "loss" and "prediction", the logits stay inside its arena), compiled once, run
// over the held-out batches in a fixed order. It holds no parameters: each Run binds the given
// store's tensors as they are (no copy), so a trainer evaluates the weights where its TrainStep
// keeps them.
class Evaluator {
 public:
  // Takes `data.held_out` (data.train is left alone).
  static absl::StatusOr<std::unique_ptr<Evaluator>> Create(runtime::Backend& backend,
                                                           const nn::Model& model, TrainData& data);
  // `max_batches` 0: all full batches.
  absl::StatusOr<EvalResult> Run(const nn::ParamStore& params, int64_t max_batches);
  // K of the recommender's recall@K (default 10).
  void set_recall_k(int64_t k) { recall_k_ = k; }

  const runtime::Executable& executable() const { return *exe_; }
  // Bytes the evaluator keeps resident: the executable's arena and hoisted values, the batch and
  // output tensors.
  int64_t resident_bytes() const;
  // The data pointer of each parameter the last Run read, in the model's order (empty before
  // the first Run): the given store's own tensors.
  const std::vector<const void*>& last_parameter_data() const { return last_params_; }

 private:
  Evaluator() = default;
  // The batches of one held-out data set: loss summed over real positions, correct predictions,
  // real positions and examples.
  struct Sums {
    double loss = 0, batch_mean_sum = 0;
    int64_t correct = 0, positions = 0, examples = 0, batches = 0;
  };
  absl::StatusOr<Sums> RunData(EvalData& data, std::vector<const Tensor*>& in, int64_t max_batches,
                               bool collect_scores = false);

  std::unique_ptr<EvalData> data_;
  std::vector<data::LanguageEvalData> languages_;
  DataShape shape_;
  std::unique_ptr<runtime::Executable> exe_;
  std::vector<std::string> param_names_;  // the executable's first inputs, in order
  Tensor x_, y_, loss_, prediction_, score_;
  std::vector<const void*> last_params_;
  bool scored_ = false;  // a two-class classifier: the graph's third output is the score
  bool ranked_ = false;  // a recommender: recall@K per user (x's first column)
  int64_t recall_k_ = 10;
  std::vector<double> scores_;  // of one Run, reused
  std::vector<int> labels_;
  std::vector<int64_t> users_;
};

// Bytes of the values `exe` computed once when it was made (compiler::BufferPlan::hoisted: iotas,
// masks), each in a buffer of its own outside the arena.
int64_t HoistedBytes(const runtime::Executable& exe);

// The model's predict graph at `batch` with "loss" (the mean cross-entropy of its logits against
// a "labels" input, or "targets" for a language model, as in its loss graph) as its first output
// and "prediction" as its second; "logits" is no output. `with_score` (two-class logits only):
// a third output "score" f32 [batch], logits[:, 1] - logits[:, 0] (the ranking score: for the
// recommender, whose logits are [0, z], the click logit z).
absl::StatusOr<ir::Graph> BuildEvalGraph(const nn::Model& model, int64_t batch, bool language_model,
                                         bool with_score = false);

struct LoadOptions {
  Env* env = nullptr;         // the run directory's files; null: Env::Default()
  int64_t restore_step = -1;  // -1: the newest checkpoint of the run that verifies
  // A `step_N` folder anywhere (e.g. copied out of its run) instead of one under
  // OUTDIR/checkpoints.
  std::string restore_path;
  // Known data dimensions (from the held-out data), else the checkpoint's "model_dims" record,
  // the config (language models), or, for a checkpoint written before that record, the held-out
  // data's shape.
  const DataShape* shape = nullptr;
};

struct LoadedRun {
  std::unique_ptr<nn::Model> model;
  nn::ParamStore params;
  int64_t step = 0;
  bool language_model = false;
  std::string restored_from;       // the checkpoint directory
  std::vector<std::string> notes;  // skipped damaged or foreign checkpoints, config hash change
};

// Restores a checkpoint of the run in config.output_dir (only checkpoints of its run id) and
// builds its model. Writes nothing.
absl::StatusOr<LoadedRun> LoadRun(const TrainConfig& config, const LoadOptions& options);

}  // namespace kiln::train

#endif  // KILN_TRAIN_EVALUATOR_H_
