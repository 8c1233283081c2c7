#!/usr/bin/env python3
"""Generates Kiln's PyTorch goldens: one small safetensors file per case in this folder.

Run from anywhere (needs Debian's python3-torch, nothing else):

    /usr/bin/python3 tests/golden/gen_goldens.py

Every case pins one Kiln op (or a small model) to what PyTorch computes. Inputs are drawn in
float32 from seeded generators, widened to float64 for the computation, and the results are
rounded back to float32 when saved, so a golden is the float32 rounding of the exact answer for
the float32 inputs. Tensor names in each file:

    in.<name>    an operand (or model parameter / input)
    out.<name>   a result
    cot.<name>   the fixed random cotangent paired with out.<name>
    grad.<name>  d loss / d in.<name>, where loss = sum over outputs of sum(out * cot) for op
                 cases, and the model's own scalar loss for model cases

__metadata__ has one key, "kiln_golden", a JSON string that says how to rebuild the case with the
Kiln builder (see README.md). Output is deterministic: rerunning gives byte-identical files.
"""

import json
import math
import os
import struct
import sys
import zlib

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
FORMAT = "kiln-golden-v1"

# Default tolerances for comparing Kiln's float32 results with the goldens:
# |kiln - golden| <= atol + rtol * |golden|, elementwise.
TOL = {"rtol": 1e-5, "atol": 1e-6, "grad_rtol": 1e-5, "grad_atol": 1e-6}
TOL_SUM = {"rtol": 1e-4, "atol": 1e-5, "grad_rtol": 1e-4, "grad_atol": 1e-5}
TOL_EXACT = {"rtol": 0.0, "atol": 0.0, "grad_rtol": 0.0, "grad_atol": 0.0}
TOL_MODEL = {"rtol": 1e-4, "atol": 1e-5, "grad_rtol": 1e-3, "grad_atol": 1e-6}

# ------------------------------------------------------------------------------------------------
# safetensors writer (the python `safetensors` package is not on Debian). Same layout Kiln writes:
# __metadata__ first, tensors in the order given, header padded with spaces to a multiple of 8.

_ST_DTYPE = {
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.bool: "BOOL",
}


def _tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata):
    assert sys.byteorder == "little"
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs = []
    offset = 0
    for name, t in tensors:
        assert name not in header, name
        b = _tensor_bytes(t)
        header[name] = {
            "dtype": _ST_DTYPE[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(b)],
        }
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# Deterministic inputs. Each family of cases (one registered function) draws its inputs from its
# own generator seeded from the family's name, and each case's cotangent from one seeded from the
# case's name, so a change in one family never changes another family's files.


class Rng:
    def __init__(self, name):
        self.g = torch.Generator().manual_seed(zlib.crc32(name.encode()))

    def normal(self, *shape, scale=1.0):
        return (torch.randn(shape, generator=self.g, dtype=torch.float32) * scale).float()

    def uniform(self, lo, hi, *shape):
        return (torch.rand(shape, generator=self.g, dtype=torch.float32) * (hi - lo) + lo).float()

    def away_from_zero(self, *shape, margin=0.1):
        """Normal values with |x| >= margin: keeps abs/relu/sign/max away from their kinks."""
        x = self.normal(*shape)
        return torch.where(x >= 0, x + margin, x - margin).float()

    def ints(self, lo, hi, *shape, dtype=torch.int32):
        return torch.randint(lo, hi, shape, generator=self.g, dtype=torch.int64).to(dtype)

    def bools(self, *shape):
        return torch.rand(shape, generator=self.g) < 0.5

    def perm(self, n):
        return torch.randperm(n, generator=self.g)


CASES = []  # filled by register()


def register(fn):
    CASES.append(fn)
    return fn


def _is_float(t):
    return t.dtype.is_floating_point


def _desc_dtype(t):
    return {
        torch.float32: "f32",
        torch.float64: "f64",
        torch.float16: "f16",
        torch.bfloat16: "bf16",
        torch.int8: "s8",
        torch.uint8: "u8",
        torch.int32: "s32",
        torch.int64: "s64",
        torch.bool: "bool",
    }[t.dtype]


def _type_str(t):
    return _desc_dtype(t) + "[" + ",".join(str(d) for d in t.shape) + "]"


def op_case(name, op, attrs, inputs, fn, grads=(), tol=None, notes="", out_dtype=None,
            broadcast=False):
    """Writes one op golden.

    inputs: list of (operand name, tensor) in operand order. Float tensors must be float32; they
      are widened to float64 for `fn`. Integer and bool tensors are passed as they are.
    fn: the op in torch, called with the operands positionally; returns one tensor.
    grads: operand names to differentiate (float operands only).
    out_dtype: the dtype to store out.y in (default: float32 for float results, else as is).
    broadcast: the operands have different shapes and the Kiln side must broadcast them
      numpy-style first (the builder's Add/Mul/... do this).
    """
    rng = Rng(name + "/cot")
    leaves = []
    for n, t in inputs:
        if _is_float(t):
            assert t.dtype == torch.float32, (name, n)
            x = t.double().requires_grad_(n in grads)
        else:
            assert n not in grads, (name, n)
            x = t
        leaves.append(x)
    y = fn(*leaves)
    tensors = [("in." + n, t) for n, t in inputs]
    if y.dtype.is_floating_point:
        stored = y.detach().to(out_dtype or torch.float32)
    else:
        stored = y.detach().to(out_dtype or y.dtype)
    tensors.append(("out.y", stored))
    if grads:
        cot = rng.normal(*y.shape)
        tensors.append(("cot.y", cot))
        wrt = [leaves[i] for i, (n, _) in enumerate(inputs) if n in grads]
        names = [n for n, _ in inputs if n in grads]
        gs = torch.autograd.grad((y * cot.double()).sum(), wrt, allow_unused=True)
        for n, w, g in zip(names, wrt, gs):
            if g is None:
                g = torch.zeros_like(w)
            tensors.append(("grad." + n, g.detach().float()))
    desc = {
        "format": FORMAT,
        "kind": "op",
        "case": name,
        "op": op,
        "attrs": attrs,
        "operands": [n for n, _ in inputs],
        "operand_types": [_type_str(t) for _, t in inputs],
        "outputs": ["y"],
        "output_types": [_type_str(stored)],
        "grads": [n for n, _ in inputs if n in grads],
        "broadcast": "numpy" if broadcast else "none",
    }
    desc.update(tol or TOL)
    if notes:
        desc["notes"] = notes
    save(name, tensors, desc)


