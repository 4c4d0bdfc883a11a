"""per_token_group_quant: the fused gated activation + per-token-group quant against the unfused ops bit
for bit (legacy) and against an fp32 torch reference bit for bit (dense); the masked MoE layout (rows
past masked_m keep their poison); scale layouts (row-major, column-major, ue8m0); strided, offset and
N-D views; poisoned outputs inside larger buffers; empty inputs; inf / NaN; graphs, torch.compile,
other devices; the unfused path; every error (the metadata ones run without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang.jit_kernel.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from sglang.jit_kernel.per_token_group_quant import (
    ACTIVATIONS,
    dense_reference,
    max_fused_group_size,
    per_token_group_quant,
    quant_reference,
)
from sglang.jit_kernel.per_token_group_quant_8bit import per_token_group_quant_8bit
from sglang.jit_kernel.testing import FLOAT_DTYPES, requires_cuda, requires_two_gpus
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=180, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=600, suite="nightly-kernel-1-gpu", nightly=True)

FP8 = torch.float8_e4m3fn
OUT_DTYPES = (FP8, torch.int8)
BOUNDS = {FP8: (-448.0, 448.0), torch.int8: (-128.0, 127.0)}
EPS = 1e-10
UNFUSED = {"silu": silu_and_mul, "gelu": gelu_and_mul, "gelu_tanh": gelu_tanh_and_mul}
NAMES = sorted(ACTIVATIONS)

#: (num_tokens, hidden_size): decode rows (the unfused activation narrows its vectors and takes the
#: formulas), rows where it takes 16-byte vectors (the branch-free activations), awkward counts;
#: launches of one step per lane and of two (with a partial last tile: 384 = 1.5 tiles of 64 chunks
#: in fp32, 48 of 64 chunks in 16-bit types). On a 132-SM GPU the one-step rule (at most 32 tiles
#: per SM) takes 7 and 2048 rows of 384 in 16-bit types and leaves 4097 rows to two steps.
SHAPES = get_ci_test_range(
    full_range=[(1, 14336), (7, 384), (64, 14336), (129, 512), (256, 1024), (2048, 14336), (4097, 256), (4097, 384)],
    ci_range=[(1, 14336), (7, 384), (129, 512), (2048, 2048), (2048, 384), (4097, 384)],
)
GROUP_SIZES = get_ci_test_range(full_range=[16, 32, 64, 128, 256, 512], ci_range=[16, 128, 512])
LAYOUTS = ("row", "col", "ue8m0")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def column_major(rows: int, cols: int, dtype: torch.dtype = torch.float32, fill: float = -7) -> torch.Tensor:
    """``[rows, cols]`` in the transposed TMA-aligned layout: strides (1, rows rounded up to 4)."""
    padded = (rows + 3) // 4 * 4
    return torch.full((cols, padded), fill, dtype=dtype, device="cuda").T[:rows]


def scales_for(rows: int, num_groups: int, layout: str) -> torch.Tensor:
    """A poisoned output_s of ``layout`` (ue8m0: column-major int32 words)."""
    if layout == "ue8m0":
        return column_major(rows, (num_groups + 3) // 4, torch.int32)
    if layout == "col":
        return column_major(rows, num_groups, fill=float("nan"))
    return torch.full((rows, num_groups), float("nan"), device="cuda")


def unfused(x: torch.Tensor, name: str, group_size: int, out_dtype: torch.dtype, layout: str):
    """The legacy composition: the activation op, then per_token_group_quant_8bit (same layout)."""
    h = UNFUSED[name](x)
    rows, hidden = h.numel() // h.shape[-1], h.shape[-1]
    h = h.reshape(rows, hidden)
    q = torch.empty(rows, hidden, dtype=out_dtype, device="cuda")
    s = scales_for(rows, hidden // group_size, layout)
    per_token_group_quant_8bit(h, q, s, group_size, EPS, *BOUNDS[out_dtype], scale_ue8m0=layout == "ue8m0")
    return q, s


def assert_same(q, s, q_ref, s_ref) -> None:
    """Equal bytes of output_q and equal scales (words for ue8m0, fp32 bits otherwise)."""
    assert torch.equal(q.reshape(q_ref.shape).view(torch.uint8), q_ref.view(torch.uint8))
    s, s_ref = s.reshape(s_ref.shape), s_ref
    if s.dtype == torch.float32:
        assert torch.equal(s.view(torch.int32), s_ref.view(torch.int32))
    else:
        assert torch.equal(s, s_ref)


def decode_ue8m0(packed: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 [M, ceil(G / 4)] of exponent bytes -> fp32 scales [M, G]."""
    rows = torch.empty(packed.shape, dtype=packed.dtype, device=packed.device).copy_(packed)
    exponents = rows.view(torch.uint8).view(packed.shape[0], -1)[:, :num_groups]
    return torch.pow(2.0, exponents.double() - 127).float()


