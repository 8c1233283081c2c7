#!/usr/bin/python3
"""Prints the PyTorch 1.13 numbers hardcoded in src/kiln/nn/optim_test.cc.

The problem: parameters w f32[3] and M f32[2,2], data x f32[2,1];
  loss = sum(c * (w - t)^2) + sum((M @ x - y)^2)
with c = [1, 2, 0.5], t = [1, 0, -1], y = [[0.3], [-0.7]]. Each case runs torch.optim for a few
steps (clip_grad_norm_ before the step when clipping; scheduler.step() after it) and prints the
lr used, the loss before each step, and the final parameters.

Run:  /usr/bin/python3 src/kiln/nn/testdata/gen_optim_expected.py
"""
import warnings

import torch

warnings.simplefilter("ignore")  # SequentialLR's own deprecation warning

torch.set_printoptions(precision=10)
W0 = [0.5, -1.0, 2.0]
M0 = [[1.0, -0.5], [0.25, 2.0]]
X = [[1.5], [-0.5]]
C = torch.tensor([1.0, 2.0, 0.5])
T = torch.tensor([1.0, 0.0, -1.0])
Y = torch.tensor([[0.3], [-0.7]])


def fmt(vals):
    return "{" + ", ".join(f"{v:.9g}" for v in vals) + "}"


def run(name, make_opt, steps, clip=0.0, make_sched=None):
    w = torch.tensor(W0, requires_grad=True)
    m = torch.tensor(M0, requires_grad=True)
    x = torch.tensor(X)
    opt = make_opt([w, m])
    sched = make_sched(opt) if make_sched else None
    losses, lrs, norms = [], [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = (C * (w - T) ** 2).sum() + ((m @ x - Y) ** 2).sum()
        loss.backward()
        n = torch.nn.utils.clip_grad_norm_([w, m], clip if clip > 0 else float("inf"))
        losses.append(loss.item())
        norms.append(n.item())
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched:
            sched.step()
    print(f"// {name}")
    print(f"  .losses = {fmt(losses)},")
    print(f"  .grad_norms = {fmt(norms)},")
    print(f"  .lrs = {fmt(lrs)},")
    print(f"  .w = {fmt(w.detach().flatten().tolist())},")
    print(f"  .m = {fmt(m.detach().flatten().tolist())},")


run("sgd momentum 0.9 dampening 0.1 wd 0.01 lr 0.05",
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01), 5)
run("sgd nesterov momentum 0.8 lr 0.05",
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True), 5)
run("adamw lr 0.1 betas (0.9, 0.99) eps 1e-8 wd 0.1",
    lambda p: torch.optim.AdamW(p, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1), 5)
run("adamw lr 0.1 clip 1.0",
    lambda p: torch.optim.AdamW(p, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1), 5,
    clip=1.0)
# Warmup 2 steps then cosine to 0.01 at step 6: LinearLR(1/2 -> 1 over 1 iter), then
# CosineAnnealingLR(T_max = 6 - 2, eta_min = 0.01).
run("adamw lr 0.1 clip 0.5, warmup 2 + cosine to 0.01 at 6 (SequentialLR)",
    lambda p: torch.optim.AdamW(p, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1), 7,
    clip=0.5,
    make_sched=lambda o: torch.optim.lr_scheduler.SequentialLR(o, [
        torch.optim.lr_scheduler.LinearLR(o, start_factor=0.5, end_factor=1.0, total_iters=1),
        torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=0.01)], milestones=[2]))
# (7 steps: past T_max torch's cosine rises again, Kiln's holds the floor.)


def sched_lrs(make_sched, steps, lr=1.0):
    p = [torch.zeros(1, requires_grad=True)]
    o = torch.optim.SGD(p, lr=lr)
    s = make_sched(o)
    out = []
    for _ in range(steps):
        out.append(o.param_groups[0]["lr"])
        o.step()
        s.step()
    return out


print("// LinearLR(start_factor=1/4, total_iters=3), lr 2.0 (= warmup 4, constant)")
print(fmt(sched_lrs(lambda o: torch.optim.lr_scheduler.LinearLR(
    o, start_factor=0.25, end_factor=1.0, total_iters=3), 8, lr=2.0)))
print("// CosineAnnealingLR(T_max=10, eta_min=0.1), lr 1.0 (= cosine, total 10, floor 0.1)")
print(fmt(sched_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(
    o, T_max=10, eta_min=0.1), 11)))
print("// LinearLR(start_factor=1, end_factor=0.2, total_iters=5), lr 0.5 (= linear, total 5, floor 0.1)")
print(fmt(sched_lrs(lambda o: torch.optim.lr_scheduler.LinearLR(
    o, start_factor=1.0, end_factor=0.2, total_iters=5), 7, lr=0.5)))