def save(name, tensors, desc):
    desc["generator"] = "tests/golden/gen_goldens.py"
    desc["torch_version"] = torch.__version__.split("+")[0]
    meta = {"kiln_golden": json.dumps(desc, sort_keys=True, separators=(",", ":"))}
    write_safetensors(os.path.join(HERE, name + ".safetensors"), tensors, meta)


# ------------------------------------------------------------------------------------------------
# Elementwise unary


def _unary(name, op, x, fn, attrs=None, tol=None, grad=True, notes=""):
    op_case(name, op, attrs or {}, [("x", x)], fn, grads=("x",) if grad else (), tol=tol,
            notes=notes)


@register
def elementwise_unary():
    r = Rng("unary")
    shape = (3, 5)
    _unary("abs", "abs", r.away_from_zero(*shape), torch.abs)
    _unary("neg", "neg", r.normal(*shape), torch.neg)
    _unary("relu", "relu", r.away_from_zero(*shape), torch.relu)
    _unary("exp", "exp", r.normal(*shape), torch.exp)
    _unary("log", "log", r.uniform(0.05, 4.0, *shape), torch.log)
    _unary("sqrt", "sqrt", r.uniform(0.05, 4.0, *shape), torch.sqrt)
    _unary("rsqrt", "rsqrt", r.uniform(0.05, 4.0, *shape), torch.rsqrt)
    _unary("sin", "sin", r.normal(*shape, scale=3.0), torch.sin)
    _unary("cos", "cos", r.normal(*shape, scale=3.0), torch.cos)
    _unary("tanh", "tanh", r.normal(*shape, scale=2.0), torch.tanh)
    _unary("sigmoid", "sigmoid", r.normal(*shape, scale=3.0), torch.sigmoid)
    _unary("silu", "silu", r.normal(*shape, scale=3.0), F.silu)
    _unary("erf", "erf", r.normal(*shape, scale=1.5), torch.erf)
    _unary("gelu_none", "gelu", r.normal(4, 7, scale=3.0),
           lambda x: F.gelu(x, approximate="none"), attrs={"approximate": "none"})
    _unary("gelu_tanh", "gelu", r.normal(4, 7, scale=3.0),
           lambda x: F.gelu(x, approximate="tanh"), attrs={"approximate": "tanh"})
    # sign: zeros included to pin sign(0) = 0; no gradient (zero almost everywhere).
    x = r.normal(4, 5)
    x[0, :3] = 0.0
    _unary("sign", "sign", x, torch.sign, grad=False, tol=TOL_EXACT)


# ------------------------------------------------------------------------------------------------
# Elementwise binary


@register
def elementwise_binary():
    r = Rng("binary")
    shape = (4, 7)

    def pair(name, op, a, b, fn, grads=("a", "b"), tol=None, broadcast=False, notes=""):
        op_case(name, op, {}, [("a", a), ("b", b)], fn, grads=grads, tol=tol,
                broadcast=broadcast, notes=notes)

    pair("add", "add", r.normal(*shape), r.normal(*shape), torch.add)
    pair("sub", "sub", r.normal(*shape), r.normal(*shape), torch.sub)
    pair("mul", "mul", r.normal(*shape), r.normal(*shape), torch.mul)
    pair("div", "div", r.normal(*shape), r.away_from_zero(*shape, margin=0.3), torch.div)
    pair("pow", "pow", r.uniform(0.2, 2.5, *shape), r.normal(*shape, scale=1.5), torch.pow)
    a = r.normal(*shape)
    gap = r.away_from_zero(*shape, margin=0.05)  # no ties: the gradient is unambiguous
    pair("max", "max", a, (a + gap).float(), torch.maximum)
    pair("min", "min", a, (a + gap).float(), torch.minimum)
    # numpy broadcasting through the builder: [3,1,5] with [4,1] -> [3,4,5].
    pair("add_broadcast", "add", r.normal(3, 1, 5), r.normal(4, 1), torch.add, broadcast=True,
         notes="operands broadcast numpy-style to [3,4,5] (builder Add)")
    pair("mul_broadcast", "mul", r.normal(2, 3, 4), r.normal(4), torch.mul, broadcast=True,
         notes="operands broadcast numpy-style to [2,3,4] (builder Mul)")


# ------------------------------------------------------------------------------------------------
# compare / select / logical / convert (no gradients except select's value operands)


@register
def compare_select_logical():
    r = Rng("compare")
    # Small integers as floats: plenty of ties so eq/ne/le/ge are all exercised.
    a = r.ints(-2, 3, 5, 6).float()
    b = r.ints(-2, 3, 5, 6).float()
    fns = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
           "ge": torch.ge}
    for d, fn in fns.items():
        op_case("compare_" + d, "compare", {"direction": d}, [("a", a), ("b", b)], fn,
                tol=TOL_EXACT)
    # Non-integer values too (ordering of close floats).
    a = r.normal(3, 4)
    b = a.clone()
    b[0] = r.normal(4)
    op_case("compare_lt_float", "compare", {"direction": "lt"}, [("a", a), ("b", b)], torch.lt,
            tol=TOL_EXACT)

    pred = r.bools(4, 5)
    op_case("select", "select", {}, [("pred", pred), ("on_true", r.normal(4, 5)),
                                     ("on_false", r.normal(4, 5))],
            torch.where, grads=("on_true", "on_false"))

    p, q = r.bools(3, 4), r.bools(3, 4)
    op_case("logical_and", "logical_and", {}, [("a", p), ("b", q)], torch.logical_and,
            tol=TOL_EXACT)
    op_case("logical_or", "logical_or", {}, [("a", p), ("b", q)], torch.logical_or, tol=TOL_EXACT)
    op_case("logical_not", "logical_not", {}, [("x", p)], torch.logical_not, tol=TOL_EXACT)


