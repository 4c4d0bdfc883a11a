"""norm_quant (rmsnorm_quant, fused_add_rmsnorm_quant): bit identity with the unfused composition of
our ops (rmsnorm / fused_add_rmsnorm, then per_token_group_quant_8bit / per_token_quant_fp8 / static
per_tensor_quant_fp8) in every quant mode and scale layout, an fp32 check of the quantization from the
normalised rows, views, poisoned outputs, empty inputs, graphs, compile, other GPUs; argument errors
(CPU tensors, no GPU needed); every variant compiles for sm_90 without spills (nvcc, no GPU needed)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import sglang.jit_kernel.norm_quant as nq
from sglang.jit_kernel._quant_8bit import emulate_amax, emulate_quant, emulate_scale
from sglang.jit_kernel.norm_quant import fused_add_rmsnorm_quant, rmsnorm_quant, unfused
from sglang.jit_kernel.testing import (
    assert_bits_equal,
    assert_poison_intact,
    kernels_without_local_memory,
    poisoned,
    requires_cuda,
    requires_nvcc,
    requires_two_gpus,
)
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cuda_ci(est_time=90, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=300, suite="nightly-kernel-1-gpu", nightly=True)
register_cpu_ci(est_time=240, suite="stage-a-kernel-cpu")

FP8, INT8, BF16, FP16 = torch.float8_e4m3fn, torch.int8, torch.bfloat16, torch.float16
EPS = 1e-6
# (num_tokens, hidden_size): awkward token counts, decode and prefill rows, both sides of the
# register path's limit (16384 elements; longer rows run the composition).
SHAPES = get_ci_test_range(
    full_range=[
        (1, 128),
        (7, 256),
        (129, 4096),
        (1, 4096),
        (4097, 4096),
        (33, 7168),
        (64, 8192),
        (5, 16384),
        (3, 32768),
    ],
    ci_range=[(1, 128), (7, 256), (129, 4096), (33, 7168), (5, 16384), (3, 32768)],
)
DTYPES = (BF16, FP16)
OPS = ("rmsnorm_quant", "fused_add_rmsnorm_quant")


def make_inputs(op: str, n: int, h: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, h, dtype=torch.float32, device="cuda", generator=g).to(dtype) * 3
    r = torch.randn(n, h, dtype=torch.float32, device="cuda", generator=g).to(dtype) if op != "rmsnorm_quant" else None
    w = torch.randn(h, dtype=torch.float32, device="cuda", generator=g).to(dtype)
    return x, r, w


def call(op: str, x: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor, **kwargs) -> tuple:
    if op == "rmsnorm_quant":
        return rmsnorm_quant(x, w, EPS, **kwargs)
    return fused_add_rmsnorm_quant(x, r, w, EPS, **kwargs)


def expected(op: str, x, r, w, group_size, out_dtype=FP8, scale=None, ue8m0=False) -> tuple:
    return unfused(x, r, w, EPS, group_size, out_dtype, scale, ue8m0)


# ---------------------------------------------------------------------------------------------
# Bit identity with the unfused composition
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n,h", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", (FP8, INT8))
@pytest.mark.parametrize("group_size", (64, 128))
def test_group_bit_identical(op, n, h, dtype, out_dtype, group_size):
    x, r, w = make_inputs(op, n, h, dtype)
    rq, rs, ry = expected(op, x, r, w, group_size, out_dtype)
    x0 = x.clone()
    q, s, y = call(op, x, r, w, group_size=group_size, out_dtype=out_dtype, return_normed=True)
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)
    assert_bits_equal(y, ry)
    assert_bits_equal(x, x0)  # input is read only
    if r is not None:
        assert_bits_equal(r, (x0.float() + make_inputs(op, n, h, dtype)[1].float()).to(dtype))


@requires_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n,h", [(1, 4096), (129, 7168), (4097, 1024), (33, 896)])  # 896: 7 groups, a partial word
@pytest.mark.parametrize("ue8m0", (False, True))
def test_group_column_major_and_ue8m0(op, n, h, ue8m0):
    x, r, w = make_inputs(op, n, h, BF16, seed=1)
    rq, rs, _ = expected(op, x, r, w, 128, FP8, ue8m0=ue8m0)
    q, s = call(op, x, r, w, group_size=128, column_major_scales=True, scale_ue8m0=ue8m0)
    assert s.stride(0) == 1 and s.shape == rs.shape, (s.shape, s.stride())
    assert (s.T.stride(0) * s.element_size()) % 16 == 0  # TMA-aligned columns
    assert_bits_equal(q, rq)
    assert_bits_equal(s.contiguous(), rs)


# rmsnorm_quant's pair CTAs (two reduction lanes a thread; launches of more CTAs than SMs): rows of
# 32 to 256 reduction lanes, one to eight rows a CTA, a row of 192 lanes (six warps' partials), a row
# whose last vectors are past its end; rows of 96 lanes two to a CTA, which take no pairs; and a
# decode row, which keeps one lane a thread.
PAIR_SHAPES = [(2401, 512), (1201, 1024), (601, 2048), (301, 4096), (1201, 896), (301, 3072), (601, 1536), (1, 4096)]


@requires_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n,h", PAIR_SHAPES)
@pytest.mark.parametrize("group_size,ue8m0", [(16, False), (32, True), (64, False), (128, True)])
def test_group_sizes_across_reduction_lanes(op, n, h, group_size, ue8m0):
    if h % group_size:
        pytest.skip("hidden_size not a multiple of group_size")
    x, r, w = make_inputs(op, n, h, BF16, seed=4)
    rq, rs, ry = expected(op, x, r, w, group_size, FP8, ue8m0=ue8m0)
    q, s, y = call(op, x, r, w, group_size=group_size, scale_ue8m0=ue8m0, return_normed=True)
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)
    assert_bits_equal(y, ry)
    x, r, w = make_inputs(op, n, h, BF16, seed=5)
    rq, rs, _ = expected(op, x, r, w, None)
    q, s = call(op, x, r, w, group_size=None)
    assert_bits_equal(q, rq)
    assert_bits_equal(s.view(n), rs)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n,h", [(301, 4096), (601, 1536), (301, 3072)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", (FP8, INT8))
def test_pair_rows_dtypes_and_modes(op, n, h, dtype, out_dtype):
    x, r, w = make_inputs(op, n, h, dtype, seed=6)
    rq, rs, _ = expected(op, x, r, w, 128, out_dtype)
    q, s = call(op, x, r, w, group_size=128, out_dtype=out_dtype)
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)
    if out_dtype != FP8:
        return  # int8 is per group only
    x, r, w = make_inputs(op, n, h, dtype, seed=7)
    rq, rs, _ = expected(op, x, r, w, None)
    q, s = call(op, x, r, w, group_size=None)
    assert_bits_equal(q, rq)
    assert_bits_equal(s.view(n), rs)
    scale = torch.tensor([0.0123], device="cuda")
    x, r, w = make_inputs(op, n, h, dtype, seed=8)
    rq, _, _ = expected(op, x, r, w, None, scale=scale)
    q, _ = call(op, x, r, w, scale=scale)
    assert_bits_equal(q, rq)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n,h", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_token_and_static_bit_identical(op, n, h, dtype):
    x, r, w = make_inputs(op, n, h, dtype, seed=2)
    rq, rs, _ = expected(op, x, r, w, None)
    q, s = call(op, x, r, w, group_size=None)
    assert s.shape == (n, 1)
    assert_bits_equal(q, rq)
    assert_bits_equal(s.view(n), rs)

    x, r, w = make_inputs(op, n, h, dtype, seed=2)
    scale = torch.tensor([0.0123], device="cuda")
    rq, _, _ = expected(op, x, r, w, None, scale=scale)
    q, s = call(op, x, r, w, scale=scale)
    assert s is scale
    assert_bits_equal(q, rq)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mode", ("group", "token"))
def test_quant_matches_fp32_emulation_of_normed(op, mode):
    """An independent reference for the quant half: the fp32 emulation from the rounded rows y."""
    n, h, g = 65, 4096, 128
    x, r, w = make_inputs(op, n, h, BF16, seed=3)
    r0 = None if r is None else r.clone()  # the fused add writes the sum into r
    kwargs = {"group_size": g if mode == "group" else None}
    q, s, y = call(op, x, r, w, return_normed=True, **kwargs)
    blocks = y.float().view(n, h // g, g) if mode == "group" else y.float().view(n, 1, h)
    rs = emulate_scale(emulate_amax(blocks, dim=-1), 1e-10, 448.0)
    rq = emulate_quant(blocks, rs.unsqueeze(-1), -448.0, 448.0, FP8).view(n, h)
    assert_bits_equal(q, rq)
    assert_bits_equal(s.view(rs.shape), rs)
    # and y is rmsnorm of the (summed) rows within one bf16 ulp of the fp32 formula
    base = x.float() + (r0.float() if r0 is not None else 0)
    base = base.to(BF16).float()
    ref = base * torch.rsqrt(base.pow(2).mean(-1, keepdim=True) + EPS) * w.float()
    torch.testing.assert_close(y.float(), ref.to(BF16).float(), rtol=2**-7, atol=1e-6)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
def test_special_values(op):
    """inf and NaN rows and all-zero rows follow the composition's rules (no NaN scale from finite input)."""
    n, h = 6, 1024
    x, r, w = make_inputs(op, n, h, BF16, seed=4)
    x[0, 5] = float("inf")
    x[1, 7] = float("nan")
    x[2].zero_()
    if r is not None:
        r[2].zero_()
    rq, rs, _ = expected(op, x, r, w, 128)
    q, s = call(op, x, r, w, group_size=128)
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)
    assert not torch.isnan(s[2:]).any()


