#!/usr/bin/env python3
"""Adversarial input tests for the jit_kernel public ops (scale, add_constant, norm.*).

Project rule under test: bad input gets a clear Python exception that names the argument (expected
vs actual), raised before any launch -- never a crash, a CUDA fault, a hang or a silently wrong
answer -- and nothing the user passed is modified except what the op documents as in-place.

Usage (from the repo root, venv active / package importable):
    python scripts/attack_inputs.py               # every case, 4 worker processes
    python scripts/attack_inputs.py -j 1 --only 'rmsnorm'   # regex filter on case names
    python scripts/attack_inputs.py --isolate     # one fresh process per case (slow, fully isolated)
    python scripts/attack_inputs.py --case NAME   # run one case in this process (debugging)
    python scripts/attack_inputs.py --list        # print the case names

Output: one line per case,
    PASS|FAIL|SKIP <case> : <exception type or 'ok'>: <detail, first 150 chars>
PASS = a clear exception naming the argument (args left untouched), or the correct result
(compared with an fp32 torch reference; guard bands around outputs checked for stray writes).
FAIL = no exception on bad input, a wrong result, an exception that does not name the argument,
a CUDA fault, a crash (signal / return code), a hang (timeout), or an argument modified.
SKIP = needs a GPU (or 2 GPUs, or numpy) that this machine lacks, or the test set-up itself failed
(e.g. out of memory), in which case the reason is printed.

Norm cases run twice: '@cold' clears norm.py's per-dtype fast-path tables before the call (the
Python-checked path), '@warm' loads the modules first (2-D inputs / any q go straight to C++,
checked only by the TensorMatcher). A summary 'N passed, N failed, N skipped' ends the report; the
exit status is 0 (a report, not a gate).

Cases run in worker subprocesses (several cases per process, a fresh process after any crash,
timeout or CUDA fault, since a fault poisons the context); every case calls
torch.cuda.synchronize() inside its try so asynchronous faults are attributed to it.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if os.path.isdir(os.path.join(REPO, "python", "sglang")) and os.path.join(REPO, "python") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "python"))

DEFAULT_TIMEOUT = 30.0
RESULT_TAG = "@@ATTACK_RESULT "

# ==================================================================================================
# Case registry
# ==================================================================================================


class Case:
    def __init__(self, name, fn, gpus, norm, timeout, mem_gib):
        self.name, self.fn, self.gpus, self.norm, self.timeout, self.mem_gib = name, fn, gpus, norm, timeout, mem_gib


CASES: dict[str, Case] = {}


def case(name, gpus=1, norm=False, timeout=DEFAULT_TIMEOUT, mem_gib=0):
    """Register a case. gpus: 0 = runs without a GPU, 1 or 2 = GPUs needed. norm: run @cold and @warm."""

    def deco(fn):
        assert name not in CASES, name
        CASES[name] = Case(name, fn, gpus, norm, timeout, mem_gib)
        return fn

    return deco


def expanded_case_names():
    names = []
    for c in CASES.values():
        if c.norm and c.gpus > 0:
            names += [c.name + "@cold", c.name + "@warm"]
        else:
            names.append(c.name)
    return names


def split_mode(full):
    if full.endswith("@cold"):
        return full[:-5], "cold"
    if full.endswith("@warm"):
        return full[:-5], "warm"
    return full, None


# ==================================================================================================
# Verdict helpers (worker side)
# ==================================================================================================


class Skip(Exception):
    pass


class Verdict(Exception):
    def __init__(self, status, etype, detail):
        super().__init__(detail)
        self.status, self.etype, self.detail = status, etype, detail


FAULT_RE = re.compile(
    r"illegal memory access|misaligned address|unspecified launch failure|device-side assert|"
    r"illegal instruction|an illegal|CUDA error|cudaError|CUDA_ERROR|launch failure|"
    r"operation not permitted when stream is capturing|invalid resource handle|invalid device context|"
    r"Segmentation fault",
    re.IGNORECASE,
)
CLEAR_TYPES = (TypeError, ValueError, RuntimeError)

_torch = None


def T():
    global _torch
    if _torch is None:
        import torch

        _torch = torch
    return _torch


FAKE_CPU = os.environ.get("ATTACK_FAKE_CPU") == "1"  # harness self-test only: 'GPU' tensors on the CPU


def have_gpu(n=1):
    torch = T()
    if FAKE_CPU:
        return True
    return torch.cuda.is_available() and torch.cuda.device_count() >= n


def sync():
    torch = T()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


def context_healthy():
    torch = T()
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return True, ""
    try:
        for i in range(torch.cuda.device_count()):
            with torch.cuda.device(i):
                x = torch.ones(4, device=f"cuda:{i}")
                float((x * 2).sum())
            torch.cuda.synchronize(i)
        return True, ""
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"


def short(msg, n=150):
    msg = " ".join(str(msg).split())
    return msg[:n]


def snapshot(tensors):
    return [(name, t, t.detach().clone()) for name, t in tensors]


def _bytes(t):
    torch = T()
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.bool else t


def changed(snaps):
    """Names of snapshotted tensors whose bytes changed (NaN-safe)."""
    torch = T()
    return [name for name, t, before in snaps if not torch.equal(_bytes(t), _bytes(before))]


def judge_exception(e, names, snaps=()):
    """An exception from the op: PASS if clear (right type, names an argument of `names`, no fault,
    arguments untouched, context alive)."""
    etype = type(e).__name__
    msg = str(e)
    if FAULT_RE.search(msg):
        ok, _ = context_healthy()
        raise Verdict("FAIL", etype, "CUDA fault / internal error, not a validation error: " + msg)
    if not isinstance(e, CLEAR_TYPES):
        raise Verdict("FAIL", etype, f"unexpected exception type (want TypeError/ValueError/RuntimeError): {msg}")
    if isinstance(names, str):
        names = (names,)
    if names and not any(n.lower() in msg.lower() for n in names):
        raise Verdict("FAIL", etype, f"exception does not name {'/'.join(names)}: {msg}")
    ok, why = context_healthy()
    if not ok:
        raise Verdict("FAIL", etype, f"exception raised but CUDA context broken afterwards ({why}): {msg}")
    mod = changed(snaps)
    if mod:
        raise Verdict("FAIL", etype, f"raised, but modified {','.join(mod)} (launch before check?): {msg}")
    raise Verdict("PASS", etype, msg)


def expect_error(call, names, keep=()):
    """Bad input: must raise a clear exception naming one of `names`; tensors in `keep` untouched."""
    snaps = snapshot(keep)
    try:
        call()
        sync()
    except Verdict:
        raise
    except Exception as e:  # noqa: BLE001
        judge_exception(e, names, snaps)
    mod = changed(snaps)
    extra = f" (and modified {','.join(mod)})" if mod else ""
    raise Verdict("FAIL", "no exception", f"bad input silently accepted{extra}; expected an error naming {names}")


def tol(dtype):
    torch = T()
    return {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1e-2)}.get(
        dtype, (0, 0)
    )


CHUNK = 1 << 26


def compare(name, got, ref):
    """Returns '' if got ~= ref (NaN == NaN, same inf), else a description (chunked for huge tensors)."""
    if got.shape == ref.shape and got.numel() > 2 * CHUNK:
        g, r = got.reshape(-1), ref.reshape(-1)
        for lo in range(0, g.numel(), CHUNK):
            m = _compare(f"{name}[flat {lo}:+{CHUNK}]", g[lo:lo + CHUNK], r[lo:lo + CHUNK])
            if m:
                return m
        return ""
    return _compare(name, got, ref)


def _compare(name, got, ref):
    torch = T()
    if got.shape != ref.shape:
        return f"{name}: shape {tuple(got.shape)} != expected {tuple(ref.shape)}"
    if got.dtype != ref.dtype:
        return f"{name}: dtype {got.dtype} != expected {ref.dtype}"
    if got.numel() == 0:
        return ""
    if not got.is_floating_point():
        bad = (got != ref).sum().item()
        return "" if bad == 0 else f"{name}: {bad} of {got.numel()} elements differ"
    g, r = got.detach().float(), ref.detach().float()
    nan_mismatch = (g.isnan() != r.isnan()).sum().item()
    if nan_mismatch:
        return f"{name}: NaN pattern differs at {nan_mismatch} of {g.numel()} elements"
    inf_mismatch = ((g.isinf() | r.isinf()) & (g != r) & ~r.isnan()).sum().item()
    if inf_mismatch:
        return f"{name}: inf pattern differs at {inf_mismatch} elements"
    fin = g.isfinite() & r.isfinite()
    rtol, atol = tol(ref.dtype)
    err = (g - r).abs()
    lim = atol + rtol * r.abs()
    bad_mask = fin & (err > lim)
    nbad = bad_mask.sum().item()
    if nbad:
        idx = bad_mask.flatten().nonzero()[0].item()
        return (
            f"{name}: {nbad} of {g.numel()} elements wrong (max abs err {err[fin].max().item():.3g}; "
            f"first at flat {idx}: got {g.flatten()[idx].item():.6g} want {r.flatten()[idx].item():.6g})"
        )
    return ""


def expect_result(call, check, names=None, keep=(), note=""):
    """Input that is valid (or debatable): PASS on the correct result; if `names` is given, a clear
    exception naming one of them is also a PASS. `check()` returns '' or a description."""
    snaps = snapshot(keep)
    try:
        call()
        sync()
    except Verdict:
        raise
    except Exception as e:  # noqa: BLE001
        if names is None:
            msg = str(e)
            if FAULT_RE.search(msg):
                raise Verdict("FAIL", type(e).__name__, "CUDA fault on valid input: " + msg)
            raise Verdict("FAIL", type(e).__name__, "valid input rejected: " + msg)
        judge_exception(e, names, snaps)
    problem = check()
    mod = changed(snaps)
    if mod:
        problem = (problem + "; " if problem else "") + f"read-only argument(s) modified: {','.join(mod)}"
    if problem:
        raise Verdict("FAIL", "wrong result", problem)
    raise Verdict("PASS", "ok", "correct result" + (f" ({note})" if note else ""))


# ==================================================================================================
# Tensor helpers and fp32 references
# ==================================================================================================

GUARD = 64  # elements of guard band on each side of a guarded output
SENTINEL = 1234.5


def dev(i=0):
    return T().device("cpu") if FAKE_CPU else T().device("cuda", i)


def rnd(*shape, dtype=None, device=None, offset=0, scale=1.0):
    """Random tensor; offset > 0 makes it a view at `offset` elements into a larger storage."""
    torch = T()
    dtype = dtype or torch.bfloat16
    device = device if device is not None else dev()
    n = math.prod(shape)
    if dtype.is_floating_point and dtype.itemsize >= 2:
        buf = (torch.randn(n + offset, device=device, dtype=torch.float32) * scale).to(dtype)
    elif dtype.is_floating_point:
        buf = torch.randn(n + offset, device=device, dtype=torch.float32).to(dtype)
    elif dtype == torch.bool:
        buf = torch.randint(0, 2, (n + offset,), device=device).bool()
    elif dtype == torch.uint8:
        buf = torch.randint(0, 200, (n + offset,), device=device, dtype=dtype)
    else:
        buf = torch.randint(-1000, 1000, (n + offset,), device=device, dtype=dtype)
    return buf[offset:].view(shape)


class Guarded:
    """An output tensor inside a storage with sentinel guard bands (catches stray writes)."""

    def __init__(self, shape, dtype, device=None, offset=0, fill=None):
        torch = T()
        device = device if device is not None else dev()
        n = math.prod(shape)
        self.buf = torch.full((GUARD + offset + n + GUARD,), SENTINEL if fill is None else fill, dtype=dtype,
                              device=device) if dtype.is_floating_point else torch.full(
            (GUARD + offset + n + GUARD,), 77, dtype=dtype, device=device)
        self.lo, self.hi = GUARD + offset, GUARD + offset + n
        self.t = self.buf[self.lo:self.hi].view(shape)
        self.pre = self.buf[: self.lo].clone()
        self.post = self.buf[self.hi:].clone()

    def guards_ok(self):
        torch = T()
        if not torch.equal(self.buf[: self.lo], self.pre):
            return "stray write BEFORE the output tensor (guard band modified)"
        if not torch.equal(self.buf[self.hi:], self.post):
            return "stray write AFTER the output tensor (guard band modified)"
        return ""


def guarded_copy(x, offset=0):
    """A copy of x inside a guarded storage (for in-place ops), at `offset` elements."""
    g = Guarded(tuple(x.shape), x.dtype, x.device, offset=offset)
    g.t.copy_(x)
    return g


def rms_ref(x, w, eps, offset=0.0, cast_first=False):
    torch = T()
    xf = x.detach().float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    n = xf * r
    if cast_first:
        n = n.to(x.dtype).float()
    return (n * (w.detach().float() + offset)).to(x.dtype)


def fused_ref(x, r, w, eps, offset=0.0):
    s = (x.detach().float() + r.detach().float()).to(x.dtype)
    return rms_ref(s, w, eps, offset), s


def both(*checks):
    msgs = [c for c in checks if c]
    return "; ".join(msgs)


# ==================================================================================================
# Op access
# ==================================================================================================


def ops():
    from sglang.jit_kernel import norm
    from sglang.jit_kernel.add_constant import add_constant
    from sglang.jit_kernel.scale import scale

    return scale, add_constant, norm


MODE = {"value": None}


def prepare_mode(mode):
    """cold: clear norm.py's fast-path tables; warm: load the modules of the three dtypes."""
    if mode is None:
        return
    _, _, norm = ops()
    torch = T()
    tables = [getattr(norm, n, None) for n in ("_RMSNORM_FNS", "_FUSED_ADD_RMSNORM_FNS", "_QKNORM_FNS")]
    if mode == "cold":
        for t in tables:
            if isinstance(t, dict):
                t.clear()
    else:
        if hasattr(norm, "_load"):
            for dt in (torch.float16, torch.bfloat16, torch.float32):
                norm._load(dt)
        else:  # fall back: a valid call per dtype fills whatever cache exists
            for dt in (torch.float16, torch.bfloat16, torch.float32):
                norm.rmsnorm(rnd(2, 8, dtype=dt), rnd(8, dtype=dt))
        sync()


