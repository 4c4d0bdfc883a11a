"""fused_qk_norm_rope against an fp32 reference and against the unfused ops (qknorm, then RoPE),
with and without YaRN, both styles, partial rotary_dim, views, graphs, compile, errors."""

import sys

import pytest
import torch

from sglang.jit_kernel.fused_qknorm_rope import (
    can_use_fused_qk_norm_rope,
    fused_qk_norm_rope,
    fused_qk_norm_rope_reference,
)
from sglang.jit_kernel.testing import TOLERANCE, requires_cuda
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=120, suite="nightly-kernel-1-gpu", nightly=True)

MAX_POS = 4096
DTYPES = get_ci_test_range(
    full_range=[torch.float16, torch.bfloat16, torch.float32], ci_range=[torch.bfloat16, torch.float32]
)
TOKENS = get_ci_test_range(full_range=[1, 7, 129, 8192], ci_range=[1, 129])
HEADS = get_ci_test_range(
    full_range=[(32, 8, 8), (64, 1, 1), (8, 8, 8), (16, 0, 0)], ci_range=[(32, 8, 8), (64, 1, 1), (16, 0, 0)]
)
DIMS = get_ci_test_range(
    full_range=[(64, None), (128, None), (128, 64), (256, None), (256, 96), (512, None)],
    ci_range=[(128, None), (128, 64), (256, None)],
)
# (factor, low, high, attention_factor): plain RoPE, YaRN, YaRN with high == low (nudged)
YARN = get_ci_test_range(
    full_range=[(1.0, 0.0, 0.0, 1.0), (4.0, 8.0, 40.0, 1.2), (8.0, 10.0, 10.0, 0.9)],
    ci_range=[(1.0, 0.0, 0.0, 1.0), (4.0, 8.0, 40.0, 1.2)],
)