# ---------------------------------------------------------------------------------------------
# Layouts: strided rows, offsets (the composition path), given outputs inside poisoned buffers
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("offset", (0, 1, 8))
@pytest.mark.parametrize("n", (37, 601))  # 601 rows: more CTAs than SMs, rmsnorm_quant's pair CTAs
def test_strided_and_offset_views(op, offset, n):
    h, wide = 2048, 2048 + 64
    x_buf, r_buf, w = make_inputs(op, n, wide + offset, BF16, seed=5)
    x = x_buf[:, offset : offset + h]
    r = None if r_buf is None else r_buf[:, offset : offset + h]
    w = w[:h].contiguous()
    rq, rs, ry = expected(op, x, r, w, 128)
    q, s, y = call(op, x, r, w, group_size=128, return_normed=True)
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)
    assert_bits_equal(y, ry)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("q_pad", (0, 3))
@pytest.mark.parametrize("n", (9, 1201))  # 1201 rows: more CTAs than SMs, rmsnorm_quant's pair CTAs
def test_given_outputs_in_poisoned_buffers(op, q_pad, n):
    h, g, guard = 1024, 128, 64
    x, r, w = make_inputs(op, n, h, BF16, seed=6)
    rq, rs, ry = expected(op, x, r, w, g)
    q_buf = torch.full((n * (h + q_pad) + 2 * guard,), 0x5A, dtype=torch.uint8, device="cuda")
    q = q_buf[guard : guard + n * (h + q_pad)].view(n, h + q_pad)[:, :h].view(FP8)
    s_buf = poisoned((n * 8 + 2 * guard,), torch.float32)
    s = s_buf[guard : guard + n * 8].view(n, 8)
    y_buf = poisoned((n * h + 2 * guard,), BF16)
    y = y_buf[guard : guard + n * h].view(n, h)
    out = call(op, x, r, w, group_size=g, output_q=q, output_s=s, output_normed=y)
    assert out[0] is q and out[1] is s and out[2] is y
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)
    assert_bits_equal(y, ry)
    assert (q_buf[:guard] == 0x5A).all() and (q_buf[-guard:] == 0x5A).all()
    if q_pad:
        assert (q.view(torch.uint8).as_strided((n, q_pad), (h + q_pad, 1), q.storage_offset() + h)[:-1] == 0x5A).all()
    assert_poison_intact(s_buf, guard, n * 8)
    assert_poison_intact(y_buf, guard, n * h)