BF16 = "bfloat16"


def dt(name):
    return getattr(T(), name)


# ==================================================================================================
# scale cases
# ==================================================================================================


@case("scale/src_cpu", gpus=0)
def _():
    scale, _, _ = ops()
    x = T().randn(8)
    expect_error(lambda: scale(x, 2.0), "src", keep=[("src", x)])


@case("scale/src_list", gpus=0)
def _():
    scale, _, _ = ops()
    expect_error(lambda: scale([1.0, 2.0], 2.0), "src")


@case("scale/src_None", gpus=0)
def _():
    scale, _, _ = ops()
    expect_error(lambda: scale(None, 2.0), "src")


@case("scale/src_numpy", gpus=0)
def _():
    scale, _, _ = ops()
    try:
        import numpy as np
    except ImportError:
        raise Skip("numpy not installed")
    expect_error(lambda: scale(np.ones(4, dtype=np.float32), 2.0), "src")


for _dtn in ("int32", "float64", "float8_e4m3fn", "bool", "int64", "complex64"):

    @case(f"scale/src_dtype_{_dtn}")
    def _(dtn=_dtn):
        scale, _, _ = ops()
        x = rnd(16, dtype=dt(dtn)) if dtn != "complex64" else T().randn(16, dtype=T().complex64, device=dev())
        expect_error(lambda: scale(x, 2.0), "src", keep=[("src", x)])


@case("scale/out_dtype_mismatch")
def _():
    scale, _, _ = ops()
    x, out = rnd(4, 8), rnd(4, 8, dtype=dt("float16"))
    expect_error(lambda: scale(x, 2.0, out=out), "out", keep=[("src", x), ("out", out)])


@case("scale/out_shape_mismatch")
def _():
    scale, _, _ = ops()
    x, out = rnd(4, 8), rnd(4, 9)
    expect_error(lambda: scale(x, 2.0, out=out), "out", keep=[("src", x), ("out", out)])


@case("scale/out_same_numel_other_shape")
def _():
    scale, _, _ = ops()
    x, out = rnd(4, 8), rnd(32)
    expect_error(lambda: scale(x, 2.0, out=out), "out", keep=[("src", x), ("out", out)])


@case("scale/out_noncontiguous")
def _():
    scale, _, _ = ops()
    x, out = rnd(8, 4), rnd(4, 8).t()
    expect_error(lambda: scale(x, 2.0, out=out), "out", keep=[("src", x), ("out", out)])


@case("scale/out_expanded_stride0")
def _():
    scale, _, _ = ops()
    x, out = rnd(4, 8), rnd(1, 8).expand(4, 8)
    expect_error(lambda: scale(x, 2.0, out=out), "out", keep=[("src", x)])


@case("scale/out_cpu")
def _():
    scale, _, _ = ops()
    x, out = rnd(4, 8), T().zeros(4, 8, dtype=T().bfloat16)
    expect_error(lambda: scale(x, 2.0, out=out), "out", keep=[("src", x), ("out", out)])


@case("scale/out_list")
def _():
    scale, _, _ = ops()
    x = rnd(4)
    expect_error(lambda: scale(x, 2.0, out=[0.0] * 4), "out", keep=[("src", x)])


@case("scale/src_transposed_copied")
def _():
    scale, _, _ = ops()
    x = rnd(16, 24).t()
    res = {}
    expect_result(lambda: res.setdefault("o", scale(x, 3.0)),
                  lambda: compare("out", res["o"], (x.float() * 3.0).to(x.dtype)), keep=[("src", x)])


@case("scale/src_expanded_stride0")
def _():
    scale, _, _ = ops()
    x = rnd(1, 24).expand(5, 24)
    res = {}
    expect_result(lambda: res.setdefault("o", scale(x, -2.0)),
                  lambda: compare("out", res["o"], (x.float() * -2.0).to(x.dtype)), keep=[("src", x)])


@case("scale/src_transposed_out_is_src")
def _():
    scale, _, _ = ops()
    x = rnd(16, 24).t()
    expect_error(lambda: scale(x, 3.0, out=x), "out", keep=[("src", x)])


@case("scale/zero_dim")
def _():
    scale, _, _ = ops()
    x = T().tensor(1.5, device=dev(), dtype=T().float32)
    res = {}
    expect_result(lambda: res.setdefault("o", scale(x, 2.0)), lambda: compare("out", res["o"], x * 2.0))


for _shape in ((0,), (0, 5), (5, 0), (3, 0, 7)):

    @case(f"scale/empty_{'x'.join(map(str, _shape))}")
    def _(shape=_shape):
        scale, _, _ = ops()
        x = T().empty(shape, device=dev(), dtype=T().float16)
        res = {}
        expect_result(lambda: res.setdefault("o", scale(x, 2.0)), lambda: compare("out", res["o"], x.clone()))


for _dtn in ("float16", "bfloat16", "float32"):
    for _n in (1, 3, 7, 33, 1000003):
        for _so, _oo in ((0, 0), (1, 0), (0, 1), (1, 3), (3, 5)):

            @case(f"scale/{_dtn}_n{_n}_srcoff{_so}_outoff{_oo}")
            def _(dtn=_dtn, n=_n, so=_so, oo=_oo):
                scale, _, _ = ops()
                d = dt(dtn)
                x = rnd(n, dtype=d, offset=so)
                g = Guarded((n,), d, offset=oo)
                ref = (x.float() * 0.75).to(d)
                expect_result(lambda: scale(x, 0.75, out=g.t),
                              lambda: both(compare("out", g.t, ref), g.guards_ok()), keep=[("src", x)])


@case("scale/in_place_out_is_src")
def _():
    scale, _, _ = ops()
    g = guarded_copy(rnd(1001), offset=1)
    ref = (g.t.float() * 1.5).to(g.t.dtype)
    expect_result(lambda: scale(g.t, 1.5, out=g.t), lambda: both(compare("out", g.t, ref), g.guards_ok()))


@case("scale/out_overlaps_src_shift+1")
def _():
    scale, _, _ = ops()
    n = 1 << 20
    buf = rnd(n + 1, dtype=dt("float32"))
    src, out = buf[:n], buf[1:]
    ref = (src.float() * 2.0).clone()
    expect_result(lambda: scale(src, 2.0, out=out), lambda: compare("out", out, ref), names=("out", "overlap"))


@case("scale/out_overlaps_src_shift-1")
def _():
    scale, _, _ = ops()
    n = 1 << 20
    buf = rnd(n + 1, dtype=dt("float32"))
    src, out = buf[1:], buf[:n]
    ref = (src.float() * 2.0).clone()
    expect_result(lambda: scale(src, 2.0, out=out), lambda: compare("out", out, ref), names=("out", "overlap"))


