// Layers and the MLP classifier, written as graph code: a layer declares its parameters
// (params.h: name, type, seeded initializer) and applies itself to builder Values.
//
//   MlpClassifier mlp({.in_features = 64, .hidden = {64}, .num_classes = 10});
//   KILN_ASSIGN_OR_RETURN(ParamStore params, InitParams(mlp.Params(), /*seed=*/0));
//   KILN_ASSIGN_OR_RETURN(ir::Graph loss, mlp.LossGraph(/*batch=*/64));
//   // loss(fc0/weight, fc0/bias, fc1/weight, fc1/bias, x f32[64,64], labels s32[64])
//   //   -> {"loss": f32[]}   mean sparse cross-entropy
//
//   Conv2d conv("stem", {.in_channels = 1, .out_channels = 16, .conv = {.padding = {1, 1, 1, 1}}});
//   ir::Value y = ir::Relu(conv.Apply(params, x));          // x [N,1,H,W] -> [N,16,H,W]
//
// Parameter names are "<layer name><sep><leaf>" with sep '/' by default ("fc0/weight"); GPT uses
// '.' so its names are Hugging Face's. Initialization follows PyTorch's defaults for the layer
// (torch.nn.Linear / Conv2d: kaiming_uniform(a=sqrt(5)) weights and +-1/sqrt(fan_in) biases;
// Embedding N(0, 1); norms: ones and zeros) unless a model sets another initializer. Linear
// weights are stored [in, out] (x @ W + b): the transpose of torch.nn.Linear's [out, in], and
// exactly the layout of Hugging Face's Conv1D.
//
// Apply() never fails loudly: a missing parameter or a wrong input shape records an error in the
// input's builder (returned by Build()) and returns an unusable value.
#ifndef KILN_NN_LAYERS_H_
#define KILN_NN_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"
#include "kiln/nn/model.h"
#include "kiln/nn/params.h"

namespace kiln::nn {

// y = x @ weight + bias; x [..., in] -> [..., out]. Parameters "<name>/weight" [in, out] and
// "<name>/bias" [out].
class Linear {
 public:
  Linear(std::string name, int64_t in_features, int64_t out_features, bool bias = true,
         DType dtype = DType::kF32, char sep = '/');

  // Replaces the torch-default initializers (e.g. GPT-2's N(0, 0.02) weights and zero biases).
  Linear& set_init(Initializer weight, Initializer bias);

  std::vector<ParamSpec> Params() const;
  // Records an error in x's builder (and returns x) if a parameter is missing or x's last dim is
  // not in_features.
  ir::Value Apply(const ParamValues& params, ir::Value x) const;

  const std::string& name() const { return name_; }
  std::string weight_name() const { return JoinName(name_, "weight", sep_); }
  std::string bias_name() const { return JoinName(name_, "bias", sep_); }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  std::string name_;
  int64_t in_, out_;
  bool bias_;
  DType dtype_;
  char sep_;
  Initializer weight_init_, bias_init_;
};

// A lookup table: integer ids [...] -> rows [..., dim]. Parameter "<name>/weight" [num, dim],
// initialized N(0, 1) as torch.nn.Embedding. Ids outside [0, num) clamp (gather semantics); the
// gradient scatter-adds into the rows looked up.
class Embedding {
 public:
  Embedding(std::string name, int64_t num_embeddings, int64_t dim, DType dtype = DType::kF32,
            char sep = '/');
  Embedding& set_init(Initializer init);

  std::vector<ParamSpec> Params() const;
  ir::Value Apply(const ParamValues& params, ir::Value ids) const;
  std::string weight_name() const { return JoinName(name_, "weight", sep_); }
  int64_t num_embeddings() const { return num_; }
  int64_t dim() const { return dim_; }

 private:
  std::string name_;
  int64_t num_, dim_;
  DType dtype_;
  char sep_;
  Initializer init_;
};

// torch.nn.LayerNorm over the last dim: parameters "<name>/weight" (ones) and "<name>/bias"
// (zeros), both [dim]; biased variance, epsilon inside the square root.
class LayerNorm {
 public:
  LayerNorm(std::string name, int64_t dim, double epsilon = 1e-5, DType dtype = DType::kF32,
            char sep = '/');
  std::vector<ParamSpec> Params() const;
  ir::Value Apply(const ParamValues& params, ir::Value x) const;
  std::string weight_name() const { return JoinName(name_, "weight", sep_); }
  std::string bias_name() const { return JoinName(name_, "bias", sep_); }

 private:
  std::string name_;
  int64_t dim_;
  double epsilon_;
  DType dtype_;
  char sep_;
};

// RMSNorm over the last dim (x * rsqrt(mean(x^2) + eps) * weight): parameter "<name>/weight"
// [dim] (ones).
class RmsNorm {
 public:
  RmsNorm(std::string name, int64_t dim, double epsilon = 1e-6, DType dtype = DType::kF32,
          char sep = '/');
  std::vector<ParamSpec> Params() const;
  ir::Value Apply(const ParamValues& params, ir::Value x) const;
  std::string weight_name() const { return JoinName(name_, "weight", sep_); }