def _strided_views(device: str, q_start: int) -> dict[str, torch.Tensor]:
    """Strided views in [4, 1024]-byte buffers: x at bf16 columns 1..256 (bytes 2..513 of each row)
    and q at fp8 bytes q_start.. q_start + 255 of the same rows; a residual and q2 laid out alike in
    another buffer. Misaligned by 2 bytes, so the composition (not the fused kernel) takes them.
    q_start 500 shares bytes 500..513 of each row; 516 shares none (interleaved)."""
    buf = torch.zeros(4, 1024, dtype=torch.uint8, device=device)
    rbuf = torch.zeros(4, 1024, dtype=torch.uint8, device=device)
    return {
        "x": buf.view(BF16)[:, 1:257],
        "q": buf.view(FP8)[:, q_start : q_start + 256],
        "r": rbuf.view(BF16)[:, 1:257],
        "q2": rbuf.view(FP8)[:, q_start : q_start + 256],
        "w": torch.ones(256, dtype=BF16, device=device),
    }


def _strided_case(v: dict[str, torch.Tensor], name: str) -> tuple:
    """(op, the error's words, x, residual, output_q) of case ``name``."""
    if name == "q_in_input":
        return "rmsnorm_quant", "output_q overlaps input", v["x"], None, v["q"]
    return "fused_add_rmsnorm_quant", "output_q overlaps residual", torch.zeros_like(v["x"]), v["r"], v["q2"]