@register
def convert():
    r = Rng("convert")
    # Values that need rounding in bf16/f16, including ties to even and an exact halfway case.
    x = r.normal(4, 6, scale=10.0)
    x[0, 0] = 1.0 + 2.0 ** -8  # halfway between two bf16 values -> 1.0 (even)
    x[0, 1] = 1.0 + 3 * 2.0 ** -8
    x[0, 2] = 1.0 + 2.0 ** -11  # halfway between two f16 values -> 1.0
    x[0, 3] = -0.0
    x[0, 4] = 70000.0  # overflows f16 -> inf
    x[0, 5] = 1e-6  # f16 subnormal
    notes = "round to nearest even"
    op_case("convert_f32_bf16", "convert", {}, [("x", x)], lambda t: t.float().bfloat16(),
            tol=TOL_EXACT, out_dtype=torch.bfloat16, notes=notes)
    op_case("convert_f32_f16", "convert", {}, [("x", x)], lambda t: t.float().half(),
            tol=TOL_EXACT, out_dtype=torch.float16, notes=notes)
    op_case("convert_f32_f64", "convert", {}, [("x", x)], lambda t: t, tol=TOL_EXACT,
            out_dtype=torch.float64)
    # float -> int truncates toward zero (values in range: torch leaves overflow undefined).
    xi = r.normal(3, 5, scale=50.0)
    xi[0, :4] = torch.tensor([2.5, -2.5, 0.99, -0.99])
    op_case("convert_f32_s32", "convert", {}, [("x", xi)], lambda t: t.to(torch.int32),
            tol=TOL_EXACT, notes="truncates toward zero")
    op_case("convert_s32_f32", "convert", {}, [("x", r.ints(-1000, 1000, 3, 5))],
            lambda t: t.float(), tol=TOL_EXACT)
    xb = r.normal(3, 5)
    xb[1, :3] = 0.0
    op_case("convert_f32_bool", "convert", {}, [("x", xb)], lambda t: t != 0, tol=TOL_EXACT,
            notes="nonzero -> true")
    op_case("convert_bool_f32", "convert", {}, [("x", r.bools(3, 5))], lambda t: t.float(),
            tol=TOL_EXACT)
    op_case("convert_s64_s32", "convert", {}, [("x", r.ints(-5000, 5000, 7, dtype=torch.int64))],
            lambda t: t.to(torch.int32), tol=TOL_EXACT)


# ------------------------------------------------------------------------------------------------
# Shape and data movement


def _broadcast_in_dim(x, shape, bd):
    view = [1] * len(shape)
    for i, d in enumerate(bd):
        view[d] = x.shape[i]
    return x.reshape(view).expand(shape)


def _pad(x, low, high, interior, value):
    """Kiln/XLA pad (all amounts >= 0) built from indexing so autograd gives the gradient."""
    out_shape = [lo + hi + d + max(d - 1, 0) * it
                 for d, lo, hi, it in zip(x.shape, low, high, interior)]
    out = torch.full(out_shape, value, dtype=x.dtype)
    idx = tuple(slice(lo, lo + max(d - 1, 0) * (it + 1) + 1, it + 1) if d > 0 else slice(0, 0)
                for d, lo, it in zip(x.shape, low, interior))
    out[idx] = x
    return out


def _gather(table, idx, axis):
    n = table.shape[axis]
    return table[(slice(None),) * axis + (idx.long().clamp(0, n - 1),)]


def _scatter_add(operand, idx, updates, axis):
    """out = operand; out[..., idx[j], ...] += updates[..., j, ...]; out-of-range j dropped."""
    shape = operand.shape
    pre = math.prod(shape[:axis])
    n = shape[axis]
    post = math.prod(shape[axis + 1:])
    flat = idx.reshape(-1).long()
    k = flat.numel()
    onehot = torch.zeros(k, n, dtype=operand.dtype)
    for j, i in enumerate(flat.tolist()):
        if 0 <= i < n:
            onehot[j, i] = 1.0
    upd = updates.reshape(pre, k, post)
    out = operand.reshape(pre, n, post) + torch.einsum("pkq,kn->pnq", upd, onehot)
    return out.reshape(shape)


