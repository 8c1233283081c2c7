// The DLRM-style recommender of the zoo (`model.kind: recommender`): sparse categorical features
// through embedding tables, dense features through a bottom MLP, a pairwise dot-product (or
// concatenation) interaction, and a top MLP to one click logit.
//
//   Recommender rec({.tables = {500, 1000}, .dense = 2, .embed_dim = 16});
//   KILN_ASSIGN_OR_RETURN(ParamStore params, InitParams(rec.Params(), /*seed=*/0));
//   KILN_ASSIGN_OR_RETURN(ir::Graph loss, rec.LossGraph(/*batch=*/256));
//   // loss(params..., x f32[256, 4], labels s32[256]) -> {"loss": f32[]}
//
// Input layout, one row per impression: x = [id_0, ..., id_{S-1}, dense_0, ..., dense_{D-1}]
// (f32; the ids are exact integers, the `dataset:` source of a `clicks` dataset writes them so;
// ids outside a table clamp, as gather does). Graph:
//   e_t  = tables/t/weight[id_t]                    [B, d]   t < S ("tables/<t>/weight")
//   h    = bottom MLP(dense) (ReLU after every layer) [B, d]   when D > 0 ("bottom/<i>/...")
//   dot:    z_in = [h, <v_a, v_b> for a < b over v = (e_0.., h)]   (DLRM's dot interaction)
//   concat: z_in = [e_0, ..., e_{S-1}, h]
//   logit = top MLP(z_in) (ReLU between layers, none after the last: one output) [B, 1]
// The loss is the batch mean of sigmoid binary cross-entropy, softplus(logit) - y * logit, with
// the label y in {0, 1}; the model's logits are [0, logit] (two classes), whose softmax
// cross-entropy is exactly that, so the classifier machinery (evaluation, export, serving)
// applies unchanged and softmax([0, logit])[1] = sigmoid(logit) is the click probability.
#ifndef KILN_NN_RECOMMENDER_H_
#define KILN_NN_RECOMMENDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/nn/layers.h"
#include "kiln/nn/model.h"

namespace kiln::nn {

struct RecommenderOptions {
  std::vector<int64_t> tables;  // rows of each sparse feature's table, in x's column order
  int64_t dense = 0;            // dense features after the ids
  int64_t embed_dim = 16;
  std::vector<int64_t> bottom = {32};  // hidden widths of the bottom MLP (its output: embed_dim)
  std::vector<int64_t> top = {32};     // hidden widths of the top MLP (its output: 1 logit)
  std::string interaction = "dot";     // dot | concat
};

class Recommender : public Model {
 public:
  explicit Recommender(RecommenderOptions options);

  absl::Status Validate() const override;
  std::vector<ParamSpec> Params() const override;
  // x [batch, S + D] -> the click logit [batch, 1].
  ir::Value Logit(const ParamValues& params, ir::Value x) const;
  absl::StatusOr<ir::Graph> LossGraph(int64_t batch) const override;
  // Outputs "logits" [batch, 2] = [0, logit] and "prediction" (1 when logit > 0).
  absl::StatusOr<ir::Graph> PredictGraph(int64_t batch) const override;
  // "recommender tables 500-1000 dim 16 dense 2 bottom 32 top 32 dot -> 1"
  std::string Describe() const override;

  const RecommenderOptions& options() const { return options_; }
  int64_t num_features() const {
    return static_cast<int64_t>(options_.tables.size()) + options_.dense;
  }
  // Features of the top MLP's input.
  int64_t interaction_width() const;

 private:
  RecommenderOptions options_;
  std::vector<Embedding> tables_;
  std::vector<Linear> bottom_, top_;
};

}  // namespace kiln::nn

#endif  // KILN_NN_RECOMMENDER_H_