for _fname, _fval in (("tensor_cpu", "T().tensor(2.0)"), ("tensor_cuda", "T().tensor(2.0, device=dev())"),
                      ("str", "'2.0'"), ("None", "None"), ("complex", "1j"), ("list", "[2.0]")):

    @case(f"scale/factor_{_fname}")
    def _(expr=_fval, fname=_fname):
        scale, _, _ = ops()
        factor = eval(expr)
        x = rnd(64)
        res = {}
        # a tensor factor may be accepted if the result is right; other types must raise naming factor
        if fname.startswith("tensor"):
            expect_result(lambda: res.setdefault("o", scale(x, factor)),
                          lambda: compare("out", res["o"], (x.float() * 2.0).to(x.dtype)),
                          names=("factor",), keep=[("src", x)])
        else:
            expect_error(lambda: scale(x, factor), "factor", keep=[("src", x)])


for _fname, _fval in (("nan", float("nan")), ("inf", float("inf")), ("huge_1e39", 1e39), ("neg_zero", -0.0),
                      ("int", 3), ("bool_True", True)):

    @case(f"scale/factor_{_fname}")
    def _(fval=_fval):
        scale, _, _ = ops()
        torch = T()
        x = rnd(257, dtype=dt("float32"))
        res = {}
        ref = x * torch.tensor(float(fval), dtype=torch.float32, device=dev())
        expect_result(lambda: res.setdefault("o", scale(x, fval)), lambda: compare("out", res["o"], ref),
                      names=("factor",), keep=[("src", x)])


@case("scale/nan_inf_inputs_propagate")
def _():
    scale, _, _ = ops()
    torch = T()
    x = rnd(1000, dtype=dt("float16"))
    x[::7] = float("nan")
    x[3::11] = float("inf")
    x[5::13] = -float("inf")
    res = {}
    expect_result(lambda: res.setdefault("o", scale(x, 0.5)),
                  lambda: compare("out", res["o"], (x.float() * 0.5).half()))


@case("scale/src_requires_grad")
def _():
    scale, _, _ = ops()
    x = rnd(64, dtype=dt("float32")).requires_grad_(True)
    res = {}
    expect_result(lambda: res.setdefault("o", scale(x, 2.0)), lambda: compare("out", res["o"], x.detach() * 2.0),
                  names=("src", "grad"))


@case("scale/huge_2pow31_plus_7_fp16", timeout=120, mem_gib=9)
def _():
    scale, _, _ = ops()
    torch = T()
    n = 2**31 + 7
    x = torch.empty(n, dtype=torch.float16, device=dev())
    x.copy_(torch.arange(n, device=dev(), dtype=torch.int64).remainder(1000).to(torch.float16))
    res = {}

    def check():
        o = res["o"]
        msgs = []
        for lo in (0, 2**31 - 4096, n - 4096):
            want = (x[lo:lo + 4096].float() * 0.5).half()
            m = compare(f"out[{lo}:+4096]", o[lo:lo + 4096], want)
            if m:
                msgs.append(m)
        return both(*msgs)

    expect_result(lambda: res.setdefault("o", scale(x, 0.5)), check)


@case("scale/out_on_cuda1", gpus=2)
def _():
    scale, _, _ = ops()
    x, out = rnd(64), rnd(64, device=dev(1))
    expect_error(lambda: scale(x, 2.0, out=out), ("out", "device"), keep=[("src", x), ("out", out)])


@case("scale/src_on_cuda1_current_cuda0", gpus=2)
def _():
    scale, _, _ = ops()
    T().cuda.set_device(0)
    x = rnd(4097, device=dev(1), offset=1)
    res = {}
    expect_result(lambda: res.setdefault("o", scale(x, 3.0)), lambda: compare("out", res["o"], (x.float() * 3).to(x.dtype)))


@case("scale/side_stream")
def _():
    scale, _, _ = ops()
    torch = T()
    src = rnd(1 << 22, dtype=torch.float32)
    x = torch.zeros_like(src)
    s = torch.cuda.Stream()
    res = {}

    def call():
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)  # delay, so a launch on the wrong stream reads zeros
            x.copy_(src)
            res["o"] = scale(x, 2.0)
        s.synchronize()

    expect_result(call, lambda: compare("out", res["o"], src * 2.0))


@case("scale/cuda_graph_capture")
def _():
    scale, _, _ = ops()
    torch = T()
    x = rnd(4096, dtype=torch.float32)
    out = torch.empty_like(x)

    def call():
        scale(x, 2.0, out=out)  # eager warm-up call
        sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            scale(x, 2.0, out=out)
        x.copy_(torch.randn_like(x))
        out.zero_()
        g.replay()

    expect_result(call, lambda: compare("out", out, x * 2.0))


# ==================================================================================================
# add_constant cases
# ==================================================================================================


@case("add_constant/src_cpu", gpus=0)
def _():
    _, add_constant, _ = ops()
    x = T().arange(8, dtype=T().int32)
    expect_error(lambda: add_constant(x, 1), "src", keep=[("src", x)])


@case("add_constant/src_list", gpus=0)
def _():
    _, add_constant, _ = ops()
    expect_error(lambda: add_constant([1, 2], 1), "src")


for _cname, _cval in (("bool_True", "True"), ("float_1.0", "1.0"), ("str", "'1'"), ("None", "None"),
                      ("2pow31", "2**31"), ("minus_2pow31_minus_1", "-2**31-1"), ("2pow63", "2**63"),
                      ("tensor", "T().tensor(1)")):

    @case(f"add_constant/constant_{_cname}", gpus=0)
    def _(expr=_cval):
        _, add_constant, _ = ops()
        torch = T()
        x = torch.arange(8, dtype=torch.int32, device=dev() if have_gpu() else "cpu")
        expect_error(lambda: add_constant(x, eval(expr)), "constant", keep=[("src", x)])


for _dtn in ("float32", "int64", "int16", "uint8", "bool", "float16"):

    @case(f"add_constant/src_dtype_{_dtn}")
    def _(dtn=_dtn):
        _, add_constant, _ = ops()
        x = rnd(16, dtype=dt(dtn))
        expect_error(lambda: add_constant(x, 1), "src", keep=[("src", x)])


for _cval in (1, 2**31 - 1, -(2**31)):

    @case(f"add_constant/wraparound_constant_{_cval}")
    def _(c=_cval):
        _, add_constant, _ = ops()
        torch = T()
        vals = torch.tensor([0, 1, -1, 2**31 - 1, -(2**31), 12345, -12345], dtype=torch.int64)
        x = vals.to(torch.int32).to(dev())
        want = ((vals + c + 2**31) % 2**32 - 2**31).to(torch.int32).to(dev())
        res = {}
        expect_result(lambda: res.setdefault("o", add_constant(x, c)), lambda: compare("out", res["o"], want),
                      keep=[("src", x)])


@case("add_constant/out_mismatch_dtype")
def _():
    _, add_constant, _ = ops()
    x, out = rnd(8, dtype=dt("int32")), rnd(8, dtype=dt("int64"))
    expect_error(lambda: add_constant(x, 1, out=out), "out", keep=[("src", x), ("out", out)])


@case("add_constant/out_mismatch_shape")
def _():
    _, add_constant, _ = ops()
    x, out = rnd(8, dtype=dt("int32")), rnd(2, 4, dtype=dt("int32"))
    expect_error(lambda: add_constant(x, 1, out=out), "out", keep=[("src", x), ("out", out)])


@case("add_constant/out_noncontiguous")
def _():
    _, add_constant, _ = ops()
    x, out = rnd(8, 4, dtype=dt("int32")), rnd(4, 8, dtype=dt("int32")).t()
    expect_error(lambda: add_constant(x, 1, out=out), "out", keep=[("src", x), ("out", out)])


@case("add_constant/out_cpu")
def _():
    _, add_constant, _ = ops()
    x, out = rnd(8, dtype=dt("int32")), T().zeros(8, dtype=T().int32)
    expect_error(lambda: add_constant(x, 1, out=out), "out", keep=[("src", x), ("out", out)])


@case("add_constant/out_on_cuda1", gpus=2)
def _():
    _, add_constant, _ = ops()
    x, out = rnd(8, dtype=dt("int32")), rnd(8, dtype=dt("int32"), device=dev(1))
    expect_error(lambda: add_constant(x, 1, out=out), ("out", "device"), keep=[("src", x), ("out", out)])


@case("add_constant/src_on_cuda1_current_cuda0", gpus=2)
def _():
    _, add_constant, _ = ops()
    T().cuda.set_device(0)
    x = rnd(1001, dtype=dt("int32"), device=dev(1))
    res = {}
    expect_result(lambda: res.setdefault("o", add_constant(x, 1)), lambda: compare("out", res["o"], x + 1))


for _shape in ((0,), (4, 0), ()):

    @case(f"add_constant/shape_{'x'.join(map(str, _shape)) or 'scalar0d'}")
    def _(shape=_shape):
        _, add_constant, _ = ops()
        x = T().full(shape, 5, dtype=T().int32, device=dev())
        res = {}
        expect_result(lambda: res.setdefault("o", add_constant(x, 1)), lambda: compare("out", res["o"], x + 1))


for _so, _oo in ((1, 0), (0, 1), (3, 1)):

    @case(f"add_constant/misaligned_srcoff{_so}_outoff{_oo}")
    def _(so=_so, oo=_oo):
        _, add_constant, _ = ops()
        x = rnd(1001, dtype=dt("int32"), offset=so)
        g = Guarded((1001,), T().int32, offset=oo)
        expect_result(lambda: add_constant(x, 1, out=g.t), lambda: both(compare("out", g.t, x + 1), g.guards_ok()),
                      keep=[("src", x)])


@case("add_constant/transposed_src_copied")
def _():
    _, add_constant, _ = ops()
    x = rnd(16, 8, dtype=dt("int32")).t()
    res = {}
    expect_result(lambda: res.setdefault("o", add_constant(x, 1)), lambda: compare("out", res["o"], x + 1),
                  keep=[("src", x)])


@case("add_constant/in_place")
def _():
    _, add_constant, _ = ops()
    x = rnd(1001, dtype=dt("int32"))
    want = x + 1
    expect_result(lambda: add_constant(x, 1, out=x), lambda: compare("out", x, want))


@case("add_constant/out_overlaps_src_shift+1")
def _():
    _, add_constant, _ = ops()
    n = 1 << 20
    buf = rnd(n + 1, dtype=dt("int32"))
    src, out = buf[:n], buf[1:]
    want = src + 1
    expect_result(lambda: add_constant(src, 1, out=out), lambda: compare("out", out, want), names=("out", "overlap"))