@register
def structural():
    r = Rng("structural")
    op_case("broadcast_in_dim", "broadcast_in_dim",
            {"shape": [2, 3, 4], "broadcast_dimensions": [1, 2]}, [("x", r.normal(3, 1))],
            lambda x: _broadcast_in_dim(x, [2, 3, 4], [1, 2]), grads=("x",))
    op_case("broadcast_in_dim_middle", "broadcast_in_dim",
            {"shape": [3, 5, 2], "broadcast_dimensions": [0, 2]}, [("x", r.normal(3, 2))],
            lambda x: _broadcast_in_dim(x, [3, 5, 2], [0, 2]), grads=("x",))
    op_case("broadcast_in_dim_scalar", "broadcast_in_dim",
            {"shape": [2, 3], "broadcast_dimensions": []}, [("x", r.normal())],
            lambda x: _broadcast_in_dim(x, [2, 3], []), grads=("x",))

    op_case("reshape", "reshape", {"shape": [4, 6]}, [("x", r.normal(2, 3, 4))],
            lambda x: x.reshape(4, 6), grads=("x",))
    op_case("reshape_unit_dims", "reshape", {"shape": [1, 2, 3, 1]}, [("x", r.normal(6))],
            lambda x: x.reshape(1, 2, 3, 1), grads=("x",))

    op_case("transpose", "transpose", {"permutation": [2, 0, 1]}, [("x", r.normal(2, 3, 4))],
            lambda x: x.permute(2, 0, 1), grads=("x",))
    op_case("transpose_4d", "transpose", {"permutation": [0, 2, 3, 1]},
            [("x", r.normal(2, 3, 4, 5))], lambda x: x.permute(0, 2, 3, 1), grads=("x",))

    op_case("slice_strided", "slice", {"start": [1, 0], "limit": [5, 7], "stride": [2, 3]},
            [("x", r.normal(5, 7))], lambda x: x[1:5:2, 0:7:3], grads=("x",))
    op_case("slice_3d", "slice", {"start": [0, 1, 2], "limit": [2, 3, 5], "stride": [1, 1, 2]},
            [("x", r.normal(3, 4, 6))], lambda x: x[0:2, 1:3, 2:5:2], grads=("x",))

    op_case("concatenate_dim1", "concatenate", {"dimension": 1},
            [("x0", r.normal(2, 3)), ("x1", r.normal(2, 1)), ("x2", r.normal(2, 4))],
            lambda a, b, c: torch.cat([a, b, c], 1), grads=("x0", "x1", "x2"))
    op_case("concatenate_dim0", "concatenate", {"dimension": 0},
            [("x0", r.normal(1, 3, 2)), ("x1", r.normal(3, 3, 2))],
            lambda a, b: torch.cat([a, b], 0), grads=("x0", "x1"))

    op_case("pad_interior", "pad",
            {"low": [1, 0], "high": [2, 1], "interior": [1, 2], "value": 0.5},
            [("x", r.normal(3, 4))], lambda x: _pad(x, [1, 0], [2, 1], [1, 2], 0.5), grads=("x",))
    op_case("pad_edges", "pad", {"low": [0, 2, 1], "high": [1, 0, 3], "interior": [0, 0, 0],
                                 "value": 0.0},
            [("x", r.normal(2, 3, 2))], lambda x: _pad(x, [0, 2, 1], [1, 0, 3], [0, 0, 0], 0.0),
            grads=("x",))

    op_case("gather_axis0", "gather", {"axis": 0},
            [("table", r.normal(5, 4)), ("indices", torch.tensor([3, 0, 3, 4], dtype=torch.int32))],
            lambda t, i: _gather(t, i, 0), grads=("table",))
    op_case("gather_axis1_2d_indices", "gather", {"axis": 1},
            [("table", r.normal(2, 6, 3)),
             ("indices", torch.tensor([[5, 1], [1, 0], [2, 5]], dtype=torch.int64))],
            lambda t, i: _gather(t, i, 1), grads=("table",))
    op_case("gather_clamp", "gather", {"axis": 0},
            [("table", r.normal(4, 3)), ("indices", torch.tensor([-3, 1, 4, 9], dtype=torch.int32))],
            lambda t, i: _gather(t, i, 0), grads=("table",),
            notes="out-of-range indices clamp to [0, n-1]")

    op_case("scatter_add_axis0", "scatter_add", {"axis": 0},
            [("operand", r.normal(5, 3)),
             ("indices", torch.tensor([1, 4, 1, 0], dtype=torch.int32)),
             ("updates", r.normal(4, 3))],
            lambda o, i, u: _scatter_add(o, i, u, 0), grads=("operand", "updates"),
            notes="duplicate indices accumulate")
    op_case("scatter_add_axis1_2d_indices", "scatter_add", {"axis": 1},
            [("operand", r.normal(2, 4, 3)),
             ("indices", torch.tensor([[3, 0], [3, 3]], dtype=torch.int64)),
             ("updates", r.normal(2, 2, 2, 3))],
            lambda o, i, u: _scatter_add(o, i, u, 1), grads=("operand", "updates"))
    op_case("scatter_add_drop", "scatter_add", {"axis": 0},
            [("operand", r.normal(3, 2)),
             ("indices", torch.tensor([2, -1, 3, 0, 7], dtype=torch.int32)),
             ("updates", r.normal(5, 2))],
            lambda o, i, u: _scatter_add(o, i, u, 0), grads=("operand", "updates"),
            notes="out-of-range indices are dropped (their updates get zero gradient)")


# ------------------------------------------------------------------------------------------------
# Reductions


@register
def reductions():
    r = Rng("reductions")
    x = r.normal(3, 4, 5)
    for op, fn in (("reduce_sum", lambda t, d: t.sum(d)),
                   ("reduce_max", lambda t, d: t.amax(d)),
                   ("reduce_min", lambda t, d: t.amin(d))):
        op_case(op + "_dims02", op, {"dimensions": [0, 2]}, [("x", x)],
                lambda t, fn=fn: fn(t, (0, 2)), grads=("x",), tol=TOL_SUM)
        op_case(op + "_dim1", op, {"dimensions": [1]}, [("x", x)],
                lambda t, fn=fn: fn(t, (1,)), grads=("x",), tol=TOL_SUM)
        op_case(op + "_all", op, {"dimensions": [0, 1, 2]}, [("x", x)],
                lambda t, fn=fn: fn(t, (0, 1, 2)), grads=("x",), tol=TOL_SUM)
    op_case("reduce_sum_none", "reduce_sum", {"dimensions": []}, [("x", r.normal(2, 3))],
            lambda t: t.clone(), grads=("x",))

    # argmax: ties on purpose; the first maximum wins (as torch documents).
    t = r.ints(0, 4, 4, 6).float()
    op_case("argmax_axis1", "argmax", {"axis": 1}, [("x", t)],
            lambda v: torch.argmax(v, 1).int(), tol=TOL_EXACT, notes="first max wins")
    op_case("argmax_axis0", "argmax", {"axis": 0}, [("x", t)],
            lambda v: torch.argmax(v, 0).int(), tol=TOL_EXACT, notes="first max wins")
    op_case("argmax_float", "argmax", {"axis": 2}, [("x", r.normal(2, 3, 7))],
            lambda v: torch.argmax(v, 2).int(), tol=TOL_EXACT)


