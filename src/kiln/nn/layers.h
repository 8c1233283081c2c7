// Layers and the MLP classifier, written as graph code: a layer declares its parameters
// (params.h) and applies itself to builder Values.
//
//   MlpClassifier mlp({.in_features = 64, .hidden = {64}, .num_classes = 10});
//   KILN_ASSIGN_OR_RETURN(ParamStore params, InitParams(mlp.Params(), /*seed=*/0));
//   KILN_ASSIGN_OR_RETURN(ir::Graph loss, mlp.LossGraph(/*batch=*/64));
//   // loss(fc0/weight, fc0/bias, fc1/weight, fc1/bias, x f32[64,64], labels s32[64])
//   //   -> {"loss": f32[]}   mean sparse cross-entropy
//
// Initialization follows torch.nn.Linear: weight and bias uniform in +-1/sqrt(in_features).
// Weights are stored [in, out] (x @ W + b), the transpose of torch's [out, in].
#ifndef KILN_NN_LAYERS_H_
#define KILN_NN_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"
#include "kiln/nn/params.h"

namespace kiln::nn {

// y = x @ weight + bias; x [..., in] -> [..., out]. Parameters "<name>/weight" [in, out] and
// "<name>/bias" [out].
class Linear {
 public:
  Linear(std::string name, int64_t in_features, int64_t out_features, bool bias = true,
         DType dtype = DType::kF32);

  std::vector<ParamSpec> Params() const;
  // Records an error in x's builder (and returns x) if a parameter is missing or x's last dim is
  // not in_features.
  ir::Value Apply(const ParamValues& params, ir::Value x) const;

  const std::string& name() const { return name_; }
  std::string weight_name() const { return name_ + "/weight"; }
  std::string bias_name() const { return name_ + "/bias"; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  std::string name_;
  int64_t in_, out_;
  bool bias_;
  DType dtype_;
};

enum class Activation { kRelu, kTanh, kGelu };

struct MlpOptions {
  int64_t in_features = 0;
  std::vector<int64_t> hidden;  // widths of the hidden layers; empty = linear classifier
  int64_t num_classes = 0;
  Activation activation = Activation::kRelu;
  DType dtype = DType::kF32;
};

// in -> [Linear -> activation] per hidden width -> Linear -> logits. Layers are named fc0, fc1,
// ... in order, the last one producing the logits.
class MlpClassifier {
 public:
  explicit MlpClassifier(MlpOptions options);

  // InvalidArgument when a width is < 1.
  absl::Status Validate() const;
  std::vector<ParamSpec> Params() const;
  // x [batch, in] -> logits [batch, num_classes].
  ir::Value Logits(const ParamValues& params, ir::Value x) const;

  // Graph parameters: Params() in order, then "x" [batch, in] and "labels" s32 [batch].
  // Output "loss": mean over the batch of sparse cross-entropy (PyTorch's cross_entropy).
  absl::StatusOr<ir::Graph> LossGraph(int64_t batch) const;
  // Graph parameters: Params() in order, then "x" [batch, in]. Outputs "logits" and
  // "prediction" (s32 [batch], argmax of the logits).
  absl::StatusOr<ir::Graph> PredictGraph(int64_t batch) const;

  const MlpOptions& options() const { return options_; }
  const std::vector<Linear>& layers() const { return layers_; }
  // "64-64-10"
  std::string Describe() const;

 private:
  MlpOptions options_;
  std::vector<Linear> layers_;
};

}  // namespace kiln::nn

#endif  // KILN_NN_LAYERS_H_
