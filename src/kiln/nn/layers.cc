#include "kiln/nn/layers.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::nn {
namespace {

// Records an error naming the layer when x's last dim is not `dim`; false when x is unusable.
bool CheckLastDim(ir::Value x, int64_t dim, const std::string& layer) {
  if (!x.valid()) return false;
  ir::Builder& b = *x.builder();
  if (!b.status().ok()) return false;
  if (x.rank() < 1 || x.dim(-1) != dim) {
    b.SetError(absl::InvalidArgumentError(absl::StrCat("layer ", layer, " expects input [..., ",
                                                       dim, "], got ", x.type().ToString())));
    return false;
  }
  return true;
}

double InvSqrt(int64_t n) { return n > 0 ? 1.0 / std::sqrt(static_cast<double>(n)) : 0.0; }

}  // namespace

RngInputs RngInputs::AddParameters(ir::Builder& b) {
  RngInputs rng;
  rng.seed = b.Parameter(kRngSeedInput, DType::kS64, Shape{});
  rng.step = b.Parameter(kRngStepInput, DType::kS64, Shape{});
  return rng;
}

// ---- Linear ----

Linear::Linear(std::string name, int64_t in_features, int64_t out_features, bool bias, DType dtype,
               char sep)
    : name_(std::move(name)),
      in_(in_features),
      out_(out_features),
      bias_(bias),
      dtype_(dtype),
      sep_(sep),
      // torch.nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) for the weight, and the
      // bias uniform in +-1/sqrt(fan_in); both come to +-1/sqrt(in_features).
      weight_init_(Initializer::KaimingUniform(in_features, std::sqrt(5.0))),
      bias_init_(Initializer::Uniform(InvSqrt(in_features))) {}

Linear& Linear::set_init(Initializer weight, Initializer bias) {
  weight_init_ = weight;
  bias_init_ = bias;
  return *this;
}

std::vector<ParamSpec> Linear::Params() const {
  std::vector<ParamSpec> specs;
  specs.push_back({weight_name(), dtype_, Shape{in_, out_}, weight_init_});
  if (bias_) specs.push_back({bias_name(), dtype_, Shape{out_}, bias_init_});
  return specs;
}

ir::Value Linear::Apply(const ParamValues& params, ir::Value x) const {
  if (!CheckLastDim(x, in_, name_)) return x;
  ir::Builder& b = *x.builder();
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

// ---- Embedding ----

Embedding::Embedding(std::string name, int64_t num_embeddings, int64_t dim, DType dtype, char sep)
    : name_(std::move(name)),
      num_(num_embeddings),
      dim_(dim),
      dtype_(dtype),
      sep_(sep),
      init_(Initializer::Normal(1.0)) {}

Embedding& Embedding::set_init(Initializer init) {
  init_ = init;
  return *this;
}

std::vector<ParamSpec> Embedding::Params() const {
  return {{weight_name(), dtype_, Shape{num_, dim_}, init_}};
}

ir::Value Embedding::Apply(const ParamValues& params, ir::Value ids) const {
  if (!ids.valid() || !ids.builder()->status().ok()) return ids;
  ir::Builder& b = *ids.builder();
  if (!IsInteger(ids.dtype())) {
    b.SetError(absl::InvalidArgumentError(
        absl::StrCat("layer ", name_, " expects integer ids, got ", ids.type().ToString())));
    return ids;
  }
  ir::Value table = Lookup(b, params, weight_name());
  if (!table.valid()) return ids;
  return ir::Gather(table, ids, 0);
}

// ---- LayerNorm / RmsNorm ----

LayerNorm::LayerNorm(std::string name, int64_t dim, double epsilon, DType dtype, char sep)
    : name_(std::move(name)), dim_(dim), epsilon_(epsilon), dtype_(dtype), sep_(sep) {}

std::vector<ParamSpec> LayerNorm::Params() const {
  return {{weight_name(), dtype_, Shape{dim_}, Initializer::Ones()},
          {bias_name(), dtype_, Shape{dim_}, Initializer::Zeros()}};
}

ir::Value LayerNorm::Apply(const ParamValues& params, ir::Value x) const {
  if (!CheckLastDim(x, dim_, name_)) return x;
  ir::Builder& b = *x.builder();
  ir::Value gamma = Lookup(b, params, weight_name());
  ir::Value beta = Lookup(b, params, bias_name());
  if (!gamma.valid() || !beta.valid()) return x;
  return ir::LayerNorm(x, gamma, beta, epsilon_);
}

RmsNorm::RmsNorm(std::string name, int64_t dim, double epsilon, DType dtype, char sep)
    : name_(std::move(name)), dim_(dim), epsilon_(epsilon), dtype_(dtype), sep_(sep) {}

std::vector<ParamSpec> RmsNorm::Params() const {
  return {{weight_name(), dtype_, Shape{dim_}, Initializer::Ones()}};
}

ir::Value RmsNorm::Apply(const ParamValues& params, ir::Value x) const {
  if (!CheckLastDim(x, dim_, name_)) return x;
  ir::Value gamma = Lookup(*x.builder(), params, weight_name());
  if (!gamma.valid()) return x;
  return ir::RmsNorm(x, gamma, epsilon_);
}

// ---- Conv2d ----

Conv2d::Conv2d(std::string name, Conv2dSpec spec, DType dtype, char sep)
    : name_(std::move(name)), spec_(std::move(spec)), dtype_(dtype), sep_(sep) {}

absl::Status Conv2d::Validate() const {
  const Conv2dSpec& s = spec_;
  if (s.in_channels < 1 || s.out_channels < 1 || s.kernel_h < 1 || s.kernel_w < 1 ||
      s.conv.groups < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("conv ", name_, ": channels, kernel and groups must be >= 1, got in ",
                     s.in_channels, " out ", s.out_channels, " kernel ", s.kernel_h, "x",
                     s.kernel_w, " groups ", s.conv.groups));
  }
  if (s.in_channels % s.conv.groups != 0 || s.out_channels % s.conv.groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("conv ", name_, ": groups ", s.conv.groups,
                                                   " must divide in (", s.in_channels,
                                                   ") and out (", s.out_channels, ") channels"));
  }
  return absl::OkStatus();
}