# ------------------------------------------------------------------------------------------------
# dot_general


def _dot_general(lhs, rhs, lb, rb, lc, rc):
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    ls = [None] * lhs.dim()
    rs = [None] * rhs.dim()
    for i, j in zip(lb, rb):
        ls[i] = rs[j] = next(letters)
    for i, j in zip(lc, rc):
        ls[i] = rs[j] = next(letters)
    for s in (ls, rs):
        for i in range(len(s)):
            if s[i] is None:
                s[i] = next(letters)
    out = [ls[i] for i in lb]
    out += [ls[i] for i in range(lhs.dim()) if i not in lb and i not in lc]
    out += [rs[i] for i in range(rhs.dim()) if i not in rb and i not in rc]
    return torch.einsum("".join(ls) + "," + "".join(rs) + "->" + "".join(out), lhs, rhs)


@register
def dot_general():
    r = Rng("dot_general")

    def case(name, lshape, rshape, lb, rb, lc, rc):
        attrs = {"lhs_batch": lb, "rhs_batch": rb, "lhs_contracting": lc, "rhs_contracting": rc}
        op_case(name, "dot_general", attrs, [("lhs", r.normal(*lshape)), ("rhs", r.normal(*rshape))],
                lambda a, b: _dot_general(a, b, lb, rb, lc, rc), grads=("lhs", "rhs"),
                tol=TOL_SUM)

    case("dot_general_matmul", (5, 7), (7, 3), [], [], [1], [0])
    case("dot_general_batched", (2, 3, 4), (2, 4, 5), [0], [0], [2], [1])
    case("dot_general_transposed", (6, 3), (4, 6), [], [], [0], [1])
    case("dot_general_mixed", (3, 4, 2), (2, 5, 4), [2], [0], [1], [2])
    case("dot_general_two_contracting", (2, 3, 4), (4, 5, 3), [], [], [1, 2], [2, 0])
    case("dot_general_vector", (6,), (6,), [], [], [0], [0])
    case("dot_general_outer", (3,), (4,), [], [], [], [])


# ------------------------------------------------------------------------------------------------
# conv2d and its gradient ops


def _conv2d(x, w, strides, padding, dilation, groups):
    x = F.pad(x, (padding[2], padding[3], padding[0], padding[1]))
    return F.conv2d(x, w, stride=strides, dilation=dilation, groups=groups)


def _conv_attrs(strides, padding, dilation, groups):
    return {"strides": strides, "padding": padding, "dilation": dilation, "groups": groups}


@register
def conv():
    r = Rng("conv")

    def case(name, xshape, wshape, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
             groups=1):
        strides, padding, dilation = list(strides), list(padding), list(dilation)
        x, w = r.normal(*xshape), r.normal(*wshape, scale=0.5)
        op_case(name, "conv2d", _conv_attrs(strides, padding, dilation, groups),
                [("input", x), ("filter", w)],
                lambda a, b: _conv2d(a, b, strides, padding, dilation, groups),
                grads=("input", "filter"), tol=TOL_SUM)
        return x, w, strides, padding, dilation, groups

    case("conv2d_basic", (2, 3, 7, 6), (4, 3, 3, 3))
    spec = case("conv2d_stride_pad", (2, 3, 8, 7), (5, 3, 3, 2), strides=(2, 2),
                padding=(1, 0, 2, 1))
    case("conv2d_dilation", (1, 2, 9, 8), (3, 2, 3, 3), dilation=(2, 1), padding=(1, 1, 0, 2))
    case("conv2d_groups", (2, 4, 6, 5), (6, 2, 3, 3), groups=2, padding=(1, 1, 1, 1))
    case("conv2d_depthwise", (1, 3, 6, 6), (3, 1, 3, 3), groups=3, strides=(1, 2))
    case("conv2d_1x1", (2, 5, 4, 3), (7, 5, 1, 1))

    # The gradient ops, as standalone ops: vector-Jacobian products of conv2d (linear in both
    # operands, so their own gradients exist and are checked too).
    x, w, strides, padding, dilation, groups = spec
    xshape, wshape = list(x.shape), list(w.shape)
    yshape = list(_conv2d(x.double(), w.double(), strides, padding, dilation, groups).shape)
    attrs = _conv_attrs(strides, padding, dilation, groups)

    def backward_input(g, filt):
        z = torch.zeros(xshape, dtype=g.dtype, requires_grad=True)
        y = _conv2d(z, filt, strides, padding, dilation, groups)
        return torch.autograd.grad(y, z, g, create_graph=True)[0]

    def backward_filter(inp, g):
        z = torch.zeros(wshape, dtype=g.dtype, requires_grad=True)
        y = _conv2d(inp, z, strides, padding, dilation, groups)
        return torch.autograd.grad(y, z, g, create_graph=True)[0]

    op_case("conv2d_backward_input", "conv2d_backward_input", dict(attrs, input_shape=xshape),
            [("grad_out", r.normal(*yshape)), ("filter", w)], backward_input,
            grads=("grad_out", "filter"), tol=TOL_SUM)
    op_case("conv2d_backward_filter", "conv2d_backward_filter", dict(attrs, filter_shape=wshape),
            [("input", x), ("grad_out", r.normal(*yshape))], backward_filter,
            grads=("input", "grad_out"), tol=TOL_SUM)


# ------------------------------------------------------------------------------------------------
# Pooling


