"""norm ops: rmsnorm (both multiply orders) and rmsnorm_hf, gemma_rmsnorm, fused_add_rmsnorm
(+ gemma), fused_inplace_qknorm, fused_inplace_qknorm_across_heads. Values against fp32 references
of the same inputs (<= 1 ulp; across heads with testing.TOLERANCE), awkward sizes, strided and
unaligned views with poisoned surroundings, empty inputs, > 2^31 elements, graphs, torch.compile,
PDL on/off, and errors in the format ``<op>: <arg> <what>: expected X, got Y`` (the CPU-tensor and
scalar ones run without a GPU)."""

from __future__ import annotations

import re

import pytest
import torch

from sglang.jit_kernel.norm import (
    can_use_fused_inplace_qknorm,
    fused_add_rmsnorm,
    fused_inplace_qknorm,
    fused_inplace_qknorm_across_heads,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    is_supported_jit_fused_add_rmsnorm_hidden_size,
    is_supported_rmsnorm_hf_hidden_size,
    rmsnorm,
    rmsnorm_hf,
)
from sglang.jit_kernel.testing import (
    FLOAT_DTYPES,
    assert_close,
    assert_poison_intact,
    poisoned,
    requires_cuda,
    requires_two_gpus,
)
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=240, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=600, suite="nightly-kernel-1-gpu", nightly=True)

HIDDEN_SIZES = get_ci_test_range(
    full_range=[1, 7, 64, 128, 255, 256, 769, 1024, 3584, 4096, 5120, 8192, 16384, 32768, 65536],
    ci_range=[1, 7, 64, 128, 255, 256, 769, 1024, 3584, 4096, 5120, 8192, 16384],
)
NUM_TOKENS = [0, 1, 7, 129, 4097]
EPS = [1e-6, 1e-5]

# (num_tokens, hidden_size) grid: every pair for bf16; two token counts per size for fp16/fp32
# (rotating through NUM_TOKENS), so each dtype still sees every size and every token count.
FULL_GRID = [(n, h) for h in HIDDEN_SIZES for n in NUM_TOKENS]
SPARSE_GRID = [(NUM_TOKENS[(i + j) % len(NUM_TOKENS)], h) for i, h in enumerate(HIDDEN_SIZES) for j in (0, 2)]
DTYPE_GRID = [(torch.bfloat16, n, h) for n, h in FULL_GRID] + [
    (d, n, h) for d in (torch.float16, torch.float32) for n, h in SPARSE_GRID
]

#: Output error budget in units in the last place of the output dtype. fp16/bf16 outputs are one
#: rounding of an fp32 value computed like the reference: <= 1 ulp. fp32 outputs are not rounded
#: from anything wider; their error is that of the fp32 sum of squares and of rsqrtf (~1e-6
#: relative), i.e. tens of ulps.
ULPS = {torch.float16: 1, torch.bfloat16: 1, torch.float32: 64}


# ---------------------------------------------------------------------------------------------
# References (fp32 from the same low-precision inputs) and the ulp comparison
# ---------------------------------------------------------------------------------------------
def ref_rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)


def ref_rmsnorm(
    x: torch.Tensor, w: torch.Tensor, eps: float, offset: float = 0.0, cast_x_first: bool = False, rstd_scale=1.0
) -> torch.Tensor:
    """``round(x * rstd * (w + offset))``; with cast_x_first ``round(float(round(x * rstd)) * (w + offset))``."""
    normed = x.float() * (ref_rstd(x, eps) * rstd_scale)
    if cast_x_first:
        normed = normed.to(x.dtype).float()
    return (normed * (w.float() + offset)).to(x.dtype)


