#!/usr/bin/python3
"""Loads GPT checkpoints written by Kiln into a GPT-2 written in plain PyTorch, by Hugging Face
name, and checks that it gives the logits Kiln computed (the Kiln -> torch half of docs/models.md
"GPT <-> Hugging Face GPT-2"; the torch -> Kiln half is gpt_test on gpt_tiny_golden).

  check_gpt_torch.py --config config.json --kiln-logits logits.safetensors W.safetensors [W ...]

--config      a Hugging Face GPT-2 config.json (vocab_size, n_positions, n_embd, n_layer, n_head,
              layer_norm_epsilon; Gpt::ExportHuggingFace writes one).
--kiln-logits a safetensors file with "tokens" (integer [B, S]) and "logits" (f32 [B, S, vocab]):
              what Kiln computed for those tokens.
W.safetensors each is loaded on its own, by name: a `kiln train` checkpoint shard
              (RUNDIR/checkpoints/step_N/shard-*.safetensors, optimizer state "opt/..." is
              skipped), the weights.safetensors of a `kiln export` artifact, or the
              model.safetensors of Gpt::ExportHuggingFace.

Every GPT2LMHeadModel parameter must be present under its Hugging Face name (with or without the
"transformer." prefix) with Hugging Face's shape (Conv1D weights [in, out]); "lm_head.weight", if
present, must equal wte. Any other tensor is an error. The model code is gen_gpt_golden.py's
(src/kiln/nn/testdata), a line-by-line port of transformers' modeling_gpt2.py.

Exit status: 0 all files match; 1 a mismatch (a missing, unexpected or mis-shaped tensor, or
logits differing by more than the tolerance); 77 torch is not importable (CTest SKIP_RETURN_CODE).
"""
import argparse
import json
import os
import struct
import sys

try:
    import torch
except ImportError as e:  # CI without torch: skipped, not passed
    print(f"SKIP: torch is not importable by {sys.executable}: {e}")
    sys.exit(77)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree when CTest runs this
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "kiln",
                                "nn", "testdata"))
import gen_gpt_golden  # noqa: E402  (the plain-torch GPT-2)

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I32": torch.int32, "I64": torch.int64, "I8": torch.int8, "U8": torch.uint8}


def read_safetensors(path):
    """name -> tensor, plus the __metadata__ dict (safetensors layout, no extra packages)."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        if info["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        data = bytearray(blob[8 + n + begin:8 + n + end])
        t = torch.frombuffer(data, dtype=DTYPES[info["dtype"]]) if data else \
            torch.empty(0, dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out, meta


def expected_shapes(cfg):
    """GPT2LMHeadModel's state dict (less lm_head and the mask buffers): name -> shape."""
    v, p, d, layers = cfg["vocab_size"], cfg["n_positions"], cfg["n_embd"], cfg["n_layer"]
    inner = cfg.get("n_inner") or 4 * d
    s = {"transformer.wte.weight": [v, d], "transformer.wpe.weight": [p, d]}
    for i in range(layers):
        h = f"transformer.h.{i}."
        s.update({h + "ln_1.weight": [d], h + "ln_1.bias": [d],
                  h + "attn.c_attn.weight": [d, 3 * d], h + "attn.c_attn.bias": [3 * d],
                  h + "attn.c_proj.weight": [d, d], h + "attn.c_proj.bias": [d],
                  h + "ln_2.weight": [d], h + "ln_2.bias": [d],
                  h + "mlp.c_fc.weight": [d, inner], h + "mlp.c_fc.bias": [inner],
                  h + "mlp.c_proj.weight": [inner, d], h + "mlp.c_proj.bias": [d]})
    s["transformer.ln_f.weight"] = [d]
    s["transformer.ln_f.bias"] = [d]
    return s


def load_by_name(path, cfg):
    """The state dict of `path` keyed by full Hugging Face names, or a list of errors."""
    tensors, _ = read_safetensors(path)
    want = expected_shapes(cfg)
    state, seen, errors, skipped = {}, set(), [], 0
    for name, t in tensors.items():
        if name.startswith("opt/"):  # a training checkpoint's optimizer state
            skipped += 1
            continue
        if name == "lm_head.weight":
            continue  # checked against wte below
        full = name if name.startswith("transformer.") else "transformer." + name
        if full in seen:
            errors.append(f"'{full}' appears twice (with and without the transformer. prefix)")
        seen.add(full)
        if full not in want:
            errors.append(f"unexpected tensor '{name}' {list(t.shape)}")
        elif list(t.shape) != want[full]:
            errors.append(f"'{name}' has shape {list(t.shape)}, GPT-2 has {want[full]}")
        else:
            state[full] = t.to(torch.float32)
    errors += [f"missing '{n}' {want[n]}" for n in want if n not in seen]
    if "lm_head.weight" in tensors and "transformer.wte.weight" in state and \
            not torch.equal(tensors["lm_head.weight"].float(), state["transformer.wte.weight"]):
        errors.append("'lm_head.weight' is not tied to (equal to) 'transformer.wte.weight'")
    return state, errors, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="Hugging Face GPT-2 config.json")
    ap.add_argument("--kiln-logits", required=True, help="safetensors with tokens and logits")
    ap.add_argument("--tolerance", type=float, default=1e-5,
                    help="max |torch - kiln| allowed, relative to max(1, max |kiln logits|)")
    ap.add_argument("weights", nargs="+", help="safetensors files to load by name")
    args = ap.parse_args()

    with open(args.config) as f:
        cfg = json.load(f)
    if cfg.get("activation_function", "gelu_new") != "gelu_new" or \
            not cfg.get("tie_word_embeddings", True):
        print(f"FAIL: {args.config}: the torch port is gelu_new with tied embeddings")
        return 1
    ref, _ = read_safetensors(args.kiln_logits)
    tokens, kiln_logits = ref["tokens"].to(torch.int64), ref["logits"].to(torch.float32)
    scale = max(1.0, kiln_logits.abs().max().item())
    torch.set_num_threads(1)  # deterministic summation order; the model is tiny

    failed = False
    for path in args.weights:
        state, errors, skipped = load_by_name(path, cfg)
        if errors:
            failed = True
            print(f"FAIL: {path}: does not load by name as GPT-2:")
            for e in errors[:20]:
                print(f"  {e}")
            continue
        with torch.no_grad():
            logits = gen_gpt_golden.gpt2_logits(state, tokens, n_head=cfg["n_head"],
                                                n_layer=cfg["n_layer"],
                                                eps=cfg.get("layer_norm_epsilon", 1e-5))
        if list(logits.shape) != list(kiln_logits.shape):
            failed = True
            print(f"FAIL: {path}: torch logits {list(logits.shape)} vs kiln "
                  f"{list(kiln_logits.shape)}")
            continue
        diff = (logits - kiln_logits).abs()
        worst = diff.max().item()
        where = [int(i) for i in torch.nonzero(diff == diff.max())[0]]
        agree = (logits.argmax(-1) == kiln_logits.argmax(-1)).float().mean().item()
        ok = worst <= args.tolerance * scale
        failed |= not ok
        print(f"{'ok' if ok else 'FAIL'}: {path}: {len(state)} GPT-2 tensors by name"
              f"{f' ({skipped} optimizer tensors skipped)' if skipped else ''}; logits "
              f"{list(logits.shape)} max |torch - kiln| {worst:.3g} at {where} (limit "
              f"{args.tolerance * scale:.3g}, |logits| <= {scale:.3g}); argmax agrees "
              f"{100 * agree:.1f}%")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
