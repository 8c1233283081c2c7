#!/usr/bin/python3
"""The PyTorch peer of bench/train_bench.cc: the same models, shapes, loss and optimizer in eager
PyTorch (Debian's python3-torch 1.13), driven over stdin/stdout by the C++ driver so that the two
sides alternate round by round in one run (DESIGN.md section 5).

The driver starts this script with the tuned environment (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
OMP_WAIT_POLICY=PASSIVE, GLIBC_TUNABLES malloc settings, OPENBLAS_L2_SIZE unset, OPENBLAS_CORETYPE
unset or, where OpenBLAS fell back to generic kernels on this CPU, the newest core type the CPU
supports: see bench/peer_blas.h).
Protocol, one line per command and one line per reply:
    (start)               -> "ready <torch version> blas=<library paths>"
    setup <bench>         -> "ok" (model built, warmed up) or "skip <reason>"
    run <bench> <reps>    -> "times <ms> <ms> ..."
    rss <bench>           -> "rss <peak delta bytes> <baseline bytes> <peak bytes>", or
                             "rss unavailable <why>"; then the benchmark is released
    blas                  -> "blas core=<OpenBLAS core type> config=<openblas_get_config>"
                             ("core=unknown" when the BLAS is not OpenBLAS)
    matmul <n> <reps>     -> "matmul <GFLOP/s> <max error>": the median rate of an n^3 float32
                             matmul, and the worst error of a float32 matmul against a float64
                             product computed without BLAS, relative to sum_k |a_ik b_kj|
    quit

Memory ("rss"): what a benchmark costs this process at its worst. Just before its setup, the
peer frees what it can (gc, then glibc's malloc_trim, so freed heap pages of earlier benchmarks
are returned to the OS and cannot be silently reused), reads VmRSS (the baseline) and resets the
kernel's peak-RSS counter (writing "5" to /proc/self/clear_refs); after the driver's last run of
that benchmark, VmHWM (peak resident set since the reset) minus the baseline is the reported
delta. It covers everything the benchmark made resident: model parameters, gradients, optimizer
state, inputs, activations and autograd temporaries at the step's peak, allocator slack, and the
pages of any code or library first touched by it (e.g. oneDNN/OpenBLAS kernels). The Kiln side
reports its planned arena (activations and temporaries of one step) and, separately, its resident
parameters and optimizer state.

Benchmarks (identical to the Kiln side):
    mlp_train_f32 / mlp_train_bf16: 1024->1024->1024->1024->10 ReLU, batch 256, cross-entropy,
        AdamW(lr 1e-3, wd 0.01); bf16 casts the model and input to bfloat16.
    encoder_train_f32 / encoder_train_bf16: a pre-norm encoder layer (nn.TransformerEncoderLayer
        d_model 256, 4 heads, ff 1024, ReLU, dropout 0, norm_first, batch_first), seq 128,
        batch 32, loss mse(layer(x), target) in f32, AdamW; bf16 casts layer and data.
    mlp_infer_b{1,256}, encoder_infer_b{1,256}: forward under torch.inference_mode().
    dispatch_2000_tiny_ops: y = y * a + b, 1000 times, on float32[8] (2000 eager ops).
    gpt2_small_train: GPT-2 small (Gpt2 below: vocab 50257, 1024 positions, d 768, 12 layers,
        12 heads, GELU tanh, layer-norm eps 1e-5, tied LM head, no dropout), tokens and
        next-token targets int64 [4, 128], loss = mean cross-entropy over the 512 positions,
        clip_grad_norm_(1.0), AdamW(lr 1e-3, wd 0.01). Initialised as GPT-2 is (weights and
        embeddings N(0, 0.02), c_proj weights N(0, 0.02 / sqrt(2 * 12)), biases zero, layer norms
        ones), as Kiln's nn::Gpt: with torch's default N(0, 1) embeddings the logit gradients
        are denormal and the LM-head matmuls run ~30x slower. Denormals are flushed
        (torch.set_flush_denormal) for the gpt2 rows.
    gpt2_small_infer_b{1,8}: its logits [B, 128, 50257] under torch.inference_mode().
    gpt2_medium_train, gpt2_small_seq512_train (train_bench --gpt2-scale): the same step for
        GPT-2 medium (d 1024, 24 layers, 16 heads) at [4, 128], and GPT-2 small at [4, 512].

`peer_torch.py --check-gpt2 VOCAB CTX DIM LAYERS HEADS` (bench/gpt2_peer_test.cc) builds that
config, checks its logits against the line-by-line port of transformers' GPT-2 that
scripts/check_gpt_torch.py uses (src/kiln/nn/testdata/gen_gpt_golden.py) and prints
"param <Hugging Face name> <shape, e.g. 32x96>" per parameter, then "ok" (exit 0), or "FAIL ..." (exit 1);
exit 77 when torch is not importable. `peer_torch.py --gpt2-small-config` prints the gpt2_small
rows' configuration: "config <vocab> <ctx> <dim> <layers> <heads> <seq> <train batch>".
"""
import ctypes
import gc
import os
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the CTest check is skipped, not failed, without torch
    print("SKIP: torch is not importable by %s: %s" % (sys.executable, e))
    sys.exit(77)