 private:
  std::string name_;
  int64_t dim_;
  double epsilon_;
  DType dtype_;
  char sep_;
};

struct Conv2dSpec {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel_h = 3;
  int64_t kernel_w = 3;
  ir::Conv2dOptions conv;  // strides, padding (top, bottom, left, right), dilation, groups
  bool bias = true;
};

// torch.nn.Conv2d: x [N, C, H, W] -> [N, O, H', W']. Parameters "<name>/weight" OIHW
// [out, in / groups, kh, kw] and "<name>/bias" [out], both uniform in +-1/sqrt(fan_in) with
// fan_in = in / groups * kh * kw.
class Conv2d {
 public:
  Conv2d(std::string name, Conv2dSpec spec, DType dtype = DType::kF32, char sep = '/');
  // InvalidArgument for non-positive sizes or channels not divisible by groups.
  absl::Status Validate() const;
  std::vector<ParamSpec> Params() const;
  ir::Value Apply(const ParamValues& params, ir::Value x) const;
  std::string weight_name() const { return JoinName(name_, "weight", sep_); }
  std::string bias_name() const { return JoinName(name_, "bias", sep_); }
  const Conv2dSpec& spec() const { return spec_; }

 private:
  std::string name_;
  Conv2dSpec spec_;
  DType dtype_;
  char sep_;
};

// Pooling over NCHW (no parameters). Square windows; `padding` on every side. AvgPool excludes
// the padding from the count (torch's count_include_pad=False); MaxPool's padding never wins.
ir::Value MaxPool(ir::Value x, int64_t window, int64_t stride, int64_t padding = 0);
ir::Value AvgPool(ir::Value x, int64_t window, int64_t stride, int64_t padding = 0);
// [N, C, H, W] -> [N, C]: the mean over each feature map.
ir::Value GlobalAvgPool(ir::Value x);

// Counters per step reserved for dropout sites: site s at step t draws with counter
// t * kDropoutSitesPerStep + s, so every (step, site) pair has its own random stream.
inline constexpr int64_t kDropoutSitesPerStep = int64_t{1} << 16;

// Inverted dropout (torch.nn.Dropout in training mode) drawing from ir::RandomBits keyed by
// "rng/seed" with a counter derived from "rng/step" and this layer's `site` (unique within a
// model, in [0, kDropoutSitesPerStep)). The mask is a pure function of (seed, step, site,
// element index), so a resumed run that feeds the same step drops the same elements. Identity in
// evaluation graphs (rng not training) and when rate is 0.
class Dropout {
 public:
  Dropout(double rate, int64_t site) : rate_(rate), site_(site) {}
  absl::Status Validate() const;
  ir::Value Apply(ir::Value x, const RngInputs& rng) const;
  double rate() const { return rate_; }
  int64_t site() const { return site_; }

 private:
  double rate_;
  int64_t site_;
};

// kGelu is the exact (erf) GELU; kGeluTanh the tanh approximation (torch approximate="tanh",
// Hugging Face "gelu_new", GPT-2's).
enum class Activation { kRelu, kTanh, kGelu, kGeluTanh, kSilu };
ir::Value Activate(ir::Value x, Activation activation);

struct MlpOptions {
  int64_t in_features = 0;
  std::vector<int64_t> hidden;  // widths of the hidden layers; empty = linear classifier
  int64_t num_classes = 0;
  Activation activation = Activation::kRelu;
  DType dtype = DType::kF32;
};

// in -> [Linear -> activation] per hidden width -> Linear -> logits. Layers are named fc0, fc1,
// ... in order, the last one producing the logits.
class MlpClassifier : public Model {
 public:
  explicit MlpClassifier(MlpOptions options);

  // InvalidArgument when a width is < 1.
  absl::Status Validate() const override;
  std::vector<ParamSpec> Params() const override;
  // x [batch, in] -> logits [batch, num_classes].
  ir::Value Logits(const ParamValues& params, ir::Value x) const;

  // Graph parameters: Params() in order, then "x" [batch, in] and "labels" s32[batch].
  // Output "loss": mean over the batch of sparse cross-entropy (PyTorch's cross_entropy).
  absl::StatusOr<ir::Graph> LossGraph(int64_t batch) const override;
  // Graph parameters: Params() in order, then "x" [batch, in]. Outputs "logits" and
  // "prediction" (s32 [batch], argmax of the logits).
  absl::StatusOr<ir::Graph> PredictGraph(int64_t batch) const override;

  const MlpOptions& options() const { return options_; }
  const std::vector<Linear>& layers() const { return layers_; }
  // "64-64-10"
  std::string Describe() const override;

 private:
  MlpOptions options_;
  std::vector<Linear> layers_;
};

}  // namespace kiln::nn

#endif  // KILN_NN_LAYERS_H_
