#include "kiln/nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::nn {

Gpt::Gpt(GptConfig config)
    : config_(config),
      wte_("transformer.wte", config.vocab_size, config.dim, DType::kF32, '.'),
      wpe_("transformer.wpe", config.context, config.dim, DType::kF32, '.'),
      ln_f_("transformer.ln_f", config.dim, config.layer_norm_epsilon, DType::kF32, '.'),
      drop_(config.dropout, 0) {
  const Initializer normal = Initializer::Normal(config_.init_stddev);
  wte_.set_init(normal);
  wpe_.set_init(normal);
  // HF GPT2PreTrainedModel._init_weights: c_proj weights get std / sqrt(2 * n_layer).
  const Initializer proj = Initializer::Normal(
      config_.init_stddev /
      std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(1, config_.layers))));
  for (int64_t i = 0; i < config_.layers; ++i) {
    blocks_.emplace_back(absl::StrCat("transformer.h.", i),
                         TransformerBlockOptions{.dim = config_.dim,
                                                 .num_heads = config_.heads,
                                                 .mlp_hidden = 4 * config_.dim,
                                                 .causal = true,
                                                 .fused_qkv = true,
                                                 .activation = Activation::kGeluTanh,
                                                 .norm = NormKind::kLayerNorm,
                                                 .norm_epsilon = config_.layer_norm_epsilon,
                                                 .dropout = config_.dropout},
                         /*dropout_site=*/1 + 2 * i, DType::kF32, '.');
    TransformerBlock& block = blocks_.back();
    block.attention().projections()[0].set_init(normal, Initializer::Zeros());
    block.attention().out_proj().set_init(proj, Initializer::Zeros());
    block.mlp().fc().set_init(normal, Initializer::Zeros());
    block.mlp().proj().set_init(proj, Initializer::Zeros());
  }
}

absl::Status Gpt::Validate() const {
  const GptConfig& c = config_;
  if (c.vocab_size < 1 || c.context < 1 || c.dim < 1 || c.layers < 0 || c.heads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPT config: vocab_size, context, dim and heads must be >= 1 and layers >= 0, got vocab ",
        c.vocab_size, " context ", c.context, " dim ", c.dim, " layers ", c.layers, " heads ",
        c.heads));
  }
  if (c.dim % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPT config: heads (", c.heads, ") must divide dim (", c.dim, ")"));
  }
  if (seq_len() < 1 || seq_len() > c.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPT config: seq_len must be in [1, context=", c.context, "], got ", seq_len()));
  }
  if (!(c.dropout >= 0.0 && c.dropout < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPT config: dropout must be in [0, 1), got ", c.dropout));
  }
  if (!(c.layer_norm_epsilon > 0.0) || !(c.init_stddev >= 0.0)) {
    return absl::InvalidArgumentError(
        "GPT config: layer_norm_epsilon must be > 0 and init_stddev >= 0");
  }
  if (2 * c.layers + 1 >= kDropoutSitesPerStep) {
    return absl::InvalidArgumentError(absl::StrCat("GPT config: too many layers (", c.layers, ")"));
  }
  return absl::OkStatus();
}

std::vector<ParamSpec> Gpt::Params() const {
  std::vector<ParamSpec> specs = wte_.Params();
  for (ParamSpec& s : wpe_.Params()) specs.push_back(std::move(s));
  for (const TransformerBlock& block : blocks_) {
    for (ParamSpec& s : block.Params()) specs.push_back(std::move(s));
  }
  for (ParamSpec& s : ln_f_.Params()) specs.push_back(std::move(s));
  return specs;
}