THREADS = int(os.environ.get("OMP_NUM_THREADS", "2"))
torch.set_num_threads(THREADS)
torch.manual_seed(0)

D, HEADS, FF, SEQ, ENC_BATCH = 256, 4, 1024, 128, 32


def mlp(dtype=torch.float32):
    layers = []
    widths = [1024, 1024, 1024, 1024]
    for i in range(3):
        layers += [nn.Linear(widths[i], widths[i + 1]), nn.ReLU()]
    layers.append(nn.Linear(1024, 10))
    return nn.Sequential(*layers).to(dtype)


def encoder(dtype=torch.float32):
    return nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, activation="relu",
                                      batch_first=True, norm_first=True).to(dtype)


class Gpt2Block(nn.Module):
    """A pre-norm GPT-2 block: x += attn(ln_1(x)); x += mlp(ln_2(x)), causal attention over
    c_attn's output split into q, k, v, GELU tanh. nn.Linear weights are [out, in] (Hugging
    Face's Conv1D transposed); the names are Hugging Face's."""

    def __init__(self, d, heads, eps):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(d, 3 * d)
        self.attn.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(d, 4 * d)
        self.mlp.c_proj = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, s, d = x.shape
        dh = d // self.heads
        qkv = self.attn.c_attn(self.ln_1(x)).view(b, s, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        w = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / dh ** 0.5)
        w = torch.softmax(w.masked_fill(mask[:s, :s], float("-inf")), dim=-1)
        o = torch.matmul(w, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.attn.c_proj(o)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    """GPT-2 (GPT2LMHeadModel without dropout), as Kiln's nn::Gpt: logits = ln_f(h) @ wte^T."""

    def __init__(self, vocab, ctx, d, layers, heads, eps=1e-5, std=0.02):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, d)
        self.transformer.wpe = nn.Embedding(ctx, d)
        self.transformer.h = nn.ModuleList(Gpt2Block(d, heads, eps) for _ in range(layers))
        self.transformer.ln_f = nn.LayerNorm(d, eps=eps)
        self.register_buffer("mask", torch.ones(ctx, ctx, dtype=torch.bool).triu(1))
        # GPT2PreTrainedModel._init_weights (and nn::Gpt's initializers).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=std / (2 * max(1, layers)) ** 0.5)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=std)

    def forward(self, tokens):
        t = self.transformer
        s = tokens.shape[1]
        h = t.wte(tokens) + t.wpe.weight[:s]
        for block in t.h:
            h = block(h, self.mask)
        return F.linear(t.ln_f(h), t.wte.weight)

    def hf_state_dict(self):
        """The parameters under Hugging Face names and layouts (Conv1D weights [in, out])."""
        out = {}
        for name, p in self.named_parameters():
            transpose = ".attn.c_" in name or ".mlp.c_" in name
            out[name] = (p.t() if transpose and name.endswith("weight") else p).detach()
        return out


GPT2_SMALL = dict(vocab=50257, ctx=1024, d=768, layers=12, heads=12)
GPT2_MEDIUM = dict(vocab=50257, ctx=1024, d=1024, layers=24, heads=16)
GPT2_SEQ, GPT2_TRAIN_BATCH = 128, 4
# The --gpt2-scale rows of train_bench: (model, sequence length) per row name.
GPT2_SCALE_ROWS = {
    "gpt2_medium_train": (GPT2_MEDIUM, GPT2_SEQ),
    "gpt2_small_seq512_train": (GPT2_SMALL, 512),
}


def gpt2_lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train_step_fn(model, inputs, loss_fn, clip_norm=0.0):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    params = list(model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs[0]), inputs[1])
        loss.backward()
        if clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        opt.step()
    return step