# ==================================================================================================
# norm cases: rmsnorm / gemma_rmsnorm
# ==================================================================================================

N, H = 7, 256


@case("rmsnorm/input_cpu", gpus=0)
def _():
    _, _, norm = ops()
    x, w = T().randn(4, 8), T().randn(8)
    expect_error(lambda: norm.rmsnorm(x, w), "input", keep=[("input", x), ("weight", w)])


@case("rmsnorm/input_list", gpus=0)
def _():
    _, _, norm = ops()
    expect_error(lambda: norm.rmsnorm([[1.0, 2.0]], T().randn(2)), "input")


@case("rmsnorm/input_None", gpus=0)
def _():
    _, _, norm = ops()
    expect_error(lambda: norm.rmsnorm(None, T().randn(2)), "input")


@case("fused_add_rmsnorm/input_cpu", gpus=0)
def _():
    _, _, norm = ops()
    x, r, w = T().randn(4, 8), T().randn(4, 8), T().randn(8)
    expect_error(lambda: norm.fused_add_rmsnorm(x, r, w), "input", keep=[("input", x), ("residual", r)])


@case("fused_inplace_qknorm/q_cpu", gpus=0)
def _():
    _, _, norm = ops()
    q, k, w = T().randn(2, 4, 8), T().randn(2, 1, 8), T().randn(8)
    expect_error(lambda: norm.fused_inplace_qknorm(q, k, w, w), "q", keep=[("q", q), ("k", k)])


@case("fused_inplace_qknorm/q_numpy", gpus=0)
def _():
    _, _, norm = ops()
    try:
        import numpy as np
    except ImportError:
        raise Skip("numpy not installed")
    w = T().randn(8)
    expect_error(lambda: norm.fused_inplace_qknorm(np.ones((2, 4, 8), np.float32), np.ones((2, 1, 8), np.float32),
                                                   w, w), "q")


def RMS_OPS():
    _, _, norm = ops()
    return {"rmsnorm": (norm.rmsnorm, 0.0), "gemma_rmsnorm": (norm.gemma_rmsnorm, 1.0)}


def FUSED_OPS():
    _, _, norm = ops()
    return {"fused_add_rmsnorm": (norm.fused_add_rmsnorm, 0.0), "gemma_fused_add_rmsnorm": (norm.gemma_fused_add_rmsnorm, 1.0)}


# ---- rmsnorm error cases (bad input must name the argument) ----
def _rms_err(name, make, names, ops_=("rmsnorm", "gemma_rmsnorm"), gpus=1):
    for opn in ops_:

        @case(f"{opn}/{name}", gpus=gpus, norm=True)
        def _(opn=opn):
            fn, _ = RMS_OPS()[opn]
            args, kwargs, keep = make()
            expect_error(lambda: fn(*args, **kwargs), names, keep=keep)


def _mk(x=None, w=None, out=None, **kw):
    x = rnd(N, H) if x is None else x
    w = rnd(H) if w is None else w
    kwargs = dict(kw)
    keep = [("input", x), ("weight", w)] if isinstance(x, T().Tensor) and isinstance(w, T().Tensor) else []
    if out is not None:
        kwargs["out"] = out
    return (x, w), kwargs, keep


_rms_err("weight_cpu", lambda: _mk(w=T().randn(H).bfloat16()), "weight")
_rms_err("weight_list", lambda: ((rnd(N, H), [1.0] * H), {}, []), "weight")
_rms_err("weight_none", lambda: ((rnd(N, H), None), {}, []), "weight")
_rms_err("out_cpu", lambda: _mk(out=T().zeros(N, H, dtype=T().bfloat16)), "out")
_rms_err("out_list", lambda: _mk(out=[[0.0] * H] * N), "out")
_rms_err("input_int32", lambda: _mk(x=rnd(N, H, dtype=dt("int32"))), "input")
_rms_err("input_float64", lambda: _mk(x=rnd(N, H, dtype=dt("float64")), w=rnd(H, dtype=dt("float64"))), "input")
_rms_err("input_fp8_e4m3", lambda: _mk(x=rnd(N, H, dtype=dt("float8_e4m3fn")), w=rnd(H, dtype=dt("float8_e4m3fn"))),
         "input")
_rms_err("weight_fp16_input_bf16", lambda: _mk(w=rnd(H, dtype=dt("float16"))), "weight")
_rms_err("weight_fp32_input_bf16", lambda: _mk(w=rnd(H, dtype=dt("float32"))), "weight")
_rms_err("out_fp16_input_bf16", lambda: _mk(out=rnd(N, H, dtype=dt("float16"))), "out")
_rms_err("out_fp32_input_bf16", lambda: _mk(out=rnd(N, H, dtype=dt("float32"))), "out")
_rms_err("weight_shape_H+1", lambda: _mk(w=rnd(H + 1)), "weight")
_rms_err("weight_shape_H-1", lambda: _mk(w=rnd(H - 1)), "weight")
_rms_err("weight_2d_1xH", lambda: _mk(w=rnd(1, H)), "weight")
_rms_err("weight_0dim", lambda: _mk(w=rnd(1).view(())), "weight")
_rms_err("weight_noncontig_stride2", lambda: _mk(w=rnd(2 * H)[::2]), "weight")
_rms_err("weight_expanded_stride0", lambda: _mk(w=rnd(1).expand(H)), "weight")
_rms_err("out_shape_mismatch", lambda: _mk(out=rnd(N + 1, H)), "out")
_rms_err("out_3d_same_numel", lambda: _mk(out=rnd(N, 1, H)), "out")
_rms_err("out_1d_same_numel", lambda: _mk(out=rnd(N * H)), "out")
_rms_err("input_lastdim_stride2", lambda: _mk(x=rnd(N, 2 * H)[:, ::2]), "input")
_rms_err("input_transposed", lambda: _mk(x=rnd(H, N).t(), w=rnd(N)), "input")
_rms_err("out_transposed", lambda: _mk(out=rnd(H, N).t()), "out")
_rms_err("input_0dim", lambda: _mk(x=rnd(1).view(()), w=rnd(1)), "input")
_rms_err("eps_negative", lambda: _mk(eps=-1e-6), "eps")
_rms_err("eps_nan", lambda: _mk(eps=float("nan")), "eps")
_rms_err("eps_str", lambda: _mk(eps="1e-6"), "eps")
_rms_err("eps_None", lambda: _mk(eps=None), "eps")
_rms_err("out_expanded_stride0_rows", lambda: _mk(out=rnd(1, H).expand(N, H)), ("out", "overlap", "alias"))
_rms_err("out_3d_nonflattenable", lambda: _mk(x=rnd(2, 3, H), out=rnd(3, 2, H).transpose(0, 1)), "out")
_rms_err("weight_on_cuda1", lambda: _mk(w=rnd(H, device=dev(1))), ("weight", "device"), gpus=2)
_rms_err("out_on_cuda1", lambda: _mk(out=rnd(N, H, device=dev(1))), ("out", "device"), gpus=2)
_rms_err("input_on_cuda1_weight_cuda0", lambda: _mk(x=rnd(N, H, device=dev(1))), ("weight", "input", "device"),
         gpus=2)


@case("rmsnorm/cast_x_before_out_mul_str", norm=True)
def _():
    _, _, norm = ops()
    x, w = rnd(N, H), rnd(H)
    res = {}
    # "no" is truthy; either a TypeError naming the flag or the True behaviour is acceptable
    expect_result(lambda: res.setdefault("o", norm.rmsnorm(x, w, cast_x_before_out_mul="no")),
                  lambda: compare("out", res["o"], rms_ref(x, w, 1e-6, cast_first=True)),
                  names=("cast_x_before_out_mul",), keep=[("input", x), ("weight", w)])


# ---- rmsnorm valid / debatable inputs: correct result required ----
def _rms_ok(name, shape, dtn="bfloat16", xoff=0, woff=0, ooff=None, eps=1e-6, names=None, gpus=1, timeout=DEFAULT_TIMEOUT,
            mem_gib=0, ops_=("rmsnorm", "gemma_rmsnorm"), cast_first=False, x_make=None, pdl=None, scale=1.0):
    for opn in ops_:

        @case(f"{opn}/{name}", gpus=gpus, norm=True, timeout=timeout, mem_gib=mem_gib)
        def _(opn=opn):
            fn, offset = RMS_OPS()[opn]
            d = dt(dtn)
            x = x_make() if x_make else rnd(*shape, dtype=d, offset=xoff, scale=scale)
            w = rnd(x.shape[-1], dtype=d, offset=woff)
            kw = {"eps": eps}
            if cast_first:
                kw["cast_x_before_out_mul"] = True
            if pdl is not None:
                kw["enable_pdl"] = pdl
            ref = rms_ref(x, w, eps, offset, cast_first)
            if ooff is None:
                res = {}
                expect_result(lambda: res.setdefault("o", fn(x, w, **kw)), lambda: compare("out", res["o"], ref),
                              names=names, keep=[("input", x), ("weight", w)])
            else:
                g = Guarded(tuple(x.shape), d, offset=ooff)
                expect_result(lambda: fn(x, w, out=g.t, **kw), lambda: both(compare("out", g.t, ref), g.guards_ok()),
                              names=names, keep=[("input", x), ("weight", w)])


for _dtn in ("float16", "bfloat16", "float32"):
    for _h in (1, 2, 3, 5, 8, 33, 127, 128, 1000, 1023, 4096, 4097, 5120, 8192, 16384, 32768):
        _rms_ok(f"{_dtn}_H{_h}", (N, _h), _dtn, ooff=0)
    for _xo, _wo, _oo in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (3, 5, 7), (2, 0, 2), (4, 4, 4)):
        for _h in (128, 4096, 1000):
            _rms_ok(f"{_dtn}_H{_h}_misaligned_x{_xo}_w{_wo}_out{_oo}", (N, _h), _dtn, _xo, _wo, _oo)
for _h in (65536, 70000, 70001, 2**20, 2**20 + 1):
    _rms_ok(f"bfloat16_huge_H{_h}", (3, _h), "bfloat16", ooff=1, names=("hidden",))
_rms_ok("float32_huge_H1048576", (2, 2**20), "float32", ooff=0, names=("hidden",))
_rms_ok("float16_1row_H2pow31-3_int32_overflow", (1, 2**31 - 3), "float16", names=("hidden",), timeout=180, mem_gib=60,
        ops_=("rmsnorm",))
