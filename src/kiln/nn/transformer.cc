#include "kiln/nn/transformer.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::nn {
namespace {

void Append(std::vector<ParamSpec>& to, std::vector<ParamSpec> from) {
  for (ParamSpec& s : from) to.push_back(std::move(s));
}

}  // namespace

// ---- MultiHeadAttention ----

MultiHeadAttention::MultiHeadAttention(std::string name, AttentionOptions options, DType dtype,
                                       char sep)
    : name_(std::move(name)),
      options_(options),
      out_(JoinName(name_, "c_proj", sep), options.dim, options.dim, options.bias, dtype, sep) {
  const int64_t d = options_.dim;
  if (options_.fused_qkv) {
    projections_.emplace_back(JoinName(name_, "c_attn", sep), d, 3 * d, options_.bias, dtype, sep);
  } else {
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
      projections_.emplace_back(JoinName(name_, p, sep), d, d, options_.bias, dtype, sep);
    }
  }
}

absl::Status MultiHeadAttention::Validate() const {
  if (options_.dim < 1 || options_.num_heads < 1 || options_.dim % options_.num_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention ", name_, ": num_heads (", options_.num_heads,
                     ") must be >= 1 and divide dim (", options_.dim, ")"));
  }
  return absl::OkStatus();
}

std::vector<ParamSpec> MultiHeadAttention::Params() const {
  std::vector<ParamSpec> specs;
  for (const Linear& p : projections_) Append(specs, p.Params());
  Append(specs, out_.Params());
  return specs;
}

ir::Value MultiHeadAttention::Apply(const ParamValues& params, ir::Value x) const {
  if (!x.valid() || !x.builder()->status().ok()) return x;
  ir::Builder& b = *x.builder();
  absl::Status valid = Validate();
  if (!valid.ok()) {
    b.SetError(valid);
    return x;
  }
  if (x.rank() != 3 || x.dim(2) != options_.dim) {
    b.SetError(
        absl::InvalidArgumentError(absl::StrCat("attention ", name_, " expects input [B, S, ",
                                                options_.dim, "], got ", x.type().ToString())));
    return x;
  }
  const int64_t batch = x.dim(0), seq = x.dim(1), d = options_.dim, heads = options_.num_heads;
  const int64_t dh = d / heads;
  // [B, S, D] -> [B, S, H, Dh] -> [B, H, S, Dh] (Hugging Face's _split_heads).
  auto split_heads = [&](ir::Value t) {
    return ir::Transpose(ir::Reshape(t, Shape{batch, seq, heads, dh}), {0, 2, 1, 3});
  };
  ir::Value q, k, v;
  if (options_.fused_qkv) {
    ir::Value qkv = projections_[0].Apply(params, x);  // [B, S, 3D]: q | k | v
    q = ir::Slice(qkv, {0, 0, 0}, {batch, seq, d});
    k = ir::Slice(qkv, {0, 0, d}, {batch, seq, 2 * d});
    v = ir::Slice(qkv, {0, 0, 2 * d}, {batch, seq, 3 * d});
  } else {
    q = projections_[0].Apply(params, x);
    k = projections_[1].Apply(params, x);
    v = projections_[2].Apply(params, x);
  }
  ir::Value o = ir::Attention(split_heads(q), split_heads(k), split_heads(v), options_.causal);
  // [B, H, S, Dh] -> [B, S, H, Dh] -> [B, S, D] (_merge_heads).
  o = ir::Reshape(ir::Transpose(o, {0, 2, 1, 3}), Shape{batch, seq, d});
  return out_.Apply(params, o);
}

// ---- MlpBlock ----

MlpBlock::MlpBlock(std::string name, int64_t dim, int64_t hidden, Activation activation,
                   DType dtype, char sep)
    : fc_(JoinName(name, "c_fc", sep), dim, hidden, true, dtype, sep),
      proj_(JoinName(name, "c_proj", sep), hidden, dim, true, dtype, sep),
      activation_(activation) {}

std::vector<ParamSpec> MlpBlock::Params() const {
  std::vector<ParamSpec> specs = fc_.Params();
  Append(specs, proj_.Params());
  return specs;
}

ir::Value MlpBlock::Apply(const ParamValues& params, ir::Value x) const {
  return proj_.Apply(params, Activate(fc_.Apply(params, x), activation_));
}

// ---- TransformerBlock ----

TransformerBlock::Norm TransformerBlock::MakeNorm(const std::string& name,
                                                  const TransformerBlockOptions& o, DType dtype,
                                                  char sep) {
  if (o.norm == NormKind::kRmsNorm) return RmsNorm(name, o.dim, o.norm_epsilon, dtype, sep);
  return LayerNorm(name, o.dim, o.norm_epsilon, dtype, sep);
}

std::vector<ParamSpec> TransformerBlock::NormParams(const Norm& n) {
  return std::visit([](const auto& norm) { return norm.Params(); }, n);
}

ir::Value TransformerBlock::ApplyNorm(const Norm& n, const ParamValues& params, ir::Value x) {
  return std::visit([&](const auto& norm) { return norm.Apply(params, x); }, n);
}

TransformerBlock::TransformerBlock(std::string name, TransformerBlockOptions options,
                                   int64_t dropout_site, DType dtype, char sep)
    : options_(options),
      ln_1_(MakeNorm(JoinName(name, "ln_1", sep), options, dtype, sep)),
      ln_2_(MakeNorm(JoinName(name, "ln_2", sep), options, dtype, sep)),
      attn_(JoinName(name, "attn", sep),
            {.dim = options.dim,
             .num_heads = options.num_heads,
             .causal = options.causal,
             .fused_qkv = options.fused_qkv},
            dtype, sep),
      mlp_(JoinName(name, "mlp", sep), options.dim,
           options.mlp_hidden > 0 ? options.mlp_hidden : 4 * options.dim, options.activation, dtype,
           sep),
      drop_attn_(options.dropout, dropout_site),
      drop_mlp_(options.dropout, dropout_site + 1) {}

absl::Status TransformerBlock::Validate() const {
  absl::Status s = attn_.Validate();
  if (!s.ok()) return s;
  s = drop_attn_.Validate();
  if (!s.ok()) return s;
  return drop_mlp_.Validate();
}

std::vector<ParamSpec> TransformerBlock::Params() const {
  std::vector<ParamSpec> specs = NormParams(ln_1_);
  Append(specs, attn_.Params());
  Append(specs, NormParams(ln_2_));
  Append(specs, mlp_.Params());
  return specs;
}

ir::Value TransformerBlock::Apply(const ParamValues& params, ir::Value x,
                                  const RngInputs& rng) const {
  ir::Value h = x + drop_attn_.Apply(attn_.Apply(params, ApplyNorm(ln_1_, params, x)), rng);
  return h + drop_mlp_.Apply(mlp_.Apply(params, ApplyNorm(ln_2_, params, h)), rng);
}

}  // namespace kiln::nn