std::vector<ParamSpec> Conv2d::Params() const {
  const Conv2dSpec& s = spec_;
  const int64_t in_per_group = s.conv.groups > 0 ? s.in_channels / s.conv.groups : 0;
  const int64_t fan_in = in_per_group * s.kernel_h * s.kernel_w;
  std::vector<ParamSpec> specs;
  specs.push_back({weight_name(), dtype_,
                   Shape{s.out_channels, in_per_group, s.kernel_h, s.kernel_w},
                   Initializer::KaimingUniform(fan_in, std::sqrt(5.0))});
  if (s.bias) {
    specs.push_back(
        {bias_name(), dtype_, Shape{s.out_channels}, Initializer::Uniform(InvSqrt(fan_in))});
  }
  return specs;
}

ir::Value Conv2d::Apply(const ParamValues& params, ir::Value x) const {
  if (!x.valid() || !x.builder()->status().ok()) return x;
  ir::Builder& b = *x.builder();
  if (x.rank() != 4 || x.dim(1) != spec_.in_channels) {
    b.SetError(absl::InvalidArgumentError(absl::StrCat("layer ", name_, " expects input [N, ",
                                                       spec_.in_channels, ", H, W], got ",
                                                       x.type().ToString())));
    return x;
  }
  ir::Value w = Lookup(b, params, weight_name());
  if (!w.valid()) return x;
  ir::Value y = ir::Conv2d(x, w, spec_.conv);
  if (!spec_.bias || !y.valid()) return y;
  ir::Value bias = Lookup(b, params, bias_name());
  if (!bias.valid()) return x;
  return y + ir::BroadcastInDim(bias, y.shape(), {1});
}

// ---- pooling ----

ir::Value MaxPool(ir::Value x, int64_t window, int64_t stride, int64_t padding) {
  return ir::MaxPool2d(x, {.window = {window, window},
                           .strides = {stride, stride},
                           .padding = {padding, padding, padding, padding}});
}

ir::Value AvgPool(ir::Value x, int64_t window, int64_t stride, int64_t padding) {
  return ir::AvgPool2d(x, {.window = {window, window},
                           .strides = {stride, stride},
                           .padding = {padding, padding, padding, padding},
                           .count_include_pad = false});
}

ir::Value GlobalAvgPool(ir::Value x) {
  if (!x.valid() || !x.builder()->status().ok()) return x;
  if (x.rank() != 4) {
    x.builder()->SetError(absl::InvalidArgumentError(
        absl::StrCat("global average pooling expects [N, C, H, W], got ", x.type().ToString())));
    return x;
  }
  return ir::Mean(x, {2, 3});
}

// ---- Dropout ----

absl::Status Dropout::Validate() const {
  if (!(rate_ >= 0.0 && rate_ < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("dropout rate must be in [0, 1), got ", rate_));
  }
  if (site_ < 0 || site_ >= kDropoutSitesPerStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("dropout site must be in [0, ", kDropoutSitesPerStep, "), got ", site_));
  }
  return absl::OkStatus();
}

ir::Value Dropout::Apply(ir::Value x, const RngInputs& rng) const {
  if (!x.valid() || !x.builder()->status().ok()) return x;
  if (!rng.training() || rate_ == 0.0) return x;
  absl::Status valid = Validate();
  if (!valid.ok()) {
    x.builder()->SetError(valid);
    return x;
  }
  ir::Value counter = rng.step * static_cast<double>(kDropoutSitesPerStep);
  if (site_ != 0) counter = counter + static_cast<double>(site_);
  return ir::Dropout(x, rate_, rng.seed, counter);
}

ir::Value Activate(ir::Value x, Activation activation) {
  switch (activation) {
    case Activation::kRelu:
      return ir::Relu(x);
    case Activation::kTanh:
      return ir::Tanh(x);
    case Activation::kGelu:
      return ir::Gelu(x, /*tanh_approximation=*/false);
    case Activation::kGeluTanh:
      return ir::Gelu(x, /*tanh_approximation=*/true);
    case Activation::kSilu:
      return ir::Silu(x);
  }
  return x;
}

// ---- MlpClassifier ----

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
    x = Activate(x, options_.activation);
  }
  return x;
}

absl::StatusOr<ir::Graph> MlpClassifier::LossGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  return BuildClassifierLossGraph(
      "mlp_loss", Params(), options_.dtype, batch, options_.in_features, /*with_rng=*/false,
      [this](const ParamValues& p, ir::Value x, const RngInputs&) { return Logits(p, x); });
}

absl::StatusOr<ir::Graph> MlpClassifier::PredictGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  return BuildClassifierPredictGraph(
      "mlp_predict", Params(), options_.dtype, batch, options_.in_features,
      [this](const ParamValues& p, ir::Value x, const RngInputs&) { return Logits(p, x); });
}

std::string MlpClassifier::Describe() const {
  std::string s = absl::StrCat(options_.in_features);
  for (const Linear& layer : layers_) absl::StrAppend(&s, "-", layer.out_features());
  return s;
}

}  // namespace kiln::nn
