#!/usr/bin/python3
"""Writes gpt_tiny_golden.safetensors: a tiny GPT-2 (vocab 50, ctx 16, d 32, 2 layers, 2 heads)
with Hugging Face parameter names and layouts, a batch of token ids, and the logits, loss and
two gradients a GPT-2 forward/backward gives for them.

transformers is not installed here, so GPT-2 is written out in plain torch following
transformers/models/gpt2/modeling_gpt2.py (GPT2LMHeadModel, eval mode) line by line: Conv1D is
x @ W + b with W [in, out]; c_attn's output splits into q, k, v in that order; heads are
view(B, S, H, Dh).permute(0, 2, 1, 3); attention weights are q k^T / sqrt(Dh), masked with
finfo.min where j > i, softmaxed in f32; act is gelu_new (tanh); layer norm eps 1e-5; ln_f; the
LM head is tied to wte. The loss is HF's shifted cross-entropy for labels=input_ids.

Run from the repository root:  /usr/bin/python3 src/kiln/nn/testdata/gen_gpt_golden.py

The model code (gpt2_logits) is also imported by scripts/check_gpt_torch.py, which loads a
checkpoint Kiln wrote into it by name and compares logits (the Kiln -> torch direction).
"""
import json
import math
import os
import struct

import torch

VOCAB, CTX, D, LAYERS, HEADS = 50, 16, 32, 2, 2
BATCH, SEQ = 2, 12  # SEQ < CTX: only the first SEQ rows of wpe are used


def init_params(gen):
    """GPT2PreTrainedModel._init_weights, with biases and LN params perturbed so they matter."""
    p = {}
    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen) * std
    p["transformer.wte.weight"] = normal(VOCAB, D)
    p["transformer.wpe.weight"] = normal(CTX, D)
    for i in range(LAYERS):
        h = f"transformer.h.{i}."
        p[h + "ln_1.weight"] = 1 + normal(D, std=0.1)
        p[h + "ln_1.bias"] = normal(D, std=0.1)
        p[h + "attn.c_attn.weight"] = normal(D, 3 * D, std=0.2)
        p[h + "attn.c_attn.bias"] = normal(3 * D, std=0.1)
        p[h + "attn.c_proj.weight"] = normal(D, D, std=0.2)
        p[h + "attn.c_proj.bias"] = normal(D, std=0.1)
        p[h + "ln_2.weight"] = 1 + normal(D, std=0.1)
        p[h + "ln_2.bias"] = normal(D, std=0.1)
        p[h + "mlp.c_fc.weight"] = normal(D, 4 * D, std=0.2)
        p[h + "mlp.c_fc.bias"] = normal(4 * D, std=0.1)
        p[h + "mlp.c_proj.weight"] = normal(4 * D, D, std=0.2)
        p[h + "mlp.c_proj.bias"] = normal(D, std=0.1)
    p["transformer.ln_f.weight"] = 1 + normal(D, std=0.1)
    p["transformer.ln_f.bias"] = normal(D, std=0.1)
    # Larger embeddings than HF's 0.02 so the logits are not all near zero.
    p["transformer.wte.weight"] *= 25
    p["transformer.wpe.weight"] *= 25
    return p


def conv1d(x, w, b):  # transformers.pytorch_utils.Conv1D
    size_out = x.size()[:-1] + (w.size(-1),)
    return torch.addmm(b, x.view(-1, x.size(-1)), w).view(size_out)


def gelu_new(x):  # transformers.activations.NewGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def attention(p, h, x, n_head=HEADS):
    B, S, D = x.shape
    dh = D // n_head
    q, k, v = conv1d(x, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"]).split(D, dim=2)
    split = lambda t: t.view(B, S, n_head, dh).permute(0, 2, 1, 3)
    q, k, v = split(q), split(k), split(v)
    w = torch.matmul(q, k.transpose(-1, -2))
    w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)
    ctx = p["transformer.wpe.weight"].shape[0]  # HF's causal-mask buffer is n_positions square
    causal = torch.tril(torch.ones((ctx, ctx), dtype=torch.bool)).view(1, 1, ctx, ctx)[:, :, :S, :S]
    w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
    w = torch.softmax(w, dim=-1)
    o = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(B, S, D)
    return conv1d(o, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])


def gpt2_logits(p, ids, n_head=HEADS, n_layer=LAYERS, eps=1e-5):
    """GPT2LMHeadModel's logits for token ids [B, S], from a state dict `p` keyed by Hugging Face
    names (the widths come from the tensors; the head and layer counts are not in the shapes)."""
    B, S = ids.shape
    D = p["transformer.wte.weight"].shape[1]
    ln = lambda t, name: torch.nn.functional.layer_norm(t, (D,), p[name + ".weight"], p[name + ".bias"], eps)
    x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][torch.arange(S)].unsqueeze(0)
    for i in range(n_layer):
        h = f"transformer.h.{i}."
        x = x + attention(p, h, ln(x, h + "ln_1"), n_head)
        m = ln(x, h + "ln_2")
        m = conv1d(gelu_new(conv1d(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"])),
                   p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
        x = x + m
    x = ln(x, "transformer.ln_f")
    return torch.matmul(x, p["transformer.wte.weight"].t())  # tied lm_head


def write_safetensors(path, tensors):
    dtypes = {torch.float32: "F32", torch.int64: "I64"}
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        t = t.detach().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    gen = torch.Generator().manual_seed(1234)
    params = {k: v.requires_grad_() for k, v in init_params(gen).items()}
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    tokens, targets = ids[:, :-1], ids[:, 1:]
    logits = gpt2_logits(params, tokens)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    out = dict(params)
    out["golden.tokens"] = tokens
    out["golden.targets"] = targets
    out["golden.logits"] = logits
    out["golden.loss"] = loss.reshape([])
    out["golden.grad.transformer.wte.weight"] = params["transformer.wte.weight"].grad
    out["golden.grad.transformer.h.0.attn.c_attn.weight"] = params["transformer.h.0.attn.c_attn.weight"].grad
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_tiny_golden.safetensors")
    write_safetensors(path, out)
    print(f"wrote {path}: loss {loss.item():.6f}, logits std {logits.std().item():.4f}")


if __name__ == "__main__":
    main()
