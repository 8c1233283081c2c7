#include "kiln/nn/vision.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::nn {
namespace {

void Append(std::vector<ParamSpec>& to, std::vector<ParamSpec> from) {
  for (ParamSpec& s : from) to.push_back(std::move(s));
}

Conv2dSpec Conv3x3(int64_t in, int64_t out) {
  return {.in_channels = in,
          .out_channels = out,
          .kernel_h = 3,
          .kernel_w = 3,
          .conv = {.padding = {1, 1, 1, 1}}};
}

}  // namespace

// ---- ResNetCnn ----

ResNetCnn::ResNetCnn(ResNetOptions options)
    : options_(std::move(options)),
      stem_("stem",
            Conv3x3(options_.in_channels, options_.widths.empty() ? 1 : options_.widths[0])),
      head_("head", options_.widths.empty() ? 1 : options_.widths.back(), options_.num_classes) {
  for (size_t s = 0; s < options_.widths.size(); ++s) {
    Stage stage;
    const std::string scope = absl::StrCat("stage", s);
    const int64_t w = options_.widths[s];
    if (s > 0) stage.down.emplace_back(scope + "/down", Conv3x3(options_.widths[s - 1], w));
    for (int64_t b = 0; b < options_.blocks_per_stage; ++b) {
      const std::string block = absl::StrCat(scope, "/block", b);
      stage.blocks.push_back(
          {Conv2d(block + "/conv1", Conv3x3(w, w)), Conv2d(block + "/conv2", Conv3x3(w, w))});
    }
    stages_.push_back(std::move(stage));
  }
}

absl::Status ResNetCnn::Validate() const {
  const ResNetOptions& o = options_;
  if (o.in_channels < 1 || o.height < 1 || o.width < 1) {
    return absl::InvalidArgumentError(absl::StrCat("resnet: input must be at least 1x1x1, got ",
                                                   o.in_channels, "x", o.height, "x", o.width));
  }
  if (o.num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("resnet: needs >= 2 classes, got ", o.num_classes));
  }
  if (o.widths.empty() || o.blocks_per_stage < 0) {
    return absl::InvalidArgumentError("resnet: needs >= 1 stage width and blocks_per_stage >= 0");
  }
  for (int64_t w : o.widths) {
    if (w < 1)
      return absl::InvalidArgumentError(absl::StrCat("resnet: width must be >= 1, got ", w));
  }
  // Each stage after the first halves the feature maps (floor).
  int64_t h = o.height, w = o.width;
  for (size_t s = 1; s < o.widths.size(); ++s) {
    h /= 2;
    w /= 2;
  }
  if (h < 1 || w < 1) {
    return absl::InvalidArgumentError(absl::StrCat("resnet: ", o.widths.size(), " stages pool a ",
                                                   o.height, "x", o.width,
                                                   " image below 1x1; use fewer stages"));
  }
  return absl::OkStatus();
}

std::vector<ParamSpec> ResNetCnn::Params() const {
  std::vector<ParamSpec> specs = stem_.Params();
  for (const Stage& stage : stages_) {
    for (const Conv2d& d : stage.down) Append(specs, d.Params());
    for (const Block& b : stage.blocks) {
      Append(specs, b.conv1.Params());
      Append(specs, b.conv2.Params());
    }
  }
  Append(specs, head_.Params());
  return specs;
}

ir::Value ResNetCnn::Logits(const ParamValues& params, ir::Value x) const {
  const ResNetOptions& o = options_;
  x = ir::Reshape(x, Shape{x.dim(0), o.in_channels, o.height, o.width});
  x = ir::Relu(stem_.Apply(params, x));
  for (const Stage& stage : stages_) {
    for (const Conv2d& d : stage.down) x = MaxPool(ir::Relu(d.Apply(params, x)), 2, 2);
    for (const Block& b : stage.blocks) {
      ir::Value y = b.conv2.Apply(params, ir::Relu(b.conv1.Apply(params, x)));
      x = ir::Relu(x + y);
    }
  }
  return head_.Apply(params, GlobalAvgPool(x));
}

absl::StatusOr<ir::Graph> ResNetCnn::LossGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  return BuildClassifierLossGraph(
      "resnet_loss", Params(), DType::kF32, batch, features(), /*with_rng=*/false,
      [this](const ParamValues& p, ir::Value x, const RngInputs&) { return Logits(p, x); });
}

absl::StatusOr<ir::Graph> ResNetCnn::PredictGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  return BuildClassifierPredictGraph(
      "resnet_predict", Params(), DType::kF32, batch, features(),
      [this](const ParamValues& p, ir::Value x, const RngInputs&) { return Logits(p, x); });
}

std::string ResNetCnn::Describe() const {
  const ResNetOptions& o = options_;
  return absl::StrCat("resnet ", o.in_channels, "x", o.height, "x", o.width, " widths ",
                      absl::StrJoin(o.widths, "-"), " blocks ", o.blocks_per_stage, " -> ",
                      o.num_classes);
}

// ---- VisionTransformer ----