_rms_ok("float16_rows0", (0, H), "float16", ooff=0)
_rms_ok("float16_hidden0", (N, 0), "float16", ooff=0)
_rms_ok("float16_rows0_hidden0", (0, 0), "float16")
_rms_ok("bfloat16_1d_input", (H,), "bfloat16", ooff=0)
_rms_ok("bfloat16_3d_input", (2, 3, H), "bfloat16", ooff=1)
_rms_ok("bfloat16_4d_input", (2, 2, 3, 8), "bfloat16")
_rms_ok("bfloat16_many_rows_1M", (1 << 20, 16), "bfloat16")
_rms_ok("bfloat16_3d_nonflattenable_input", None, x_make=lambda: rnd(3, 2, H).transpose(0, 1))
_rms_ok("bfloat16_row_stride_odd", None, x_make=lambda: rnd(N, H + 1)[:, :H], ooff=0)
_rms_ok("bfloat16_row_stride_odd_misaligned", None, x_make=lambda: rnd(N, H + 3, offset=1)[:, 1:H + 1], ooff=3)
_rms_ok("bfloat16_rows_expanded_stride0", None, x_make=lambda: rnd(1, H).expand(N, H), ooff=0)
_rms_ok("bfloat16_cast_x_before_out_mul", (N, 4096), "bfloat16", cast_first=True, ops_=("rmsnorm",))
_rms_ok("float16_cast_x_before_out_mul_misaligned", (N, 1001), "float16", 1, 1, 1, cast_first=True, ops_=("rmsnorm",))
_rms_ok("bfloat16_pdl_on", (N, 4096), pdl=True)
_rms_ok("bfloat16_pdl_off", (N, 4096), pdl=False)
_rms_ok("eps_inf", (N, 128), "float32", eps=float("inf"), names=("eps",))
_rms_ok("eps_huge_1e300", (N, 128), "float32", eps=1e300, names=("eps",))
_rms_ok("eps_zero", (N, 128), "float32", eps=0.0)
_rms_ok("float32_values_1e20_sumsq_overflow", (N, 128), "float32", scale=1e20)
_rms_ok("float16_values_60000", (N, 128), "float16", x_make=lambda: T().full((N, 128), 60000.0, dtype=T().float16,
                                                                           device=dev()))
_rms_ok("float32_denormal_values", (N, 128), "float32", scale=1e-40)


def _nan_inf_input(dtn):
    torch = T()
    x = rnd(6, 64, dtype=dt(dtn))
    x[1, 5] = float("nan")
    x[2, 7] = float("inf")
    x[3, 0] = -float("inf")
    x[4] = 0.0  # zero row: finite with eps > 0
    return x


for _dtn in ("float16", "bfloat16", "float32"):
    _rms_ok(f"{_dtn}_nan_inf_rows_propagate", None, _dtn, x_make=lambda d=_dtn: _nan_inf_input(d))
    _rms_ok(f"{_dtn}_nan_inf_rows_propagate_H4096", None, _dtn,
            x_make=lambda d=_dtn: T().cat([_nan_inf_input(d)] * 64, dim=1))


for _opn in ("rmsnorm", "gemma_rmsnorm"):

    @case(f"{_opn}/input_on_cuda1_current_cuda0", gpus=2, norm=True)
    def _(opn=_opn):
        fn, offset = RMS_OPS()[opn]
        T().cuda.set_device(0)
        x, w = rnd(N, H, device=dev(1), offset=1), rnd(H, device=dev(1))
        res = {}
        expect_result(lambda: res.setdefault("o", fn(x, w)), lambda: compare("out", res["o"], rms_ref(x, w, 1e-6, offset)))

    @case(f"{_opn}/all_on_cuda0_inside_device1_ctx", gpus=2, norm=True)
    def _(opn=_opn):
        fn, offset = RMS_OPS()[opn]
        torch = T()
        x, w = rnd(N, H), rnd(H)
        res = {}

        def call():
            with torch.cuda.device(1):
                res["o"] = fn(x, w)

        expect_result(call, lambda: compare("out", res["o"], rms_ref(x, w, 1e-6, offset)))

    @case(f"{_opn}/out_is_input_in_place", norm=True)
    def _(opn=_opn):
        fn, offset = RMS_OPS()[opn]
        g = guarded_copy(rnd(N, 4096), offset=1)
        w = rnd(4096)
        ref = rms_ref(g.t, w, 1e-6, offset)
        expect_result(lambda: fn(g.t, w, out=g.t), lambda: both(compare("out", g.t, ref), g.guards_ok()),
                      keep=[("weight", w)])

    for _shift, _h in (("1elem", 4096), ("1row", 4096), ("1row_smallH", 64), ("1elem_H16384", 16384)):

        @case(f"{_opn}/out_partially_overlaps_input_shift_{_shift}", norm=True)
        def _(opn=_opn, shift=_shift, h=_h):
            fn, offset = RMS_OPS()[opn]
            n = 4096 if h <= 4096 else 512
            step = 1 if shift.startswith("1elem") else h
            buf = rnd(n * h + step, dtype=dt("float32"))
            x = buf[:n * h].view(n, h)
            out = buf[step:step + n * h].view(n, h)
            w = rnd(h, dtype=dt("float32"))
            ref = rms_ref(x, w, 1e-6, offset).clone()
            expect_result(lambda: fn(x, w, out=out), lambda: compare("out", out, ref),
                          names=("out", "overlap", "alias"), keep=[("weight", w)])

    @case(f"{_opn}/input_requires_grad", norm=True)
    def _(opn=_opn):
        fn, offset = RMS_OPS()[opn]
        x, w = rnd(N, H, dtype=dt("float32")).requires_grad_(), rnd(H, dtype=dt("float32"))
        res = {}
        expect_result(lambda: res.setdefault("o", fn(x, w)), lambda: compare("out", res["o"], rms_ref(x, w, 1e-6, offset)),
                      names=("input", "grad"))

    @case(f"{_opn}/weight_is_nn_Parameter", norm=True)
    def _(opn=_opn):
        fn, offset = RMS_OPS()[opn]
        torch = T()
        x = rnd(N, H)
        w = torch.nn.Parameter(rnd(H))
        res = {}
        expect_result(lambda: res.setdefault("o", fn(x, w)), lambda: compare("out", res["o"], rms_ref(x, w, 1e-6, offset)),
                      names=("weight", "grad"))

    @case(f"{_opn}/side_stream", norm=True)
    def _(opn=_opn):
        fn, offset = RMS_OPS()[opn]
        torch = T()
        src, w = rnd(4096, 4096), rnd(4096)
        x = torch.zeros_like(src)
        s = torch.cuda.Stream()
        res = {}

        def call():
            with torch.cuda.stream(s):
                torch.cuda._sleep(50_000_000)
                x.copy_(src)
                res["o"] = fn(x, w)
            s.synchronize()

        expect_result(call, lambda: compare("out", res["o"], rms_ref(src, w, 1e-6, offset)))

    @case(f"{_opn}/cuda_graph_capture", norm=True)
    def _(opn=_opn):
        fn, offset = RMS_OPS()[opn]
        torch = T()
        x, w = rnd(64, 4096), rnd(4096)
        out = torch.empty_like(x)

        def call():
            fn(x, w, out=out)  # eager warm-up call
            sync()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn(x, w, out=out)
            x.copy_(torch.randn_like(x))
            out.zero_()
            g.replay()

        expect_result(call, lambda: compare("out", out, rms_ref(x, w, 1e-6, offset)))


@case("rmsnorm/hidden_2pow31_rejected", norm=True, timeout=120, mem_gib=13)
def _():
    _, _, norm = ops()
    torch = T()
    h = 2**31
    x = torch.zeros(1, h, dtype=torch.float16, device=dev())
    w = torch.zeros(h, dtype=torch.float16, device=dev())
    out = torch.full((1, h), 1.0, dtype=torch.float16, device=dev())
    res = {}
    expect_result(lambda: norm.rmsnorm(x, w, out=out), lambda: compare("out", out[:, -4096:], out[:, -4096:] * 0),
                  names=("hidden",))


# ==================================================================================================
# fused_add_rmsnorm / gemma_fused_add_rmsnorm
# ==================================================================================================


def _fused_err(name, make, names, gpus=1):
    for opn in ("fused_add_rmsnorm", "gemma_fused_add_rmsnorm"):

        @case(f"{opn}/{name}", gpus=gpus, norm=True)
        def _(opn=opn):
            fn, _ = FUSED_OPS()[opn]
            args, kwargs = make()
            keep = [(n, a) for n, a in zip(("input", "residual", "weight"), args) if isinstance(a, T().Tensor)]
            expect_error(lambda: fn(*args, **kwargs), names, keep=keep)


def _fk(x=None, r=None, w=None, **kw):
    x = rnd(N, H) if x is None else x
    r = rnd(N, H) if r is None else r
    w = rnd(H) if w is None else w
    return (x, r, w), kw


_fused_err("residual_cpu", lambda: _fk(r=T().randn(N, H).bfloat16()), "residual")
_fused_err("residual_None", lambda: ((rnd(N, H), None, rnd(H)), {}), "residual")
_fused_err("residual_list", lambda: ((rnd(N, H), [[0.0] * H] * N, rnd(H)), {}), "residual")
_fused_err("weight_cpu", lambda: _fk(w=T().randn(H).bfloat16()), "weight")
_fused_err("input_int32", lambda: _fk(x=rnd(N, H, dtype=dt("int32"))), "input")
_fused_err("input_float64_all", lambda: _fk(x=rnd(N, H, dtype=dt("float64")), r=rnd(N, H, dtype=dt("float64")),
                                            w=rnd(H, dtype=dt("float64"))), "input")
_fused_err("input_fp8_all", lambda: _fk(x=rnd(N, H, dtype=dt("float8_e5m2")), r=rnd(N, H, dtype=dt("float8_e5m2")),
                                        w=rnd(H, dtype=dt("float8_e5m2"))), "input")
