// Transformer building blocks as graph code: multi-head attention (fused or separate q/k/v
// projections, causal option, over ir::Attention on [B, H, S, Dh]), the MLP block, and the
// pre-norm transformer block used by the ViT and GPT models.
//
//   TransformerBlock block("h.0", {.dim = 64, .num_heads = 4, .causal = true}, /*site=*/1, '.');
//   std::vector<ParamSpec> specs = block.Params();   // h.0.ln_1.weight, h.0.attn.c_attn.weight...
//   ir::Value y = block.Apply(params, x, rng);         // x [B, S, 64] -> [B, S, 64]
//
// Sublayer names follow GPT-2 (Hugging Face): ln_1, attn.c_attn (fused q|k|v, [dim, 3*dim]),
// attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj. With separate projections the attention has
// attn.q_proj, attn.k_proj, attn.v_proj and attn.c_proj. All projections are Linear layers in
// [in, out] layout (Hugging Face's Conv1D layout).
#ifndef KILN_NN_TRANSFORMER_H_
#define KILN_NN_TRANSFORMER_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "kiln/ir/builder.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/model.h"
#include "kiln/nn/params.h"

namespace kiln::nn {

struct AttentionOptions {
  int64_t dim = 0;
  int64_t num_heads = 1;
  bool causal = false;
  // true: one projection "c_attn" [dim, 3*dim] whose output splits into q, k, v in that order
  // (GPT-2); false: "q_proj", "k_proj", "v_proj", each [dim, dim].
  bool fused_qkv = true;
  bool bias = true;
};

// x [B, S, dim] -> [B, S, dim]: project to q, k, v, split dim into num_heads heads of dim /
// num_heads ([B, H, S, Dh]), softmax(q k^T / sqrt(Dh)) v (causal: position i sees j <= i),
// merge heads, project with "c_proj".
class MultiHeadAttention {
 public:
  MultiHeadAttention(std::string name, AttentionOptions options, DType dtype = DType::kF32,
                     char sep = '/');
  // InvalidArgument unless dim >= 1, num_heads >= 1 and num_heads divides dim.
  absl::Status Validate() const;
  std::vector<ParamSpec> Params() const;
  ir::Value Apply(const ParamValues& params, ir::Value x) const;

  // The projections, to change their initializers: qkv (fused) or q, k, v; then out.
  std::vector<Linear>& projections() { return projections_; }
  Linear& out_proj() { return out_; }
  const AttentionOptions& options() const { return options_; }

 private:
  std::string name_;
  AttentionOptions options_;
  std::vector<Linear> projections_;
  Linear out_;
};

// x [..., dim] -> c_proj(act(c_fc(x))): "c_fc" [dim, hidden], "c_proj" [hidden, dim].
class MlpBlock {
 public:
  MlpBlock(std::string name, int64_t dim, int64_t hidden, Activation activation,
           DType dtype = DType::kF32, char sep = '/');
  std::vector<ParamSpec> Params() const;
  ir::Value Apply(const ParamValues& params, ir::Value x) const;
  Linear& fc() { return fc_; }
  Linear& proj() { return proj_; }

 private:
  Linear fc_, proj_;
  Activation activation_;
};

enum class NormKind { kLayerNorm, kRmsNorm };

struct TransformerBlockOptions {
  int64_t dim = 0;
  int64_t num_heads = 1;
  int64_t mlp_hidden = 0;  // 0: 4 * dim
  bool causal = false;
  bool fused_qkv = true;
  Activation activation = Activation::kGeluTanh;
  NormKind norm = NormKind::kLayerNorm;
  double norm_epsilon = 1e-5;
  double dropout = 0.0;  // residual dropout after the attention and after the MLP
};

// Pre-norm block: x + drop(attn(ln_1(x))), then h + drop(mlp(ln_2(h))). The two dropouts use
// sites dropout_site and dropout_site + 1.
class TransformerBlock {
 public:
  TransformerBlock(std::string name, TransformerBlockOptions options, int64_t dropout_site,
                   DType dtype = DType::kF32, char sep = '/');
  absl::Status Validate() const;
  std::vector<ParamSpec> Params() const;
  ir::Value Apply(const ParamValues& params, ir::Value x, const RngInputs& rng) const;

  MultiHeadAttention& attention() { return attn_; }
  MlpBlock& mlp() { return mlp_; }

 private:
  using Norm = std::variant<LayerNorm, RmsNorm>;
  static Norm MakeNorm(const std::string& name, const TransformerBlockOptions& o, DType dtype,
                       char sep);
  static std::vector<ParamSpec> NormParams(const Norm& n);
  static ir::Value ApplyNorm(const Norm& n, const ParamValues& params, ir::Value x);

  TransformerBlockOptions options_;
  Norm ln_1_, ln_2_;
  MultiHeadAttention attn_;
  MlpBlock mlp_;
  Dropout drop_attn_, drop_mlp_;
};

}  // namespace kiln::nn

#endif  // KILN_NN_TRANSFORMER_H_