def ulp_of(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at |ref| (the subnormal spacing below the smallest normal)."""
    finfo = torch.finfo(dtype)
    magnitude = ref.float().abs().clamp_min(finfo.tiny)
    _, exponent = torch.frexp(magnitude)  # magnitude = m * 2^e, 0.5 <= m < 1
    return torch.ldexp(torch.full_like(magnitude, finfo.eps), exponent - 1)


def within_ulps(actual: torch.Tensor, expected: torch.Tensor, ulps: int) -> torch.Tensor:
    diff = (actual.float() - expected.float()).abs()
    ok = diff <= ulps * ulp_of(expected, actual.dtype)
    return ok & torch.isfinite(actual.float())


def assert_within_ulps(actual: torch.Tensor, expected: torch.Tensor, ulps: int | None = None, *alternatives) -> None:
    """Every element within ``ulps`` (default ULPS[dtype]) of ``expected`` or of one of
    ``alternatives``; NaN / inf never pass."""
    ulps = ULPS[actual.dtype] if ulps is None else ulps
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    ok = within_ulps(actual, expected, ulps)
    for alt in alternatives:
        ok |= within_ulps(actual, alt, ulps)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:5].tolist()
        idx = tuple(bad[0])
        raise AssertionError(
            f"{int((~ok).sum())} of {ok.numel()} elements off by more than {ulps} ulp(s); first at {bad}: "
            f"got {actual[idx].item()!r}, expected {expected[idx].item()!r}"
        )


def make_rows(n: int, h: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(n, h, device="cuda") * scale).to(dtype)


def make_weight(h: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.rand(h, device="cuda") * 2 - 0.5).to(dtype)  # mixed signs, mean around 0.5


def strided_view(buffer_rows: int, h: int, dtype: torch.dtype, pad_cols: int, col: int) -> tuple:
    """A [rows, h] view at column ``col`` of a poisoned [rows, h + pad_cols] buffer."""
    buffer = poisoned((buffer_rows, h + pad_cols), dtype)
    return buffer[:, col : col + h], buffer


def assert_outside_untouched(buffer: torch.Tensor, col: int, h: int) -> None:
    """Columns of a 2-D poisoned buffer outside [col, col + h) still hold NaN."""
    mask = torch.ones(buffer.shape[1], dtype=torch.bool, device=buffer.device)
    mask[col : col + h] = False
    assert torch.isnan(buffer[:, mask]).all(), "an op wrote outside its output view"


# ---------------------------------------------------------------------------------------------
# rmsnorm / gemma_rmsnorm
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("dtype,num_tokens,hidden_size", DTYPE_GRID)
def test_rmsnorm(dtype, num_tokens, hidden_size):
    x = make_rows(num_tokens, hidden_size, dtype)
    w = make_weight(hidden_size, dtype)
    before = x.clone()
    out = rmsnorm(x, w, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert_within_ulps(out, ref_rmsnorm(x, w, 1e-6))
    assert torch.equal(x, before), "rmsnorm modified its input"


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_tokens,hidden_size", [(1, 4096), (129, 7), (7, 769), (4097, 128), (33, 8192)])
def test_rmsnorm_hf_order(dtype, num_tokens, hidden_size):
    """cast_x_before_out_mul: x * rstd rounded to the dtype, then times w. The intermediate rounding
    can flip on a near-tie when rstd differs from the reference's in its last fp32 bits (another
    summation order); such elements are accepted against the reference with rstd nudged 1e-6."""
    x = make_rows(num_tokens, hidden_size, dtype)
    w = make_weight(hidden_size, dtype)
    out = rmsnorm(x, w, 1e-6, cast_x_before_out_mul=True)
    expected = ref_rmsnorm(x, w, 1e-6, cast_x_first=True)
    nudged = [ref_rmsnorm(x, w, 1e-6, cast_x_first=True, rstd_scale=1 + s) for s in (1e-6, -1e-6)]
    assert_within_ulps(out, expected, None, *nudged)
    if dtype != torch.float32:
        # The two orders are different functions: they must disagree somewhere on this much data.
        default_order = ref_rmsnorm(x, w, 1e-6)
        if x.numel() >= 4096:
            assert not torch.equal(expected, default_order)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("hidden_size", [64, 4096, 5120])
def test_rmsnorm_eps_small_rows_and_zero_row(dtype, eps, hidden_size):
    """Rows with mean square ~1e-4 (so eps matters: 1e-5 vs 1e-6 changes the result) and an
    all-zero row, which must give exact zeros (no NaN)."""
    x = make_rows(65, hidden_size, dtype, scale=1e-2)
    x[17].zero_()
    w = make_weight(hidden_size, dtype)
    for fn, offset in ((rmsnorm, 0.0), (gemma_rmsnorm, 1.0)):
        out = fn(x, w, eps)
        assert_within_ulps(out, ref_rmsnorm(x, w, eps, offset))
        assert torch.equal(out[17], torch.zeros_like(out[17]))
    # eps is really used: the other eps gives a visibly different answer
    other = 1e-5 if eps == 1e-6 else 1e-6
    assert not bool(within_ulps(rmsnorm(x, w, eps)[:17], ref_rmsnorm(x, w, other)[:17], 1).all())


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_tokens,hidden_size", [(1, 1), (129, 7), (7, 769), (4097, 4096), (3, 16384)])
def test_gemma_rmsnorm(dtype, num_tokens, hidden_size):
    x = make_rows(num_tokens, hidden_size, dtype)
    w = make_weight(hidden_size, dtype)
    out = gemma_rmsnorm(x, w, 1e-6)
    assert_within_ulps(out, ref_rmsnorm(x, w, 1e-6, offset=1.0))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hidden_size", [7, 128, 769, 4096, 8192])
@pytest.mark.parametrize("in_pad,in_col,out_pad,out_col", [(8, 0, 16, 8), (3, 1, 5, 3), (64, 32, 1, 1)])
def test_rmsnorm_strided_rows_and_offsets(dtype, hidden_size, in_pad, in_col, out_pad, out_col):
    """input and out are column windows of wider buffers (row stride != hidden_size; with odd
    columns the data pointers are not 16-byte aligned): right values, nothing written outside."""
    n = 33
    x_full = make_rows(n, hidden_size + in_pad, dtype)
    x = x_full[:, in_col : in_col + hidden_size]
    w = make_weight(hidden_size, dtype)
    out, out_buffer = strided_view(n, hidden_size, dtype, out_pad, out_col)
    result = rmsnorm(x, w, 1e-6, out=out)
    assert result is out
    assert_within_ulps(out, ref_rmsnorm(x, w, 1e-6))
    assert_outside_untouched(out_buffer, out_col, hidden_size)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("hidden_size", [64, 4096])
def test_rmsnorm_unaligned_storage_offsets(dtype, offset, hidden_size):
    """Contiguous views starting `offset` elements into their storage (narrower vectors), weight
    included."""
    n = 9
    x = torch.empty(n * hidden_size + offset, dtype=dtype, device="cuda")[offset:].view(n, hidden_size)
    x.copy_(make_rows(n, hidden_size, dtype))
    w = torch.empty(hidden_size + offset, dtype=dtype, device="cuda")[offset:]
    w.copy_(make_weight(hidden_size, dtype))
    buffer = poisoned((n * hidden_size + 2 * (offset + 8),), dtype)
    out = buffer[offset + 8 : offset + 8 + n * hidden_size].view(n, hidden_size)
    rmsnorm(x, w, 1e-6, out=out)
    assert_within_ulps(out, ref_rmsnorm(x, w, 1e-6))
    assert_poison_intact(buffer, offset + 8, n * hidden_size)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rmsnorm_leading_dims_and_in_place(dtype):
    x = torch.randn(3, 5, 7, 256, device="cuda").to(dtype)
    w = make_weight(256, dtype)
    expected = ref_rmsnorm(x, w, 1e-5)
    out = rmsnorm(x, w, 1e-5)
    assert out.shape == x.shape
    assert_within_ulps(out, expected)
    v = x[:, 1:4]  # leading dims that flatten to strided rows without a copy
    assert_within_ulps(rmsnorm(v, w, 1e-5), ref_rmsnorm(v, w, 1e-5))
    y = torch.randn(256, device="cuda").to(dtype)  # 1-D: one token
    assert_within_ulps(rmsnorm(y, w), ref_rmsnorm(y, w, 1e-6))
    result = rmsnorm(x, w, 1e-5, out=x)  # in place
    assert result is x
    assert_within_ulps(x, expected)


@requires_cuda
@pytest.mark.parametrize("shape", [(0, 4096), (0, 3, 64), (5, 0)])
def test_rmsnorm_empty(shape):
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    w = torch.empty(shape[-1], dtype=torch.bfloat16, device="cuda")
    out = rmsnorm(x, w)
    assert out.shape == x.shape
    r = torch.empty_like(x)
    assert fused_add_rmsnorm(x, r, w) is None


@requires_cuda
@pytest.mark.parametrize("enable_pdl", [None, True, False])
def test_rmsnorm_pdl_does_not_change_results(enable_pdl):
    x = make_rows(4097, 4096, torch.bfloat16)
    w = make_weight(4096, torch.bfloat16)
    reference = rmsnorm(x, w, enable_pdl=False)
    for _ in range(3):  # back-to-back launches, each depending on the previous one's output
        y = rmsnorm(x, w, enable_pdl=enable_pdl)
        z = rmsnorm(y, w, enable_pdl=enable_pdl)
    assert torch.equal(y, reference)
    assert torch.equal(z, rmsnorm(reference, w, enable_pdl=False))
    r = x.clone()
    a, ra = x.clone(), r.clone()
    fused_add_rmsnorm(a, ra, w, enable_pdl=enable_pdl)
    b, rb = x.clone(), r.clone()
    fused_add_rmsnorm(b, rb, w, enable_pdl=False)
    assert torch.equal(a, b) and torch.equal(ra, rb)


@requires_cuda
def test_rmsnorm_more_than_2_pow_31_elements():
    """64-bit offsets: 524291 rows x 4096 bf16 (2^31 + 12288 elements)."""
    n, h = (1 << 31) // 4096 + 3, 4096
    free, _ = torch.cuda.mem_get_info()
    need = 3 * n * h * 2 + (1 << 30)
    if free < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB free GPU memory, {free / 2**30:.0f} GiB free")
    x = torch.empty(n, h, dtype=torch.bfloat16, device="cuda").uniform_(-2, 2)
    w = make_weight(h, torch.bfloat16)
    out = torch.empty_like(x)
    out[-4096:].fill_(float("nan"))
    rmsnorm(x, w, out=out)
    for lo, hi in [(0, 64), (n // 2 - 32, n // 2 + 32), (n - 4096, n)]:
        assert_within_ulps(out[lo:hi], ref_rmsnorm(x[lo:hi], w, 1e-6))
    r = torch.empty_like(x).uniform_(-1, 1)
    tail_x, tail_r = x[-64:].clone(), r[-64:].clone()
    fused_add_rmsnorm(x, r, w)
    s = (tail_x.float() + tail_r.float()).to(torch.bfloat16)
    assert torch.equal(r[-64:], s)
    assert_within_ulps(x[-64:], ref_rmsnorm(s, w, 1e-6))
    del x, out, r
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# fused_add_rmsnorm / gemma_fused_add_rmsnorm
# ---------------------------------------------------------------------------------------------
def ref_fused(x, r, w, eps, offset=0.0):
    """Residual = round(x + r); output = RMSNorm of that ROUNDED sum."""
    s = (x.float() + r.float()).to(x.dtype)
    return ref_rmsnorm(s, w, eps, offset), s


FUSED_GRID = [(torch.bfloat16, n, h) for n, h in SPARSE_GRID] + [
    (d, n, h) for d in (torch.float16, torch.float32) for n, h in SPARSE_GRID[::2]
]


@requires_cuda
@pytest.mark.parametrize("dtype,num_tokens,hidden_size", FUSED_GRID)
@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_rmsnorm(dtype, num_tokens, hidden_size, gemma):
    x = make_rows(num_tokens, hidden_size, dtype)
    r = make_rows(num_tokens, hidden_size, dtype)
    w = make_weight(hidden_size, dtype)
    expected, expected_residual = ref_fused(x, r, w, 1e-6, 1.0 if gemma else 0.0)
    result = (gemma_fused_add_rmsnorm if gemma else fused_add_rmsnorm)(x, r, w, 1e-6)
    assert result is None
    assert torch.equal(r, expected_residual), "residual must be exactly round(input + residual)"
    assert_within_ulps(x, expected)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_add_rmsnorm_uses_rounded_sum(dtype):
    """The variance comes from the rounded sum (what residual stores), not the fp32 sum. The data
    makes the two differ systematically: big x in [256, 512) (spacing 2 in bf16, 0.25 in fp16) plus
    a small r that rounding drops, so the fp32-sum variance is ~0.1% larger. The kernel must match
    the rounded-sum reference and visibly not the fp32-sum one."""
    n, h = 64, 4096
    x = (256 + 256 * torch.rand(n, h, device="cuda")).to(dtype)
    r = torch.full((n, h), 0.75 if dtype == torch.bfloat16 else 0.09375, device="cuda").to(dtype)
    w = torch.ones(h, dtype=dtype, device="cuda")
    s_rounded = (x.float() + r.float()).to(dtype)
    s_fp32 = x.float() + r.float()
    expected = ref_rmsnorm(s_rounded, w, 1e-6)
    from_fp32_sum = (s_rounded.float() * torch.rsqrt(s_fp32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    assert not torch.equal(s_rounded.float(), s_fp32), "the test data must make rounding matter"
    xk, rk = x.clone(), r.clone()
    fused_add_rmsnorm(xk, rk, w, 1e-6)
    assert torch.equal(rk, s_rounded)
    assert_within_ulps(xk, expected)
    agree_rounded = (xk == expected).float().mean().item()
    agree_fp32 = (xk == from_fp32_sum).float().mean().item()
    assert agree_rounded > 0.99, agree_rounded
    assert agree_fp32 < agree_rounded - 0.05, (agree_fp32, agree_rounded)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hidden_size", [7, 128, 4096, 5120])
def test_fused_add_rmsnorm_strided_and_unaligned(dtype, hidden_size):
    """input and residual are column windows of wider poisoned-around buffers with different row
    strides and odd offsets; nothing outside the windows changes."""
    n = 65
    xbuf = make_rows(n, hidden_size + 9, dtype)
    rbuf = make_rows(n, hidden_size + 4, dtype)
    xbuf[:, :3] = float("nan")
    xbuf[:, 3 + hidden_size :] = float("nan")
    rbuf[:, :1] = float("nan")
    rbuf[:, 1 + hidden_size :] = float("nan")
    x, r = xbuf[:, 3 : 3 + hidden_size], rbuf[:, 1 : 1 + hidden_size]
    w = make_weight(hidden_size, dtype)
    expected, expected_residual = ref_fused(x, r, w, 1e-5)
    fused_add_rmsnorm(x, r, w, 1e-5)
    assert torch.equal(r, expected_residual)
    assert_within_ulps(x, expected)
    assert_outside_untouched(xbuf, 3, hidden_size)
    assert_outside_untouched(rbuf, 1, hidden_size)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("eps", EPS)
def test_fused_add_rmsnorm_eps_and_zero_row(dtype, eps):
    n, h = 33, 1024
    x = make_rows(n, h, dtype, scale=1e-2)
    r = make_rows(n, h, dtype, scale=1e-2)
    x[5].zero_()
    r[5].zero_()
    w = make_weight(h, dtype)
    expected, expected_residual = ref_fused(x, r, w, eps)
    fused_add_rmsnorm(x, r, w, eps)
    assert torch.equal(r, expected_residual)
    assert_within_ulps(x, expected)
    assert torch.equal(x[5], torch.zeros_like(x[5]))


@requires_cuda
def test_fused_add_rmsnorm_leading_dims():
    x = torch.randn(4, 33, 512, device="cuda").to(torch.bfloat16)
    r = torch.randn(4, 33, 512, device="cuda").to(torch.bfloat16)
    w = make_weight(512, torch.bfloat16)
    expected, expected_residual = ref_fused(x, r, w, 1e-6)
    fused_add_rmsnorm(x, r, w)
    assert torch.equal(r, expected_residual)
    assert_within_ulps(x, expected)


# ---------------------------------------------------------------------------------------------
# fused_inplace_qknorm
# ---------------------------------------------------------------------------------------------
HEAD_DIMS = get_ci_test_range(
    full_range=[1, 7, 64, 80, 96, 128, 192, 256, 512, 576, 1024, 2048, 4096],
    ci_range=[7, 64, 96, 128, 256, 512, 1024, 2048],
)
HEADS = [(32, 8), (8, 1), (1, 1), (5, 3)]


def qkv_views(num_tokens, num_q_heads, num_kv_heads, head_dim, dtype, offset=0):
    """q, k, v as strided views of one fused [num_tokens, (Hq + 2 Hk) * D] buffer (with an optional
    storage offset), plus the buffer."""
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    storage = torch.randn(num_tokens * width + offset, device="cuda").to(dtype)
    qkv = storage[offset:].view(num_tokens, width)
    q = qkv[:, : num_q_heads * head_dim].view(num_tokens, num_q_heads, head_dim)
    k = qkv[:, num_q_heads * head_dim : (num_q_heads + num_kv_heads) * head_dim].view(
        num_tokens, num_kv_heads, head_dim
    )
    v = qkv[:, (num_q_heads + num_kv_heads) * head_dim :]
    return q, k, v, qkv


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads_index", range(len(HEADS)))
def test_qknorm_fused_qkv_views(dtype, head_dim, heads_index):
    num_q_heads, num_kv_heads = HEADS[heads_index]
    num_tokens = NUM_TOKENS[(heads_index + HEAD_DIMS.index(head_dim)) % len(NUM_TOKENS)]
    if dtype != torch.bfloat16 and num_tokens == 4097:
        num_tokens = 129
    q, k, v, _ = qkv_views(num_tokens, num_q_heads, num_kv_heads, head_dim, dtype)
    qw, kw = make_weight(head_dim, dtype), make_weight(head_dim, dtype)
    expected_q, expected_k = ref_rmsnorm(q, qw, 1e-6), ref_rmsnorm(k, kw, 1e-6)
    v_before = v.clone()
    assert fused_inplace_qknorm(q, k, qw, kw, 1e-6) is None
    assert_within_ulps(q, expected_q)
    assert_within_ulps(k, expected_k)
    assert torch.equal(v, v_before), "qknorm touched v"


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 2, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_qknorm_unaligned_and_separate(dtype, offset, head_dim):
    """A qkv buffer at a storage offset (narrower vectors); then separate contiguous q and k."""
    q, k, v, _ = qkv_views(129, 32, 8, head_dim, dtype, offset=offset)
    qw, kw = make_weight(head_dim, dtype), make_weight(head_dim, dtype)
    expected_q, expected_k, v_before = ref_rmsnorm(q, qw, 1e-5), ref_rmsnorm(k, kw, 1e-5), v.clone()
    fused_inplace_qknorm(q, k, qw, kw, 1e-5)
    assert_within_ulps(q, expected_q)
    assert_within_ulps(k, expected_k)
    assert torch.equal(v, v_before)
    q2, k2 = torch.randn(7, 16, head_dim, device="cuda").to(dtype), torch.randn(7, 2, head_dim, device="cuda").to(dtype)
    expected_q, expected_k = ref_rmsnorm(q2, qw, 1e-6), ref_rmsnorm(k2, kw, 1e-6)
    fused_inplace_qknorm(q2, k2, qw, kw)
    assert_within_ulps(q2, expected_q)
    assert_within_ulps(k2, expected_k)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("eps", EPS)
def test_qknorm_eps_and_zero_head(dtype, eps):
    q, k, _, _ = qkv_views(17, 8, 2, 128, dtype)
    q.mul_(1e-2)
    k.mul_(1e-2)
    q[3, 5].zero_()
    k[4, 1].zero_()
    qw, kw = make_weight(128, dtype), make_weight(128, dtype)
    expected_q, expected_k = ref_rmsnorm(q, qw, eps), ref_rmsnorm(k, kw, eps)
    fused_inplace_qknorm(q, k, qw, kw, eps)
    assert_within_ulps(q, expected_q)
    assert_within_ulps(k, expected_k)
    assert torch.equal(q[3, 5], torch.zeros_like(q[3, 5])) and torch.equal(k[4, 1], torch.zeros_like(k[4, 1]))


@requires_cuda
def test_qknorm_empty():
    q, k, _, _ = qkv_views(0, 32, 8, 128, torch.bfloat16)
    w = make_weight(128, torch.bfloat16)
    assert fused_inplace_qknorm(q, k, w, w) is None


def check_qknorm_in_qkv(num_tokens: int, dtype: torch.dtype, offset: int) -> torch.Tensor:
    """fused_inplace_qknorm on q / k views (32 + 8 heads x 128) of a fused qkv buffer stored at
    ``offset`` elements: both within ULPS of the fp32 reference, v unchanged. Returns the buffer."""
    q, k, v, buffer = qkv_views(num_tokens, 32, 8, 128, dtype, offset=offset)
    qw, kw = make_weight(128, dtype), make_weight(128, dtype)
    expected_q, expected_k, v_before = ref_rmsnorm(q, qw, 1e-6), ref_rmsnorm(k, kw, 1e-6), v.clone()
    fused_inplace_qknorm(q, k, qw, kw, 1e-6)
    assert_within_ulps(q, expected_q)
    assert_within_ulps(k, expected_k)
    assert torch.equal(v, v_before)
    return buffer


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_norm_in_place_launches_above_and_below_the_l2_hint_threshold(dtype):
    """In-place launches with 16-byte vectors whose input rows hold at least 1 MiB take the
    L2-hint builds (loads evict_last, stores evict_normal), smaller ones and narrower vectors the
    plain builds: every one within ULPS of the fp32 reference, for every vector width (16 / 8 / 4 /
    2 bytes via storage offsets), the two-pass rows, and qknorm heads in a fused qkv buffer whose v
    part stays untouched."""
    for n, h, offset in [
        (129, 4096, 0),  # 1 MiB in bf16 / fp16: hinted
        (127, 4096, 0),  # just below: plain
        (129, 4096, 1),
        (67, 770, 2),
        (33, 1538, 4),
        (5, 16384, 0),
        (3, 65536, 0),
        (7, 1, 0),
    ]:
        x = make_rows(n * h + offset, 1, dtype).view(-1)[offset:].view(n, h)
        w = make_weight(h, dtype)
        expected = ref_rmsnorm(x, w, 1e-6)
        assert rmsnorm(x, w, 1e-6, out=x) is x
        assert_within_ulps(x, expected)
        r = make_rows(n, h, dtype)
        expected, expected_residual = ref_fused(x, r, w, 1e-6)
        fused_add_rmsnorm(x, r, w, 1e-6)
        assert torch.equal(r, expected_residual)
        assert_within_ulps(x, expected)
    for tokens in (257, 4097):
        for offset in (0, 1):
            check_qknorm_in_qkv(tokens, dtype, offset=offset)
            q, k, v, _ = across_views(tokens, 4096, 1024, dtype, offset=offset)
            check_across_heads(q, k, v)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rmsnorm_hf_and_across_heads_shapes(dtype):
    """rmsnorm_hf (fp16 / bf16: the weight multiply as one packed multiply, which gives the bits of
    the fp32 order) against the fp32 reference at decode and odd sizes; across heads for every
    ACROSS_SIZES pair (CTAs of 64 to 512 threads) at decode and many-wave token counts, fused qkv
    views (v untouched) and unaligned storage (narrow vectors)."""
    for n, h in [(1, 4096), (64, 4096), (300, 5120), (17, 129), (4, 7)]:
        x = make_rows(n, h, dtype)
        w = make_weight(h, dtype)
        assert_hf_matches(rmsnorm_hf(x, w, 1e-6), x, w, 1e-6)
    for i, (hq, hk) in enumerate(ACROSS_SIZES):
        for n, offset in ((1, 0), (3, 0), (300, i % 2)):
            q, k, v, _ = across_views(n, hq, hk, dtype, offset=offset)
            check_across_heads(q, k, v)


# ---------------------------------------------------------------------------------------------
# rmsnorm_hf (Hugging Face order) and fused_inplace_qknorm's head_dim
# ---------------------------------------------------------------------------------------------
def assert_hf_matches(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float) -> None:
    """out within ULPS of round(float(round(x * rstd)) * w). The intermediate rounding can flip on a
    near-tie where the kernel's rstd differs from the reference's in its last fp32 bits (another
    summation order, rsqrtf): such elements are accepted against the reference with rstd nudged by
    1e-6 either way (a few fp32 ulps, far below the spacing of any output dtype)."""
    expected = ref_rmsnorm(x, w, eps, cast_x_first=True)
    nudged = [ref_rmsnorm(x, w, eps, cast_x_first=True, rstd_scale=1 + s) for s in (1e-6, -1e-6)]
    assert_within_ulps(out, expected, None, *nudged)


# Every hidden size once for bf16 (SPARSE_GRID holds each twice), a quarter of them for fp16 / fp32.
HF_GRID = [(torch.bfloat16, n, h) for n, h in SPARSE_GRID[::2]] + [
    (d, n, h) for d in (torch.float16, torch.float32) for n, h in SPARSE_GRID[1::4]
]


@requires_cuda
@pytest.mark.parametrize("dtype,num_tokens,hidden_size", HF_GRID)
def test_rmsnorm_hf(dtype, num_tokens, hidden_size):
    """rmsnorm_hf against the two-rounding reference, out allocated and given (poisoned, inside a
    larger buffer), input untouched; bit-identical to rmsnorm(cast_x_before_out_mul=True)."""
    x = make_rows(num_tokens, hidden_size, dtype)
    w = make_weight(hidden_size, dtype)
    before = x.clone()
    out = rmsnorm_hf(x, w, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert_hf_matches(out, x, w, 1e-6)
    assert torch.equal(x, before), "rmsnorm_hf modified its input"
    given, buffer = strided_view(num_tokens, hidden_size, dtype, 3, 1)
    assert rmsnorm_hf(x, w, 1e-6, out=given) is given
    # Not bit-equal to `out`: an unaligned out takes narrower vectors, another summation order, and
    # the intermediate rounding of x * rstd can flip on a near-tie (see test_rmsnorm_hf_order).
    assert_hf_matches(given, x, w, 1e-6)
    assert_outside_untouched(buffer, 1, hidden_size)
    assert torch.equal(out, rmsnorm(x, w, 1e-6, cast_x_before_out_mul=True))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hidden_size", [1, 7, 129, 4096, 4097])
def test_rmsnorm_hf_views_in_place_and_eps(dtype, hidden_size):
    """Strided input rows at an odd column, an unaligned storage offset, leading dims, in place,
    eps 1e-5 on small rows (eps matters), an all-zero row (exact zeros)."""
    n = 33
    x_full = make_rows(n, hidden_size + 5, dtype)
    x = x_full[:, 3 : 3 + hidden_size]
    w = make_weight(hidden_size, dtype)
    assert_hf_matches(rmsnorm_hf(x, w), x, w, 1e-6)
    storage = torch.empty(n * hidden_size + 1, dtype=dtype, device="cuda")
    y = storage[1:].view(n, hidden_size)
    y.copy_(make_rows(n, hidden_size, dtype, scale=1e-2))
    y[5].zero_()
    expected_in = y.clone()
    assert rmsnorm_hf(y, w, 1e-5, out=y) is y
    assert_hf_matches(y, expected_in, w, 1e-5)
    assert torch.equal(y[5], torch.zeros_like(y[5]))
    z = make_rows(3 * 11, hidden_size, dtype).view(3, 11, hidden_size)
    assert_hf_matches(rmsnorm_hf(z, w), z, w, 1e-6)


@requires_cuda
@pytest.mark.parametrize("shape", [(0, 4096), (0, 3, 64), (5, 0)])
def test_rmsnorm_hf_empty(shape):
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    w = torch.empty(shape[-1], dtype=torch.bfloat16, device="cuda")
    out = rmsnorm_hf(x, w)
    assert out.shape == x.shape


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_qknorm_head_dim_argument(dtype):
    """head_dim=0 (default) and head_dim=q.shape[-1] give the same result as leaving it out."""
    q, k, v, _ = qkv_views(129, 16, 4, 96, dtype)
    qw, kw = make_weight(96, dtype), make_weight(96, dtype)
    expected_q, expected_k, v_before = ref_rmsnorm(q, qw, 1e-6), ref_rmsnorm(k, kw, 1e-6), v.clone()
    start_q, start_k = q.clone(), k.clone()
    for head_dim in (0, 96):
        q.copy_(start_q)
        k.copy_(start_k)
        assert fused_inplace_qknorm(q, k, qw, kw, 1e-6, head_dim=head_dim) is None
        assert_within_ulps(q, expected_q)
        assert_within_ulps(k, expected_k)
    assert torch.equal(v, v_before)


# ---------------------------------------------------------------------------------------------
# fused_inplace_qknorm_across_heads
# ---------------------------------------------------------------------------------------------
# (hidden_q, hidden_k): GQA shapes (k shorter than q, and longer), awkward sizes, rows whose
# threads per row is not a power of two (1536 -> 96 x 2 per row, k fitted into 96- and 8-thread
# rows), two-pass rows (16384 bf16 / fp16: 256 threads, chunks), one tensor with empty rows.
ACROSS_SIZES = get_ci_test_range(
    full_range=[
        (4096, 1024),
        (1024, 4096),
        (1, 1),
        (7, 129),
        (129, 7),
        (4097, 4096),
        (128, 128),
        (1536, 1024),
        (1536, 256),
        (8192, 512),
        (5120, 640),
        (16384, 1024),
        (576, 64),
        (4096, 0),
        (0, 1024),
    ],
    ci_range=[
        (4096, 1024),
        (1024, 4096),
        (1, 1),
        (7, 129),
        (4097, 4096),
        (1536, 1024),
        (1536, 256),
        (16384, 1024),
        (4096, 0),
    ],
)
ACROSS_GRID = [
    (dtype, NUM_TOKENS[(i + j) % len(NUM_TOKENS)], hq, hk)
    for j, dtype in enumerate(FLOAT_DTYPES)
    for i, (hq, hk) in enumerate(ACROSS_SIZES)
]


def across_views(num_tokens: int, hidden_q: int, hidden_k: int, dtype: torch.dtype, offset: int = 0, pad: int = 0):
    """q [num_tokens, hidden_q] and k [num_tokens, hidden_k] as views of a fused qkv buffer
    [num_tokens, hidden_q + 2 * hidden_k + pad] stored ``offset`` elements into its storage (v and the
    padding columns after k), plus the v-and-padding view and the buffer."""
    width = hidden_q + 2 * hidden_k + pad
    storage = torch.randn(num_tokens * width + offset, device="cuda").to(dtype)
    qkv = storage[offset:].view(num_tokens, width)
    return qkv[:, :hidden_q], qkv[:, hidden_q : hidden_q + hidden_k], qkv[:, hidden_q + hidden_k :], qkv


def check_across_heads(
    q: torch.Tensor, k: torch.Tensor, untouched: torch.Tensor | None = None, eps: float = 1e-6, **kwargs
) -> None:
    """fused_inplace_qknorm_across_heads on q, k against the fp32 reference (testing.TOLERANCE);
    ``untouched`` (v, padding, poison) must not change."""
    qw, kw = make_weight(q.shape[1], q.dtype), make_weight(k.shape[1], q.dtype)
    expected_q, expected_k = ref_rmsnorm(q, qw, eps), ref_rmsnorm(k, kw, eps)
    before = None if untouched is None else untouched.clone()
    assert fused_inplace_qknorm_across_heads(q, k, qw, kw, eps, **kwargs) is None
    assert_close(q, expected_q)
    assert_close(k, expected_k)
    if before is not None:
        torch.testing.assert_close(untouched, before, rtol=0, atol=0, equal_nan=True)


@requires_cuda
@pytest.mark.parametrize("dtype,num_tokens,hidden_q,hidden_k", ACROSS_GRID)
def test_qknorm_across_heads_fused_qkv(dtype, num_tokens, hidden_q, hidden_k):
    """q and k as token-strided views of one qkv buffer (v untouched), then as separate
    contiguous tensors."""
    q, k, v, _ = across_views(num_tokens, hidden_q, hidden_k, dtype)
    check_across_heads(q, k, v)
    check_across_heads(make_rows(num_tokens, hidden_q, dtype), make_rows(num_tokens, hidden_k, dtype))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset,pad", [(1, 0), (2, 6), (4, 64), (0, 3)])
@pytest.mark.parametrize("hidden_q,hidden_k", [(4096, 1024), (129, 7), (1536, 256)])
def test_qknorm_across_heads_unaligned_and_padded(dtype, offset, pad, hidden_q, hidden_k):
    """A qkv buffer at a storage offset and with padded rows (narrower vectors; padding poisoned):
    right values, nothing outside q and k written."""
    q, k, rest, qkv = across_views(129, hidden_q, hidden_k, dtype, offset=offset, pad=pad)
    if pad:
        qkv[:, -pad:] = float("nan")
    check_across_heads(q, k, rest)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_qknorm_across_heads_poisoned_surroundings(dtype):
    """q and k as column windows of wider poisoned buffers with their own token strides."""
    n, hq, hk = 65, 1024, 256
    qbuf = poisoned((n, hq + 9), dtype)
    kbuf = poisoned((n, hk + 4), dtype)
    q, k = qbuf[:, 3 : 3 + hq], kbuf[:, 1 : 1 + hk]
    q.copy_(make_rows(n, hq, dtype))
    k.copy_(make_rows(n, hk, dtype))
    check_across_heads(q, k)
    assert_outside_untouched(qbuf, 3, hq)
    assert_outside_untouched(kbuf, 1, hk)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("eps", EPS)
def test_qknorm_across_heads_eps_and_zero_row(dtype, eps):
    """Small rows (eps matters), an all-zero q row and k row: exact zeros, no NaN."""
    q, k, v, _ = across_views(17, 2048, 512, dtype)
    q.mul_(1e-2)
    k.mul_(1e-2)
    q[3].zero_()
    k[4].zero_()
    check_across_heads(q, k, v, eps=eps)
    assert torch.equal(q[3], torch.zeros_like(q[3])) and torch.equal(k[4], torch.zeros_like(k[4]))


@requires_cuda
@pytest.mark.parametrize("num_tokens,hidden_q,hidden_k", [(0, 4096, 1024), (7, 0, 0), (7, 0, 128), (0, 0, 0)])
def test_qknorm_across_heads_empty(num_tokens, hidden_q, hidden_k):
    q, k, v, _ = across_views(num_tokens, hidden_q, hidden_k, torch.bfloat16)
    check_across_heads(q, k, v)


@requires_cuda
@pytest.mark.parametrize("enable_pdl", [None, True, False])
def test_qknorm_across_heads_pdl_and_back_to_back(enable_pdl):
    """Chained launches (each reads what the previous one wrote): the same bits with PDL on or off."""
    q, k, _, qkv = across_views(4097, 4096, 1024, torch.bfloat16)
    qw, kw = make_weight(4096, torch.bfloat16), make_weight(1024, torch.bfloat16)
    start = qkv.clone()
    fused_inplace_qknorm_across_heads(q, k, qw, kw, enable_pdl=False)
    fused_inplace_qknorm_across_heads(q, k, qw, kw, enable_pdl=False)
    reference = qkv.clone()
    qkv.copy_(start)
    for _ in range(2):
        fused_inplace_qknorm_across_heads(q, k, qw, kw, enable_pdl=enable_pdl)
    assert torch.equal(qkv, reference)


@requires_cuda
def test_qknorm_across_heads_decode_no_slower_path():
    """At decode sizes q and k of one token run in one launch: the profiler sees one kernel."""
    q, k, _, _ = across_views(1, 4096, 1024, torch.bfloat16)
    qw, kw = make_weight(4096, torch.bfloat16), make_weight(1024, torch.bfloat16)
    fused_inplace_qknorm_across_heads(q, k, qw, kw)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fused_inplace_qknorm_across_heads(q, k, qw, kw)
        torch.cuda.synchronize()
    cuda_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not cuda_events:  # CUPTI cannot trace here (e.g. under compute-sanitizer): nothing to count
        pytest.skip("the profiler recorded no CUDA events (CUPTI unavailable, e.g. under compute-sanitizer)")
    kernels = [e for e in cuda_events if "norm_rows_kernel" in e.name]
    assert len(kernels) == 1, [e.name for e in kernels]


@requires_cuda
def test_qknorm_across_heads_more_than_2_pow_31_elements():
    """64-bit offsets: q of 524291 rows x 4096 bf16 (2^31 + 12288 elements) and k x 1024, in one
    qkv buffer; the last rows checked."""
    n, hq, hk = (1 << 31) // 4096 + 3, 4096, 1024
    free, _ = torch.cuda.mem_get_info()
    need = n * (hq + 2 * hk) * 2 + (1 << 30)
    if free < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB free GPU memory, {free / 2**30:.0f} GiB free")
    qkv = torch.empty(n, hq + 2 * hk, dtype=torch.bfloat16, device="cuda").uniform_(-2, 2)
    q, k = qkv[:, :hq], qkv[:, hq : hq + hk]
    qw, kw = make_weight(hq, torch.bfloat16), make_weight(hk, torch.bfloat16)
    tail_q, tail_k, tail_v = q[-64:].clone(), k[-64:].clone(), qkv[-64:, hq + hk :].clone()
    fused_inplace_qknorm_across_heads(q, k, qw, kw)
    assert_close(q[-64:], ref_rmsnorm(tail_q, qw, 1e-6))
    assert_close(k[-64:], ref_rmsnorm(tail_k, kw, 1e-6))
    assert torch.equal(qkv[-64:, hq + hk :], tail_v)
    del qkv, q, k
    torch.cuda.empty_cache()


@requires_cuda
def test_qknorm_across_heads_aliasing_rejected():
    """k overlapping q, q or k sharing memory with a weight: RuntimeError from the launcher before
    any launch, the buffer unchanged."""
    b = make_rows(4, 1024, torch.bfloat16)
    before = b.clone()
    w = make_weight(512, torch.bfloat16)
    with pytest.raises(
        RuntimeError,
        match=r"^fused_inplace_qknorm(_across_heads)?: k overlaps q: expected disjoint memory, got a partial overlap \(k \[0x",
    ):
        fused_inplace_qknorm_across_heads(b[:, :512], b[:, 256:768], w, w)
    with pytest.raises(
        RuntimeError, match=r"k overlaps q: expected disjoint memory, got (the same tensor|a partial overlap) \(k \[0x"
    ):
        fused_inplace_qknorm_across_heads(b[:, :512], b[:, :512], w, w)
    with pytest.raises(RuntimeError, match=r"q overlaps q_weight: expected disjoint memory, got a partial overlap"):
        fused_inplace_qknorm_across_heads(b[:2, :512], b[2:, :512], b[1, :512], w)
    with pytest.raises(RuntimeError, match=r"k overlaps k_weight: expected disjoint memory, got a partial overlap"):
        fused_inplace_qknorm_across_heads(b[:2, :512], b[2:, :512], w, b[3, 256:768])
    with pytest.raises(
        RuntimeError,
        match=r"k strides: expected no dim of size > 1 with stride 0 .*, got dim 0 of size \d+ with stride 0",
    ):
        fused_inplace_qknorm_across_heads(b[:, :512], b[:1, 512:].clone().expand(4, 512), w, w)
    assert torch.equal(b, before)


@requires_cuda
@pytest.mark.parametrize("loaded", [True, False])
def test_qknorm_across_heads_bad_arguments(loaded, monkeypatch):
    import sglang.jit_kernel.norm as norm

    op = "fused_inplace_qknorm_across_heads"
    q, k, _, _ = across_views(4, 512, 128, torch.bfloat16)
    qw, kw = make_weight(512, torch.bfloat16), make_weight(128, torch.bfloat16)
    fused_inplace_qknorm_across_heads(q, k, qw, kw)  # load the module
    if not loaded:
        monkeypatch.setattr(norm, "_QKNORM_ACROSS_HEADS_FNS", {})
    with raises(RuntimeError, f"{op}: q dtype: expected one of float16, bfloat16, float32, got int32"):
        fused_inplace_qknorm_across_heads(q.to(torch.int32), k, qw, kw)
    with raises(RuntimeError, f"{op}: k dtype: expected bfloat16 (the dtype of q), got float16"):
        fused_inplace_qknorm_across_heads(q, k.half(), qw, kw)
    with raises(RuntimeError, f"{op}: q shape: expected [num_tokens, hidden_q], got (4, 8, 64)"):
        fused_inplace_qknorm_across_heads(q.reshape(4, 8, 64), k, qw, kw)
    with raises(RuntimeError, f"{op}: k shape: expected [num_tokens=4, hidden_k], got (3, 128)"):
        fused_inplace_qknorm_across_heads(q, k[:3], qw, kw)
    with raises(RuntimeError, f"{op}: q_weight shape: expected [hidden_q=512], got (128,)"):
        fused_inplace_qknorm_across_heads(q, k, kw, kw)
    with raises(RuntimeError, f"{op}: k_weight shape: expected [hidden_k=128], got (512,)"):
        fused_inplace_qknorm_across_heads(q, k, qw, qw)
    with raises(RuntimeError, f"{op}: k_weight layout: expected contiguous, got shape (128,) with strides (2,)"):
        fused_inplace_qknorm_across_heads(q, k, qw, make_weight(256, torch.bfloat16)[::2])
    with raises(RuntimeError, f"{op}: q_weight device: expected a CUDA device, got cpu"):
        fused_inplace_qknorm_across_heads(q, k, qw.cpu(), kw)
    with raises(
        RuntimeError,
        f"{op}: k last-dim stride: expected 1 (a contiguous last dim), got 2 (shape (4, 128) with strides (256, 2))",
    ):
        fused_inplace_qknorm_across_heads(q, make_rows(4, 256, torch.bfloat16)[:, ::2], qw, kw)
    with raises(ValueError, f"{op}: eps value: expected >= 0.0, got -1.0"):
        fused_inplace_qknorm_across_heads(q, k, qw, kw, -1.0)


# ---------------------------------------------------------------------------------------------
# CUDA graphs, torch.compile, streams, devices
# ---------------------------------------------------------------------------------------------
@requires_cuda
def test_norm_cuda_graph_capture_and_replay():
    dtype, n, h = torch.bfloat16, 64, 4096
    x, r, w = make_rows(n, h, dtype), make_rows(n, h, dtype), make_weight(h, dtype)
    out = poisoned((n, h), dtype)
    q, k, _, qkv = qkv_views(n, 32, 8, 128, dtype)
    qw, kw = make_weight(128, dtype), make_weight(128, dtype)
    q2, k2, _, qkv2 = across_views(n, 4096, 1024, dtype)
    qw2, kw2 = make_weight(4096, dtype), make_weight(1024, dtype)
    out_hf = poisoned((n, h), dtype)
    # load outside capture
    rmsnorm(x, w, out=out)
    fused_add_rmsnorm(x.clone(), r.clone(), w)
    fused_inplace_qknorm(q.clone(), k.clone(), qw, kw)
    fused_inplace_qknorm_across_heads(q2.clone(), k2.clone(), qw2, kw2)
    xg, rg = x.clone(), r.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rmsnorm(x, w, out=out)
        rmsnorm_hf(x, w, out=out_hf)
        fused_add_rmsnorm(xg, rg, w)
        fused_inplace_qknorm(q, k, qw, kw, head_dim=128)
        fused_inplace_qknorm_across_heads(q2, k2, qw2, kw2)
    for _ in range(2):
        x.copy_(make_rows(n, h, dtype))
        xg.copy_(make_rows(n, h, dtype))
        rg.copy_(make_rows(n, h, dtype))
        qkv.copy_(torch.randn_like(qkv))
        qkv2.copy_(torch.randn_like(qkv2))
        out.fill_(float("nan"))
        out_hf.fill_(float("nan"))
        expected = ref_rmsnorm(x, w, 1e-6)
        expected_fused, expected_residual = ref_fused(xg, rg, w, 1e-6)
        expected_q, expected_k = ref_rmsnorm(q, qw, 1e-6), ref_rmsnorm(k, kw, 1e-6)
        expected_q2, expected_k2 = ref_rmsnorm(q2, qw2, 1e-6), ref_rmsnorm(k2, kw2, 1e-6)
        x_before = x.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert_within_ulps(out, expected)
        assert_hf_matches(out_hf, x_before, w, 1e-6)
        assert_close(q2, expected_q2)
        assert_close(k2, expected_k2)
        assert torch.equal(rg, expected_residual)
        assert_within_ulps(xg, expected_fused)
        assert_within_ulps(q, expected_q)
        assert_within_ulps(k, expected_k)


@requires_cuda
def test_norm_torch_compile_fullgraph():
    torch._dynamo.reset()
    dtype, n, h = torch.bfloat16, 37, 1024

    def f(x, r, w):
        y = rmsnorm(x + 1, w) * 2
        g = gemma_rmsnorm(x, w, 1e-5)
        hf = rmsnorm_hf(x, w)
        a = x * 1
        fused_add_rmsnorm(a, r, w)
        return y, g, hf, a, r

    compiled = torch.compile(f, fullgraph=True)
    x, r, w = make_rows(n, h, dtype), make_rows(n, h, dtype), make_weight(h, dtype)
    y, g, hf, a, r_out = compiled(x, r.clone(), w)
    assert_within_ulps(y, (ref_rmsnorm(x + 1, w, 1e-6).float() * 2).to(dtype))
    assert_within_ulps(g, ref_rmsnorm(x, w, 1e-5, 1.0))
    assert_hf_matches(hf, x, w, 1e-6)
    expected, expected_residual = ref_fused(x, r, w, 1e-6)
    assert torch.equal(r_out, expected_residual)
    assert_within_ulps(a, expected)

    def qk(qkv, qw, kw):
        qkv = qkv * 1
        q = qkv[:, : 4 * 128].view(-1, 4, 128)
        k = qkv[:, 4 * 128 : 6 * 128].view(-1, 2, 128)
        fused_inplace_qknorm(q, k, qw, kw, head_dim=128)
        return qkv

    q, k, v, qkv = qkv_views(19, 4, 2, 128, dtype)
    qw, kw = make_weight(128, dtype), make_weight(128, dtype)
    result = torch.compile(qk, fullgraph=True)(qkv, qw, kw)
    assert_within_ulps(result[:, : 4 * 128].view(-1, 4, 128), ref_rmsnorm(q, qw, 1e-6))
    assert_within_ulps(result[:, 4 * 128 : 6 * 128].view(-1, 2, 128), ref_rmsnorm(k, kw, 1e-6))
    assert torch.equal(result[:, 6 * 128 :], v)

    def across(qkv, qw, kw):
        qkv = qkv * 1
        fused_inplace_qknorm_across_heads(qkv[:, :512], qkv[:, 512:640], qw, kw)
        return qkv

    q2, k2, v2, qkv2 = across_views(19, 512, 128, dtype)
    qw2, kw2 = make_weight(512, dtype), make_weight(128, dtype)
    result = torch.compile(across, fullgraph=True)(qkv2, qw2, kw2)
    assert_close(result[:, :512], ref_rmsnorm(q2, qw2, 1e-6))
    assert_close(result[:, 512:640], ref_rmsnorm(k2, kw2, 1e-6))
    assert torch.equal(result[:, 640:], v2)


@requires_cuda
def test_norm_on_side_stream():
    x, w = make_rows(4097, 2048, torch.float16), make_weight(2048, torch.float16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = rmsnorm(x, w)
    stream.synchronize()
    assert_within_ulps(out, ref_rmsnorm(x, w, 1e-6))


@requires_two_gpus
def test_norm_on_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    x = torch.randn(129, 4096, device="cuda:1").to(torch.bfloat16)
    w = (torch.rand(4096, device="cuda:1") + 0.5).to(torch.bfloat16)
    out = rmsnorm(x, w)
    assert out.device == x.device
    # compare on the CPU: torch.ldexp (in ulp_of) faults on cuda:1 tensors while cuda:0 is current
    assert_within_ulps(out.cpu(), ref_rmsnorm(x, w, 1e-6).cpu())
    q = torch.randn(3, 8, 128, device="cuda:1").to(torch.bfloat16)
    k = torch.randn(3, 2, 128, device="cuda:1").to(torch.bfloat16)
    qw = w[:128].contiguous()
    expected_q, expected_k = ref_rmsnorm(q, qw, 1e-6), ref_rmsnorm(k, qw, 1e-6)
    fused_inplace_qknorm(q, k, qw, qw)
    assert_within_ulps(q.cpu(), expected_q.cpu())
    assert_within_ulps(k.cpu(), expected_k.cpu())
    with raises(RuntimeError, "rmsnorm: weight device: expected cuda:1 (the device of input), got cuda:0"):
        rmsnorm(x, w.to("cuda:0"))
    q2, k2 = (
        torch.randn(3, 512, device="cuda:1").to(torch.bfloat16),
        torch.randn(3, 128, device="cuda:1").to(torch.bfloat16),
    )
    expected_q, expected_k = ref_rmsnorm(q2, w[:512], 1e-6), ref_rmsnorm(k2, qw, 1e-6)
    fused_inplace_qknorm_across_heads(q2, k2, w[:512].contiguous(), qw)
    assert_close(q2.cpu(), expected_q.cpu())
    assert_close(k2.cpu(), expected_k.cpu())


# ---------------------------------------------------------------------------------------------
# Errors (raised before any launch). The CPU-tensor ones need no GPU and no compiler.
# ---------------------------------------------------------------------------------------------
def raises(error: type[Exception], message: str):
    """pytest.raises for exactly ``message`` (the whole text, matched literally)."""
    return pytest.raises(error, match=f"^{re.escape(message)}$")


def test_norm_cpu_tensors_rejected():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    for name, call in (
        ("rmsnorm", lambda: rmsnorm(x, w)),
        ("rmsnorm_hf", lambda: rmsnorm_hf(x, w)),
        ("gemma_rmsnorm", lambda: gemma_rmsnorm(x, w)),
        ("fused_add_rmsnorm", lambda: fused_add_rmsnorm(x, x.clone(), w)),
        ("gemma_fused_add_rmsnorm", lambda: gemma_fused_add_rmsnorm(x, x.clone(), w)),
    ):
        with raises(RuntimeError, f"{name}: input device: expected a CUDA device, got cpu"):
            call()
    q = torch.randn(4, 8, 64, dtype=torch.bfloat16)
    with raises(RuntimeError, "fused_inplace_qknorm: q device: expected a CUDA device, got cpu"):
        fused_inplace_qknorm(q, q[:, :2], w, w)
    with raises(RuntimeError, "fused_inplace_qknorm_across_heads: q device: expected a CUDA device, got cpu"):
        fused_inplace_qknorm_across_heads(x, x[:, :8], w, w[:8])


@pytest.mark.parametrize(
    "eps,error,what",
    [
        ("1e-6", TypeError, "type: expected a real number (int or float), got str"),
        (None, TypeError, "type: expected a real number (int or float), got NoneType"),
        (-1.0, ValueError, "value: expected >= 0.0, got -1.0"),
        (float("nan"), ValueError, "value: expected >= 0.0, got nan"),
    ],
)
def test_norm_bad_eps_named(eps, error, what):
    """Scalar arguments are checked before tensors and named (runs without a GPU)."""
    x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    for op, call in (
        ("rmsnorm", lambda: rmsnorm(x, w, eps)),
        ("rmsnorm_hf", lambda: rmsnorm_hf(x, w, eps)),
        ("gemma_rmsnorm", lambda: gemma_rmsnorm(x, w, eps)),
        ("fused_add_rmsnorm", lambda: fused_add_rmsnorm(x, x.clone(), w, eps)),
        ("fused_inplace_qknorm", lambda: fused_inplace_qknorm(x.view(4, 1, 64), x.clone().view(4, 1, 64), w, w, eps)),
        ("fused_inplace_qknorm_across_heads", lambda: fused_inplace_qknorm_across_heads(x, x.clone(), w, w, eps)),
    ):
        with raises(error, f"{op}: eps {what}"):
            call()


def test_norm_bad_flags_named():
    """enable_pdl, cast_x_before_out_mul and head_dim: TypeError naming the argument, before any
    tensor is looked at (runs without a GPU)."""
    x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    with raises(TypeError, "rmsnorm: enable_pdl type: expected a bool or None, got str"):
        rmsnorm(x, w, enable_pdl="no")
    with raises(TypeError, "rmsnorm_hf: enable_pdl type: expected a bool or None, got int"):
        rmsnorm_hf(x, w, enable_pdl=1)
    with raises(TypeError, "rmsnorm: cast_x_before_out_mul type: expected a bool, got str"):
        rmsnorm(x, w, cast_x_before_out_mul="yes")
    with raises(TypeError, "fused_add_rmsnorm: enable_pdl type: expected a bool or None, got int"):
        fused_add_rmsnorm(x, x.clone(), w, enable_pdl=0)
    q = x.view(4, 1, 64)
    for head_dim, got in (("64", "str"), (64.0, "float"), (True, "bool"), (None, "NoneType")):
        with raises(TypeError, f"fused_inplace_qknorm: head_dim type: expected an int, got {got}"):
            fused_inplace_qknorm(q, q.clone(), w, w, head_dim=head_dim)
    with raises(TypeError, "fused_inplace_qknorm: enable_pdl type: expected a bool or None, got str"):
        fused_inplace_qknorm(q, q.clone(), w, w, enable_pdl="auto")
    with raises(TypeError, "fused_inplace_qknorm_across_heads: enable_pdl type: expected a bool or None, got int"):
        fused_inplace_qknorm_across_heads(x, x.clone(), w, w, enable_pdl=1)


def test_rmsnorm_hf_module_path():
    """sglang.jit_kernel.rmsnorm_hf, the original package's module path, exports the op and its
    support query (the same functions as norm's), and registers rmsnorm_hf on rmsnorm's module."""
    import sglang.jit_kernel.rmsnorm_hf as hf_module
    from sglang.jit_kernel.registry import all_ops

    assert hf_module.rmsnorm_hf is rmsnorm_hf
    assert hf_module.is_supported_rmsnorm_hf_hidden_size is is_supported_rmsnorm_hf_hidden_size
    assert hf_module.is_supported_rmsnorm_hf_hidden_size(4096) and not hf_module.is_supported_rmsnorm_hf_hidden_size(0)
    ops = all_ops()
    assert ops["rmsnorm_hf"].source == "sglang.jit_kernel.rmsnorm_hf"
    assert ops["rmsnorm_hf"].module is ops["rmsnorm"].module


def test_norm_support_queries():
    """can_use_fused_inplace_qknorm / is_supported_rmsnorm_hf_hidden_size: every size the kernels
    take, for every dtype they take; nothing else (runs without a GPU)."""
    for head_dim in (1, 7, 64, 80, 96, 128, 192, 256, 576, 4096, (1 << 30) - 1):
        for dtype in FLOAT_DTYPES:
            assert can_use_fused_inplace_qknorm(head_dim, dtype)
    for head_dim, dtype in (
        (0, torch.bfloat16),
        (-128, torch.bfloat16),
        (1 << 30, torch.bfloat16),
        (128.0, torch.bfloat16),
        (True, torch.bfloat16),
        (128, torch.int32),
        (128, torch.float64),
        (128, torch.float8_e4m3fn),
    ):
        assert not can_use_fused_inplace_qknorm(head_dim, dtype), (head_dim, dtype)
    for hidden_size in (1, 7, 129, 4096, 4097, 5120, 65536, (1 << 30) - 1):
        assert is_supported_rmsnorm_hf_hidden_size(hidden_size)
    for hidden_size in (0, -1, 1 << 30, 4096.0, True, "4096", None):
        assert not is_supported_rmsnorm_hf_hidden_size(hidden_size), hidden_size


def test_fused_add_rmsnorm_support_query():
    """is_supported_jit_fused_add_rmsnorm_hidden_size: True for every size the launcher takes
    (1 <= hidden_size < 2^30, vectorised or not), False otherwise, never raising (runs without a GPU)."""
    for hidden_size in (1, 2, 7, 129, 4096, 4097, 5120, 65536, (1 << 30) - 1):
        assert is_supported_jit_fused_add_rmsnorm_hidden_size(hidden_size) is True, hidden_size
    for hidden_size in (0, -1, -4096, 1 << 30, 1 << 40, 4096.0, True, False, "4096", None, torch.tensor(4096)):
        assert is_supported_jit_fused_add_rmsnorm_hidden_size(hidden_size) is False, hidden_size


@requires_cuda
def test_norm_aliasing_rejected():
    x = make_rows(8, 256, torch.bfloat16)
    w = make_weight(256, torch.bfloat16)
    buffer = make_rows(9, 256, torch.bfloat16)
    with pytest.raises(
        RuntimeError,
        match=r"^rmsnorm: out overlaps input: expected disjoint memory or the same tensor, got a partial overlap \(out \[0x[0-9a-f]+, 0x[0-9a-f]+\), input \[0x",
    ):
        rmsnorm(buffer[:-1], w, out=buffer[1:])
    with pytest.raises(
        RuntimeError,
        match=r"^fused_add_rmsnorm: residual overlaps input: expected disjoint memory, got the same tensor",
    ):
        fused_add_rmsnorm(x, x, w)
    with pytest.raises(
        RuntimeError, match=r"^fused_add_rmsnorm: residual strides: expected no dim of size > 1 with stride 0"
    ):
        fused_add_rmsnorm(x, x[:1].clone().expand(8, 256), w)
    q = make_rows(4 * 2, 128, torch.bfloat16).view(4, 2, 128)
    with pytest.raises(
        RuntimeError, match=r"k overlaps q: expected disjoint memory, got (the same tensor|a partial overlap) \(k \[0x"
    ):
        fused_inplace_qknorm(q, q, w[:128].contiguous(), w[:128].contiguous())


@requires_cuda
def test_norm_outputs_overlapping_weight_rejected():
    """Other rows still read the weight while an op writes its outputs, so an output sharing memory
    with a weight would change the answer: refused before any launch, naming both tensors, every
    buffer unchanged."""
    buffer = make_rows(3, 256, torch.bfloat16)
    before = buffer.clone()
    x, w = buffer[:2], buffer[2]
    with pytest.raises(RuntimeError, match=r"out overlaps weight: expected disjoint memory, got a partial overlap"):
        rmsnorm(buffer[2:].clone(), w, out=buffer[2:])
    with pytest.raises(RuntimeError, match=r"out overlaps weight: expected disjoint memory, got a partial overlap"):
        gemma_rmsnorm(buffer[1:2].clone(), buffer[1], out=buffer[1:2])
    with pytest.raises(
        RuntimeError,
        match=r"^fused_add_rmsnorm: input overlaps weight: expected disjoint memory, got a partial overlap",
    ):
        fused_add_rmsnorm(buffer[1:], make_rows(2, 256, torch.bfloat16), w)
    with pytest.raises(
        RuntimeError,
        match=r"^fused_add_rmsnorm: residual overlaps weight: expected disjoint memory, got a partial overlap",
    ):
        fused_add_rmsnorm(x.clone(), buffer[1:], w)
    qkv = make_rows(4, 3 * 128, torch.bfloat16).view(4, 3, 128)
    qkv_before = qkv.clone()
    q, k = qkv[:, 0:2], qkv[:, 2:3]
    other = make_weight(128, torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"q overlaps q_weight: expected disjoint memory, got a partial overlap"):
        fused_inplace_qknorm(q, k, qkv[1, 1], other)
    with pytest.raises(RuntimeError, match=r"k overlaps k_weight: expected disjoint memory, got a partial overlap"):
        fused_inplace_qknorm(q, k, other, qkv[3, 2])
    assert torch.equal(buffer, before)
    assert torch.equal(qkv, qkv_before)


@requires_cuda
def test_qknorm_overlapping_heads_rejected():
    """k = b[:, 3:5] with q = b[:, 0:4] (k's head 0 is q's head 3), and q whose heads overlap each
    other (head stride head_dim // 2): refused before any launch, the buffer unchanged."""
    b = make_rows(5 * 6, 128, torch.bfloat16).view(5, 6, 128)
    before = b.clone()
    w = make_weight(128, torch.bfloat16)
    with pytest.raises(
        RuntimeError,
        match=r"^fused_inplace_qknorm(_across_heads)?: k overlaps q: expected disjoint memory, got a partial overlap \(k \[0x",
    ):
        fused_inplace_qknorm(b[:, 0:4], b[:, 3:5], w, w)
    q = b.as_strided((5, 4, 128), (6 * 128, 64, 1))
    with pytest.raises(
        RuntimeError,
        match=r"^fused_inplace_qknorm: q strides: expected elements at addresses of their own .*, got dim 1 stride 64 < extent 128",
    ):
        fused_inplace_qknorm(q, b[:, 5:6], w, w)
    assert torch.equal(b, before)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["fused_padded", "head_major"])
def test_qknorm_interleaved_layouts_accepted(dtype, layout):
    """q and k interleaved in one buffer without sharing an element pass the overlap check: a fused
    qkv buffer with padded rows (token stride > (Hq + 2 Hk) * D, padding poisoned), and head-major
    views buf[heads].transpose(0, 1) (token stride D, head stride num_tokens * D); v untouched."""
    n, hq, hk, d = 33, 8, 2, 128
    if layout == "fused_padded":
        width = (hq + 2 * hk) * d
        buffer = poisoned((n, width + 64), dtype)
        buffer[:, :width] = torch.randn(n, width, device="cuda").to(dtype)
        q = buffer[:, : hq * d].view(n, hq, d)
        k = buffer[:, hq * d : (hq + hk) * d].view(n, hk, d)
        v = buffer[:, (hq + hk) * d :]  # v and the padding
    else:
        buffer = torch.randn(hq + 2 * hk, n, d, device="cuda").to(dtype)
        q = buffer[:hq].transpose(0, 1)
        k = buffer[hq : hq + hk].transpose(0, 1)
        v = buffer[hq + hk :]
    qw, kw = make_weight(d, dtype), make_weight(d, dtype)
    expected_q, expected_k, v_before = ref_rmsnorm(q, qw, 1e-6), ref_rmsnorm(k, kw, 1e-6), v.clone()
    fused_inplace_qknorm(q, k, qw, kw)
    assert_within_ulps(q, expected_q)
    assert_within_ulps(k, expected_k)
    torch.testing.assert_close(v, v_before, rtol=0, atol=0, equal_nan=True)  # NaN padding stays NaN


def test_norm_not_a_tensor():
    with raises(TypeError, "rmsnorm: input type: expected a torch.Tensor, got list"):
        rmsnorm([1.0, 2.0], torch.ones(2))
    with raises(TypeError, "rmsnorm_hf: input type: expected a torch.Tensor, got list"):
        rmsnorm_hf([1.0, 2.0], torch.ones(2))
    with raises(TypeError, "fused_add_rmsnorm: input type: expected a torch.Tensor, got NoneType"):
        fused_add_rmsnorm(None, None, None)
    with raises(TypeError, "fused_inplace_qknorm: q type: expected a torch.Tensor, got NoneType"):
        fused_inplace_qknorm(None, None, None, None)
    with raises(TypeError, "fused_inplace_qknorm_across_heads: q type: expected a torch.Tensor, got NoneType"):
        fused_inplace_qknorm_across_heads(None, None, None, None)


# The eager fast path (an input of a loaded dtype) lets the launcher's TensorMatcher refuse, then
# runs the checked path, whose Python checks explain the refusal: the messages are the same whether
# the module is loaded (fast path first) or not (checked path only).
@requires_cuda
@pytest.mark.parametrize("loaded", [True, False])
def test_norm_bad_arguments(loaded, monkeypatch):
    import sglang.jit_kernel.norm as norm

    x = make_rows(4, 64, torch.bfloat16)
    w = make_weight(64, torch.bfloat16)
    rmsnorm(x, w)  # load the module
    if not loaded:  # force the checked (Python) path
        monkeypatch.setattr(norm, "_RMSNORM_FNS", {})
        monkeypatch.setattr(norm, "_FUSED_ADD_RMSNORM_FNS", {})
    for op, fn in (("rmsnorm", rmsnorm), ("rmsnorm_hf", rmsnorm_hf), ("gemma_rmsnorm", gemma_rmsnorm)):
        with raises(RuntimeError, f"{op}: input dtype: expected one of float16, bfloat16, float32, got int32"):
            fn(x.to(torch.int32), w)
        with raises(RuntimeError, f"{op}: weight dtype: expected bfloat16 (the dtype of input), got float16"):
            fn(x, w.half())
        with raises(RuntimeError, f"{op}: weight shape: expected [hidden_size=64], got (63,)"):
            fn(x, w[:63])
        with raises(RuntimeError, f"{op}: out shape: expected (4, 64) (the shape of input), got (4, 32)"):
            fn(x, w, out=torch.empty(4, 32, dtype=torch.bfloat16, device="cuda"))
    with raises(RuntimeError, "rmsnorm: weight device: expected a CUDA device, got cpu"):
        rmsnorm(x, w.cpu())
    with raises(RuntimeError, "rmsnorm: weight layout: expected contiguous, got shape (64,) with strides (2,)"):
        rmsnorm(x, make_weight(128, torch.bfloat16)[::2])
    with raises(
        RuntimeError,
        "rmsnorm: input last-dim stride: expected 1 (a contiguous last dim), "
        "got 2 (shape (4, 64) with strides (128, 2))",
    ):
        rmsnorm(make_rows(4, 128, torch.bfloat16)[:, ::2], w)
    with raises(RuntimeError, "rmsnorm: out dtype: expected bfloat16 (the dtype of input), got float32"):
        rmsnorm(x, w, out=torch.empty(4, 64, dtype=torch.float32, device="cuda"))
    with raises(
        RuntimeError,
        "rmsnorm_hf: out last-dim stride: expected 1 (a contiguous last dim), "
        "got 2 (shape (4, 64) with strides (128, 2))",
    ):
        rmsnorm_hf(x, w, out=torch.empty(4, 128, dtype=torch.bfloat16, device="cuda")[:, ::2])
    with raises(RuntimeError, "rmsnorm: out device: expected a CUDA device, got cpu"):
        rmsnorm(x, w, out=torch.empty(4, 64, dtype=torch.bfloat16))
    with raises(ValueError, "rmsnorm: eps value: expected >= 0.0, got -1.0"):
        rmsnorm(x, w, -1.0)
    with raises(RuntimeError, "fused_add_rmsnorm: residual dtype: expected bfloat16 (the dtype of input), got float16"):
        fused_add_rmsnorm(x, x.half(), w)
    with raises(RuntimeError, "fused_add_rmsnorm: residual shape: expected (4, 64) (the shape of input), got (3, 64)"):
        fused_add_rmsnorm(x, x[:3].clone(), w)
    with raises(RuntimeError, "gemma_fused_add_rmsnorm: residual device: expected a CUDA device, got cpu"):
        gemma_fused_add_rmsnorm(x, x.cpu(), w)
    with raises(RuntimeError, "fused_add_rmsnorm: weight shape: expected [hidden_size=64], got (64, 1)"):
        fused_add_rmsnorm(x, x.clone(), w[:, None])
    no_flat_view = torch.randn(4, 3, 64, device="cuda").to(torch.bfloat16).transpose(0, 1)  # [3, 4, 64]
    with raises(
        RuntimeError,
        "fused_add_rmsnorm: input layout: expected leading dims that flatten to "
        "[num_tokens, hidden_size] without a copy, got shape (3, 4, 64) with strides (64, 192, 1)",
    ):
        fused_add_rmsnorm(no_flat_view, no_flat_view.clone(), w)


@requires_cuda
@pytest.mark.parametrize("loaded", [True, False])
def test_qknorm_bad_arguments(loaded, monkeypatch):
    import sglang.jit_kernel.norm as norm

    op = "fused_inplace_qknorm"
    q, k, _, _ = qkv_views(4, 8, 2, 64, torch.bfloat16)
    w = make_weight(64, torch.bfloat16)
    fused_inplace_qknorm(q, k, w, w)  # load the module
    if not loaded:
        monkeypatch.setattr(norm, "_QKNORM_FNS", {})
    with raises(RuntimeError, f"{op}: k dtype: expected bfloat16 (the dtype of q), got float16"):
        fused_inplace_qknorm(q, k.half(), w, w)
    with raises(RuntimeError, f"{op}: q_weight dtype: expected bfloat16 (the dtype of q), got float32"):
        fused_inplace_qknorm(q, k, w.float(), w)
    with raises(RuntimeError, f"{op}: k_weight shape: expected [head_dim=64], got (32,)"):
        fused_inplace_qknorm(q, k, w, w[:32])
    with raises(RuntimeError, f"{op}: q shape: expected [num_tokens, num_q_heads, head_dim], got (4, 512)"):
        fused_inplace_qknorm(q.reshape(4, -1), k, w, w)
    with raises(RuntimeError, f"{op}: k shape: expected [num_tokens=4, num_kv_heads, head_dim=64], got (3, 2, 64)"):
        fused_inplace_qknorm(q, k[:3], w, w)
    q_bad = torch.randn(4, 64, 8, device="cuda").to(torch.bfloat16).transpose(1, 2)  # [4, 8, 64], last stride 8
    with raises(
        RuntimeError,
        f"{op}: q last-dim stride: expected 1 (a contiguous last dim), "
        "got 8 (shape (4, 8, 64) with strides (512, 1, 8))",
    ):
        fused_inplace_qknorm(q_bad, k, w, w)
    with raises(RuntimeError, f"{op}: k_weight device: expected a CUDA device, got cpu"):
        fused_inplace_qknorm(q, k, w, w.cpu())
    with raises(RuntimeError, f"{op}: q_weight layout: expected contiguous, got shape (64,) with strides (2,)"):
        fused_inplace_qknorm(q, k, make_weight(128, torch.bfloat16)[::2], w)
    with raises(ValueError, f"{op}: eps value: expected >= 0.0, got -1e-06"):
        fused_inplace_qknorm(q, k, w, w, -1e-6)
    for head_dim in (32, 128, -64, 1):
        with raises(ValueError, f"{op}: head_dim value: expected 0 or q.shape[-1] (64), got {head_dim}"):
            fused_inplace_qknorm(q, k, w, w, head_dim=head_dim)


@requires_cuda
def test_norm_launchers_reject_mismatch_from_cpp():
    """The C++ TensorMatcher is the second line: the module called directly with bad tensors
    raises RuntimeError naming the tensor, never a CUDA fault."""
    from sglang.jit_kernel.norm import _jit_fused_add_rmsnorm_module, _jit_qknorm_module, _jit_rmsnorm_module

    rms = _jit_rmsnorm_module(torch.bfloat16)
    fused = _jit_fused_add_rmsnorm_module(torch.bfloat16)
    module = _jit_qknorm_module(torch.bfloat16)
    x = make_rows(4, 64, torch.bfloat16)
    w = make_weight(64, torch.bfloat16)
    with pytest.raises(RuntimeError, match="weight"):
        rms.rmsnorm(torch.empty_like(x), x, w[:32], 1e-6, 0.0, False, -1)
    with pytest.raises(RuntimeError, match="out"):
        rms.rmsnorm(torch.empty(4, 64, device="cuda"), x, w, 1e-6, 0.0, False, -1)
    with pytest.raises(RuntimeError, match="residual"):
        fused.fused_add_rmsnorm(x, x[:3].clone(), w, 1e-6, 0.0, -1)
    q = torch.randn(4, 8, 64, device="cuda").to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="num_tokens"):
        module.fused_inplace_qknorm(q, q[:3, :2].clone(), w, w, 1e-6, -1)
    q2 = make_rows(4, 128, torch.bfloat16)
    with pytest.raises(RuntimeError, match="num_tokens"):
        module.fused_inplace_qknorm_across_heads(q2, q2[:3].clone(), w, w, 1e-6, -1)
    with pytest.raises(RuntimeError, match="k_weight"):
        module.fused_inplace_qknorm_across_heads(q2, q2.clone(), w.repeat(2), w[:32], 1e-6, -1)
    with pytest.raises(
        RuntimeError, match=r"k overlaps q: expected disjoint memory, got (the same tensor|a partial overlap) \(k \[0x"
    ):
        module.fused_inplace_qknorm_across_heads(q2, q2, w.repeat(2), w.repeat(2), 1e-6, -1)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
