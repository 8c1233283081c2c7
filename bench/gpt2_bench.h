// The GPT-2-small benchmark rows' model and their roofline arithmetic (bench/train_bench.cc),
// shared with bench/gpt2_peer_test.cc, which checks that the PyTorch peer (bench/peer_torch.py)
// builds the same model.
//
//   nn::Gpt gpt(bench::Gpt2Small());                       // 124,439,808 parameters
//   double flops = 3 * bench::GptForwardFlops(gpt.config(), bench::kGptTrainBatch);
#ifndef KILN_BENCH_GPT2_BENCH_H_
#define KILN_BENCH_GPT2_BENCH_H_

#include <cstdint>

#include "kiln/nn/gpt.h"

namespace kiln::bench {

// GPT-2 small (issue 14's configuration: `kiln train examples/gpt_text.yaml` with n_layer=12
// n_head=12 n_embd=768 vocab_size=50257 seq_len=128 batch_size=4), with GPT-2's 1024 positions.
// nn::Gpt initialises it as GPT-2 is (N(0, 0.02), c_proj N(0, 0.02 / sqrt(24)), zero biases,
// unit layer norms); the peer does the same.
inline constexpr int64_t kGptSeq = 128, kGptTrainBatch = 4;
inline nn::GptConfig Gpt2Small() {
  return {.vocab_size = 50257,
          .context = 1024,
          .dim = 768,
          .layers = 12,
          .heads = 12,
          .seq_len = kGptSeq};
}

// GPT-2 medium (d 1024, 24 layers, 16 heads) at the same batch and sequence length: the
// --gpt2-scale rows of train_bench, beside GPT-2 small at seq_len 512.
inline nn::GptConfig Gpt2Medium() {
  nn::GptConfig c = Gpt2Small();
  c.dim = 1024;
  c.layers = 24;
  c.heads = 16;
  return c;
}

// Matmul FLOPs of a GPT forward: per token and layer, c_attn (2 d 3d), c_proj (2 d d), the MLP
// (2 * 2 d 4d) and attention's two [S, S] products (2 * 2 S d, unmasked as computed); per token,
// the tied LM head (2 d V). A train step is 3x (forward, dX, dW).
inline double GptForwardFlops(const nn::GptConfig& c, int64_t batch) {
  const double d = c.dim, s = c.seq_len > 0 ? c.seq_len : c.context;
  const double per_layer = 2 * d * 3 * d + 2 * d * d + 2 * 2 * d * 4 * d + 2 * 2 * s * d;
  return (c.layers * per_layer + 2 * d * c.vocab_size) * batch * s;
}

// The least an AdamW update with global-norm clipping moves per f32 parameter: the norm reads
// the gradient (4 bytes), the update reads parameter, gradient, m and v and writes parameter, m
// and v (28).
inline double AdamWClipBytes(int64_t params) { return 32.0 * params; }

}  // namespace kiln::bench

#endif  // KILN_BENCH_GPT2_BENCH_H_