def gate_up(m: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """Gate and up rows with magnitudes spread over six decades (tiny groups to large ones)."""
    scale = torch.logspace(-3, 3, m, device="cuda").unsqueeze(1)
    return (torch.randn(m, 2 * hidden, device="cuda") * scale).to(dtype)


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_legacy_is_bit_identical_to_unfused(name, in_dtype, out_dtype, shape, layout):
    m, hidden = shape
    if layout == "ue8m0" and out_dtype == torch.int8:
        pytest.skip("ue8m0 is for fp8")
    x = gate_up(m, hidden, in_dtype)
    before = x.clone()
    q_ref, s_ref = unfused(x, name, 128, out_dtype, layout)
    q = torch.empty(m, hidden, dtype=out_dtype, device="cuda")
    s = scales_for(m, hidden // 128, layout)
    result = per_token_group_quant(x, q, s, 128, scale_ue8m0=layout == "ue8m0", fuse_silu_and_mul=True, activation=name)
    assert result[0] is q and result[1] is s
    assert torch.equal(x, before), "the op modified its input"
    assert_same(q, s, q_ref, s_ref)


@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("m", [1, 7, 300])
def test_group_sizes_legacy_and_dense(in_dtype, group_size, m):
    """Every group size the fused path takes (one lane's chunk up to both steps of a warp)."""
    if group_size > max_fused_group_size(in_dtype):
        pytest.skip("group_size exceeds the fused path's maximum for the dtype")
    hidden = 3 * max(group_size, 128)
    x = gate_up(m, hidden, in_dtype)
    q_ref, s_ref = unfused(x, "silu", group_size, FP8, "row")
    q, s = per_token_group_quant(x, group_size=group_size, fuse_silu_and_mul=True)
    assert_same(q, s, q_ref, s_ref)
    q, s = per_token_group_quant(x, group_size=group_size, fuse_silu_and_mul=True, silu_and_mul_mode="dense")
    assert_same(q, s, *quant_reference(dense_reference("silu", x), group_size, FP8))


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_dense_is_bit_exact_to_fp32_reference(name, in_dtype, out_dtype, shape):
    """Dense: h = round_T(act(g) * u) with act by the formulas (torch fp32 operations as the kernel
    rounds them), then the quantization's fp32 emulation: the same bytes."""
    m, hidden = shape
    x = gate_up(m, hidden, in_dtype)
    q, s = per_token_group_quant(
        x, out_dtype=out_dtype, fuse_silu_and_mul=True, activation=name, silu_and_mul_mode="dense"
    )
    assert_same(q, s, *quant_reference(dense_reference(name, x), 128, out_dtype))


@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_unfused_path_is_per_token_group_quant_8bit(in_dtype, layout):
    x = torch.randn(33, 1024, dtype=in_dtype, device="cuda")
    ue8m0 = layout == "ue8m0"
    q_ref = torch.empty(33, 1024, dtype=FP8, device="cuda")
    s_ref = scales_for(33, 8, layout)
    per_token_group_quant_8bit(x, q_ref, s_ref, 128, EPS, -448.0, 448.0, scale_ue8m0=ue8m0)
    q, s = per_token_group_quant(x, scale_ue8m0=ue8m0, column_major_scales=layout != "row")
    assert_same(q, s, q_ref, s_ref)
    if layout != "row":
        assert s.stride() == (1, 36)


# ---------------------------------------------------------------------------------------------
# Layouts: allocation, scale layouts, views, poison
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("column_major", [False, True])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_allocated_outputs(column_major, ue8m0):
    m, hidden = 37, 7 * 128
    x = gate_up(m, hidden, torch.bfloat16)
    q, s = per_token_group_quant(x, fuse_silu_and_mul=True, scale_ue8m0=ue8m0, column_major_scales=column_major)
    assert q.shape == (m, hidden) and q.dtype == FP8 and q.is_contiguous()
    cols = 2 if ue8m0 else 7
    assert s.shape == (m, cols) and s.dtype == (torch.int32 if ue8m0 else torch.float32)
    assert s.stride() == ((1, 40) if column_major else (cols, 1))
    q_ref, s_ref = unfused(x, "silu", 128, FP8, "ue8m0" if ue8m0 else "row")
    assert_same(q, s, q_ref, s_ref)
    if ue8m0:
        assert (decode_ue8m0(s, 7) > 0).all()
    q8, _ = per_token_group_quant(x, fuse_silu_and_mul=True, out_dtype=torch.int8)
    assert q8.dtype == torch.int8


@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_offset,q_offset", [(0, 0), (1, 0), (0, 3), (8, 8)])
def test_strided_and_offset_views_with_poisoned_outputs(in_dtype, x_offset, q_offset):
    """Row slices of wider buffers at (un)aligned offsets, read as laid out; outputs inside poisoned
    buffers: nothing outside the views is written."""
    m, hidden, g = 67, 512, 64
    wide = gate_up(m, hidden + 24, in_dtype)
    x = wide[:, x_offset : x_offset + 2 * hidden]
    q_buffer = torch.full((m, hidden + 24), 0x7F, dtype=torch.uint8, device="cuda")
    q = q_buffer[:, q_offset : q_offset + hidden].view(FP8)
    s_buffer = torch.full((m, hidden // g + 5), float("nan"), device="cuda")
    s = s_buffer[:, 2 : 2 + hidden // g]
    per_token_group_quant(x, q, s, g, fuse_silu_and_mul=True)
    assert_same(q, s, *unfused(x, "silu", g, FP8, "row"))
    outside = torch.ones_like(q_buffer, dtype=torch.bool)
    outside[:, q_offset : q_offset + hidden] = False
    assert (q_buffer[outside] == 0x7F).all(), "wrote outside output_q"
    assert torch.isnan(s_buffer[:, :2]).all() and torch.isnan(s_buffer[:, 2 + hidden // g :]).all()


@requires_cuda
def test_nd_and_transposed_inputs():
    x3 = gate_up(15, 256, torch.bfloat16).view(3, 5, 512)
    q, s = per_token_group_quant(x3, fuse_silu_and_mul=True)
    assert q.shape == (3, 5, 256) and s.shape == (3, 5, 2)
    assert_same(q.view(15, 256), s.reshape(15, 2), *unfused(x3.view(15, 512), "silu", 128, FP8, "row"))
    s2 = torch.empty(15, 2, device="cuda")  # [num_tokens, num_groups] for an N-D input
    per_token_group_quant(x3, None, s2, fuse_silu_and_mul=True)
    assert torch.equal(s2, s.view(15, 2))
    x_t = gate_up(512, 16, torch.bfloat16).T  # [32, 512] with a strided last dim: copied first
    q, s = per_token_group_quant(x_t, fuse_silu_and_mul=True)
    assert_same(q, s, *per_token_group_quant(x_t.contiguous(), fuse_silu_and_mul=True))


@requires_cuda
@pytest.mark.parametrize("shape", [(0, 512), (0, 3, 512)])
@pytest.mark.parametrize("fuse", [False, True])
def test_empty_inputs(shape, fuse):
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    q, s = per_token_group_quant(x, fuse_silu_and_mul=fuse)
    hidden = 256 if fuse else 512
    assert q.shape == (*shape[:-1], hidden) and s.shape == (*shape[:-1], hidden // 128)


# ---------------------------------------------------------------------------------------------
# Masked MoE layout
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("expected_m", [None, 1, 8, 64, 240])
@pytest.mark.parametrize("mode", ["legacy", "dense"])
@pytest.mark.parametrize("t_pad", [37, 256])
def test_masked_layout(in_dtype, layout, expected_m, mode, t_pad):
    """Rows t < masked_m[e] equal the unfused composition over all E * T_pad rows (legacy) or the fp32
    reference (dense); the other rows of output_q / output_s keep their poison; masked_m entries
    outside [0, T_pad] are clamped; expected_m changes nothing but the grid. On a 132-SM GPU T_pad 37
    launches one step per lane; 256 two, one with expected_m <= 64, and two over 240 rows with CTAs
    looping over the other 16 with expected_m 240."""
    e, hidden = 5, 7 * 128
    ue8m0 = layout == "ue8m0"
    cols = 2 if ue8m0 else 7
    x = gate_up(e * t_pad, hidden, in_dtype).view(e, t_pad, 2 * hidden)
    masked_m = torch.tensor([0, 1, 20, 37, 1000], dtype=torch.int32, device="cuda")
    valid = [0, 1, 20, 37, t_pad]
    q = torch.full((e, t_pad, hidden), 0x7F, dtype=torch.uint8, device="cuda").view(FP8)
    s_dtype = torch.int32 if ue8m0 else torch.float32
    if layout == "row":
        s = torch.full((e, t_pad, cols), -7, dtype=s_dtype, device="cuda")
    else:  # per expert column-major, T_pad padded by 3
        s = torch.full((e, cols, t_pad + 3), -7, dtype=s_dtype, device="cuda").transpose(1, 2)[:, :t_pad]
    per_token_group_quant(x, q, s, 128, ue8m0, True, masked_m, expected_m, activation="silu", silu_and_mul_mode=mode)
    if mode == "legacy":
        q_ref, s_ref = unfused(x, "silu", 128, FP8, "ue8m0" if ue8m0 else "row")
    else:
        h = dense_reference("silu", x.view(e * t_pad, 2 * hidden))
        q_ref, s_ref = quant_reference(h, 128, FP8, ue8m0=ue8m0)
        if ue8m0:  # compare packed words: pack the reference's exponents as the kernel does
            exps = (s_ref.view(torch.int32) >> 23).to(torch.uint8)
            padded = torch.zeros(e * t_pad, 8, dtype=torch.uint8, device="cuda")
            padded[:, :7] = exps
            s_ref = padded.view(torch.int32)
    q_ref, s_ref = q_ref.view(e, t_pad, hidden), s_ref.view(e, t_pad, cols)
    for i, rows in enumerate(valid):
        assert torch.equal(q[i, :rows].view(torch.uint8), q_ref[i, :rows].view(torch.uint8)), f"expert {i}"
        assert torch.equal(s[i, :rows], s_ref[i, :rows]), f"expert {i}"
        assert (q[i, rows:].view(torch.uint8) == 0x7F).all(), f"expert {i}: wrote a masked row of output_q"
        assert (s[i, rows:] == -7).all(), f"expert {i}: wrote a masked row of output_s"


@requires_cuda
def test_masked_allocated_column_major():
    e, t_pad, hidden = 3, 9, 256
    x = gate_up(e * t_pad, hidden, torch.bfloat16).view(e, t_pad, 2 * hidden)
    masked_m = torch.tensor([9, 4, 0], dtype=torch.int32, device="cuda")
    q, s = per_token_group_quant(x, None, None, 128, False, True, masked_m, 4, column_major_scales=True)
    assert q.shape == (e, t_pad, hidden) and s.shape == (e, t_pad, 2)
    assert s.stride() == (2 * 12, 1, 12)
    q_ref, s_ref = unfused(x, "silu", 128, FP8, "row")
    q_ref, s_ref = q_ref.view(e, t_pad, hidden), s_ref.view(e, t_pad, 2)
    for i, rows in enumerate([9, 4, 0]):
        assert torch.equal(q[i, :rows].view(torch.uint8), q_ref[i, :rows].view(torch.uint8)), f"expert {i}"
        assert torch.equal(s[i, :rows], s_ref[i, :rows]), f"expert {i}"


# ---------------------------------------------------------------------------------------------
# Special values
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("mode", ["legacy", "dense"])
def test_zero_huge_inf_and_nan(in_dtype, out_dtype, mode):
    """Finite inputs never give a NaN scale (all-zero groups: eps / q_type_max; a product that
    overflows T: inf in h, scale FLT_MAX); inf / NaN inputs follow the quant rules; the legacy bytes
    stay the unfused composition's."""
    m, hidden = 6, 512
    x = gate_up(m, hidden, in_dtype)
    x[0] = 0.0  # all-zero groups
    big = torch.finfo(in_dtype).max
    x[1, :128], x[1, hidden : hidden + 128] = 100.0, big  # silu(100) * max overflows fp16 / bf16
    x[2, 5] = float("inf")  # gate inf: silu(inf) * u = +-inf
    x[3, hidden + 7] = float("nan")  # up NaN: h NaN, ignored by the maximum
    x[4, 9] = -float("inf")  # gate -inf: silu(-inf) = NaN
    q, s = per_token_group_quant(x, out_dtype=out_dtype, fuse_silu_and_mul=True, silu_and_mul_mode=mode)
    assert not torch.isnan(s).any(), "a NaN scale"
    assert torch.isfinite(s[[0, 5]]).all()
    if mode == "legacy":
        assert_same(q, s, *unfused(x, "silu", 128, out_dtype, "row"))
    else:
        assert_same(q, s, *quant_reference(dense_reference("silu", x), 128, out_dtype))
    type_max = 448.0 if out_dtype == FP8 else 127.0
    # a tensor divisor: torch divides by a Python scalar as a product with its reciprocal
    assert torch.equal(s[0], torch.full_like(s[0], EPS) / torch.full_like(s[0], type_max))


# ---------------------------------------------------------------------------------------------
# Graphs, compile, devices
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("masked", [False, True])
def test_cuda_graph_replay(masked):
    x = gate_up(4 * 16, 1024, torch.bfloat16)
    masked_m = torch.tensor([16, 3, 0, 9], dtype=torch.int32, device="cuda") if masked else None
    if masked:
        x = x.view(4, 16, 2048)
    q, s = per_token_group_quant(x, None, None, 128, False, True, masked_m, 4 if masked else None)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        per_token_group_quant(x, q, s, 128, False, True, masked_m, 4 if masked else None)
    x.copy_(gate_up(4 * 16, 1024, torch.bfloat16).view(x.shape))
    q_ref, s_ref = unfused(x, "silu", 128, FP8, "row")
    graph.replay()
    torch.cuda.synchronize()
    if masked:
        for i, rows in enumerate([16, 3, 0, 9]):
            assert torch.equal(q[i, :rows].view(torch.uint8), q_ref.view(4, 16, -1)[i, :rows].view(torch.uint8))
            assert torch.equal(s[i, :rows], s_ref.view(4, 16, -1)[i, :rows]), f"expert {i}"
    else:
        assert_same(q, s, q_ref, s_ref)


@requires_cuda
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("fuse", [False, True])
def test_torch_compile_fullgraph(ue8m0, fuse):
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return per_token_group_quant(
            x * 2, scale_ue8m0=ue8m0, fuse_silu_and_mul=fuse, column_major_scales=True, activation="silu"
        )

    x = gate_up(33, 512, torch.bfloat16)
    q, s = torch.compile(f, fullgraph=True)(x)
    q_ref, s_ref = f(x)
    assert_same(q, s, q_ref, s_ref)


@requires_two_gpus
def test_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    x = gate_up(129, 512, torch.bfloat16).to("cuda:1")
    q, s = per_token_group_quant(x, fuse_silu_and_mul=True)
    assert q.device == x.device and s.device == x.device
    h = silu_and_mul(x)
    q_ref = torch.empty_like(q)
    s_ref = torch.empty_like(s)
    per_token_group_quant_8bit(h, q_ref, s_ref, 128, EPS, -448.0, 448.0)
    assert_same(q, s, q_ref, s_ref)


# ---------------------------------------------------------------------------------------------
# Errors: raised before any launch, nothing written. Metadata is checked before devices, so these
# run on CPU tensors without a GPU.
# ---------------------------------------------------------------------------------------------
OP = r"^per_token_group_quant: "


def cpu_args(m: int = 4, hidden: int = 512, dtype: torch.dtype = torch.bfloat16):
    x = torch.randn(m, 2 * hidden, dtype=dtype)
    q = torch.zeros(m, hidden, dtype=FP8)
    s = torch.full((m, hidden // 128), -1.0)
    return x, q, s


def assert_untouched(q: torch.Tensor, s: torch.Tensor) -> None:
    assert (q.view(torch.uint8) == 0).all() and (s == -1).all(), "an output was written before the error"


@pytest.mark.parametrize(
    "change,error,pattern",
    [
        (dict(group_size=96), ValueError, r"group_size value: expected a power of two, got 96"),
        (dict(group_size=1024), ValueError, r"group_size value: expected >= 16 and <= 512, got 1024"),
        (dict(group_size=128.0), TypeError, r"group_size type: expected an int, got float"),
        (dict(scale_ue8m0=1), TypeError, r"scale_ue8m0 type: expected a bool, got int"),
        (dict(eps=-1.0), ValueError, r"eps value: expected >= 0.0, got -1.0"),
        (dict(eps=10**400), ValueError, r"eps value: expected a real number in the float range"),
        (dict(expected_m=-1), ValueError, r"expected_m value: expected >= 0, got -1"),
        (dict(activation="relu"), ValueError, r"activation value: expected one of 'silu', 'gelu', 'gelu_tanh'"),
        (dict(silu_and_mul_mode="fast"), ValueError, r"silu_and_mul_mode value: expected one of 'legacy', 'dense'"),
        (dict(out_dtype=torch.uint8), ValueError, r"out_dtype value: expected float8_e4m3fn or int8"),
        (dict(fuse_silu_and_mul=False, activation="gelu"), ValueError, r"activation value: expected 'silu' without"),
    ],
)
def test_bad_scalars(change, error, pattern):
    x, q, s = cpu_args()
    kwargs = dict(group_size=128, fuse_silu_and_mul=True)
    kwargs.update(change)
    with pytest.raises(error, match=OP + pattern):
        per_token_group_quant(x, q, s, **kwargs)
    assert_untouched(q, s)


@pytest.mark.parametrize(
    "out_dtype",
    [np.array([1, 2]), "float8_e4m3fn", torch.tensor(1), 8],
    ids=["ndarray", "str", "tensor", "int"],
)
def test_out_dtype_not_a_dtype(out_dtype):
    """A non-dtype out_dtype is a TypeError naming out_dtype (an array raised numpy's own ValueError)."""
    x, q, s = cpu_args()
    with pytest.raises(TypeError, match=OP + r"out_dtype type: expected a torch.dtype or None, got "):
        per_token_group_quant(x, q, s, group_size=128, fuse_silu_and_mul=True, out_dtype=out_dtype)
    assert_untouched(q, s)


def test_int8_out_dtype_with_ue8m0_names_out_dtype():
    """out_dtype=int8 with scale_ue8m0 and no output_q blamed output_q, which was not passed."""
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with pytest.raises(
        ValueError,
        match=OP + r"out_dtype value: expected float8_e4m3fn with scale_ue8m0 \(ue8m0 is for fp8\), got int8$",
    ):
        per_token_group_quant(x, scale_ue8m0=True, out_dtype=torch.int8)


def test_bad_tensors():
    x, q, s = cpu_args()
    cases = [
        (dict(output_q=q.view(torch.uint8)), r"output_q dtype: expected one of float8_e4m3fn, int8, got uint8"),
        (dict(input=x.double()), r"input dtype: expected one of float16, bfloat16, float32, got float64"),
        (dict(output_s=s.double()), r"output_s dtype: expected float32, got float64"),
        (dict(output_s=s[:, :3]), r"output_s shape: expected \[dim0=4, num_groups=4\], got \(4, 3\)"),
        (dict(output_s=s[:3]), r"output_s shape: expected \[dim0=4, num_groups=4\], got \(3, 4\)"),
        (dict(output_q=q[:, :256]), r"output_q shape: expected \(4, 512\) \(the shape of input with the last dim"),
        (dict(input=x[:, :1000]), r"input shape: expected hidden_size \(half the last dim\) a multiple of group_size"),
        (dict(input=x[:, :1023]), r"input last dim: expected even \(2 \* hidden_size\), got 1023"),
        (dict(output_q=q.T.contiguous().T), r"output_q last-dim stride: expected 1"),
        (dict(output_s=torch.empty(1, 1).expand(4, 4)), r"output_s strides: expected no dim of size > 1 with stride 0"),
        (dict(output_s=torch.empty(4, 8)[:, ::2].as_strided((4, 4), (1, 1))), r"output_s strides: expected elements"),
        (dict(output_q=q.view(torch.int8), out_dtype=FP8), r"output_q dtype: expected float8_e4m3fn, got int8"),
        (dict(), r"input device: expected a CUDA device, got cpu$"),
    ]
    # Leading dims that do not flatten to rows (3-D input, each output's dims 0 and 1 swapped in memory).
    x3, q3 = x.view(2, 2, -1), torch.empty(2, 2, 512, dtype=FP8)
    s3 = torch.empty(2, 2, 4)
    unflat = "layout: expected leading dims that flatten to one stride"
    cases += [
        (dict(input=x3, output_q=q3.transpose(0, 1).contiguous().transpose(0, 1), output_s=s3), "output_q " + unflat),
        (dict(input=x3, output_q=q3, output_s=s3.transpose(0, 1).contiguous().transpose(0, 1)), "output_s " + unflat),
    ]
    for change, pattern in cases:
        kwargs = dict(input=x, output_q=q, output_s=s, group_size=128, fuse_silu_and_mul=True)
        kwargs.update(change)
        with pytest.raises(RuntimeError, match=OP + pattern):
            per_token_group_quant(**kwargs)
        assert_untouched(q, s)
    with pytest.raises(RuntimeError, match=OP + r"output_s dtype: expected int32, got float32"):
        per_token_group_quant(x, q, s, 128, True, True)
    with pytest.raises(RuntimeError, match=OP + r"output_q dtype: expected float8_e4m3fn \(scale_ue8m0 is for fp8\)"):
        per_token_group_quant(x, q.view(torch.int8), s.int()[:, :1], 128, True, True)
    with pytest.raises(TypeError, match=OP + r"input type: expected a torch.Tensor, got list"):
        per_token_group_quant([1.0], q, s)
    assert_untouched(q, s)


def test_bad_masked_m():
    e, t_pad, hidden = 3, 5, 256
    x = torch.randn(e, t_pad, 2 * hidden, dtype=torch.bfloat16)
    q = torch.zeros(e, t_pad, hidden, dtype=FP8)
    s = torch.full((e, t_pad, 2), -1.0)
    good = torch.full((e,), 2, dtype=torch.int32)
    cases = [
        (dict(masked_m=good.long()), RuntimeError, r"masked_m dtype: expected int32, got int64"),
        (dict(masked_m=good[:2]), RuntimeError, r"masked_m shape: expected \[num_experts=3\], got \(2,\)"),
        (dict(masked_m=good.view(3, 1)), RuntimeError, r"masked_m shape: expected \[num_experts=3\], got \(3, 1\)"),
        (dict(masked_m=torch.zeros(6, dtype=torch.int32)[::2]), RuntimeError, r"masked_m layout: expected contiguous"),
        (dict(masked_m=[2, 2, 2]), TypeError, r"masked_m type: expected a torch.Tensor, got list"),
        (dict(input=x.view(e * t_pad, -1)), RuntimeError, r"input dims: expected 3 with masked_m"),
        (dict(fuse_silu_and_mul=False), ValueError, r"masked_m value: expected None without fuse_silu_and_mul=True"),
        (dict(output_s=s[:, :4]), RuntimeError, r"output_s shape: expected \[num_experts=3, T_pad=5, num_groups=2\]"),
        (dict(), RuntimeError, r"input device: expected a CUDA device, got cpu$"),
    ]
    for change, error, pattern in cases:
        kwargs = dict(input=x, output_q=q, output_s=s, fuse_silu_and_mul=True, masked_m=good)
        kwargs.update(change)
        with pytest.raises(error, match=OP + pattern):
            per_token_group_quant(**kwargs)
        assert (q.view(torch.uint8) == 0).all() and (s == -1).all()


@requires_cuda
def test_bad_devices_and_overlaps():
    x = torch.randn(4, 1024, dtype=torch.bfloat16, device="cuda")
    q = torch.zeros(4, 512, dtype=FP8, device="cuda")
    s = torch.full((4, 4), -1.0, device="cuda")
    cases = [
        (dict(output_s=s.cpu()), r"output_s device: expected cuda:0 \(the device of input\), got cpu"),
        (dict(output_q=q.cpu()), r"output_q device: expected cuda:0 \(the device of input\), got cpu"),
        (dict(output_s=x.view(torch.float32)[:, :4]), r"output_s overlaps input: expected disjoint memory"),
    ]
    for change, pattern in cases:
        kwargs = dict(input=x, output_q=q, output_s=s, fuse_silu_and_mul=True)
        kwargs.update(change)
        with pytest.raises(RuntimeError, match=OP + pattern):
            per_token_group_quant(**kwargs)
    assert (q.view(torch.uint8) == 0).all() and (s == -1).all()


@requires_cuda
@pytest.mark.parametrize("fuse", [False, True])
def test_packed_q_and_scales_in_one_buffer(fuse):
    """output_q and output_s in the rows of one buffer, sharing no byte, are taken (the launcher's exact
    test); the same buffer with output_s moved 4 bytes into output_q raises and writes nothing."""
    n, h, g = 4, 256, 128
    x = torch.randn(n, 2 * h if fuse else h, dtype=torch.bfloat16, device="cuda")
    pack = torch.zeros(n, h + 4 * (h // g), dtype=torch.uint8, device="cuda")
    q, s = per_token_group_quant(x, pack[:, :h].view(FP8), pack[:, h:].view(torch.float32), g, fuse_silu_and_mul=fuse)
    rq, rs = torch.empty(n, h, dtype=FP8, device="cuda"), torch.empty(n, h // g, device="cuda")
    per_token_group_quant_8bit(silu_and_mul(x) if fuse else x, rq, rs, g, EPS, -448.0, 448.0)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    pack.zero_()
    with pytest.raises(RuntimeError, match=r"^per_token_group_quant(_8bit)?: output_s overlaps output_q"):
        per_token_group_quant(
            x, pack[:, :h].view(FP8), pack[:, h - 4 : h + 4].view(torch.float32), g, fuse_silu_and_mul=fuse
        )
    torch.cuda.synchronize()
    assert (pack == 0).all()


@requires_cuda
def test_launcher_rejects_mismatch_from_cpp():
    """The C++ TensorMatcher is the second line: the module called directly raises RuntimeError naming
    the tensor, never a CUDA fault."""
    from sglang.jit_kernel.per_token_group_quant import _jit_module

    fn = _jit_module(torch.bfloat16, FP8, "silu").per_token_group_quant
    x = torch.randn(1, 4, 1024, dtype=torch.bfloat16, device="cuda")
    q = torch.zeros(1, 4, 512, dtype=FP8, device="cuda")
    s = torch.full((1, 4, 4), -1.0, device="cuda")
    with pytest.raises(RuntimeError, match="output_q"):
        fn(x, q.view(torch.uint8), s, None, 128, EPS, False, False, 0)
    with pytest.raises(RuntimeError, match="group_size"):
        fn(x, q, s, None, 96, EPS, False, False, 0)
    with pytest.raises(RuntimeError, match="output_s"):
        fn(x, q, s[:, :, :3], None, 128, EPS, False, False, 0)
    with pytest.raises(RuntimeError, match="masked_m"):
        fn(x, q, s, torch.zeros(2, dtype=torch.int32, device="cuda"), 128, EPS, False, False, 0)
    with pytest.raises(RuntimeError, match="launch_rows"):
        fn(x, q, s, None, 128, EPS, False, False, 5)
    assert (s == -1).all()


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