VisionTransformer::VisionTransformer(VitOptions options)
    : options_(std::move(options)),
      patch_embed_("patch_embed", {.in_channels = options_.in_channels,
                                   .out_channels = options_.dim,
                                   .kernel_h = options_.patch,
                                   .kernel_w = options_.patch,
                                   .conv = {.strides = {options_.patch, options_.patch}}}),
      norm_("norm", options_.dim, options_.norm_epsilon),
      head_("head", options_.dim, options_.num_classes),
      drop_(options_.dropout, 0) {
  for (int64_t i = 0; i < options_.depth; ++i) {
    blocks_.emplace_back(absl::StrCat("blocks/", i),
                         TransformerBlockOptions{.dim = options_.dim,
                                                 .num_heads = options_.heads,
                                                 .mlp_hidden = options_.mlp_ratio * options_.dim,
                                                 .causal = false,
                                                 .fused_qkv = true,
                                                 .activation = Activation::kGelu,
                                                 .norm = NormKind::kLayerNorm,
                                                 .norm_epsilon = options_.norm_epsilon,
                                                 .dropout = options_.dropout},
                         /*dropout_site=*/1 + 2 * i);
  }
}

int64_t VisionTransformer::num_patches() const {
  if (options_.patch < 1) return 0;
  return (options_.height / options_.patch) * (options_.width / options_.patch);
}

absl::Status VisionTransformer::Validate() const {
  const VitOptions& o = options_;
  if (o.in_channels < 1 || o.height < 1 || o.width < 1 || o.patch < 1 || o.height % o.patch != 0 ||
      o.width % o.patch != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vit: patch (", o.patch, ") must be >= 1 and divide the ", o.height, "x",
                     o.width, " image (", o.in_channels, " channels)"));
  }
  if (o.dim < 1 || o.depth < 0 || o.heads < 1 || o.dim % o.heads != 0 || o.mlp_ratio < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vit: heads (", o.heads, ") must divide dim (",
                                                   o.dim, "); depth >= 0, mlp_ratio >= 1"));
  }
  if (o.num_classes < 2) {
    return absl::InvalidArgumentError(absl::StrCat("vit: needs >= 2 classes, got ", o.num_classes));
  }
  if (!(o.dropout >= 0.0 && o.dropout < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("vit: dropout must be in [0, 1), got ", o.dropout));
  }
  if (2 * o.depth + 1 >= kDropoutSitesPerStep) {
    return absl::InvalidArgumentError(absl::StrCat("vit: depth ", o.depth, " is too large"));
  }
  return absl::OkStatus();
}

std::vector<ParamSpec> VisionTransformer::Params() const {
  const int64_t d = options_.dim;
  std::vector<ParamSpec> specs = patch_embed_.Params();
  specs.push_back({"cls_token", DType::kF32, Shape{1, 1, d}, Initializer::Normal(0.02)});
  specs.push_back(
      {"pos_embed", DType::kF32, Shape{1, num_patches() + 1, d}, Initializer::Normal(0.02)});
  for (const TransformerBlock& block : blocks_) Append(specs, block.Params());
  Append(specs, norm_.Params());
  Append(specs, head_.Params());
  return specs;
}

ir::Value VisionTransformer::Logits(const ParamValues& params, ir::Value x,
                                    const RngInputs& rng) const {
  if (!x.valid() || !x.builder()->status().ok()) return x;
  ir::Builder& b = *x.builder();
  const VitOptions& o = options_;
  const int64_t batch = x.dim(0), d = o.dim, n = num_patches();
  ir::Value cls = Lookup(b, params, "cls_token");
  ir::Value pos = Lookup(b, params, "pos_embed");
  if (!cls.valid() || !pos.valid()) return x;
  x = ir::Reshape(x, Shape{batch, o.in_channels, o.height, o.width});
  // [B, D, H/p, W/p] -> [B, D, N] -> [B, N, D]
  ir::Value tokens =
      ir::Transpose(ir::Reshape(patch_embed_.Apply(params, x), Shape{batch, d, n}), {0, 2, 1});
  ir::Value h = ir::Concatenate({ir::BroadcastTo(cls, Shape{batch, 1, d}), tokens}, 1) + pos;
  h = drop_.Apply(h, rng);
  for (const TransformerBlock& block : blocks_) h = block.Apply(params, h, rng);
  h = norm_.Apply(params, h);
  ir::Value cls_out = ir::Reshape(ir::Slice(h, {0, 0, 0}, {batch, 1, d}), Shape{batch, d});
  return head_.Apply(params, cls_out);
}

absl::StatusOr<ir::Graph> VisionTransformer::LossGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  return BuildClassifierLossGraph("vit_loss", Params(), DType::kF32, batch, features(),
                                  /*with_rng=*/false,
                                  [this](const ParamValues& p, ir::Value x, const RngInputs& rng) {
                                    return Logits(p, x, rng);
                                  });
}

absl::StatusOr<ir::Graph> VisionTransformer::TrainLossGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  return BuildClassifierLossGraph("vit_train_loss", Params(), DType::kF32, batch, features(),
                                  /*with_rng=*/options_.dropout > 0,
                                  [this](const ParamValues& p, ir::Value x, const RngInputs& rng) {
                                    return Logits(p, x, rng);
                                  });
}

absl::StatusOr<ir::Graph> VisionTransformer::PredictGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  return BuildClassifierPredictGraph("vit_predict", Params(), DType::kF32, batch, features(),
                                     [this](const ParamValues& p, ir::Value x,
                                            const RngInputs& rng) { return Logits(p, x, rng); });
}

std::string VisionTransformer::Describe() const {
  const VitOptions& o = options_;
  return absl::StrCat("vit ", o.in_channels, "x", o.height, "x", o.width, " patch ", o.patch,
                      " dim ", o.dim, " depth ", o.depth, " heads ", o.heads, " -> ",
                      o.num_classes);
}

}  // namespace kiln::nn