ir::Value Gpt::Logits(const ParamValues& params, ir::Value tokens, const RngInputs& rng) const {
  if (!tokens.valid() || !tokens.builder()->status().ok()) return tokens;
  ir::Builder& b = *tokens.builder();
  if (tokens.rank() != 2 || tokens.dim(1) > config_.context) {
    b.SetError(absl::InvalidArgumentError(
        absl::StrCat("GPT expects tokens [B, S] with S <= ", config_.context, ", got ",
                     tokens.type().ToString())));
    return tokens;
  }
  const int64_t seq = tokens.dim(1);
  ir::Value wpe = Lookup(b, params, wpe_.weight_name());
  ir::Value wte = Lookup(b, params, wte_.weight_name());
  if (!wpe.valid() || !wte.valid()) return tokens;
  // Positions 0..S-1 are the first S rows of wpe.
  ir::Value h = wte_.Apply(params, tokens) + ir::Slice(wpe, {0, 0}, {seq, config_.dim});
  h = drop_.Apply(h, rng);
  for (const TransformerBlock& block : blocks_) h = block.Apply(params, h, rng);
  h = ln_f_.Apply(params, h);
  // Tied head: [B, S, D] x [V, D] contracting D -> [B, S, V].
  return ir::DotGeneral(h, wte, {{}, {}, {2}, {1}});
}

absl::StatusOr<ir::Graph> Gpt::BuildLoss(int64_t batch, bool training) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", batch));
  ir::Builder b("gpt_loss");
  ParamValues p = AddParameters(b, Params());
  ir::Value tokens = b.Parameter("tokens", DType::kS32, Shape{batch, seq_len()});
  ir::Value targets = b.Parameter("targets", DType::kS32, Shape{batch, seq_len()});
  RngInputs rng;
  if (training && config_.dropout > 0) rng = RngInputs::AddParameters(b);
  ir::Value per_token = ir::SparseCrossEntropy(Logits(p, tokens, rng), targets);
  b.Output("loss", ir::Mean(per_token, {0, 1}));
  return b.Build();
}

absl::StatusOr<ir::Graph> Gpt::LossGraph(int64_t batch) const { return BuildLoss(batch, false); }

absl::StatusOr<ir::Graph> Gpt::TrainLossGraph(int64_t batch) const {
  return BuildLoss(batch, true);
}

absl::StatusOr<ir::Graph> Gpt::PredictGraph(int64_t batch) const {
  absl::Status valid = Validate();
  if (!valid.ok()) return valid;
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", batch));
  ir::Builder b("gpt_predict");
  ParamValues p = AddParameters(b, Params());
  ir::Value tokens = b.Parameter("tokens", DType::kS32, Shape{batch, seq_len()});
  ir::Value logits = Logits(p, tokens, RngInputs{});
  b.Output("logits", logits);
  b.Output("prediction", ir::ArgMax(logits, -1));
  return b.Build();
}

std::string Gpt::Describe() const {
  const GptConfig& c = config_;
  return absl::StrCat("gpt vocab ", c.vocab_size, " ctx ", c.context, " d ", c.dim, " layers ",
                      c.layers, " heads ", c.heads, " seq ", seq_len());
}

absl::StatusOr<ParamStore> Gpt::ImportHuggingFace(
    const std::map<std::string, Tensor>& tensors) const {
  const std::string kPrefix = "transformer.";
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    if (name == "lm_head.weight" || absl::EndsWith(name, ".attn.masked_bias")) continue;
    if (absl::EndsWith(name, ".attn.bias") && t.shape().rank() == 4) continue;  // causal mask
    const std::string full = absl::StartsWith(name, kPrefix) ? name : kPrefix + name;
    by_name[full] = &t;
  }
  ParamStore store;
  for (const ParamSpec& spec : Params()) {
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      return absl::NotFoundError(absl::StrCat("GPT-2 import: no tensor '", spec.name,
                                              "' (or without the 'transformer.' prefix)"));
    }
    const Tensor& t = *it->second;
    if (t.shape() != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat("GPT-2 import: '", spec.name, "' is ",
                                                     t.TypeString(), ", the model expects ",
                                                     spec.shape.ToString()));
    }
    if (!IsFloating(t.dtype())) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPT-2 import: '", spec.name, "' is ", t.TypeString(), ", not a float"));
    }
    absl::Status s =
        store.Add(spec.name, t.dtype() == spec.dtype ? t.Clone() : t.ConvertTo(spec.dtype));
    if (!s.ok()) return s;
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 import: unexpected tensor '",
                                                   by_name.begin()->first,
                                                   "' (does the config match the checkpoint?)"));
  }
  return store;
}