def assert_rope_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Per-dtype tolerance plus the angle error: the YaRN blend may contract into an FMA in the kernel
    (one fp32 ulp of a frequency <= 1), so angles may differ by pos * 2^-23 rad and an element
    of magnitude |y| <= 16 (normalised, times a randn weight) by 16 * MAX_POS * 2^-23 (0.0078)."""
    rtol, atol = TOLERANCE[actual.dtype]
    torch.testing.assert_close(
        actual.float(), expected.float(), rtol=max(rtol, 2e-3), atol=atol + 16 * MAX_POS * 2.0**-23
    )


def make(n, hq, hk, hv, d, dtype, pos_dtype=torch.int64):
    qkv = torch.randn(n, (hq + hk + hv) * d, dtype=dtype, device="cuda")
    qw = torch.randn(d, dtype=dtype, device="cuda")
    kw = torch.randn(d, dtype=dtype, device="cuda")
    positions = torch.randint(0, MAX_POS, (n,), device="cuda", dtype=pos_dtype)
    return qkv, qw, kw, positions


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("d,rotary_dim", DIMS)
@pytest.mark.parametrize("hq,hk,hv", HEADS)
@pytest.mark.parametrize("n", TOKENS)
@pytest.mark.parametrize("yarn", YARN)
def test_fused_qk_norm_rope(dtype, is_neox, d, rotary_dim, hq, hk, hv, n, yarn):
    factor, low, high, attention = yarn
    qkv, qw, kw, positions = make(n, hq, hk, hv, d, dtype)
    expected = fused_qk_norm_rope_reference(
        qkv, hq, hk, d, 1e-6, qw, kw, 1e4, is_neox, positions, factor, low, high, attention, rotary_dim
    )
    v_before = qkv[:, (hq + hk) * d :].clone()
    fused_qk_norm_rope(
        qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e4, is_neox, positions, factor, low, high, attention, rotary_dim
    )
    assert_rope_close(qkv, expected)
    assert torch.equal(qkv[:, (hq + hk) * d :], v_before), "v was modified"


@requires_cuda
@pytest.mark.parametrize("n", [64, 70000])
def test_large_positions_trig(n):
    """Positions past sincosf's fast range (|angle| > 105615 rad: its slow path), in both kernels (the
    table kernel at 64 tokens, the per-token CTA kernel past the large-size switch)."""
    hq, hk, hv, d = 4, 2, 2, 128
    qkv, qw, kw, _ = make(n, hq, hk, hv, d, torch.float32)
    positions = torch.randint(100000, 1000000, (n,), device="cuda")
    expected = fused_qk_norm_rope_reference(qkv, hq, hk, d, 1e-6, qw, kw, 1e4, True, positions, 1.0, 0.0, 0.0, 1.0)
    fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e4, True, positions, 1.0, 0.0, 0.0, 1.0)
    assert torch.isfinite(qkv).all()
    # the same fp32 angle as the reference: sincosf ~1 ulp, times |y| <= 16
    torch.testing.assert_close(qkv, expected, rtol=1e-3, atol=1e-3)


@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
def test_against_unfused_qknorm_then_rope(is_neox):
    """The unfused ops (fused_inplace_qknorm, then apply_rope_inplace with a cache of the same fp32
    angles) round between the norm and the rotation; the fused op does not."""
    from sglang.jit_kernel.norm import fused_inplace_qknorm
    from sglang.jit_kernel.rope import apply_rope_inplace

    n, hq, hk, hv, d, base = 129, 16, 4, 4, 128, 1e4
    qkv, qw, kw, positions = make(n, hq, hk, hv, d, torch.bfloat16)
    unfused = qkv.clone()
    q, k = unfused[:, : hq * d].view(n, hq, d), unfused[:, hq * d : (hq + hk) * d].view(n, hk, d)
    fused_inplace_qknorm(q, k, qw, kw, 1e-6)
    inv_freq = torch.pow(
        torch.tensor(base, dtype=torch.float32, device="cuda"),
        -2.0 * torch.arange(d // 2, dtype=torch.float32, device="cuda") / d,
    )
    theta = torch.arange(MAX_POS, dtype=torch.float32, device="cuda")[:, None] * inv_freq[None, :]
    cache = torch.cat([theta.cos(), theta.sin()], dim=-1)
    apply_rope_inplace(q, k, cache, positions, is_neox=is_neox)
    fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, base, is_neox, positions, 1.0, 0.0, 0.0, 1.0)
    # The unfused path rounds y before the rotation, so an output may be off by about one bf16 ulp of
    # the larger element of its pair (2^-8 * max|y|), plus the final rounding: bound by 2^-7 * max|y|.
    diff = (qkv.float() - unfused.float()).abs()
    scale = unfused.float().abs().max()
    assert diff.max() <= 2.0**-7 * scale, f"max diff {diff.max():.4g} vs max |y| {scale:.4g}"
    assert diff.mean() <= 2.0**-9 * scale, f"mean diff {diff.mean():.4g} vs max |y| {scale:.4g}"


@requires_cuda
def test_strided_rows_int32_positions_and_unaligned():
    """qkv as a column slice of a wider buffer (token stride > row), int32 positions; then a view
    off 16-byte alignment (one-element vectors)."""
    n, hq, hk, hv, d = 33, 8, 2, 2, 128
    row = (hq + hk + hv) * d
    wide = torch.randn(n, row + 72, dtype=torch.bfloat16, device="cuda")
    qkv = wide[:, :row]
    _, qw, kw, positions = make(n, hq, hk, hv, d, torch.bfloat16, torch.int32)
    pad_before = wide[:, row:].clone()
    expected = fused_qk_norm_rope_reference(qkv, hq, hk, d, 1e-6, qw, kw, 1e4, True, positions, 1.0, 0.0, 0.0, 1.0)
    fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e4, True, positions, 1.0, 0.0, 0.0, 1.0)
    assert_rope_close(qkv, expected)
    assert torch.equal(wide[:, row:], pad_before)
    odd = wide[:, 1 : row + 1]
    expected = fused_qk_norm_rope_reference(odd, hq, hk, d, 1e-6, qw, kw, 1e4, False, positions, 1.0, 0.0, 0.0, 1.0)
    fused_qk_norm_rope(odd, hq, hk, hv, d, 1e-6, qw, kw, 1e4, False, positions, 1.0, 0.0, 0.0, 1.0)
    assert_rope_close(odd, expected)


@requires_cuda
def test_empty_graph_and_compile():
    n, hq, hk, hv, d = 0, 8, 2, 2, 128
    qkv, qw, kw, positions = make(n, hq, hk, hv, d, torch.bfloat16)
    fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e4, True, positions, 1.0, 0.0, 0.0, 1.0)

    n = 64
    qkv, qw, kw, positions = make(n, hq, hk, hv, d, torch.bfloat16)
    fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e4, True, positions, 1.0, 0.0, 0.0, 1.0)  # load
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e4, True, positions, 4.0, 4.0, 32.0, 1.1)
    qkv.copy_(torch.randn_like(qkv))
    expected = fused_qk_norm_rope_reference(qkv, hq, hk, d, 1e-6, qw, kw, 1e4, True, positions, 4.0, 4.0, 32.0, 1.1)
    graph.replay()
    torch.cuda.synchronize()
    assert_rope_close(qkv, expected)

    torch._dynamo.reset()

    def f(x):
        y = x * 1
        fused_qk_norm_rope(y, hq, hk, hv, d, 1e-6, qw, kw, 1e4, True, positions, 1.0, 0.0, 0.0, 1.0)
        return y

    x = torch.randn_like(qkv)
    expected = fused_qk_norm_rope_reference(x, hq, hk, d, 1e-6, qw, kw, 1e4, True, positions, 1.0, 0.0, 0.0, 1.0)
    assert_rope_close(torch.compile(f, fullgraph=True)(x), expected)


def test_cpu_and_scalar_errors():
    op = "fused_qk_norm_rope"
    qkv, w, pos = torch.randn(2, 3 * 64), torch.randn(64), torch.zeros(2, dtype=torch.int64)

    def call(**kw):
        args = dict(
            qkv=qkv,
            num_heads_q=1,
            num_heads_k=1,
            num_heads_v=1,
            head_dim=64,
            eps=1e-6,
            q_weight=w,
            k_weight=w,
            base=1e4,
            is_neox=True,
            position_ids=pos,
            factor=1.0,
            low=0.0,
            high=0.0,
            attention_factor=1.0,
        )
        args.update(kw)
        fused_qk_norm_rope(**args)

    with pytest.raises(RuntimeError, match=rf"^{op}: qkv device: expected a CUDA device, got cpu$"):
        call()
    with pytest.raises(TypeError, match=rf"^{op}: num_heads_q type: expected an int, got float$"):
        call(num_heads_q=1.0)
    with pytest.raises(ValueError, match=rf"^{op}: eps value: expected >= 0.0, got -1.0$"):
        call(eps=-1.0)
    with pytest.raises(ValueError, match=rf"^{op}: base value: expected > 0.0, got 0.0$"):
        call(base=0.0)
    with pytest.raises(ValueError, match=rf"^{op}: factor value: expected > 0.0, got -2.0$"):
        call(factor=-2.0)
    with pytest.raises(
        ValueError,
        match=rf"^{op}: rotary_dim value: expected an even number in \[2, head_dim=64\], "
        r"got 65$",
    ):
        call(rotary_dim=65)
    with pytest.raises(ValueError, match=rf"^{op}: low value: expected a finite number, got nan$"):
        call(low=float("nan"))
    with pytest.raises(ValueError, match=rf"^{op}: attention_factor value: expected a magnitude of at most"):
        call(attention_factor=1e39)
    with pytest.raises(ValueError, match=rf"^{op}: base value: expected a magnitude of at most"):
        call(base=1e300)
    with pytest.raises(ValueError, match=rf"^{op}: factor value: expected a finite number, got inf$"):
        call(factor=float("inf"))
    with pytest.raises(TypeError, match=rf"^{op}: is_neox type: expected a bool, got int$"):
        call(is_neox=1)


@requires_cuda
def test_tensor_errors():
    op = "fused_qk_norm_rope"
    n, d = 4, 128
    qkv, qw, kw, positions = make(n, 2, 1, 1, d, torch.bfloat16)

    def call(qkv=qkv, qw=qw, kw=kw, positions=positions, hq=2):
        fused_qk_norm_rope(qkv, hq, 1, 1, d, 1e-6, qw, kw, 1e4, True, positions, 1.0, 0.0, 0.0, 1.0)

    cases = [
        (r"qkv shape: expected \[num_tokens, row=640\], got \(4, 512\)$", dict(qkv=qkv, hq=3)),
        (r"q_weight dtype: expected bfloat16 \(the dtype of qkv\), got float32$", dict(qw=qw.float())),
        (r"k_weight shape: expected \[head_dim=128\], got \(64,\)$", dict(kw=kw[:64])),
        (r"position_ids shape: expected \[num_tokens=4\], got \(3,\)$", dict(positions=positions[:3])),
        (r"position_ids dtype: expected one of int32, int64, got float32$", dict(positions=positions.float())),
        (r"qkv dtype: expected one of float16, bfloat16, float32, got int32$", dict(qkv=qkv.int())),
    ]
    before = qkv.clone()
    for message, kwargs in cases:
        with pytest.raises(RuntimeError, match=rf"^{op}: {message}"):
            call(**kwargs)
    assert torch.equal(qkv, before)


# Both kernels at the shapes where their layouts are awkward: the table kernel below the large-size
# switch (16-byte vectors, one unit per lane), the per-token CTA kernel at 4096 tokens (past it), at
# two units per lane (d = 1024 bf16/fp16) and at narrow vectors. 64 + 1 + 1 heads (65 normed: the
# last warp holds one k head, the last CTA one warp and three without heads), 64 + 2 + 2 at 1 token
# (a half-full last warp, then warps without heads that still fill their share of the CTA table);
# fp32 d = 1024 (128 units) is refused.
@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("yarn", [False, True])
@pytest.mark.parametrize(
    "hq,hk,hv,n,d,rotary_dim",
    [
        (32, 8, 8, 1, 128, None),
        (32, 8, 8, 64, 128, None),
        (3, 5, 1, 7, 128, 64),
        (16, 0, 0, 2, 64, None),
        (0, 4, 4, 3, 512, 96),
        (8, 2, 2, 5, 256, None),
        (32, 8, 8, 4096, 128, None),
        (64, 1, 1, 64, 128, None),
        (64, 1, 1, 7, 128, None),
        (64, 2, 2, 1, 128, None),
        (2, 2, 2, 64, 1024, None),
        (2, 2, 2, 1, 1024, None),
    ],
)
def test_default_kernels_against_reference(is_neox, dtype, yarn, hq, hk, hv, n, d, rotary_dim):
    qkv, qw, kw, positions = make(n, hq, hk, hv, d, dtype)
    scaling = (4.0, 8.0, 40.0, 1.2) if yarn else (1.0, 0.0, 0.0, 1.0)
    if dtype == torch.float32 and d == 1024:
        before = qkv.clone()
        with pytest.raises(RuntimeError, match=r"needs 128 units of 8 elements, at most 64 are supported"):
            fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e4, is_neox, positions, *scaling, rotary_dim)
        assert torch.equal(qkv, before)
        return
    expected = fused_qk_norm_rope_reference(qkv, hq, hk, d, 1e-6, qw, kw, 1e4, is_neox, positions, *scaling, rotary_dim)
    fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e4, is_neox, positions, *scaling, rotary_dim)
    assert_rope_close(qkv, expected)


@requires_cuda
@pytest.mark.parametrize("n", [204, 205])
def test_both_sides_of_the_large_size_switch(n):
    """Qwen3's 32 + 8 + 8 heads x 128 bf16 (40 normed heads of 8 lanes: 320 threads a token): 204
    tokens stay below kLargeThreads (the table kernel), 205 reach it (the per-token CTA kernel);
    strided rows."""
    hq, hk, hv, d = 32, 8, 8, 128
    row = (hq + hk + hv) * d
    wide = torch.randn(n, row + 64, dtype=torch.bfloat16, device="cuda")
    qkv = wide[:, :row]
    _, qw, kw, positions = make(n, hq, hk, hv, d, torch.bfloat16)
    expected = fused_qk_norm_rope_reference(qkv, hq, hk, d, 1e-6, qw, kw, 1e6, True, positions, 1.0, 0.0, 0.0, 1.0)
    pad = wide[:, row:].clone()
    fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e6, True, positions, 1.0, 0.0, 0.0, 1.0)
    assert_rope_close(qkv, expected)
    assert torch.equal(wide[:, row:], pad)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("yarn", [False, True])
def test_can_use_fused_qk_norm_rope(is_neox, yarn):
    """Every even head_dim <= 128; above it multiples of 2 * (16 / element_size) up to 128 vectors
    (1024 for 2-byte dtypes, 512 for fp32); both styles, with and without YaRN (no GPU needed)."""
    for dtype, vec in ((torch.float16, 8), (torch.bfloat16, 8), (torch.float32, 4)):
        for head_dim in (2, 4, 6, 62, 64, 80, 96, 126, 128):
            assert can_use_fused_qk_norm_rope(head_dim, is_neox, dtype, yarn) is True, (head_dim, dtype)
        for head_dim in (2 * vec * 9, 192, 256, 512, 128 * vec):
            assert can_use_fused_qk_norm_rope(head_dim, is_neox, dtype, yarn) is True, (head_dim, dtype)
        for head_dim in (0, -2, -128, 1, 3, 127, 129, 128 + vec, 128 * vec + 2 * vec, 2048, 1 << 30):
            assert can_use_fused_qk_norm_rope(head_dim, is_neox, dtype, yarn) is False, (head_dim, dtype)
    assert can_use_fused_qk_norm_rope(1024, is_neox, torch.bfloat16, yarn) is True
    assert can_use_fused_qk_norm_rope(1024, is_neox, torch.float32, yarn) is False
    assert can_use_fused_qk_norm_rope(136, is_neox, torch.bfloat16, yarn) is False  # R/2 = 68: not 16-byte vectors
    assert can_use_fused_qk_norm_rope(136, is_neox, torch.float32, yarn) is True
    for dtype in (torch.float64, torch.int32, torch.float8_e4m3fn, torch.uint8):
        assert can_use_fused_qk_norm_rope(128, is_neox, dtype, yarn) is False, dtype


def test_can_use_fused_qk_norm_rope_default_yarn_and_bad_types():
    assert can_use_fused_qk_norm_rope(128, True, torch.bfloat16) is True
    op = "can_use_fused_qk_norm_rope"
    for args, arg, expected, got in (
        ((128.0, True, torch.bfloat16), "head_dim", "an int", "float"),
        ((True, True, torch.bfloat16), "head_dim", "an int", "bool"),
        (("128", True, torch.bfloat16), "head_dim", "an int", "str"),
        ((128, 1, torch.bfloat16), "is_neox", "a bool", "int"),
        ((128, None, torch.bfloat16), "is_neox", "a bool", "NoneType"),
        ((128, True, "bfloat16"), "dtype", "a torch.dtype", "str"),
        ((128, True, None), "dtype", "a torch.dtype", "NoneType"),
        ((128, True, torch.bfloat16, 1), "yarn", "a bool", "int"),
        ((128, True, torch.bfloat16, None), "yarn", "a bool", "NoneType"),
    ):
        with pytest.raises(TypeError, match=rf"^{op}: {arg} type: expected {expected}, got {got}$"):
            can_use_fused_qk_norm_rope(*args)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [2, 80, 126, 128, 192, 256, 512])
def test_can_use_fused_qk_norm_rope_matches_the_launcher(dtype, d):
    """Every head_dim the query accepts runs (contiguous qkv and weights, the aligned case); its
    neighbour d + 2 past 128, which the query refuses, is refused by the launcher."""
    n, hq, hk, hv = 3, 2, 1, 1
    for head_dim in (d, d + 2) if d >= 128 else (d,):
        qkv, qw, kw, positions = make(n, hq, hk, hv, head_dim, dtype)
        args = (qkv, hq, hk, hv, head_dim, 1e-6, qw, kw, 1e4, True, positions, 4.0, 8.0, 40.0, 1.2)
        if can_use_fused_qk_norm_rope(head_dim, True, dtype, yarn=True):
            expected = fused_qk_norm_rope_reference(qkv, hq, hk, *args[4:])
            fused_qk_norm_rope(*args)
            assert_rope_close(qkv, expected)
        else:
            with pytest.raises(RuntimeError, match=r"fused_qk_norm_rope: head_dim"):
                fused_qk_norm_rope(*args)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