def infer_fn(model, x):
    model.eval()

    def step():
        with torch.inference_mode():
            model(x)
    return step


def make(name):
    if name.startswith("mlp_train_"):
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[name[len("mlp_train_"):]]
        x = torch.rand(256, 1024, dtype=dtype) * 2 - 1
        labels = torch.randint(0, 10, (256,))
        return train_step_fn(mlp(dtype), (x, labels), F.cross_entropy), 3
    if name.startswith("encoder_train_"):
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[name[len("encoder_train_"):]]
        x = (torch.rand(ENC_BATCH, SEQ, D) * 2 - 1).to(dtype)
        t = (torch.rand(ENC_BATCH, SEQ, D) * 2 - 1).to(dtype)
        # The loss in f32, as on the Kiln side (and torch 1.13 has no bf16 mse_loss on CPU).
        return train_step_fn(encoder(dtype), (x, t),
                             lambda y, t: F.mse_loss(y.float(), t.float())), 2
    if name.startswith("mlp_infer_b"):
        batch = int(name[len("mlp_infer_b"):])
        return infer_fn(mlp(), torch.rand(batch, 1024) * 2 - 1), 5
    if name.startswith("encoder_infer_b"):
        batch = int(name[len("encoder_infer_b"):])
        return infer_fn(encoder(), torch.rand(batch, SEQ, D) * 2 - 1), 1
    if name == "gpt2_small_train":
        tokens = torch.randint(0, GPT2_SMALL["vocab"], (GPT2_TRAIN_BATCH, GPT2_SEQ))
        targets = torch.randint(0, GPT2_SMALL["vocab"], (GPT2_TRAIN_BATCH, GPT2_SEQ))
        return train_step_fn(Gpt2(**GPT2_SMALL), (tokens, targets), gpt2_lm_loss,
                             clip_norm=1.0), 2
    if name in GPT2_SCALE_ROWS:
        config, seq = GPT2_SCALE_ROWS[name]
        tokens = torch.randint(0, config["vocab"], (GPT2_TRAIN_BATCH, seq))
        targets = torch.randint(0, config["vocab"], (GPT2_TRAIN_BATCH, seq))
        return train_step_fn(Gpt2(**config), (tokens, targets), gpt2_lm_loss, clip_norm=1.0), 2
    if name.startswith("gpt2_small_infer_b"):
        batch = int(name[len("gpt2_small_infer_b"):])
        tokens = torch.randint(0, GPT2_SMALL["vocab"], (batch, GPT2_SEQ))
        return infer_fn(Gpt2(**GPT2_SMALL), tokens), 1
    if name == "dispatch_2000_tiny_ops":
        x, a, b = torch.rand(8), torch.full((8,), 0.5), torch.rand(8)

        def step():
            with torch.inference_mode():
                y = x
                for _ in range(1000):
                    y = y * a + b
        return step, 20
    return None, 0


def blas_library():
    """The BLAS that float32 matmuls load (torch 1.13 from Debian has no MKL): after one matmul,
    the libblas/libopenblas mapped into this process. Debian's default libblas.so.3 is the netlib
    reference BLAS, an order of magnitude slower than OpenBLAS: the driver warns about it."""
    torch.rand(64, 64) @ torch.rand(64, 64)
    libs = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            base = os.path.basename(path)
            if "blas" in base or "mkl" in base:
                libs.add(os.path.realpath(path))
    return ",".join(sorted(libs)) or "unknown"


def openblas_info():
    """(core type, config) of the OpenBLAS that torch's matmuls run on, from openblas_get_corename
    and openblas_get_config (exported by Debian's OpenBLAS, also from its libblas.so.3);
    ("unknown", "") when the BLAS is not OpenBLAS."""
    for path in blas_library().split(","):
        try:
            lib = ctypes.CDLL(path)
            core, config = lib.openblas_get_corename, lib.openblas_get_config
        except (OSError, AttributeError):
            continue
        core.restype = config.restype = ctypes.c_char_p
        return core().decode(), config().decode()
    return "unknown", ""