@pytest.mark.parametrize("name", ["q_in_input", "q_in_residual"])
def test_composition_path_refuses_shared_bytes(name, monkeypatch):
    """Rows the fused kernel does not take run the unfused composition, whose fresh intermediates hide
    the outputs from any launcher's element test: _launch refuses outputs sharing bytes with input or
    residual before composing, and composes interleaved views that share none (CPU tensors: _launch
    itself, past the wrappers' device check)."""
    composed = []
    monkeypatch.setattr(nq, "_compose", lambda *a: composed.append(a))
    for q_start, shares in ((500, True), (516, False)):
        v = _strided_views("cpu", q_start)
        op, message, x, r, q = _strided_case(v, name)
        s = torch.empty(x.shape[0], x.shape[1] // 128)
        args = (op, x, r, v["w"], q, s, None, None, EPS, 1e-10, 128, False, -1)
        if shares:
            with pytest.raises(RuntimeError, match=message):
                nq._launch(*args)
            assert not composed
        else:
            nq._launch(*args)
            assert len(composed) == 1


def test_share_bytes_against_byte_sets():
    """_validate.share_bytes: exact on 2-D row views with one row stride (or a single row), never
    False where the views share a byte (a byte-set model of random views of one buffer)."""
    import itertools
    import random

    from sglang.jit_kernel._validate import share_bytes

    def byte_set(t: torch.Tensor) -> set[int]:
        size = t.element_size()
        offsets = (sum(i * st for i, st in zip(idx, t.stride())) for idx in itertools.product(*map(range, t.shape)))
        return {t.data_ptr() + o * size + b for o in offsets for b in range(size)}

    buf = torch.zeros(2048, dtype=torch.uint8)
    rng = random.Random(0)

    def view() -> torch.Tensor:
        dtype = rng.choice([torch.uint8, torch.bfloat16, torch.float32])
        size = torch.empty(0, dtype=dtype).element_size()
        rows, stride = rng.randint(1, 5), rng.choice([16, 20, 32, 40, 64]) // size
        width, offset = rng.randint(1, stride + 2), rng.randrange(0, 200, size)
        return (
            buf[offset : offset + (rows - 1) * stride * size + width * size]
            .view(dtype)
            .as_strided((rows, width), (stride, 1))
        )

    for _ in range(400):
        a, b = view(), view()
        exact = bool(byte_set(a) & byte_set(b))
        got = share_bytes(a, b)
        one_stride = len({t.stride(0) * t.element_size() for t in (a, b) if t.shape[0] > 1}) <= 1
        assert got == exact if one_stride else got >= exact, (a.shape, a.stride(), b.shape, b.stride())


def test_composition_path_takes_packed_q_and_scales(monkeypatch):
    """output_q and output_s packed in the rows of one buffer reach the quant op together (its
    launcher tests them element by element): the composition takes them, as the fused kernel does."""
    composed = []
    monkeypatch.setattr(nq, "_compose", lambda *a: composed.append(a))
    n, h, g = 3, 16512, 128  # 33024-byte rows: the composition
    x, w = torch.randn(n, h, dtype=BF16), torch.ones(h, dtype=BF16)
    pack = torch.empty(n, h + 4 * (h // g), dtype=torch.uint8)
    q, s = pack[:, :h].view(FP8), pack[:, h:].view(torch.float32)
    nq._launch("rmsnorm_quant", x, None, w, q, s, None, None, EPS, 1e-10, g, False, -1)
    assert len(composed) == 1


@requires_cuda
@pytest.mark.parametrize("name", ["q_in_input", "q_in_residual"])
def test_composition_path_shared_bytes_raise_and_write_nothing(name):
    v = _strided_views("cuda", 500)
    op, message, x, r, q = _strided_case(v, name)
    watched = (v["x"], v["q"], v["r"], v["q2"])
    before = [t.clone() for t in watched]
    with pytest.raises(RuntimeError, match=message):
        call(op, x, r, v["w"], output_q=q)
    torch.cuda.synchronize()
    for t, b in zip(watched, before):
        assert_bits_equal(t, b)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
def test_composition_path_interleaved_outputs(op):
    """Interleaved views that share no byte: the composition's result, input left as it was."""
    v = _strided_views("cuda", 516)
    v["x"].copy_(torch.randn(4, 256, device="cuda").to(BF16))
    v["r"].copy_(torch.randn(4, 256, device="cuda").to(BF16))
    x_before = v["x"].clone()
    r = v["r"] if op == "fused_add_rmsnorm_quant" else None
    rq, rs, _ = expected(op, v["x"].clone(), None if r is None else r.clone(), v["w"], 128)
    q, s = call(op, v["x"], r, v["w"], output_q=v["q"])[:2]
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)
    assert_bits_equal(v["x"], x_before)


def _written_overlap_case(device: str, name: str) -> tuple:
    """(the error's words, x, residual, keyword outputs) of a composition call (2-byte offset rows)
    whose written tensors overlap, which no launcher of the composition sees before residual or
    output_normed is written."""
    xb = torch.zeros(4 * 256 + 1, dtype=BF16, device=device)
    x, r = xb[1:].view(4, 256), torch.zeros(4, 256, dtype=BF16, device=device)
    if name == "s_rows_overlap":
        return (
            "output_s strides: expected elements at addresses of their own",
            x,
            r,
            {"output_s": torch.empty(8, device=device).as_strided((4, 2), (1, 1))},
        )
    if name == "q_rows_overlap":
        q = torch.empty(4 * 256, dtype=FP8, device=device).as_strided((4, 256), (128, 1))
        return "output_q strides: expected elements at addresses of their own", x, r, {"output_q": q}
    rb = torch.zeros(4, 384, dtype=BF16, device=device)  # residual and output_normed interleaved, sharing columns
    return "output_normed overlaps residual", x, rb[:, :256], {"output_normed": rb[:, 128:]}


@pytest.mark.parametrize("name", ["s_rows_overlap", "q_rows_overlap", "normed_in_residual"])
def test_composition_path_refuses_overlapping_outputs(name, monkeypatch):
    """The composition writes residual and output_normed before its quant op's launcher would test the
    outputs: _launch refuses every overlap of the written tensors before composing (CPU tensors)."""
    composed = []
    monkeypatch.setattr(nq, "_compose", lambda *a: composed.append(a))
    message, x, r, out = _written_overlap_case("cpu", name)
    q = out.get("output_q", torch.empty(4, 256, dtype=FP8))
    s = out.get("output_s", torch.empty(4, 2))
    with pytest.raises(RuntimeError, match=message):
        nq._launch("fused_add_rmsnorm_quant", x, r, torch.ones(256, dtype=BF16), q, s, None, out.get("output_normed"),
                   EPS, 1e-10, 128, False, -1)  # fmt: skip
    assert not composed


@requires_cuda
@pytest.mark.parametrize("name", ["s_rows_overlap", "q_rows_overlap", "normed_in_residual"])
def test_composition_path_overlapping_outputs_raise_and_write_nothing(name):
    message, x, r, out = _written_overlap_case("cuda", name)
    r.copy_(torch.randn(r.shape, device="cuda").to(BF16))
    watched = [x, r] + list(out.values())
    before = [t.clone() for t in watched]
    with pytest.raises(RuntimeError, match=f"^fused_add_rmsnorm_quant: {message}"):
        fused_add_rmsnorm_quant(x, r, torch.ones(256, dtype=BF16, device="cuda"), EPS, **out)
    torch.cuda.synchronize()
    for t, b in zip(watched, before):
        assert_bits_equal(t, b)


@requires_cuda
@pytest.mark.parametrize("h", [12, 64])  # 24-byte rows: the composition; 128-byte rows: the kernel
@pytest.mark.parametrize("written", ["residual", "output_normed"])
def test_static_scale_sharing_a_written_tensor_raises(h, written):
    """The static scale is read after the norm: sharing memory with residual or output_normed (both
    written) raises naming scale, before anything is written."""
    buf = torch.randn(2 * h, device="cuda").to(BF16)
    x, w = torch.randn(2, h, device="cuda").to(BF16), torch.ones(h, dtype=BF16, device="cuda")
    scale = buf[:2].view(torch.float32)
    before = buf.clone()
    with pytest.raises(RuntimeError, match=f"scale overlaps {written}"):
        if written == "residual":
            fused_add_rmsnorm_quant(x, buf.view(2, h), w, EPS, scale=scale)
        else:
            rmsnorm_quant(x, w, EPS, scale=scale, output_normed=buf.view(2, h))
    torch.cuda.synchronize()
    assert_bits_equal(buf, before)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("group_size", [128, None])
def test_zero_hidden_size(op, group_size):
    """[4, 0] rows: 4 tokens of no values; the scales are [4, 0] per group, [4, 1] per token, given or
    allocated; nothing is launched."""
    x, r = torch.empty(4, 0, dtype=BF16, device="cuda"), torch.empty(4, 0, dtype=BF16, device="cuda")
    w = torch.empty(0, dtype=BF16, device="cuda")
    r = r if op == "fused_add_rmsnorm_quant" else None
    cols = 0 if group_size else 1
    q, s = call(op, x, r, w, group_size=group_size)
    assert q.shape == (4, 0) and s.shape == (4, cols)
    given = torch.empty(4, cols, device="cuda")
    assert call(op, x, r, w, group_size=group_size, output_s=given)[1] is given
    if group_size is None:
        call(op, x, r, w, group_size=None, output_s=torch.empty(4, device="cuda"))


@requires_cuda
@pytest.mark.parametrize("op", OPS)
def test_stride_zero_on_size_one_dims(op):
    """A stride 0 on a dim of size 1 is a valid layout."""
    x, r, w = make_inputs(op, 1, 512, BF16, seed=9)
    rq, rs, _ = expected(op, x.clone(), None if r is None else r.clone(), w, None)
    q = torch.empty(512, dtype=FP8, device="cuda").as_strided((1, 512), (0, 1))
    s = torch.empty(1, device="cuda").as_strided((1, 1), (0, 0))
    assert q.stride() == (0, 1) and s.stride() == (0, 0)
    call(op, x, r, w, group_size=None, output_q=q, output_s=s)
    assert_bits_equal(q, rq)
    assert_bits_equal(s.new_empty(1, 1).copy_(s), rs.view(1, 1))


@requires_cuda
def test_normed_in_place_over_input():
    """output_normed=input gives fused_add_rmsnorm's in-place result as well."""
    x, r, w = make_inputs("fused_add_rmsnorm_quant", 17, 4096, BF16, seed=7)
    rq, rs, ry = expected("fused_add_rmsnorm_quant", x, r, w, 128)
    q, s, y = fused_add_rmsnorm_quant(x, r, w, EPS, output_normed=x)
    assert y is x
    assert_bits_equal(x, ry)
    assert_bits_equal(q, rq)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
def test_three_dim_input(op):
    x, r, w = make_inputs(op, 12, 512, BF16, seed=8)
    rq, rs, _ = expected(op, x, r, w, 128)
    x3 = x.view(3, 4, 512)
    r3 = None if r is None else r.view(3, 4, 512)
    q, s = call(op, x3, r3, w, group_size=128)
    assert q.shape == (3, 4, 512) and s.shape == (12, 4)
    assert_bits_equal(q.view(12, 512), rq)
    assert_bits_equal(s, rs)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
def test_empty_input(op):
    x, r, w = make_inputs(op, 0, 256, BF16)
    q, s = call(op, x, r, w)
    assert q.shape == (0, 256) and s.shape == (0, 2)


# ---------------------------------------------------------------------------------------------
# CUDA graphs, torch.compile, other GPUs
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("op", OPS)
def test_cuda_graph_capture_and_replay(op):
    n, h = 64, 4096
    x, r, w = make_inputs(op, n, h, BF16, seed=9)
    r0 = None if r is None else r.clone()
    q = torch.empty(n, h, dtype=FP8, device="cuda")
    s = torch.empty(n, h // 128, device="cuda")
    call(op, x, r, w, output_q=q, output_s=s)  # compile and warm up outside the capture
    if r is not None:
        r.copy_(r0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(op, x, r, w, output_q=q, output_s=s)
    if r is not None:
        r.copy_(r0)
    q.view(torch.uint8).zero_()
    graph.replay()
    torch.cuda.synchronize()
    rq, rs, _ = expected(op, x, r0, w, 128)
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)


@requires_cuda
@pytest.mark.parametrize("op", OPS)
def test_torch_compile_fullgraph(op):
    n, h = 16, 2048
    x, r, w = make_inputs(op, n, h, BF16, seed=10)
    r0 = None if r is None else r.clone()
    rq, rs, ry = expected(op, x, r, w, 128)

    @torch.compile(fullgraph=True)
    def fn(x, r, w):
        q, s, y = call(op, x, r, w, group_size=128, return_normed=True)
        return q.view(torch.uint8).int().sum() * 0 + s.sum() * 0 + y.float(), q, s

    _, q, s = fn(x, r, w)
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)
    if r is not None:
        assert_bits_equal(r, (x.float() + r0.float()).to(BF16))


@requires_two_gpus
@pytest.mark.parametrize("op", OPS)
def test_second_gpu(op):
    with torch.cuda.device(1):
        x, r, w = make_inputs(op, 33, 4096, BF16, seed=11)
    x, w = x.to("cuda:1"), w.to("cuda:1")
    r = None if r is None else r.to("cuda:1")
    rq, rs, _ = expected(op, x, r, w, 128)
    q, s = call(op, x, r, w)
    assert q.device == torch.device("cuda:1")
    assert_bits_equal(q, rq)
    assert_bits_equal(s, rs)


# ---------------------------------------------------------------------------------------------
# Argument errors: raised before any launch, naming the argument, nothing changed. CPU tensors:
# the dtype, shape, layout and aliasing checks run before the device check, so these need no GPU.
# ---------------------------------------------------------------------------------------------
def cpu_args(op: str, n: int = 4, h: int = 256, **overrides) -> tuple[tuple, dict]:
    x = torch.randn(n, h).to(BF16)
    r = torch.randn(n, h).to(BF16)
    w = torch.randn(h).to(BF16)
    x, r, w = overrides.pop("x", x), overrides.pop("r", r), overrides.pop("w", w)
    args = (x, w) if op == "rmsnorm_quant" else (x, r, w)
    return args, overrides


def bad_cases(op: str) -> list[tuple[str, type, str, tuple, dict]]:
    x = torch.randn(4, 256).to(BF16)
    flat = torch.randn(5 * 256).to(BF16)
    cases = [
        (
            "output_q_dtype",
            RuntimeError,
            "output_q dtype",
            *cpu_args(op, output_q=torch.empty(4, 256, dtype=INT8), out_dtype=FP8),
        ),
        ("output_s_dtype", RuntimeError, "output_s dtype", *cpu_args(op, output_s=torch.empty(4, 2, dtype=FP16))),
        ("output_s_too_small", RuntimeError, "output_s shape", *cpu_args(op, output_s=torch.empty(4, 1))),
        ("output_s_too_few_rows", RuntimeError, "output_s shape", *cpu_args(op, output_s=torch.empty(3, 2))),
        (
            "output_s_ue8m0_dtype",
            RuntimeError,
            "output_s dtype",
            *cpu_args(op, output_s=torch.empty(4, 1), scale_ue8m0=True),
        ),
        ("output_s_row_major_wanted", RuntimeError, "output_s layout", *cpu_args(op, output_s=torch.empty(2, 4).T)),
        (
            "output_s_column_major_wanted",
            RuntimeError,
            "output_s layout",
            *cpu_args(op, output_s=torch.empty(4, 2), column_major_scales=True),
        ),
        ("output_s_expanded", RuntimeError, "output_s strides", *cpu_args(op, output_s=torch.empty(1, 2).expand(4, 2))),
        (
            "token_output_s_shape",
            RuntimeError,
            "output_s shape",
            *cpu_args(op, group_size=None, output_s=torch.empty(4, 2)),
        ),
        ("hidden_not_multiple", RuntimeError, "input shape", *cpu_args(op, h=192, group_size=128)),
        ("group_size_48", ValueError, "group_size value", *cpu_args(op, group_size=48)),
        ("group_size_float", TypeError, "group_size type", *cpu_args(op, group_size=128.0)),
        ("ue8m0_int8", ValueError, "scale_ue8m0 value", *cpu_args(op, scale_ue8m0=True, out_dtype=INT8)),
        ("int8_per_token", ValueError, "out_dtype value", *cpu_args(op, group_size=None, out_dtype=INT8)),
        ("out_dtype_fp16", ValueError, "out_dtype value", *cpu_args(op, out_dtype=FP16)),
        (
            "column_major_per_token",
            ValueError,
            "column_major_scales value",
            *cpu_args(op, group_size=None, column_major_scales=True),
        ),
        (
            "output_s_with_scale",
            ValueError,
            "output_s value",
            *cpu_args(op, scale=torch.ones(1), output_s=torch.empty(4, 2)),
        ),
        ("scale_dtype", RuntimeError, "scale dtype", *cpu_args(op, scale=torch.ones(1, dtype=FP16))),
        ("scale_shape", RuntimeError, "scale shape", *cpu_args(op, scale=torch.ones(2))),
        ("eps_negative", ValueError, "eps value", *cpu_args(op, eps=-1.0)),
        ("input_fp32", RuntimeError, "input dtype", *cpu_args(op, x=torch.randn(4, 256))),
        ("input_not_tensor", TypeError, "input type", *cpu_args(op, x=[1.0])),
        (
            "input_strided_last_dim",
            RuntimeError,
            "input last-dim stride",
            *cpu_args(op, x=torch.randn(256, 4).to(BF16).T),
        ),
        ("weight_shape", RuntimeError, "weight shape", *cpu_args(op, w=torch.randn(128).to(BF16))),
        ("weight_dtype", RuntimeError, "weight dtype", *cpu_args(op, w=torch.randn(256).to(FP16))),
        (
            "output_normed_dtype",
            RuntimeError,
            "output_normed dtype",
            *cpu_args(op, output_normed=torch.empty(4, 256, dtype=FP16)),
        ),
        (
            "output_q_overlaps_input",
            RuntimeError,
            "output_q overlaps",
            *cpu_args(op, x=x, output_q=x.view(-1).view(torch.uint8)[:1024].view(4, 256).view(FP8)),
        ),
        ("input_on_cpu", RuntimeError, "input device", *cpu_args(op)),
    ]
    if op == "fused_add_rmsnorm_quant":
        cases += [
            ("residual_is_input", RuntimeError, "residual overlaps", (x, x, torch.randn(256).to(BF16)), {}),
            (
                "residual_partial_overlap",
                RuntimeError,
                "residual overlaps",
                (flat[:1024].view(4, 256), flat[256:1280].view(4, 256), torch.randn(256).to(BF16)),
                {},
            ),
            ("residual_dtype", RuntimeError, "residual dtype", *cpu_args(op, r=torch.randn(4, 256).to(FP16))),
            ("residual_shape", RuntimeError, "residual shape", *cpu_args(op, r=torch.randn(4, 128).to(BF16))),
            ("residual_none", TypeError, "residual type", *cpu_args(op, r=None)),
        ]
    return cases


ERROR_CASES = [(op, *case) for op in OPS for case in bad_cases(op)]


@pytest.mark.parametrize("op,name,exc,message,args,kwargs", ERROR_CASES, ids=[f"{c[0]}-{c[1]}" for c in ERROR_CASES])
def test_bad_input_raises_before_launch(op, name, exc, message, args, kwargs):
    fn = rmsnorm_quant if op == "rmsnorm_quant" else fused_add_rmsnorm_quant
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    before = [t.clone() for t in tensors]
    with pytest.raises(exc, match=rf"^{op}: {re.escape(message)}"):
        fn(*args, **kwargs)
    for t, b in zip(tensors, before):
        assert_bits_equal(t, b)


# Hostile inputs that were accepted silently or raised an internal error (no GPU needed).
def hostile_cases(op: str) -> list[tuple[str, type, str, tuple, dict]]:
    return [
        # -1.0 == -1 made a float group_size mean "per token"
        ("group_size_minus_one_float", TypeError, "group_size type", *cpu_args(op, group_size=-1.0)),
        # group_size was not looked at with a static scale: any object passed
        (
            "group_size_str_with_scale",
            TypeError,
            "group_size type",
            *cpu_args(op, group_size="128", scale=torch.ones(1)),
        ),
        (
            "group_size_bool_with_scale",
            TypeError,
            "group_size type",
            *cpu_args(op, group_size=True, scale=torch.ones(1)),
        ),
        # `group_size == -1` on an array / a tensor of 2 elements: numpy's / torch's ambiguous-truth error
        ("group_size_ndarray", TypeError, "group_size type", *cpu_args(op, group_size=np.array([128, 128]))),
        ("group_size_tensor", TypeError, "group_size type", *cpu_args(op, group_size=torch.tensor([128, 128]))),
        # `out_dtype not in OUT_DTYPES` on an array: numpy's ambiguous-truth ValueError, no op named
        ("out_dtype_ndarray", TypeError, "out_dtype type", *cpu_args(op, out_dtype=np.array([1, 2]))),
        ("out_dtype_str", TypeError, "out_dtype type", *cpu_args(op, out_dtype="float8_e4m3fn")),
        # output_q of a non-8-bit dtype and no out_dtype blamed out_dtype, which was not passed
        ("output_q_fp16", RuntimeError, "output_q dtype", *cpu_args(op, output_q=torch.empty(4, 256, dtype=FP16))),
        # a [1, 1] scale passed though the message (and check_static_scale) say [1] or []
        ("scale_2d", RuntimeError, "scale shape", *cpu_args(op, scale=torch.ones(1, 1))),
        # an int8 output_q per token (out_dtype not given) blamed out_dtype, which was not passed
        (
            "output_q_int8_per_token",
            RuntimeError,
            "output_q dtype: expected float8_e4m3fn (per token or with a static scale), got int8",
            *cpu_args(op, group_size=None, output_q=torch.empty(4, 256, dtype=INT8)),
        ),
        # an int past the float range passed the check and overflowed in float() at the launch
        ("eps_int_past_float_range", ValueError, "eps value", *cpu_args(op, eps=10**400)),
        ("quant_eps_int_past_float_range", ValueError, "quant_eps value", *cpu_args(op, quant_eps=10**400)),
    ]


HOSTILE_CASES = [(op, *case) for op in OPS for case in hostile_cases(op)]


@pytest.mark.parametrize(
    "op,name,exc,message,args,kwargs", HOSTILE_CASES, ids=[f"{c[0]}-{c[1]}" for c in HOSTILE_CASES]
)
def test_hostile_input_raises_before_launch(op, name, exc, message, args, kwargs):
    test_bad_input_raises_before_launch(op, name, exc, message, args, kwargs)


def test_torch_library_op_declares_its_mutations():
    schema = str(torch.ops.sglang_jit_kernel.norm_quant.default._schema)
    for arg in ("residual", "output_q", "output_s", "output_normed"):
        assert re.search(rf"Tensor\(\w+!\)\?? {arg}\b", schema), schema
    assert not re.search(r"Tensor\(\w+!\)\?? (input|weight|scale)\b", schema), schema


def test_registered_with_variants_and_check_cases():
    from sglang.jit_kernel.registry import all_ops  # noqa: PLC0415

    ops = all_ops()
    for op in OPS:
        entry = ops[op]
        assert entry.module.name == op and entry.module.ops == [op]
        assert sorted(map(str, entry.variants)) == sorted(map(str, [(d, o) for d in DTYPES for o in (FP8, INT8)]))


# ---------------------------------------------------------------------------------------------
# Every variant compiles for sm_90 without a GPU: no spills, only its own kernels
# ---------------------------------------------------------------------------------------------
_KIND = {"rmsnorm_quant": "NormKindE0", "fused_add_rmsnorm_quant": "NormKindE1"}
#: Kernels of each module: one, two and four vectors per thread, and the wide CTA builds of one and
#: two; rmsnorm_quant also the pair build (two reduction lanes a thread) of two.
KERNELS_PER_MODULE = {"rmsnorm_quant": 6, "fused_add_rmsnorm_quant": 5}


@requires_nvcc
def test_every_variant_compiles_without_spills(monkeypatch, sm90_cache_dir):
    # The session's sm_90 cache (conftest): modules test_build_all compiled are loaded, others compiled.
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(sm90_cache_dir))
    builders = {
        "rmsnorm_quant": nq._jit_rmsnorm_quant_module,
        "fused_add_rmsnorm_quant": nq._jit_fused_add_rmsnorm_quant_module,
    }
    for build in builders.values():
        build.cache_clear()
    # CI: the bfloat16 modules (test_build_all's); SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1: fp16 too
    dtypes = get_ci_test_range(DTYPES, [BF16])
    jobs = [(op, build, d, o) for op, build in builders.items() for d in dtypes for o in (FP8, INT8)]
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            modules = list(pool.map(lambda j: (j[0], j[1](j[2], j[3])), jobs))
        for op, module in modules:
            assert callable(getattr(module, op))
    finally:
        for build in builders.values():
            build.cache_clear()
    for op in OPS:
        logs = sorted(Path(sm90_cache_dir).glob(f"{op}_*/build.log"))
        assert len(logs) >= 2 * len(dtypes), f"expected {2 * len(dtypes)} {op} builds, found {[str(p) for p in logs]}"
        for log in logs:
            kernels = kernels_without_local_memory(log)
            assert len(kernels) == KERNELS_PER_MODULE[op], (log, kernels)
            for kernel in kernels:
                assert "norm_quant_kernel" in kernel and _KIND[op] in kernel, kernel


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
