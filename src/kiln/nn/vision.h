// Image classifiers over flat NCHW inputs: a ResNet-style CNN and a Vision Transformer.
//
//   ResNetCnn cnn({.in_channels = 1, .height = 8, .width = 8, .num_classes = 10});
//   KILN_ASSIGN_OR_RETURN(ir::Graph loss, cnn.LossGraph(/*batch=*/32));
//   // loss(stem/weight, ..., head/bias, x f32[32,64], labels s32[32]) -> {"loss"}
//
//   VisionTransformer vit({.in_channels = 1, .height = 8, .width = 8, .patch = 2, .dim = 32,
//                          .depth = 2, .heads = 2, .num_classes = 10});
//
// Both take "x" as [batch, C*H*W], the image flattened in NCHW order (a dataset's feature
// vectors as they are), and reshape it to [batch, C, H, W] inside the graph (free).
#ifndef KILN_NN_VISION_H_
#define KILN_NN_VISION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/model.h"
#include "kiln/nn/transformer.h"

namespace kiln::nn {

struct ResNetOptions {
  int64_t in_channels = 1;
  int64_t height = 0;
  int64_t width = 0;
  int64_t num_classes = 0;
  // Channels of each stage; stage s > 0 starts with a 3x3 conv to widths[s] and a 2x2 max pool.
  std::vector<int64_t> widths = {16, 32};
  int64_t blocks_per_stage = 1;
};

// stem: conv3x3(in -> widths[0]) + relu; per stage s: [s > 0: conv3x3(widths[s-1] -> widths[s])
// + relu + maxpool 2x2], then blocks_per_stage residual blocks y = relu(x + conv2(relu(conv1(x))))
// (3x3, padding 1, no batch norm); head: global average pool + linear. Names: "stem",
// "stage{s}/down", "stage{s}/block{b}/conv1" / "conv2", "head" (each with /weight, /bias).
class ResNetCnn : public Model {
 public:
  explicit ResNetCnn(ResNetOptions options);
  absl::Status Validate() const override;
  std::vector<ParamSpec> Params() const override;
  // x [batch, C*H*W] -> logits [batch, classes].
  ir::Value Logits(const ParamValues& params, ir::Value x) const;
  absl::StatusOr<ir::Graph> LossGraph(int64_t batch) const override;
  absl::StatusOr<ir::Graph> PredictGraph(int64_t batch) const override;
  std::string Describe() const override;

 private:
  struct Block {
    Conv2d conv1, conv2;
  };
  struct Stage {
    std::vector<Conv2d> down;  // empty for stage 0
    std::vector<Block> blocks;
  };
  int64_t features() const { return options_.in_channels * options_.height * options_.width; }

  ResNetOptions options_;
  Conv2d stem_;
  std::vector<Stage> stages_;
  Linear head_;
};

struct VitOptions {
  int64_t in_channels = 1;
  int64_t height = 0;
  int64_t width = 0;
  int64_t patch = 0;  // square patches; must divide height and width
  int64_t dim = 0;
  int64_t depth = 0;  // transformer blocks
  int64_t heads = 1;
  int64_t mlp_ratio = 4;
  int64_t num_classes = 0;
  double dropout = 0.0;  // after the position embedding and in every block's residuals
  double norm_epsilon = 1e-6;
};

// Patch embedding by a conv with kernel = stride = patch ("patch_embed", OIHW), tokens
// [B, N, dim], a learned class token prepended ("cls_token" [1, 1, dim]), a learned position
// embedding ("pos_embed" [1, N + 1, dim]), pre-norm transformer blocks ("blocks/{i}/..." as in
// transformer.h, GELU exact, non-causal), a final layer norm ("norm") and a linear head on the
// class token ("head"). cls_token and pos_embed start N(0, 0.02).
class VisionTransformer : public Model {
 public:
  explicit VisionTransformer(VitOptions options);
  absl::Status Validate() const override;
  std::vector<ParamSpec> Params() const override;
  ir::Value Logits(const ParamValues& params, ir::Value x, const RngInputs& rng) const;
  absl::StatusOr<ir::Graph> LossGraph(int64_t batch) const override;
  absl::StatusOr<ir::Graph> TrainLossGraph(int64_t batch) const override;
  absl::StatusOr<ir::Graph> PredictGraph(int64_t batch) const override;
  std::string Describe() const override;

  int64_t num_patches() const;

 private:
  int64_t features() const { return options_.in_channels * options_.height * options_.width; }

  VitOptions options_;
  Conv2d patch_embed_;
  std::vector<TransformerBlock> blocks_;
  LayerNorm norm_;
  Linear head_;
  Dropout drop_;
};

}  // namespace kiln::nn

#endif  // KILN_NN_VISION_H_
