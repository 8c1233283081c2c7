// A GPT-2-style decoder language model whose parameters are named and laid out exactly as
// Hugging Face's GPT2LMHeadModel, so Kiln's safetensors files load there by name and Hugging
// Face's load here (docs/models.md has the full mapping).
//
//   Gpt gpt({.vocab_size = 50257, .context = 1024, .dim = 768, .layers = 12, .heads = 12});
//   KILN_ASSIGN_OR_RETURN(ParamStore params, InitParams(gpt.Params(), /*seed=*/0));
//   KILN_ASSIGN_OR_RETURN(ir::Graph loss, gpt.LossGraph(/*batch=*/8));
//   // loss(transformer.wte.weight, ..., tokens s32[8,1024], targets s32[8,1024]) -> {"loss"}
//
// Forward (Hugging Face semantics): h = wte[tokens] + wpe[0..S); per layer i, pre-norm blocks
// h += attn(ln_1(h)) and h += mlp(ln_2(h)) with causal attention over c_attn's output split into
// q, k, v in that order, GELU tanh ("gelu_new"), layer-norm epsilon 1e-5; then ln_f, and the
// tied LM head logits = h @ wte^T (no lm_head parameter). Dropout (embedding and residual, one
// rate) applies in training graphs only; attention-probability dropout is not modelled.
//
// The loss takes explicit next-token targets: loss = mean over all B*S positions of
// cross_entropy(logits[b, s], targets[b, s]). Hugging Face's labels=input_ids loss is this with
// tokens = ids[:, :-1] and targets = ids[:, 1:].
#ifndef KILN_NN_GPT_H_
#define KILN_NN_GPT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/sharding.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/model.h"
#include "kiln/nn/params.h"
#include "kiln/nn/transformer.h"

namespace kiln::nn {

struct GptConfig {
  int64_t vocab_size = 0;  // HF n_vocab / vocab_size
  int64_t context = 0;     // HF n_positions: rows of wpe
  int64_t dim = 0;         // HF n_embd
  int64_t layers = 0;      // HF n_layer
  int64_t heads = 0;       // HF n_head
  int64_t seq_len = 0;     // length of the sequences the graphs take; 0: context
  double dropout = 0.0;    // HF embd_pdrop = resid_pdrop (attn_pdrop is not modelled)
  double layer_norm_epsilon = 1e-5;
  double init_stddev = 0.02;  // HF initializer_range
};

class Gpt : public Model {
 public:
  explicit Gpt(GptConfig config);

  absl::Status Validate() const override;
  // In Hugging Face state_dict order: wte, wpe, h.{i}.*, ln_f. Initialization as HF's
  // _init_weights: weights and embeddings N(0, init_stddev), c_proj weights N(0, init_stddev /
  // sqrt(2 * layers)), biases zero, layer norms ones and zeros.
  std::vector<ParamSpec> Params() const override;
  // tokens [B, S] (integer) -> logits [B, S, vocab].
  ir::Value Logits(const ParamValues& params, ir::Value tokens, const RngInputs& rng) const;

  // Params, "tokens" s32[batch, seq], "targets" s32[batch, seq] -> "loss".
  absl::StatusOr<ir::Graph> LossGraph(int64_t batch) const override;
  // As LossGraph plus "rng/seed", "rng/step" when dropout > 0.
  absl::StatusOr<ir::Graph> TrainLossGraph(int64_t batch) const override;
  // Params, "tokens" -> "logits" f32[batch, seq, vocab], "prediction" s32[batch, seq].
  absl::StatusOr<ir::Graph> PredictGraph(int64_t batch) const override;
  std::string Describe() const override;

  const GptConfig& config() const { return config_; }
  int64_t seq_len() const { return config_.seq_len > 0 ? config_.seq_len : config_.context; }

  // Megatron tensor-parallel layouts of Params() over `model_ranks` ranks of mesh axis `axis`
  // (ir/sharding.h; docs/distributed.md "Tensor parallel"): c_attn split by column in whole heads
  // of each of q, k and v ("3*model"), c_fc by column, both c_proj by row, and the (tied)
  // embedding by vocabulary; norms, biases after a row split and wpe replicated. Only split
  // parameters are listed. InvalidArgument when heads, 4 * dim or vocab_size do not divide.
  absl::StatusOr<std::map<std::string, ir::Sharding>> TensorParallelShardings(
      int64_t model_ranks, const std::string& axis = "model") const;

  // Takes a Hugging Face GPT-2 state dict (e.g. read from model.safetensors) and returns the
  // parameters in Params() order, as f32. Accepts names with or without the "transformer."
  // prefix (GPT2LMHeadModel vs GPT2Model files); ignores "lm_head.weight" (tied to wte) and the
  // attention mask buffers ("*.attn.bias" of rank 4, "*.attn.masked_bias"). NotFound naming a
  // missing tensor, InvalidArgument for a shape mismatch or an unknown tensor.
  absl::StatusOr<ParamStore> ImportHuggingFace(const std::map<std::string, Tensor>& tensors) const;

  // The Hugging Face config.json of this model (GPT2LMHeadModel, gelu_new, tied embeddings).
  std::string HuggingFaceConfigJson() const;
  // Writes `dir`/config.json and `dir`/model.safetensors (Params() names, f32, metadata
  // {"format": "pt"} as transformers requires), a directory GPT2LMHeadModel.from_pretrained
  // loads. `dir` must exist. InvalidArgument if `params` lacks a parameter or has a wrong shape.
  absl::Status ExportHuggingFace(const ParamStore& params, const std::string& dir) const;

 private:
  absl::StatusOr<ir::Graph> BuildLoss(int64_t batch, bool training) const;

  GptConfig config_;
  Embedding wte_, wpe_;
  std::vector<TransformerBlock> blocks_;
  LayerNorm ln_f_;
  Dropout drop_;
};

}  // namespace kiln::nn

#endif  // KILN_NN_GPT_H_
