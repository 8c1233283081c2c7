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
"""
import ctypes
import gc
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

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


def train_step_fn(model, inputs, loss_fn):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs[0]), inputs[1])
        loss.backward()
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


if __name__ == "__main__":
    main()