_fused_err("residual_fp16_input_bf16", lambda: _fk(r=rnd(N, H, dtype=dt("float16"))), "residual")
_fused_err("residual_fp32_input_bf16", lambda: _fk(r=rnd(N, H, dtype=dt("float32"))), "residual")
_fused_err("weight_fp32_input_bf16", lambda: _fk(w=rnd(H, dtype=dt("float32"))), "weight")
_fused_err("residual_shape_mismatch_rows", lambda: _fk(r=rnd(N + 1, H)), "residual")
_fused_err("residual_shape_mismatch_hidden", lambda: _fk(r=rnd(N, H * 2)), "residual")
_fused_err("residual_3d_same_numel", lambda: _fk(r=rnd(N, 1, H)), "residual")
_fused_err("weight_shape_H+1", lambda: _fk(w=rnd(H + 1)), "weight")
_fused_err("weight_noncontig", lambda: _fk(w=rnd(2 * H)[::2]), "weight")
_fused_err("input_transposed", lambda: _fk(x=rnd(H, H).t(), r=rnd(H, H)), "input")
_fused_err("residual_transposed", lambda: _fk(x=rnd(H, H), r=rnd(H, H).t()), "residual")
_fused_err("residual_lastdim_stride2", lambda: _fk(r=rnd(N, 2 * H)[:, ::2]), "residual")
_fused_err("input_0dim", lambda: _fk(x=rnd(1).view(()), r=rnd(1).view(()), w=rnd(1)), "input")
_fused_err("input_3d_nonflattenable", lambda: _fk(x=rnd(3, 2, H).transpose(0, 1), r=rnd(2, 3, H)), "input")
_fused_err("eps_negative", lambda: _fk(eps=-1.0), "eps")
_fused_err("eps_nan", lambda: _fk(eps=float("nan")), "eps")
_fused_err("eps_str", lambda: _fk(eps="x"), "eps")
_fused_err("residual_is_input", lambda: (lambda x: ((x, x, rnd(H)), {}))(rnd(N, H)),
           ("residual", "overlap", "alias"))
_fused_err("residual_overlaps_input_shift_1row", lambda: (lambda b: ((b[:N], b[1:N + 1], rnd(H)), {}))(rnd(N + 1, H)),
           ("residual", "overlap", "alias"))
_fused_err("residual_expanded_stride0_rows", lambda: _fk(r=rnd(1, H).expand(N, H)), ("residual", "overlap", "alias"))
_fused_err("input_expanded_stride0_rows", lambda: _fk(x=rnd(1, H).expand(N, H)), ("input", "overlap", "alias"))
_fused_err("residual_on_cuda1", lambda: _fk(r=rnd(N, H, device=dev(1))), ("residual", "device"), gpus=2)
_fused_err("weight_on_cuda1", lambda: _fk(w=rnd(H, device=dev(1))), ("weight", "device"), gpus=2)


def _fused_ok(name, shape, dtn="bfloat16", xoff=0, roff=0, woff=0, eps=1e-6, names=None, gpus=1, timeout=DEFAULT_TIMEOUT,
              mem_gib=0, ops_=("fused_add_rmsnorm", "gemma_fused_add_rmsnorm"), x_make=None, r_make=None):
    for opn in ops_:

        @case(f"{opn}/{name}", gpus=gpus, norm=True, timeout=timeout, mem_gib=mem_gib)
        def _(opn=opn):
            fn, offset = FUSED_OPS()[opn]
            d = dt(dtn)
            x0 = x_make() if x_make else rnd(*shape, dtype=d)
            r0 = r_make() if r_make else rnd(*x0.shape, dtype=x0.dtype)
            w = rnd(x0.shape[-1], dtype=x0.dtype, offset=woff)
            ref_out, ref_sum = fused_ref(x0, r0, w, eps, offset)
            if x_make is None:
                gx, gr = guarded_copy(x0, xoff), guarded_copy(r0, roff)
                x, r = gx.t, gr.t
            else:  # in place on the (possibly strided) views the case built
                gx = gr = None
                x, r = x0, r0
            expect_result(lambda: fn(x, r, w, eps=eps),
                          lambda: both(compare("input(out)", x, ref_out), compare("residual(sum)", r, ref_sum),
                                       gx.guards_ok() if gx else "", gr.guards_ok() if gr else ""),
                          names=names, keep=[("weight", w)])


for _dtn in ("float16", "bfloat16", "float32"):
    for _h in (1, 3, 8, 33, 128, 1000, 4096, 4097, 8192, 16384, 32768):
        _fused_ok(f"{_dtn}_H{_h}", (N, _h), _dtn)
    for _xo, _ro, _wo in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (3, 5, 7), (2, 2, 2)):
        for _h in (128, 4096, 1000):
            _fused_ok(f"{_dtn}_H{_h}_misaligned_x{_xo}_res{_ro}_w{_wo}", (N, _h), _dtn, _xo, _ro, _wo)
for _h in (65536, 70000, 70001, 2**20):
    _fused_ok(f"bfloat16_huge_H{_h}", (3, _h), "bfloat16", 1, 1, names=("hidden",))
_fused_ok("float16_1row_H2pow31-3_int32_overflow", (1, 2**31 - 3), "float16", names=("hidden",), timeout=180, mem_gib=70,
          ops_=("fused_add_rmsnorm",))
_fused_ok("float16_rows0", (0, H), "float16")
_fused_ok("float16_hidden0", (N, 0), "float16")
_fused_ok("bfloat16_1d", (H,))
_fused_ok("bfloat16_3d", (2, 3, H))
_fused_ok("bfloat16_row_strides_differ", None, x_make=lambda: rnd(N, H + 8)[:, :H], r_make=lambda: rnd(N, H + 1)[:, :H])
_fused_ok("bfloat16_row_strides_odd_misaligned", None, x_make=lambda: rnd(N, H + 3, offset=1)[:, 1:H + 1],
          r_make=lambda: rnd(N, H + 5, offset=3)[:, 2:H + 2])
_fused_ok("eps_inf", (N, 128), "float32", eps=float("inf"), names=("eps",))
_fused_ok("eps_zero", (N, 128), "float32", eps=0.0)
_fused_ok("float32_values_1e20", None, x_make=lambda: rnd(N, 128, dtype=dt("float32"), scale=1e20))
for _dtn in ("float16", "bfloat16", "float32"):
    _fused_ok(f"{_dtn}_nan_inf_propagate", None, x_make=lambda d=_dtn: _nan_inf_input(d))
    _fused_ok(f"{_dtn}_sum_overflows_dtype", None, x_make=lambda d=_dtn: T().full((N, 64), T().finfo(dt(d)).max,
                                                                                   dtype=dt(d), device=dev()),
              r_make=lambda d=_dtn: T().full((N, 64), T().finfo(dt(d)).max, dtype=dt(d), device=dev()))

for _opn in ("fused_add_rmsnorm", "gemma_fused_add_rmsnorm"):

    @case(f"{_opn}/all_on_cuda1_current_cuda0", gpus=2, norm=True)
    def _(opn=_opn):
        fn, offset = FUSED_OPS()[opn]
        T().cuda.set_device(0)
        x, r, w = rnd(N, H, device=dev(1)), rnd(N, H, device=dev(1)), rnd(H, device=dev(1))
        ref_out, ref_sum = fused_ref(x, r, w, 1e-6, offset)
        expect_result(lambda: fn(x, r, w), lambda: both(compare("input", x, ref_out), compare("residual", r, ref_sum)))

    @case(f"{_opn}/leaf_requires_grad_in_place", norm=True)
    def _(opn=_opn):
        fn, offset = FUSED_OPS()[opn]
        x = rnd(N, H, dtype=dt("float32")).requires_grad_()
        r = rnd(N, H, dtype=dt("float32"))
        w = rnd(H, dtype=dt("float32"))
        ref_out, ref_sum = fused_ref(x, r, w, 1e-6, offset)
        # torch refuses in-place ops on leaves that require grad; an error naming input is the best answer
        expect_result(lambda: fn(x, r, w), lambda: both(compare("input", x.detach(), ref_out), compare("residual", r, ref_sum)),
                      names=("input", "grad"))

    @case(f"{_opn}/side_stream", norm=True)
    def _(opn=_opn):
        fn, offset = FUSED_OPS()[opn]
        torch = T()
        src, r, w = rnd(4096, 4096), rnd(4096, 4096), rnd(4096)
        ref_out, ref_sum = fused_ref(src, r, w, 1e-6, offset)
        x = torch.zeros_like(src)
        s = torch.cuda.Stream()

        def call():
            with torch.cuda.stream(s):
                torch.cuda._sleep(50_000_000)
                x.copy_(src)
                fn(x, r, w)
            s.synchronize()

        expect_result(call, lambda: both(compare("input", x, ref_out), compare("residual", r, ref_sum)))


# ==================================================================================================
# fused_inplace_qknorm
# ==================================================================================================

NT, HQ, HK, D = 5, 8, 2, 128


def _qk_err(name, make, names, gpus=1):
    @case(f"fused_inplace_qknorm/{name}", gpus=gpus, norm=True)
    def _():
        _, _, norm = ops()
        args, kwargs = make()
        keep = [(n, a) for n, a in zip(("q", "k", "q_weight", "k_weight"), args) if isinstance(a, T().Tensor)]
        expect_error(lambda: norm.fused_inplace_qknorm(*args, **kwargs), names, keep=keep)


def _qk(q=None, k=None, qw=None, kw=None, **extra):
    q = rnd(NT, HQ, D) if q is None else q
    k = rnd(NT, HK, D) if k is None else k
    qw = rnd(D) if qw is None else qw
    kw = rnd(D) if kw is None else kw
    return (q, k, qw, kw), extra


_qk_err("k_cpu", lambda: _qk(k=T().randn(NT, HK, D).bfloat16()), "k")
_qk_err("q_weight_cpu", lambda: _qk(qw=T().randn(D).bfloat16()), "q_weight")
_qk_err("k_weight_cpu", lambda: _qk(kw=T().randn(D).bfloat16()), "k_weight")
_qk_err("k_None", lambda: ((rnd(NT, HQ, D), None, rnd(D), rnd(D)), {}), "k")
_qk_err("q_weight_list", lambda: ((rnd(NT, HQ, D), rnd(NT, HK, D), [1.0] * D, rnd(D)), {}), "q_weight")
_qk_err("k_weight_None", lambda: ((rnd(NT, HQ, D), rnd(NT, HK, D), rnd(D), None), {}), "k_weight")
_qk_err("q_2d", lambda: _qk(q=rnd(NT, HQ * D)), "q")
_qk_err("k_2d", lambda: _qk(k=rnd(NT, HK * D)), "k")
_qk_err("q_4d", lambda: _qk(q=rnd(NT, HQ, 1, D)), "q")
_qk_err("k_4d", lambda: _qk(k=rnd(NT, HK, 1, D)), "k")
_qk_err("q_int32", lambda: _qk(q=rnd(NT, HQ, D, dtype=dt("int32"))), "q")
_qk_err("q_float64_all", lambda: _qk(q=rnd(NT, HQ, D, dtype=dt("float64")), k=rnd(NT, HK, D, dtype=dt("float64")),
                                     qw=rnd(D, dtype=dt("float64")), kw=rnd(D, dtype=dt("float64"))), "q")