def _max_pool(x, window, strides, padding):
    x = F.pad(x, (padding[2], padding[3], padding[0], padding[1]), value=-math.inf)
    return F.max_pool2d(x, window, strides)


def _avg_pool(x, window, strides, padding, count_include_pad):
    pad = (padding[2], padding[3], padding[0], padding[1])
    area = window[0] * window[1]
    s = F.avg_pool2d(F.pad(x, pad), window, strides) * area
    if count_include_pad:
        return s / area
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype)
    count = F.avg_pool2d(F.pad(ones, pad), window, strides) * area
    return s / count


def _pool_attrs(window, strides, padding, count_include_pad=None):
    a = {"window": window, "strides": strides, "padding": padding}
    if count_include_pad is not None:
        a["count_include_pad"] = count_include_pad
    return a


@register
def pooling():
    r = Rng("pooling")
    for name, xshape, window, strides, padding in (
            ("2x2", (2, 3, 6, 8), [2, 2], [2, 2], [0, 0, 0, 0]),
            ("3x3_pad", (1, 2, 7, 7), [3, 3], [2, 2], [1, 1, 1, 1]),
            ("asym", (2, 2, 5, 7), [2, 3], [1, 2], [0, 1, 1, 0])):
        x = r.normal(*xshape)
        op_case("max_pool2d_" + name, "max_pool2d", _pool_attrs(window, strides, padding),
                [("x", x)], lambda t: _max_pool(t, window, strides, padding), grads=("x",),
                notes="padding never wins the max")
        for cip in (0, 1):
            op_case(f"avg_pool2d_{name}_cip{cip}", "avg_pool2d",
                    _pool_attrs(window, strides, padding, cip), [("x", x)],
                    lambda t, cip=cip: _avg_pool(t, window, strides, padding, cip), grads=("x",))

    # The gradient ops as standalone ops.
    window, strides, padding = [3, 3], [2, 2], [1, 1, 1, 1]
    x = r.normal(1, 2, 7, 7)
    yshape = list(_max_pool(x.double(), window, strides, padding).shape)

    def max_pool_grad(inp, g):
        z = inp.detach().requires_grad_(True)
        return torch.autograd.grad(_max_pool(z, window, strides, padding), z, g,
                                   create_graph=True)[0]

    op_case("max_pool2d_grad", "max_pool2d_grad", _pool_attrs(window, strides, padding),
            [("x", x), ("grad_out", r.normal(*yshape))], max_pool_grad, grads=("grad_out",),
            notes="the gradient goes to the (first) max; linear in grad_out")
    for cip in (0, 1):
        def avg_pool_grad(g, cip=cip):
            z = torch.zeros(list(x.shape), dtype=g.dtype, requires_grad=True)
            return torch.autograd.grad(_avg_pool(z, window, strides, padding, cip), z, g,
                                       create_graph=True)[0]

        op_case(f"avg_pool2d_grad_cip{cip}", "avg_pool2d_grad",
                dict(_pool_attrs(window, strides, padding, cip), input_shape=list(x.shape)),
                [("grad_out", r.normal(*yshape))], avg_pool_grad, grads=("grad_out",))


# ------------------------------------------------------------------------------------------------
# NN composites


def _layer_norm(x, gamma, beta, eps):
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)


def _rms_norm(x, gamma, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma


def _cross_entropy(logits, labels):
    c = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, c), labels.reshape(-1).long(), reduction="none")
    return loss.reshape(labels.shape)