def matmul_check(n, reps):
    """Median GFLOP/s of an n^3 float32 matmul, and the worst relative error of a float32 matmul
    (odd shapes, so edge kernels run too) against float64 products summed without BLAS."""
    torch.manual_seed(1)
    a, b = torch.rand(n, n) * 2 - 1, torch.rand(n, n) * 2 - 1
    times = []
    for i in range(reps + 3):
        t0 = time.perf_counter()
        a @ b
        if i >= 3:
            times.append(time.perf_counter() - t0)
    times.sort()
    rate = 2.0 * n ** 3 / times[len(times) // 2] * 1e-9
    x, y = torch.rand(161, 97) * 2 - 1, torch.rand(97, 131) * 2 - 1
    exact = (x.double()[:, :, None] * y.double()[None, :, :])
    scale = exact.abs().sum(1)
    err = ((x @ y).double() - exact.sum(1)).abs() / scale
    return rate, float(err.max())


def status_bytes(field):
    """A "<field>: <n> kB" line of /proc/self/status, in bytes (None if absent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def release_memory():
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def reset_peak_rss():
    """Frees what can be freed, resets VmHWM to the current RSS and returns that baseline (bytes),
    or None when the kernel does not let this process reset its peak."""
    release_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return status_bytes("VmRSS")


def main():
    steps = {}
    baselines = {}
    print("ready " + torch.__version__ + " blas=" + blas_library(), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] == "setup":
            # GPT-2's peer flushes denormals (the module docstring); the other rows run as before.
            torch.set_flush_denormal(words[1].startswith("gpt2_"))
            baselines[words[1]] = reset_peak_rss()
            fn, warmup = make(words[1])
            if fn is None:
                print("skip unknown benchmark", flush=True)
                continue
            try:
                for _ in range(warmup):
                    fn()
            except Exception as e:  # e.g. an op without a bf16 CPU kernel
                print("skip " + str(e).splitlines()[0][:120], flush=True)
                continue
            steps[words[1]] = fn
            print("ok", flush=True)
        elif words[0] == "run":
            fn, reps = steps.get(words[1]), int(words[2])
            times = []
            if fn is not None:
                for _ in range(reps):
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1e3)
            print("times " + " ".join("%.4f" % t for t in times), flush=True)
        elif words[0] == "rss":
            base, peak = baselines.get(words[1]), status_bytes("VmHWM")
            if words[1] not in steps:
                print("rss unavailable benchmark not set up", flush=True)
            elif base is None or peak is None:
                print("rss unavailable cannot reset the peak RSS (/proc/self/clear_refs)",
                      flush=True)
            else:
                print("rss %d %d %d" % (peak - base, base, peak), flush=True)
            steps.pop(words[1], None)
            release_memory()
        elif words[0] == "blas":
            core, config = openblas_info()
            print("blas core=%s config=%s" % (core, config.replace(" ", "_")), flush=True)
        elif words[0] == "matmul":
            rate, err = matmul_check(int(words[1]), int(words[2]))
            print("matmul %.2f %.3g" % (rate, err), flush=True)
        else:
            print("skip unknown command", flush=True)


def check_gpt2(vocab, ctx, d, layers, heads):
    """The --check-gpt2 mode (module docstring). Returns the exit status."""
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree when CTest runs this
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src",
                                    "kiln", "nn", "testdata"))
    import gen_gpt_golden  # the plain-torch port of transformers' GPT-2
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Gpt2(vocab, ctx, d, layers, heads)
    # Biases and norms perturbed so that a mix-up of them shows in the logits.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    tokens = torch.randint(0, vocab, (2, max(1, ctx - 1)))
    with torch.no_grad():
        got = model(tokens)
        want = gen_gpt_golden.gpt2_logits(model.hf_state_dict(), tokens, n_head=heads,
                                          n_layer=layers)
    worst = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
    for name, p in model.hf_state_dict().items():
        print("param %s %s" % (name, "x".join(str(n) for n in p.shape)))
    if list(got.shape) != list(want.shape) or not worst <= 1e-5:
        print("FAIL: the peer's GPT-2 logits differ from gen_gpt_golden's by %.3g" % worst)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--gpt2-small-config"]:
        print("config %d %d %d %d %d %d %d" % (GPT2_SMALL["vocab"], GPT2_SMALL["ctx"],
                                              GPT2_SMALL["d"], GPT2_SMALL["layers"],
                                              GPT2_SMALL["heads"], GPT2_SEQ, GPT2_TRAIN_BATCH))
        sys.exit(0)
    if len(sys.argv) == 7 and sys.argv[1] == "--check-gpt2":
        sys.exit(check_gpt2(*(int(a) for a in sys.argv[2:])))
    main()