std::string Gpt::HuggingFaceConfigJson() const {
  const GptConfig& c = config_;
  return absl::StrFormat(
      "{\n"
      "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
      "  \"model_type\": \"gpt2\",\n"
      "  \"vocab_size\": %d,\n"
      "  \"n_positions\": %d,\n"
      "  \"n_ctx\": %d,\n"
      "  \"n_embd\": %d,\n"
      "  \"n_layer\": %d,\n"
      "  \"n_head\": %d,\n"
      "  \"n_inner\": null,\n"
      "  \"activation_function\": \"gelu_new\",\n"
      "  \"resid_pdrop\": %.17g,\n"
      "  \"embd_pdrop\": %.17g,\n"
      "  \"attn_pdrop\": 0.0,\n"
      "  \"layer_norm_epsilon\": %.17g,\n"
      "  \"initializer_range\": %.17g,\n"
      "  \"scale_attn_weights\": true,\n"
      "  \"tie_word_embeddings\": true\n"
      "}\n",
      c.vocab_size, c.context, c.context, c.dim, c.layers, c.heads, c.dropout, c.dropout,
      c.layer_norm_epsilon, c.init_stddev);
}

absl::Status Gpt::ExportHuggingFace(const ParamStore& params, const std::string& dir) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamSpec& spec : Params()) {
    const Tensor* t = params.Find(spec.name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPT-2 export: no parameter '", spec.name, "'"));
    }
    if (t->shape() != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat("GPT-2 export: '", spec.name, "' is ",
                                                     t->TypeString(), ", expected ",
                                                     spec.shape.ToString()));
    }
    tensors.emplace_back(spec.name, t->dtype() == DType::kF32 ? *t : t->ConvertTo(DType::kF32));
  }
  const std::string config_path = dir + "/config.json";
  if (absl::Status s = WriteStringToFile(Env::Default(), HuggingFaceConfigJson(), config_path);
      !s.ok())
    return absl::Status(
        s.code(), "GPT-2 export: cannot write " + config_path + ": " + std::string(s.message()));
  return WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

absl::StatusOr<std::map<std::string, ir::Sharding>> Gpt::TensorParallelShardings(
    int64_t model_ranks, const std::string& axis) const {
  KILN_RETURN_IF_ERROR(Validate());
  const int64_t m = model_ranks;
  if (m < 1 || config_.heads % m != 0 || (4 * config_.dim) % m != 0 || config_.vocab_size % m != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallel over ", m, " ranks needs heads (", config_.heads, "), 4 * dim (",
        4 * config_.dim, ") and vocab_size (", config_.vocab_size, ") divisible by ", m));
  auto split = [&](int rank, int dim, int64_t groups) {
    ir::Sharding s = ir::Sharding::Replicated(rank);
    s.dims[dim].axis = axis;
    s.dims[dim].groups = groups;
    return s;
  };
  std::map<std::string, ir::Sharding> out;
  out[wte_.weight_name()] = split(2, 0, 1);  // vocabulary
  for (int64_t i = 0; i < config_.layers; ++i) {
    const std::string p = absl::StrCat("transformer.h.", i, ".");
    out[p + "attn.c_attn.weight"] = split(2, 1, 3);  // whole heads of q, k and v
    out[p + "attn.c_attn.bias"] = split(1, 0, 3);
    out[p + "attn.c_proj.weight"] = split(2, 0, 1);  // row
    out[p + "mlp.c_fc.weight"] = split(2, 1, 1);     // column
    out[p + "mlp.c_fc.bias"] = split(1, 0, 1);
    out[p + "mlp.c_proj.weight"] = split(2, 0, 1);  // row
  }
  std::map<std::string, ir::Sharding> checked;
  for (const ParamSpec& spec : Params()) {
    auto it = out.find(spec.name);
    if (it == out.end()) continue;
    KILN_RETURN_IF_ERROR(ir::CheckSharding(it->second, ir::Type{spec.dtype, spec.shape}, m));
    checked.insert(*it);
  }
  if (checked.size() != out.size())
    return absl::InternalError("TensorParallelShardings: a layout names no parameter");
  return checked;
}

}  // namespace kiln::nn
