#include "kiln/nn/layers.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::nn {

Linear::Linear(std::string name, int64_t in_features, int64_t out_features, bool bias, DType dtype)
    : name_(std::move(name)), in_(in_features), out_(out_features), bias_(bias), dtype_(dtype) {}

std::vector<ParamSpec> Linear::Params() const {
  // torch.nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) for the weight, and the bias
  // uniform in +-1/sqrt(fan_in); both come to +-1/sqrt(in_features).
  std::vector<ParamSpec> specs;
  specs.push_back(
      {weight_name(), dtype_, Shape{in_, out_}, Initializer::KaimingUniform(in_, std::sqrt(5.0))});
  if (bias_) {
    specs.push_back(
        {bias_name(), dtype_, Shape{out_},
         Initializer::Uniform(in_ > 0 ? 1.0 / std::sqrt(static_cast<double>(in_)) : 0)});
  }
  return specs;
}

ir::Value Linear::Apply(const ParamValues& params, ir::Value x) const {
  ir::Builder& b = *x.builder();
  if (!b.status().ok()) return x;
  if (x.rank() < 1 || x.dim(-1) != in_) {
    b.SetError(absl::InvalidArgumentError(absl::StrCat("layer ", name_, " expects input [..., ",
                                                       in_, "], got ", x.type().ToString())));
    return x;
  }
  ir::Value w = Lookup(b, params, weight_name());
  if (!w.valid()) return x;
  ir::Value y;
  if (x.rank() == 2) {
    y = ir::MatMul(x, w);
  } else {
    // Contract the last dim of x with the first of w: [..., in] x [in, out] -> [..., out].
    y = ir::DotGeneral(x, w, {{}, {}, {x.rank() - 1}, {0}});
  }
  if (!bias_) return y;
  ir::Value bias = Lookup(b, params, bias_name());
  if (!bias.valid()) return x;
  return y + bias;
}

MlpClassifier::MlpClassifier(MlpOptions options) : options_(std::move(options)) {
  int64_t in = options_.in_features;
  int i = 0;
  for (int64_t width : options_.hidden) {
    layers_.emplace_back(absl::StrCat("fc", i++), in, width, true, options_.dtype);
    in = width;
  }
  layers_.emplace_back(absl::StrCat("fc", i), in, options_.num_classes, true, options_.dtype);
}

absl::Status MlpClassifier::Validate() const {
  if (options_.in_features < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLP input features must be >= 1, got ", options_.in_features));
  }
  for (int64_t width : options_.hidden) {
    if (width < 1) {
      return absl::InvalidArgumentError(absl::StrCat("MLP hidden width must be >= 1, got ", width));
    }
  }
  if (options_.num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLP classifier needs >= 2 classes, got ", options_.num_classes));
  }
  if (!IsFloating(options_.dtype) || IsStorageOnly(options_.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("MLP dtype must be a compute float, got ",
                                                   std::string(DTypeName(options_.dtype))));
  }
  return absl::OkStatus();
}

std::vector<ParamSpec> MlpClassifier::Params() const {
  std::vector<ParamSpec> specs;
  for (const Linear& layer : layers_) {
    for (ParamSpec& s : layer.Params()) specs.push_back(std::move(s));
  }
  return specs;
}

ir::Value MlpClassifier::Logits(const ParamValues& params, ir::Value x) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    x = layers_[i].Apply(params, x);
    if (i + 1 == layers_.size()) break;
    switch (options_.activation) {
      case Activation::kRelu:
        x = ir::Relu(x);
        break;
      case Activation::kTanh:
        x = ir::Tanh(x);
        break;
      case Activation::kGelu:
        x = ir::Gelu(x);
        break;
    }
  }
  return x;
}

absl::StatusOr<ir::Graph> MlpClassifier::LossGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", batch));
  ir::Builder b("mlp_loss");
  ParamValues p = AddParameters(b, Params());
  ir::Value x = b.Parameter("x", options_.dtype, Shape{batch, options_.in_features});
  ir::Value labels = b.Parameter("labels", DType::kS32, Shape{batch});
  ir::Value per_example = ir::SparseCrossEntropy(Logits(p, x), labels);
  b.Output("loss", ir::Mean(per_example, {0}));
  return b.Build();
}

absl::StatusOr<ir::Graph> MlpClassifier::PredictGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", batch));
  ir::Builder b("mlp_predict");
  ParamValues p = AddParameters(b, Params());
  ir::Value x = b.Parameter("x", options_.dtype, Shape{batch, options_.in_features});
  ir::Value logits = Logits(p, x);
  b.Output("logits", logits);
  b.Output("prediction", ir::ArgMax(logits, 1));
  return b.Build();
}

std::string MlpClassifier::Describe() const {
  std::string s = absl::StrCat(options_.in_features);
  for (const Linear& layer : layers_) absl::StrAppend(&s, "-", layer.out_features());
  return s;
}

}  // namespace kiln::nn
