// The interface every model of the zoo implements (MLP, ResNet-style CNN, ViT, GPT), so the
// trainer, the CLI and checkpoints handle them alike, and the shared builder of classifier graphs.
//
//   std::unique_ptr<Model> model = std::make_unique<ResNetCnn>(ResNetOptions{...});
//   KILN_RETURN_IF_ERROR(model->Validate());
//   KILN_ASSIGN_OR_RETURN(ParamStore params, InitParams(model->Params(), /*seed=*/0));
//   KILN_ASSIGN_OR_RETURN(ir::Graph loss, model->TrainLossGraph(/*batch=*/32));
//
// Graph signatures: parameters first (Params(), in order), then the data inputs (a classifier:
// "x" and "labels"; GPT: "tokens" and "targets"), then, only in a training graph of a model with
// dropout, "rng/seed" and "rng/step" (s64[], see Dropout in layers.h). Loss graphs output "loss"
// (f32[], the batch mean); predict graphs output "logits" and "prediction" (argmax).
#ifndef KILN_NN_MODEL_H_
#define KILN_NN_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"
#include "kiln/nn/params.h"

namespace kiln::nn {

// Graph inputs that feed dropout in a training graph: a seed and the step count (s64[] each).
inline constexpr char kRngSeedInput[] = "rng/seed";
inline constexpr char kRngStepInput[] = "rng/step";

// The randomness a graph's dropout layers draw from. Invalid values (the default) mean an
// evaluation graph: dropout is the identity.
struct RngInputs {
  ir::Value seed, step;
  bool training() const { return seed.valid() && step.valid(); }
  // Adds "rng/seed" and "rng/step" as the builder's next two parameters.
  static RngInputs AddParameters(ir::Builder& b);
};

class Model {
 public:
  virtual ~Model() = default;

  // InvalidArgument naming the bad option.
  virtual absl::Status Validate() const = 0;
  virtual std::vector<ParamSpec> Params() const = 0;
  // The evaluation loss (dropout off).
  virtual absl::StatusOr<ir::Graph> LossGraph(int64_t batch) const = 0;
  // The training loss: dropout on. Models without dropout return LossGraph(batch).
  virtual absl::StatusOr<ir::Graph> TrainLossGraph(int64_t batch) const { return LossGraph(batch); }
  // Data inputs as the loss graph less the labels/targets; outputs "logits" and "prediction".
  virtual absl::StatusOr<ir::Graph> PredictGraph(int64_t batch) const = 0;
  // A one-line summary, e.g. "resnet 1x8x8 widths 16-32 blocks 1 -> 10".
  virtual std::string Describe() const = 0;
};

// x [batch, in] (already in the model's layout) -> logits [batch, classes].
using LogitsFn =
    std::function<ir::Value(const ParamValues& params, ir::Value x, const RngInputs& rng)>;

// The standard graphs of a classifier over flat feature vectors: parameters `specs`, then
// "x" (`dtype` [batch, features]) and, for the loss, "labels" (s32 [batch]); a training graph
// (training && has_dropout) also takes "rng/seed" and "rng/step". The loss is the batch mean of
// sparse cross-entropy.
absl::StatusOr<ir::Graph> BuildClassifierLossGraph(const std::string& name,
                                                   const std::vector<ParamSpec>& specs, DType dtype,
                                                   int64_t batch, int64_t features, bool with_rng,
                                                   const LogitsFn& logits);
absl::StatusOr<ir::Graph> BuildClassifierPredictGraph(const std::string& name,
                                                      const std::vector<ParamSpec>& specs,
                                                      DType dtype, int64_t batch, int64_t features,
                                                      const LogitsFn& logits);

}  // namespace kiln::nn

#endif  // KILN_NN_MODEL_H_