_qk_err("q_fp8_all", lambda: _qk(q=rnd(NT, HQ, D, dtype=dt("float8_e4m3fn")), k=rnd(NT, HK, D, dtype=dt("float8_e4m3fn")),
                                 qw=rnd(D, dtype=dt("float8_e4m3fn")), kw=rnd(D, dtype=dt("float8_e4m3fn"))), "q")
_qk_err("k_fp16_q_bf16", lambda: _qk(k=rnd(NT, HK, D, dtype=dt("float16"))), "k")
_qk_err("q_weight_fp32", lambda: _qk(qw=rnd(D, dtype=dt("float32"))), "q_weight")
_qk_err("k_weight_fp16", lambda: _qk(kw=rnd(D, dtype=dt("float16"))), "k_weight")
_qk_err("k_head_dim_mismatch", lambda: _qk(k=rnd(NT, HK, D // 2)), ("k", "head_dim"))
_qk_err("q_head_dim_vs_weights", lambda: _qk(q=rnd(NT, HQ, 64), k=rnd(NT, HK, 64)), ("q_weight", "head_dim"))
_qk_err("k_num_tokens_mismatch", lambda: _qk(k=rnd(NT + 1, HK, D)), ("k", "num_tokens"))
_qk_err("q_weight_shape_D+1", lambda: _qk(qw=rnd(D + 1)), "q_weight")
_qk_err("k_weight_shape_D-1", lambda: _qk(kw=rnd(D - 1)), "k_weight")
_qk_err("k_weight_2d", lambda: _qk(kw=rnd(1, D)), "k_weight")
_qk_err("q_weight_noncontig", lambda: _qk(qw=rnd(2 * D)[::2]), "q_weight")
_qk_err("q_lastdim_stride2", lambda: _qk(q=rnd(NT, HQ, 2 * D)[:, :, ::2]), "q")
_qk_err("k_lastdim_transposed", lambda: _qk(k=rnd(NT, D, HK).transpose(1, 2)), "k")
_qk_err("q_0dim", lambda: _qk(q=rnd(1).view(())), "q")
_qk_err("eps_negative", lambda: _qk(eps=-1e-5), "eps")
_qk_err("eps_nan", lambda: _qk(eps=float("nan")), "eps")
_qk_err("eps_list", lambda: _qk(eps=[1e-6]), "eps")
_qk_err("k_is_q_same_tensor", lambda: (lambda q: ((q, q, rnd(D), rnd(D)), {}))(rnd(NT, HQ, D)), ("k", "overlap", "alias"))
_qk_err("k_overlaps_q_shift_1head",
        lambda: (lambda b: ((b[:, 0:4], b[:, 3:5], rnd(D), rnd(D)), {}))(rnd(NT, 6, D)), ("k", "overlap", "alias"))
_qk_err("q_heads_expanded_stride0", lambda: _qk(q=rnd(NT, 1, D).expand(NT, HQ, D)), ("q", "overlap", "alias"))
_qk_err("k_tokens_expanded_stride0", lambda: _qk(k=rnd(1, HK, D).expand(NT, HK, D)), ("k", "overlap", "alias"))
_qk_err("k_on_cuda1", lambda: _qk(k=rnd(NT, HK, D, device=dev(1))), ("k", "device"), gpus=2)
_qk_err("k_weight_on_cuda1", lambda: _qk(kw=rnd(D, device=dev(1))), ("k_weight", "device"), gpus=2)


def _qk_ok(name, nt=NT, hq=HQ, hk=HK, d=D, dtn="bfloat16", qoff=0, koff=0, qwoff=0, kwoff=0, fused=False, eps=1e-6,
           names=None, gpus=1, device=0, timeout=DEFAULT_TIMEOUT, mem_gib=0, q_make=None):
    @case(f"fused_inplace_qknorm/{name}", gpus=gpus, norm=True, timeout=timeout, mem_gib=mem_gib)
    def _():
        _, _, norm = ops()
        torch = T()
        dd = dt(dtn)
        if device:
            torch.cuda.set_device(0)
        dv = dev(device)
        hv = hk
        guards = []
        if q_make is not None:
            q, k = q_make()
            qkv = None
        elif fused:  # one [nt, (hq + 2 hk) * d] buffer, q | k | v
            g = Guarded((nt, (hq + 2 * hk) * d), dd, dv, offset=qoff)
            g.t.copy_(torch.randn(g.t.shape, device=dv).to(dd))
            qkv = g.t
            q = qkv[:, : hq * d].view(nt, hq, d) if nt else qkv[:, : hq * d].reshape(nt, hq, d)
            k = qkv[:, hq * d:(hq + hk) * d].view(nt, hk, d) if nt else qkv[:, hq * d:(hq + hk) * d].reshape(nt, hk, d)
            guards.append(g)
        else:
            gq = guarded_copy(rnd(nt, hq, d, dtype=dd, device=dv), qoff)
            gk = guarded_copy(rnd(nt, hk, d, dtype=dd, device=dv), koff)
            q, k, qkv = gq.t, gk.t, None
            guards += [gq, gk]
        qw = rnd(q.shape[-1], dtype=dd, device=dv, offset=qwoff)
        kw = rnd(q.shape[-1], dtype=dd, device=dv, offset=kwoff)
        ref_q, ref_k = rms_ref(q, qw, eps), rms_ref(k, kw, eps)
        v_before = qkv[:, (hq + hk) * d:].clone() if qkv is not None else None

        def check():
            msgs = [compare("q", q, ref_q), compare("k", k, ref_k)] + [g_.guards_ok() for g_ in guards]
            if v_before is not None and not torch.equal(qkv[:, (hq + hk) * d:], v_before):
                msgs.append("v part of the fused qkv buffer was modified")
            return both(*msgs)

        expect_result(lambda: norm.fused_inplace_qknorm(q, k, qw, kw, eps=eps), check, names=names,
                      keep=[("q_weight", qw), ("k_weight", kw)])


for _dtn in ("float16", "bfloat16", "float32"):
    for _d in (1, 3, 8, 64, 80, 96, 128, 256, 512, 1000):
        _qk_ok(f"{_dtn}_D{_d}", d=_d, dtn=_dtn)
        _qk_ok(f"{_dtn}_D{_d}_fused_qkv", d=_d, dtn=_dtn, fused=True)
    for _qo, _ko, _qwo, _kwo in ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 3, 5, 7)):
        for _d in (64, 128):
            _qk_ok(f"{_dtn}_D{_d}_misaligned_q{_qo}_k{_ko}_qw{_qwo}_kw{_kwo}", d=_d, dtn=_dtn, qoff=_qo, koff=_ko,
                   qwoff=_qwo, kwoff=_kwo)
    _qk_ok(f"{_dtn}_fused_qkv_misaligned_base", dtn=_dtn, fused=True, qoff=1)
_qk_ok("bfloat16_odd_heads_fused", hq=7, hk=3, d=128, fused=True)
_qk_ok("bfloat16_hk0", hk=0)
_qk_ok("bfloat16_hq0", hq=0)
_qk_ok("bfloat16_hq0_hk0", hq=0, hk=0)
_qk_ok("bfloat16_tokens0", nt=0)
_qk_ok("bfloat16_head_dim0", d=0)
_qk_ok("bfloat16_head_dim_16384", d=16384, hq=2, hk=1, names=("head_dim",))
_qk_ok("bfloat16_head_dim_65536", d=65536, hq=2, hk=1, names=("head_dim",))
_qk_ok("bfloat16_many_tokens_100k", nt=100_000, hq=4, hk=1, d=64)
_qk_ok("eps_inf", dtn="float32", eps=float("inf"), names=("eps",))
_qk_ok("eps_zero", dtn="float32", eps=0.0)
_qk_ok("all_on_cuda1_current_cuda0", gpus=2, device=1)
_qk_ok("all_on_cuda1_fused_current_cuda0", gpus=2, device=1, fused=True)
_qk_ok("bfloat16_nan_inf_heads", q_make=lambda: (_nan_inf_input("bfloat16").view(3, 2, 64),
                                                   _nan_inf_input("bfloat16").view(3, 2, 64)))


@case("fused_inplace_qknorm/float16_rows_over_2pow32_D1", norm=True, timeout=300, mem_gib=40)
def _():
    """num_tokens * num_heads > 2^32 rows (the 64-bit row -> (token, head) division path)."""
    _, _, norm = ops()
    torch = T()
    nt, hq, hk = 2**31 + 1, 2, 1
    q = torch.empty(nt, hq, 1, dtype=torch.float16, device=dev())
    k = torch.empty(nt, hk, 1, dtype=torch.float16, device=dev())
    for t, m in ((q, 7), (k, 5)):
        f = t.view(-1)
        for lo in range(0, f.numel(), CHUNK):
            n = min(CHUNK, f.numel() - lo)
            f[lo:lo + n] = (torch.arange(lo, lo + n, device=dev()) % m - m // 2).to(torch.float16)
    qw = torch.tensor([0.5], dtype=torch.float16, device=dev())
    kw = torch.tensor([2.0], dtype=torch.float16, device=dev())

    def check():
        for name, t, m, w in (("q", q, 7, 0.5), ("k", k, 5, 2.0)):
            f = t.view(-1)
            for lo in range(0, f.numel(), CHUNK):
                n = min(CHUNK, f.numel() - lo)
                x = (torch.arange(lo, lo + n, device=dev()) % m - m // 2).float()
                want = (x * torch.rsqrt(x * x + 1e-6) * w).to(torch.float16)
                msg = _compare(f"{name}[flat {lo}:+{n}]", f[lo:lo + n], want)
                if msg:
                    return msg
        return ""

    expect_result(lambda: norm.fused_inplace_qknorm(q, k, qw, kw), check)


@case("fused_inplace_qknorm/q_requires_grad_leaf", norm=True)
def _():
    _, _, norm = ops()
    q = rnd(NT, HQ, D, dtype=dt("float32")).requires_grad_()
    k = rnd(NT, HK, D, dtype=dt("float32"))
    qw, kw = rnd(D, dtype=dt("float32")), rnd(D, dtype=dt("float32"))
    rq, rk = rms_ref(q, qw, 1e-6), rms_ref(k, kw, 1e-6)
    expect_result(lambda: norm.fused_inplace_qknorm(q, k, qw, kw),
                  lambda: both(compare("q", q.detach(), rq), compare("k", k, rk)), names=("q", "grad"))


@case("fused_inplace_qknorm/side_stream", norm=True)
def _():
    _, _, norm = ops()
    torch = T()
    src = rnd(8192, 8, 128)
    k = rnd(8192, 2, 128)
    qw, kw = rnd(128), rnd(128)
    rq, rk = rms_ref(src, qw, 1e-6), rms_ref(k, kw, 1e-6)
    q = torch.zeros_like(src)
    s = torch.cuda.Stream()

    def call():
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)
            q.copy_(src)
            norm.fused_inplace_qknorm(q, k, qw, kw)
        s.synchronize()

    expect_result(call, lambda: both(compare("q", q, rq), compare("k", k, rk)))


# ==================================================================================================
# Worker / runner
# ==================================================================================================


def run_case_inproc(full):
    """Runs one case in this process; returns a result dict."""
    base, mode = split_mode(full)
    c = CASES.get(base)
    t0 = time.time()
    if c is None:
        return dict(case=full, status="SKIP", etype="unknown case", detail="no such case")
    torch = T()
    if c.gpus > 0 and not have_gpu(c.gpus):
        why = "no GPU" if not torch.cuda.is_available() else f"needs {c.gpus} GPUs, {torch.cuda.device_count()} visible"
        return dict(case=full, status="SKIP", etype="skipped", detail=why)
    if c.mem_gib and FAKE_CPU:
        return dict(case=full, status="SKIP", etype="skipped", detail="big case skipped in self-test")
    if c.mem_gib and have_gpu():
        free, _ = torch.cuda.mem_get_info(0)
        if free < c.mem_gib * 2**30:
            return dict(case=full, status="SKIP", etype="skipped",
                        detail=f"needs ~{c.mem_gib} GiB free GPU memory, {free / 2**30:.1f} GiB free")
    try:
        if have_gpu() and not FAKE_CPU:
            torch.cuda.set_device(0)
        torch.manual_seed(1234)
        if mode is not None:
            prepare_mode(mode)
        c.fn()
        res = dict(status="FAIL", etype="harness", detail="case returned without a verdict")
    except Verdict as v:
        res = dict(status=v.status, etype=v.etype, detail=v.detail)
    except Skip as s:
        res = dict(status="SKIP", etype="skipped", detail=str(s))
    except Exception as e:  # noqa: BLE001 -- set-up error (not the op under test)
        msg = str(e)
        if FAULT_RE.search(msg):
            res = dict(status="FAIL", etype=type(e).__name__, detail="CUDA fault surfaced outside the op call: " + msg)
        elif isinstance(e, torch.OutOfMemoryError):
            res = dict(status="SKIP", etype=type(e).__name__, detail="test set-up out of memory: " + msg)
        else:
            here = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == os.path.abspath(__file__)]
            line = here[-1].lineno if here else "?"
            res = dict(status="SKIP", etype=type(e).__name__, detail=f"test set-up error at line {line}: {msg}")
    finally:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.set_device(0)
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
    ok, why = context_healthy()
    res["poisoned"] = not ok
    if not ok and res["status"] == "PASS":
        res["status"], res["detail"] = "FAIL", f"CUDA context broken after the case ({why}); " + res["detail"]
    res["case"] = full
    res["secs"] = round(time.time() - t0, 2)
    return res


def worker_main():
    for line in sys.stdin:
        full = line.strip()
        if not full:
            continue
        if full == "__warmup__":
            res = warmup()
        else:
            res = run_case_inproc(full)
        sys.stdout.write(RESULT_TAG + json.dumps(res) + "\n")
        sys.stdout.flush()
        if res.get("poisoned"):
            os._exit(3)  # a fresh process for the next case


def warmup():
    """Builds/loads every module the cases use (outside the per-case timeouts)."""
    t0 = time.time()
    torch = T()
    if not have_gpu():
        return dict(case="__warmup__", status="SKIP", etype="", detail="no GPU")
    try:
        from sglang.jit_kernel.add_constant import _jit_add_constant_module
        from sglang.jit_kernel.scale import _jit_scale_module

        _, _, norm = ops()
        for d in (torch.float16, torch.bfloat16, torch.float32):
            _jit_scale_module(d)
            norm._jit_norm_module(d)
        for c in (1, 2**31 - 1, -(2**31)):
            _jit_add_constant_module(c)
        return dict(case="__warmup__", status="PASS", etype="ok", detail=f"modules ready in {time.time() - t0:.1f} s")
    except Exception as e:  # noqa: BLE001
        return dict(case="__warmup__", status="FAIL", etype=type(e).__name__, detail=str(e))


def describe_rc(rc):
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


class Worker:
    def __init__(self, isolate):
        self.isolate = isolate
        self.proc = None
        self.lines = None
        self.err = None

    def start(self):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, cwd=REPO)
        self.lines = queue.Queue()
        self.err = collections.deque(maxlen=40)
        proc, lines, err = self.proc, self.lines, self.err

        def read_out():
            for ln in proc.stdout:
                lines.put(ln)
            lines.put(None)

        def read_err():
            for ln in proc.stderr:
                err.append(ln.rstrip())

        threading.Thread(target=read_out, daemon=True).start()
        threading.Thread(target=read_err, daemon=True).start()

    def stop(self, kill=False):
        if self.proc is None:
            return
        try:
            if kill:
                self.proc.kill()
            else:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001
            self.proc.kill()
        self.proc = None

    def run(self, full, timeout):
        if self.proc is None:
            self.start()
        try:
            self.proc.stdin.write(full + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.stop(kill=True)
            self.start()
            self.proc.stdin.write(full + "\n")
            self.proc.stdin.flush()
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                self.stop(kill=True)
                return dict(case=full, status="FAIL", etype="timeout",
                            detail=f"no result within {timeout:.0f} s (hang?); worker killed")
            try:
                ln = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if ln is None:  # process died mid-case
                try:
                    rc = self.proc.wait(timeout=10)
                except Exception:  # noqa: BLE001
                    rc = None
                tail = " | ".join(l for l in list(self.err)[-6:] if l.strip())
                self.proc = None
                return dict(case=full, status="FAIL", etype="crash",
                            detail=f"process died ({describe_rc(rc)}); stderr tail: {tail}")
            if ln.startswith(RESULT_TAG):
                res = json.loads(ln[len(RESULT_TAG):])
                if res.get("poisoned") or self.isolate:
                    self.stop(kill=not self.isolate)
                return res
            # other stdout noise from the worker: ignore


def fmt(res):
    return f"{res['status']} {res['case']} : {res['etype']}: {short(res['detail'])}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", help="run one case in this process and print its line")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only", help="regex: run only matching case names")
    ap.add_argument("--list", action="store_true", help="list case names")
    ap.add_argument("-j", "--jobs", type=int, default=4, help="parallel worker processes (default 4)")
    ap.add_argument("--isolate", action="store_true", help="one fresh process per case")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="per-case timeout, s (default 30)")
    ap.add_argument("--no-warmup", action="store_true", help="skip the module build/load step")
    args = ap.parse_args()

    if args.worker:
        worker_main()
        return 0
    names = expanded_case_names()
    if args.only:
        rx = re.compile(args.only)
        names = [n for n in names if rx.search(n)]
    if args.list:
        print("\n".join(names))
        print(f"{len(names)} cases")
        return 0
    if args.case:
        res = run_case_inproc(args.case)
        print(fmt(res), flush=True)
        return 0

    print(f"attack_inputs: {len(names)} cases, python {sys.executable}", flush=True)
    probe = subprocess.run([sys.executable, "-c",
                            "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count(),"
                            " torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"],
                           capture_output=True, text=True, cwd=REPO)
    print("torch / cuda available / GPUs / name:", probe.stdout.strip() or probe.stderr.strip()[-300:], flush=True)
    gpu = " True " in f" {probe.stdout} "

    if gpu and not args.no_warmup:
        # Build every module the cases use up front, in parallel (outside the 30 s per-case timeouts):
        # the project's builder for scale / norm / add_constant(1), plus the two boundary constants.
        t_w = time.time()
        jobs_n = str(max(2, os.cpu_count() or 2))
        procs = [subprocess.Popen([sys.executable, "-m", "sglang.jit_kernel", "build", "scale", "rmsnorm", "add_constant",
                                   "-j", jobs_n], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
        for c in (2**31 - 1, -(2**31)):
            procs.append(subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, 'python');"
                                           "from sglang.jit_kernel.add_constant import _jit_add_constant_module as m;"
                                           f"m({c})"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        for p in procs:
            try:
                out, _ = p.communicate(timeout=900)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            if p.returncode != 0:
                print(f"warmup build step failed ({describe_rc(p.returncode)}): {short(out[-600:], 600)}", flush=True)
        w = Worker(isolate=True)
        res = w.run("__warmup__", 900)
        w.stop()
        print(f"warmup (JIT build/load of scale x3, norm x3, add_constant x3) in {time.time() - t_w:.0f} s: "
              f"{res['status']} {short(res['detail'], 300)}", flush=True)

    # big-memory cases run alone at the end (they need tens of GiB and long timeouts)
    big = [n for n in names if CASES[split_mode(n)[0]].mem_gib]
    small = [n for n in names if n not in big]
    results = {}
    lock = threading.Lock()
    counts = collections.Counter()
    t0 = time.time()

    def emit(res):
        with lock:
            results[res["case"]] = res
            counts[res["status"]] += 1
            print(fmt(res), flush=True)

    def drain(q, jobs):
        def loop():
            w = Worker(args.isolate)
            while True:
                try:
                    full = q.get_nowait()
                except queue.Empty:
                    break
                c = CASES[split_mode(full)[0]]
                timeout = max(args.timeout, c.timeout)
                res = w.run(full, timeout)
                emit(res)
            w.stop()

        threads = [threading.Thread(target=loop) for _ in range(max(1, jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    jobs = args.jobs if gpu else min(args.jobs, 2)
    q = queue.Queue()
    for n in small:
        q.put(n)
    drain(q, jobs)
    q = queue.Queue()
    for n in big:
        q.put(n)
    drain(q, 1)

    print("-" * 100)
    fails = [r for r in results.values() if r["status"] == "FAIL"]
    if fails:
        print(f"FAILED cases ({len(fails)}):")
        for r in sorted(fails, key=lambda r: r["case"]):
            print("  " + fmt(r))
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
          f"({len(results)} cases, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