def _attention(q, k, v, causal, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        i = torch.arange(sq).unsqueeze(1) + (sk - sq)
        j = torch.arange(sk).unsqueeze(0)
        s = s.masked_fill(j > i, -math.inf)
    return torch.matmul(torch.softmax(s, -1), v)


@register
def nn_composites():
    r = Rng("nn")
    x = r.normal(3, 5, 4, scale=2.0)
    op_case("softmax_axis1", "softmax", {"axis": 1}, [("x", x)], lambda t: torch.softmax(t, 1),
            grads=("x",))
    op_case("softmax_last", "softmax", {"axis": 2}, [("x", x)], lambda t: torch.softmax(t, 2),
            grads=("x",))
    op_case("log_softmax_last", "log_softmax", {"axis": 2}, [("x", x)],
            lambda t: torch.log_softmax(t, 2), grads=("x",))
    op_case("log_softmax_axis0", "log_softmax", {"axis": 0}, [("x", x)],
            lambda t: torch.log_softmax(t, 0), grads=("x",))
    # Large logits: a naive exp overflows in float32.
    big = r.normal(2, 6, scale=40.0)
    big[0, 0] = 120.0
    op_case("softmax_large", "softmax", {"axis": 1}, [("x", big)], lambda t: torch.softmax(t, 1),
            grads=("x",))
    op_case("log_softmax_large", "log_softmax", {"axis": 1}, [("x", big)],
            lambda t: torch.log_softmax(t, 1), grads=("x",), tol=TOL_SUM)

    d = 8
    op_case("layer_norm", "layer_norm", {"epsilon": 1e-5},
            [("x", r.normal(2, 3, d, scale=2.0)), ("gamma", (1 + r.normal(d, scale=0.2)).float()),
             ("beta", r.normal(d, scale=0.2))],
            lambda a, g, b: _layer_norm(a, g, b, 1e-5), grads=("x", "gamma", "beta"), tol=TOL_SUM)
    op_case("layer_norm_eps", "layer_norm", {"epsilon": 0.1},
            [("x", r.normal(4, 5)), ("gamma", (1 + r.normal(5, scale=0.2)).float()),
             ("beta", r.normal(5, scale=0.2))],
            lambda a, g, b: _layer_norm(a, g, b, 0.1), grads=("x", "gamma", "beta"), tol=TOL_SUM)
    op_case("rms_norm", "rms_norm", {"epsilon": 1e-6},
            [("x", r.normal(4, 6, scale=2.0)), ("gamma", (1 + r.normal(6, scale=0.2)).float())],
            lambda a, g: _rms_norm(a, g, 1e-6), grads=("x", "gamma"), tol=TOL_SUM)
    op_case("rms_norm_eps", "rms_norm", {"epsilon": 0.5},
            [("x", r.normal(2, 3, 5)), ("gamma", (1 + r.normal(5, scale=0.2)).float())],
            lambda a, g: _rms_norm(a, g, 0.5), grads=("x", "gamma"), tol=TOL_SUM)

    op_case("cross_entropy", "cross_entropy", {},
            [("logits", r.normal(6, 5, scale=2.0)), ("labels", r.ints(0, 5, 6))],
            _cross_entropy, grads=("logits",), tol=TOL_SUM)
    op_case("cross_entropy_3d", "cross_entropy", {},
            [("logits", r.normal(2, 3, 4, scale=2.0)),
             ("labels", r.ints(0, 4, 2, 3, dtype=torch.int64))],
            _cross_entropy, grads=("logits",), tol=TOL_SUM)

    def attn(name, qs, ks, vs, causal, scale=None, notes=""):
        q, k, v = r.normal(*qs), r.normal(*ks), r.normal(*vs)
        sc = float(scale if scale is not None else 1.0 / math.sqrt(qs[-1]))
        op_case(name, "attention", {"causal": int(causal), "scale": sc},
                [("q", q), ("k", k), ("v", v)],
                lambda a, b, c: _attention(a, b, c, causal, sc), grads=("q", "k", "v"),
                tol=TOL_SUM, notes=notes)

    attn("attention", (2, 5, 4), (2, 6, 4), (2, 6, 3), False)
    attn("attention_causal", (2, 2, 6, 4), (2, 2, 6, 4), (2, 2, 6, 4), True)
    attn("attention_causal_offset", (1, 3, 4), (1, 7, 4), (1, 7, 5), True,
         notes="Sq < Sk: the mask is aligned at the end (query i sees keys j <= i + Sk - Sq)")
    attn("attention_scale", (3, 4, 8), (3, 4, 8), (3, 4, 2), False, scale=0.7)


# ------------------------------------------------------------------------------------------------
# Composite models


@register
def mlp():
    name = "model_mlp"
    r = Rng(name)
    sizes = [16, 32, 32, 10]
    batch = 8
    params = []
    for i in range(3):
        fan_in, fan_out = sizes[i], sizes[i + 1]
        params.append((f"w{i + 1}", r.normal(fan_in, fan_out, scale=1 / math.sqrt(fan_in))))
        params.append((f"b{i + 1}", r.normal(fan_out, scale=0.1)))
    x = r.normal(batch, sizes[0])
    labels = r.ints(0, sizes[-1], batch)
    p = {n: t.double().requires_grad_(True) for n, t in params}
    h = torch.relu(x.double() @ p["w1"] + p["b1"])
    h = torch.relu(h @ p["w2"] + p["b2"])
    logits = h @ p["w3"] + p["b3"]
    loss = F.cross_entropy(logits, labels.long(), reduction="mean")
    grads = torch.autograd.grad(loss, [p[n] for n, _ in params])
    tensors = [("in.x", x), ("in.labels", labels)] + [("in." + n, t) for n, t in params]
    tensors += [("out.logits", logits.detach().float()), ("out.loss", loss.detach().float())]
    tensors += [("grad." + n, g.float()) for (n, _), g in zip(params, grads)]
    desc = {
        "format": FORMAT,
        "kind": "model",
        "case": name,
        "model": "mlp",
        "inputs": ["x", "labels"],
        "params": [n for n, _ in params],
        "outputs": ["logits", "loss"],
        "grads": [n for n, _ in params],
        "loss": "loss",
        "architecture": {
            "layers": sizes,
            "weight_layout": "w<i>: [in, out], used as x @ w; b<i>: [out]",
            "forward": [
                "h1 = relu(x @ w1 + b1)",
                "h2 = relu(h1 @ w2 + b2)",
                "logits = h2 @ w3 + b3",
                "loss = mean over the batch of cross_entropy(logits, labels)",
            ],
            "x": [batch, sizes[0]],
            "labels": "s32[%d], class ids in [0, %d)" % (batch, sizes[-1]),
        },
        "notes": "grad.<param> is d loss / d param (no cotangent: loss is the scalar output)",
    }
    desc.update(TOL_MODEL)
    save(name, tensors, desc)


@register
def transformer_block():
    name = "model_transformer_block"
    r = Rng(name)
    batch, seq, d_model, heads, d_ff = 2, 8, 32, 2, 64
    dh = d_model // heads
    eps = 1e-5

    def lin(fan_in, fan_out):
        return r.normal(fan_in, fan_out, scale=1 / math.sqrt(fan_in))

    params = [
        ("ln1.gamma", (1 + r.normal(d_model, scale=0.1)).float()),
        ("ln1.beta", r.normal(d_model, scale=0.1)),
        ("attn.wq", lin(d_model, d_model)), ("attn.bq", r.normal(d_model, scale=0.1)),
        ("attn.wk", lin(d_model, d_model)), ("attn.bk", r.normal(d_model, scale=0.1)),
        ("attn.wv", lin(d_model, d_model)), ("attn.bv", r.normal(d_model, scale=0.1)),
        ("attn.wo", lin(d_model, d_model)), ("attn.bo", r.normal(d_model, scale=0.1)),
        ("ln2.gamma", (1 + r.normal(d_model, scale=0.1)).float()),
        ("ln2.beta", r.normal(d_model, scale=0.1)),
        ("mlp.w1", lin(d_model, d_ff)), ("mlp.b1", r.normal(d_ff, scale=0.1)),
        ("mlp.w2", lin(d_ff, d_model)), ("mlp.b2", r.normal(d_model, scale=0.1)),
    ]
    x = r.normal(batch, seq, d_model)
    cot = r.normal(batch, seq, d_model)
    p = {n: t.double().requires_grad_(True) for n, t in params}
    xd = x.double().requires_grad_(True)

    def heads_split(t):  # [B,S,D] -> [B,H,S,Dh]
        return t.reshape(batch, seq, heads, dh).permute(0, 2, 1, 3)

    h = F.layer_norm(xd, (d_model,), p["ln1.gamma"], p["ln1.beta"], eps)
    q = heads_split(h @ p["attn.wq"] + p["attn.bq"])
    k = heads_split(h @ p["attn.wk"] + p["attn.bk"])
    v = heads_split(h @ p["attn.wv"] + p["attn.bv"])
    a = _attention(q, k, v, True, 1.0 / math.sqrt(dh))
    a = a.permute(0, 2, 1, 3).reshape(batch, seq, d_model)
    x1 = xd + (a @ p["attn.wo"] + p["attn.bo"])
    h2 = F.layer_norm(x1, (d_model,), p["ln2.gamma"], p["ln2.beta"], eps)
    m = F.gelu(h2 @ p["mlp.w1"] + p["mlp.b1"], approximate="tanh") @ p["mlp.w2"] + p["mlp.b2"]
    y = x1 + m
    loss = (y * cot.double()).mean()
    wrt = [xd] + [p[n] for n, _ in params]
    grads = torch.autograd.grad(loss, wrt)
    tensors = [("in.x", x)] + [("in." + n, t) for n, t in params]
    tensors += [("out.y", y.detach().float()), ("out.loss", loss.detach().float()),
                ("cot.y", cot)]
    tensors += [("grad.x", grads[0].float())]
    tensors += [("grad." + n, g.float()) for (n, _), g in zip(params, grads[1:])]
    desc = {
        "format": FORMAT,
        "kind": "model",
        "case": name,
        "model": "transformer_block",
        "inputs": ["x"],
        "params": [n for n, _ in params],
        "outputs": ["y", "loss"],
        "grads": ["x"] + [n for n, _ in params],
        "loss": "loss",
        "architecture": {
            "batch": batch, "seq": seq, "d_model": d_model, "heads": heads, "head_dim": dh,
            "d_ff": d_ff, "layer_norm_epsilon": eps,
            "weight_layout": "every w: [in, out], used as t @ w + b; biases [out]; "
                             "layer norm gamma/beta [d_model]",
            "forward": [
                "h = layer_norm(x, ln1.gamma, ln1.beta, eps)",
                "q = h @ attn.wq + attn.bq; k = h @ attn.wk + attn.bk; v = h @ attn.wv + attn.bv",
                "split heads: [B,S,D] -> reshape [B,S,H,Dh] -> transpose [0,2,1,3] -> [B,H,S,Dh]",
                "a = attention(q, k, v, causal=1, scale=1/sqrt(Dh))",
                "merge heads: [B,H,S,Dh] -> transpose [0,2,1,3] -> reshape [B,S,D]",
                "x1 = x + (a @ attn.wo + attn.bo)",
                "h2 = layer_norm(x1, ln2.gamma, ln2.beta, eps)",
                "y = x1 + (gelu_tanh(h2 @ mlp.w1 + mlp.b1) @ mlp.w2 + mlp.b2)",
                "loss = mean(y * cot.y)   (mean over all B*S*D elements)",
            ],
        },
        "notes": "grad.<name> is d loss / d in.<name>; cot.y is the fixed cotangent in the loss",
    }
    desc.update(TOL_MODEL)
    save(name, tensors, desc)


# Ops of opcodes.def with no golden, and why. main() fails when an op is neither covered nor
# listed here, so a new op cannot be forgotten.
NO_GOLDEN = {
    "parameter": "graph input, not a computation",
    "constant": "literal value, not a computation",
    "iota": "no PyTorch semantics to pin (XLA's); covered by the op-consistency table",
    "random_bits": "Kiln's Philox4x32-10 stream is its own; torch's generator differs",
    "all_reduce": "collective: identity in one process; tested in dist/",
    "all_gather": "collective: tested in dist/",
    "reduce_scatter": "collective: tested in dist/",
}


def check_coverage():
    path = os.path.join(HERE, "..", "..", "src", "kiln", "ir", "opcodes.def")
    ops = []
    with open(path) as f:
        for line in f:
            if line.startswith("KILN_OP("):
                ops.append(line.split('"')[1])
    covered = set()
    for fname in os.listdir(HERE):
        if fname.endswith(".safetensors"):
            with open(os.path.join(HERE, fname), "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                desc = json.loads(json.loads(f.read(n))["__metadata__"]["kiln_golden"])
            if desc["kind"] == "op":
                covered.add(desc["op"])
    missing = [op for op in ops if op not in covered and op not in NO_GOLDEN]
    stale = [op for op in NO_GOLDEN if op not in ops or op in covered]
    if missing or stale:
        sys.exit(f"golden coverage out of date: no golden for {missing}; "
                 f"NO_GOLDEN entries to remove: {stale}")
    print(f"{len(covered)} of {len(ops)} ops have goldens; without: {sorted(NO_GOLDEN)}")


def main():
    torch.set_num_threads(1)
    old = [f for f in os.listdir(HERE) if f.endswith(".safetensors")]
    for f in old:
        os.remove(os.path.join(HERE, f))
    for fn in CASES:
        fn()
    files = sorted(f for f in os.listdir(HERE) if f.endswith(".safetensors"))
    total = sum(os.path.getsize(os.path.join(HERE, f)) for f in files)
    print(f"wrote {len(files)} goldens, {total} bytes, to {HERE}")
    check_coverage()


if __name__ == "__main__":
    main()
