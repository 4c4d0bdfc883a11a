"""downcast_fp8: bit-exact against torch's own e4m3 cast of the documented formula (boundary values,
inf/NaN, power-of-two scales against the original's input-dtype path), sentinel-filled caches
(every row not addressed keeps the sentinel), mult/offset, out-of-range rows, views, empty inputs,
graphs, compile, the index check and every error case."""

import pytest
import torch

from sglang.jit_kernel._validate import CHECK_INDICES_ENV
from sglang.jit_kernel.cast import _loc_range, downcast_fp8, reference_downcast_fp8
from sglang.jit_kernel.testing import (
    SENTINEL_BYTE,
    assert_bits_equal,
    requires_cuda,
    requires_two_gpus,
    sentinel_filled,
)
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=180, suite="nightly-kernel-1-gpu", nightly=True)

DTYPES = [torch.bfloat16, torch.float16]
# (num_kv_heads, head_dim): awkward head dims take 4-, 2- and 1-element vectors.
HEADS = get_ci_test_range(
    full_range=[(1, 1), (1, 7), (8, 128), (32, 128), (3, 129), (2, 576), (5, 6), (1, 4096)],
    ci_range=[(1, 7), (8, 128), (3, 129), (5, 6)],
)
TOKENS = get_ci_test_range(full_range=[1, 7, 129, 1000, 4097], ci_range=[1, 7, 129])


def scale_of(value: float, device="cuda") -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32, device=device)


def source(shape, dtype, spread: float = 60.0, device="cuda") -> torch.Tensor:
    """Normal values of std `spread` (many near and past 448 / scale), in `dtype`."""
    return (torch.randn(shape, device=device) * spread).to(dtype)


def expected_cache(
    out: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, loc: torch.Tensor, mult: int = 1, offset: int = 0
) -> torch.Tensor:
    """``out`` (as bytes) with the rows ``loc * mult + offset`` inside it set to the reference."""
    expected = out.view(torch.uint8).clone()
    rows = loc.long() * mult + offset
    valid = (rows >= 0) & (rows < out.shape[0])
    expected[rows[valid]] = reference_downcast_fp8(x, scale)[valid]
    return expected


def run_and_check(k, v, k_out, v_out, k_scale, v_scale, loc, mult=1, offset=0) -> None:
    """downcast_fp8, then both caches bit for bit against the reference and the inputs unchanged."""
    expected_k = expected_cache(k_out, k, k_scale, loc, mult, offset)
    expected_v = expected_cache(v_out, v, v_scale, loc, mult, offset)
    before = [t.clone() for t in (k, v, k_scale, v_scale, loc)]
    downcast_fp8(k, v, k_out, v_out, k_scale, v_scale, loc, mult, offset)
    assert_bits_equal(k_out.view(torch.uint8), expected_k)
    assert_bits_equal(v_out.view(torch.uint8), expected_v)
    for t, b in zip((k, v, k_scale, v_scale, loc), before):
        assert_bits_equal(t, b)


def make(num_tokens, heads, dim, dtype, num_slots, out_dtype=torch.uint8) -> list:
    k, v = source((num_tokens, heads, dim), dtype), source((num_tokens, heads, dim), dtype)
    k_out, v_out = (
        sentinel_filled((num_slots, heads, dim), out_dtype),
        sentinel_filled((num_slots, heads, dim), out_dtype),
    )
    return [k, v, k_out, v_out, scale_of(0.37), scale_of(1.7)]


# ---- values ----
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,dim", HEADS)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_downcast_fp8_values(dtype, heads, dim, num_tokens):
    num_slots = 2 * num_tokens + 3
    loc = torch.randperm(num_slots, device="cuda")[:num_tokens]
    run_and_check(*make(num_tokens, heads, dim, dtype, num_slots), loc)


@requires_cuda
@pytest.mark.parametrize("out_dtype", [torch.uint8, torch.float8_e4m3fn])
@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_downcast_fp8_output_and_loc_dtypes(out_dtype, loc_dtype):
    loc = torch.randperm(300, device="cuda")[:64].to(loc_dtype)
    run_and_check(*make(64, 8, 128, torch.bfloat16, 300, out_dtype), loc)


def boundary_values(dtype: torch.dtype) -> torch.Tensor:
    """+-447 ... +-1000 (every value of the dtype there), the e4m3 midpoints around 448, +-inf, NaN,
    +-0, tiny values (e4m3 subnormals and below), as a [n] tensor of `dtype`."""
    grid = torch.arange(447, 1001, dtype=torch.float32)
    mids = torch.tensor([416.0, 432.0, 440.0, 448.0, 464.0, 479.9, 480.0, 0.5**10, 0.5**9, 3 * 0.5**10, 0.5**11])
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30])
    values = torch.cat([grid, grid + 0.5, mids, special])
    values = torch.cat([values, -values]).to(dtype)
    return values


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.5, 2.0, 1.7, 0.0078125, 3.0])
def test_downcast_fp8_boundary_values_bit_exact(dtype, scale):
    """Bit for bit against torch's cast of (x.float() / scale).clamp(-448, 448); inf -> +-448 (0x7E /
    0xFE); NaN -> 0x7F whatever its sign."""
    values = boundary_values(dtype).cuda()
    n = values.numel()
    k = values.view(n, 1, 1)
    v = values.flip(0).contiguous().view(n, 1, 1)
    out_k, out_v = sentinel_filled((n, 1, 1), torch.uint8), sentinel_filled((n, 1, 1), torch.uint8)
    loc = torch.arange(n, device="cuda")
    run_and_check(k, v, out_k, out_v, scale_of(scale), scale_of(scale), loc)
    flat = out_k.view(-1)
    assert (flat[torch.isnan(values)] == 0x7F).all()
    if scale == 1.0:
        assert (flat[values == float("inf")] == 0x7E).all() and (flat[values == float("-inf")] == 0xFE).all()
        assert (flat[values.float().abs() >= 464] & 0x7F == 0x7E).all()  # saturated, never NaN


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_downcast_fp8_head_dims_cover_every_vector_width(dtype):
    """Boundary values spread over rows of 16 (16-wide vectors), 8, 4, 2 and 1 elements."""
    values = boundary_values(dtype).cuda()
    for dim in (16, 8, 4, 2, 1):
        n = values.numel() // dim
        k = values[: n * dim].view(n, 1, dim)
        out = sentinel_filled((n + 1, 1, dim), torch.uint8)
        out_v = sentinel_filled((n + 1, 1, dim), torch.uint8)
        run_and_check(k, k.clone(), out, out_v, scale_of(1.0), scale_of(0.75), torch.arange(n, device="cuda") + 1)


# Scales around the flat kernel's fast-division range [2^-40, 2^40] (inside, at and past both ends),
# ordinary ones, and those that always take __fdiv_rn (negative, subnormal, huge).
EXHAUSTIVE_SCALES = [
    0.37,
    1.7,
    3.0,
    1.0,
    0.1,
    1e-3,
    7.1e-5,
    12345.678,
    2.0**-20 * 1.3,
    2.0**-40,
    2.0**40,
    2.0**-40 * 0.999,
    2.0**40 * 1.001,
    2.0**-60,
    2.0**70,
    -0.37,
    1e-40,
    3e38,
]


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [16, 8])
def test_downcast_fp8_every_source_value_bit_exact(dtype, dim):
    """Every 16-bit pattern of the source dtype (zeros, subnormals, inf, NaN, the largest values) in
    rows of 16 elements (the lean kernel) and 8 (the flat kernel), k and v with different scales, bit
    for bit against torch's cast (the fast division takes only ordinary exponents; file comment of
    downcast_fp8.cuh)."""
    n = 2**16 // dim
    patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)
    k = patterns.view(n, 1, dim)
    v = patterns.flip(0).contiguous().view(n, 1, dim)
    loc = torch.arange(n, device="cuda")
    for i, scale in enumerate(EXHAUSTIVE_SCALES):
        v_scale = EXHAUSTIVE_SCALES[(i + 1) % len(EXHAUSTIVE_SCALES)]
        out_k, out_v = sentinel_filled((n, 1, dim), torch.uint8), sentinel_filled((n, 1, dim), torch.uint8)
        downcast_fp8(k, v, out_k, out_v, scale_of(scale), scale_of(v_scale), loc)
        assert_bits_equal(out_k, reference_downcast_fp8(k, scale_of(scale)))
        assert_bits_equal(out_v, reference_downcast_fp8(v, scale_of(v_scale)))


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads,dim,view",
    [(8, 128, "plain"), (8, 128, "strided"), (3, 24, "plain"), (5, 6, "plain"), (8, 128, "shifted")],
)
def test_downcast_fp8_kernel_shapes_against_reference(dtype, heads, dim, view):
    """Each kernel the launcher picks, against the reference, bit for bit: the bench's 16384 x 8 x 128
    (lean: thousands of blocks), padded token / head strides with int32 loc and mult / offset (lean),
    a head_dim of 24 (flat: 8-element vectors, 3 per head), head_dim 6 (flat: 2-element vectors) and
    a source shifted by one element (flat: 1-element vectors); -1 entries in loc."""
    t = 16384 if view == "plain" and dim == 128 else 777
    slots = 2 * t + 5
    if view == "strided":
        k = source((t, heads + 1, dim + 16), dtype, spread=300.0)[:, :heads, :dim]
        v = source((t, heads, dim + 8), dtype, spread=300.0)[:, :, :dim]
    elif view == "shifted":
        k = source((t * heads * dim + 1,), dtype, spread=300.0)[1:].view(t, heads, dim)
        v = source((t, heads, dim), dtype, spread=300.0)
    else:
        k, v = source((t, heads, dim), dtype, spread=300.0), source((t, heads, dim), dtype, spread=300.0)
    loc = torch.randperm(slots, device="cuda")[:t]
    loc[::11] = -1
    mult, offset = (1, 0) if view == "plain" else (2, 1)
    if view == "strided":
        loc = loc.to(torch.int32)
    out_slots = slots * mult + offset
    k_out = sentinel_filled((out_slots, heads, dim), torch.uint8)
    v_out = sentinel_filled((out_slots, heads, dim), torch.uint8)
    run_and_check(k, v, k_out, v_out, scale_of(0.37), scale_of(1.7), loc, mult, offset)


@requires_cuda
@pytest.mark.parametrize("dim", [128, 8])
@pytest.mark.parametrize("loc_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize(
    "mult,offset,bad",
    [
        (4, 0, -1),
        (4, 0, 2**62),  # 2^62 * 4 wraps to 0 in 64 bits
        (4, 3, 2**63 - 1),
        (-3, 250, -(2**63)),
        (1, -(2**62), 2**62 - 1),  # row -1
        (2**40, 5, 2**40),
        (0, 7, 1),  # one token: every token goes to row 7
        (0, 1000, 3),  # offset outside the cache: nothing is written
    ],
)
def test_downcast_fp8_destinations_exact(dim, loc_dtype, mult, offset, bad):
    """The slot test of the lean kernel (dim 128: a loc range computed on the host in 128-bit
    arithmetic, then two 64-bit compares) and of the flat kernel (dim 8: a 128-bit test) against rows
    computed in Python integers: distinct loc values from 3 below to 3 above the valid range, a `bad`
    entry where loc * mult wraps around in 64 bits or sits at the int64 limits, negative mult,
    mult 0, int32 loc."""
    heads, num_slots = 8, 260
    bounds = _loc_range(mult, offset, num_slots)
    lo, hi = bounds if bounds is not None else (-20, 20)
    if mult == 0:
        lo, hi = -20, 20
    if loc_dtype == torch.int32 and not (-(2**31) <= lo - 3 and hi + 3 < 2**31 and -(2**31) <= bad < 2**31):
        pytest.skip("outside int32")
    span = hi - lo + 7
    t = 1 if mult == 0 and bounds is not None else min(40, span)
    loc = lo - 3 + torch.randperm(span, device="cuda")[:t]
    if t > 1:
        loc[t // 2] = bad
    loc = loc.to(loc_dtype)
    k, v = source((t, heads, dim), torch.bfloat16, spread=300.0), source((t, heads, dim), torch.bfloat16)
    k_out = sentinel_filled((num_slots, heads, dim), torch.uint8)
    v_out = sentinel_filled((num_slots, heads, dim), torch.uint8)
    expected_k, expected_v = k_out.clone(), v_out.clone()
    qk, qv = reference_downcast_fp8(k, scale_of(0.37)), reference_downcast_fp8(v, scale_of(1.7))
    written = 0
    for i, x in enumerate(loc.tolist()):
        row = x * mult + offset  # exact
        if 0 <= row < num_slots:
            expected_k[row], expected_v[row] = qk[i], qv[i]
            written += 1
    assert written == sum(bounds is not None and bounds[0] <= x <= bounds[1] for x in loc.tolist())
    downcast_fp8(k, v, k_out, v_out, scale_of(0.37), scale_of(1.7), loc, mult, offset)
    assert_bits_equal(k_out, expected_k)
    assert_bits_equal(v_out, expected_v)


def original_path(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The original package's rounding: 1 / scale rounded to the input dtype, the product rounded to
    it, clamped, then to e4m3 (as bytes)."""
    inv = (1.0 / torch.tensor(scale, dtype=torch.float32)).to(x.dtype).to(x.device)
    y = (x * inv).clamp(-448, 448)
    return y.float().to(torch.float8_e4m3fn).view(torch.uint8)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_downcast_fp8_matches_the_original_for_power_of_two_scales(dtype):
    """With a power-of-two scale both extra roundings of the original are exact: same bytes (finite
    inputs; the original's NaN handling is its own)."""
    x = source((4096, 1, 128), dtype, spread=300.0)
    for scale in (0.125, 0.5, 1.0, 2.0, 16.0):
        out, out_v = sentinel_filled((4096, 1, 128), torch.uint8), sentinel_filled((4096, 1, 128), torch.uint8)
        downcast_fp8(x, x, out, out_v, scale_of(scale), scale_of(scale), torch.arange(4096, device="cuda"))
        assert_bits_equal(out, original_path(x, scale))


@requires_cuda
def test_downcast_fp8_differs_from_the_original_for_other_scales():
    """Scale 1.7, bf16: the original's rounded inverse moves some quotients across a midpoint (a few %
    of the elements, by one e4m3 step); ours is the correctly rounded division."""
    x = source((4096, 1, 128), torch.bfloat16, spread=100.0)
    out, out_v = sentinel_filled((4096, 1, 128), torch.uint8), sentinel_filled((4096, 1, 128), torch.uint8)
    downcast_fp8(x, x, out, out_v, scale_of(1.7), scale_of(1.7), torch.arange(4096, device="cuda"))
    assert_bits_equal(out, reference_downcast_fp8(x, scale_of(1.7)))
    theirs = original_path(x, 1.7)
    differ = out != theirs
    assert 0.005 < differ.float().mean().item() < 0.1
    steps = (out[differ].view(torch.float8_e4m3fn).float() - theirs[differ].view(torch.float8_e4m3fn).float()).abs()
    magnitude = out[differ].view(torch.float8_e4m3fn).float().abs().clamp_min(2.0**-6)  # subnormal step 2^-9
    ulp = 2.0 ** (torch.floor(torch.log2(magnitude)) - 3)
    assert (steps <= ulp + 1e-6).all()  # one e4m3 step apart


@requires_cuda
def test_downcast_fp8_zero_and_nan_scales():
    """Scale 0: +-448 for nonzero elements, NaN (0x7F) for zeros; a NaN scale: 0x7F everywhere."""
    k = torch.tensor([1.0, -2.0, 0.0, -0.0], device="cuda").to(torch.bfloat16).view(4, 1, 1)
    out, out_v = sentinel_filled((4, 1, 1), torch.uint8), sentinel_filled((4, 1, 1), torch.uint8)
    downcast_fp8(k, k, out, out_v, scale_of(0.0), scale_of(float("nan")), torch.arange(4, device="cuda"))
    assert out.view(-1).tolist() == [0x7E, 0xFE, 0x7F, 0x7F]
    assert out_v.view(-1).tolist() == [0x7F] * 4


# ---- destinations ----
@requires_cuda
@pytest.mark.parametrize("mult,offset", [(1, 0), (2, 1), (3, -2), (1, 5), (-1, 99), (0, 7)])
def test_downcast_fp8_mult_and_offset(mult, offset):
    """Rows loc * mult + offset; mult 0 sends every token to one row (which token wins is unspecified:
    one token only here)."""
    num_tokens = 1 if mult == 0 else 33
    loc = torch.randperm(33, device="cuda")[:num_tokens]
    run_and_check(*make(num_tokens, 4, 64, torch.float16, 100), loc, mult, offset)


@requires_cuda
@pytest.mark.parametrize("bad", [-1, -2, 80, 81, 2**31, 2**40, -(2**40), 2**62, -(2**63)])
def test_downcast_fp8_out_of_range_rows_are_skipped(bad):
    """A row outside [0, num_slots) writes nothing, also where loc * mult wraps around in 64 bits
    (2^62 * 4 = 0 mod 2^64); poison slots on both sides of the cache stay intact."""
    heads, dim, num_slots = 8, 128, 80
    big = sentinel_filled((num_slots + 2, heads, dim), torch.uint8)
    k_out = big[1:-1]
    v_out = sentinel_filled((num_slots, heads, dim), torch.uint8)
    k, v = source((16, heads, dim), torch.bfloat16), source((16, heads, dim), torch.bfloat16)
    loc = torch.randperm(num_slots // 4, device="cuda")[:16]
    loc[[0, 5, 15]] = bad
    mult = 4
    expected_big = big.clone()
    expected_big[1:-1] = expected_cache(k_out, k, scale_of(0.5), loc.clamp(-(2**40), 2**40), mult)
    downcast_fp8(k, v, k_out, v_out, scale_of(0.5), scale_of(0.5), loc, mult)
    torch.cuda.synchronize()
    assert_bits_equal(big, expected_big)
    assert torch.ones(4, device="cuda").sum().item() == 4  # the context still works


@requires_cuda
@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("dim", [128, 98, 7])
def test_downcast_fp8_strided_and_unaligned_views(offset, dim):
    """Sources sliced from a wider [T, H, dim + pad] buffer at an element offset (free token and head
    strides, pointers off 16-byte alignment), outputs inside wider sentinel rows, loc strided int32."""
    dtype, num_tokens, heads, num_slots, pad = torch.bfloat16, 77, 4, 200, 9
    k = source((num_tokens, heads, dim + pad), dtype)[:, :, offset : offset + dim]
    v = source((num_tokens + 3, heads + 1, dim + 1), dtype)[3:, 1:, 1:]
    k_big = sentinel_filled((num_slots, heads, dim + 2 * pad), torch.uint8)
    v_big = sentinel_filled((num_slots, heads + 2, dim), torch.uint8)
    k_out, v_out = k_big[:, :, pad + offset : pad + offset + dim], v_big[:, 1:-1]
    loc = torch.randperm(num_slots, device="cuda")[: 2 * num_tokens].to(torch.int32)[::2]
    expected_k_big, expected_v_big = k_big.clone(), v_big.clone()
    expected_k_big[:, :, pad + offset : pad + offset + dim] = expected_cache(k_out, k, scale_of(0.37), loc)
    expected_v_big[:, 1:-1] = expected_cache(v_out, v, scale_of(1.7), loc)
    downcast_fp8(k, v, k_out, v_out, scale_of(0.37), scale_of(1.7), loc)
    assert_bits_equal(k_big, expected_k_big)
    assert_bits_equal(v_big, expected_v_big)


@requires_cuda
def test_downcast_fp8_scales_as_views_and_0d():
    """Scales may be views of one buffer (offsets) or 0-d tensors."""
    scales = torch.tensor([9.0, 0.37, 1.7], device="cuda")
    tensors = make(20, 2, 16, torch.float16, 40)
    loc = torch.randperm(40, device="cuda")[:20]
    run_and_check(*tensors[:4], scales[1:2], scales[2:3], loc)
    run_and_check(*tensors[:4], scales[1], scales[2], loc)


@requires_cuda
def test_downcast_fp8_empty():
    k, v, k_out, v_out, ks, vs = make(0, 8, 128, torch.bfloat16, 10)
    before = k_out.clone()
    downcast_fp8(k, v, k_out, v_out, ks, vs, torch.empty(0, dtype=torch.int64, device="cuda"))
    assert_bits_equal(k_out, before)
    k, v, k_out, v_out, ks, vs = make(3, 8, 128, torch.bfloat16, 0)  # no slots: every row skipped
    downcast_fp8(k, v, k_out, v_out, ks, vs, torch.zeros(3, dtype=torch.int64, device="cuda"))
    k, v, k_out, v_out, ks, vs = make(3, 0, 128, torch.bfloat16, 5)  # no heads: nothing to write
    downcast_fp8(k, v, k_out, v_out, ks, vs, torch.zeros(3, dtype=torch.int64, device="cuda"))


@requires_cuda
def test_downcast_fp8_offsets_past_4_gib():
    """64-bit offsets: a destination row whose bytes start past 2^32 (a 4.3 GiB cache)."""
    heads, dim, num_slots = 8, 1024, (1 << 19) + 4  # 8 KiB rows: row 2^19 starts at byte 2^32
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * num_slots * heads * dim:
        pytest.skip(f"needs {3 * num_slots * heads * dim / 2**30:.0f} GiB free GPU memory")
    k_out = torch.zeros(num_slots, heads, dim, dtype=torch.uint8, device="cuda")
    v_out = torch.zeros(num_slots, heads, dim, dtype=torch.uint8, device="cuda")
    k, v = source((3, heads, dim), torch.bfloat16), source((3, heads, dim), torch.bfloat16)
    loc = torch.tensor([num_slots - 1, 1 << 19, 5], device="cuda")
    downcast_fp8(k, v, k_out, v_out, scale_of(1.0), scale_of(2.0), loc)
    for i, row in enumerate(loc.tolist()):
        assert_bits_equal(k_out[row], reference_downcast_fp8(k[i], scale_of(1.0)))
        assert_bits_equal(v_out[row], reference_downcast_fp8(v[i], scale_of(2.0)))
    assert k_out[(1 << 19) - 1].sum().item() == 0 and k_out[(1 << 19) + 1].sum().item() == 0
    del k_out, v_out
    torch.cuda.empty_cache()


# ---- graphs, compile, devices ----
@requires_cuda
def test_downcast_fp8_cuda_graph():
    """Captured once, replayed with new k, v, scales and rows in the same buffers."""
    k, v, k_out, v_out, ks, vs = make(64, 8, 128, torch.bfloat16, 300)
    loc = torch.randperm(300, device="cuda")[:64]
    downcast_fp8(k, v, k_out, v_out, ks, vs, loc)  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        downcast_fp8(k, v, k_out, v_out, ks, vs, loc)
    k.copy_(source(k.shape, k.dtype))
    v.copy_(source(v.shape, v.dtype))
    ks.fill_(0.9)
    vs.fill_(2.5)
    loc.copy_(torch.randperm(300, device="cuda")[:64])
    loc[::5] = -1
    k_out.fill_(SENTINEL_BYTE)
    v_out.fill_(SENTINEL_BYTE)
    expected_k, expected_v = expected_cache(k_out, k, ks, loc), expected_cache(v_out, v, vs, loc)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(k_out, expected_k)
    assert_bits_equal(v_out, expected_v)


@requires_cuda
def test_downcast_fp8_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(k, v, k_out, v_out, ks, vs, loc):
        downcast_fp8(k * 2, v, k_out, v_out, ks, vs, loc, 2, 1)
        return k_out.float().sum(dim=-1)

    k, v, k_out, v_out, ks, vs = make(16, 8, 128, torch.bfloat16, 40)
    loc = torch.randperm(19, device="cuda")[:16]
    expected_k, expected_v = expected_cache(k_out, k * 2, ks, loc, 2, 1), expected_cache(v_out, v, vs, loc, 2, 1)
    sums = torch.compile(f, fullgraph=True)(k, v, k_out, v_out, ks, vs, loc)
    assert_bits_equal(k_out, expected_k)
    assert_bits_equal(v_out, expected_v)
    torch.testing.assert_close(sums, expected_k.float().sum(dim=-1))


@requires_two_gpus
def test_downcast_fp8_on_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    dev = "cuda:1"
    k, v = source((9, 2, 64), torch.bfloat16, device=dev), source((9, 2, 64), torch.bfloat16, device=dev)
    k_out, v_out = sentinel_filled((20, 2, 64), torch.uint8, dev), sentinel_filled((20, 2, 64), torch.uint8, dev)
    loc = torch.randperm(20, device=dev)[:9]
    ks, vs = scale_of(0.5, dev), scale_of(3.0, dev)
    expected = expected_cache(k_out, k, ks, loc)
    downcast_fp8(k, v, k_out, v_out, ks, vs, loc)
    assert_bits_equal(k_out, expected)


# ---- the index check (SGLANG_JIT_CHECK_INDICES=1) ----
@requires_cuda
def test_downcast_fp8_index_check(monkeypatch):
    monkeypatch.setenv(CHECK_INDICES_ENV, "1")
    k, v, k_out, v_out, ks, vs = make(4, 2, 16, torch.bfloat16, 10)
    downcast_fp8(k, v, k_out, v_out, ks, vs, torch.tensor([0, -1, 3, 4], device="cuda"), 2, 1)  # -1 is skipped
    before = k_out.clone()
    with pytest.raises(
        IndexError,
        match=r"^downcast_fp8: loc value: expected entries with loc \* mult \+ offset in "
        r"\[0, 10\) \(num_slots; mult=2, offset=1\) or -1 \(skipped\), got 5 \(row 11\) at position 2$",
    ):
        downcast_fp8(k, v, k_out, v_out, ks, vs, torch.tensor([0, 4, 5, -3], device="cuda"), 2, 1)
    assert_bits_equal(k_out, before)
    with pytest.raises(IndexError, match=r"got 4611686018427387904 \(row 18446744073709551616\) at position 0$"):
        downcast_fp8(k, v, k_out, v_out, ks, vs, torch.tensor([2**62, 0, 1, 2], device="cuda"), 4, 0)


@requires_cuda
def test_downcast_fp8_index_check_left_out_while_capturing(monkeypatch):
    monkeypatch.setenv(CHECK_INDICES_ENV, "1")
    k, v, k_out, v_out, ks, vs = make(8, 2, 16, torch.float16, 16)
    loc = torch.randperm(16, device="cuda")[:8]
    downcast_fp8(k, v, k_out, v_out, ks, vs, loc)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        downcast_fp8(k, v, k_out, v_out, ks, vs, loc)
    k_out.fill_(SENTINEL_BYTE)
    expected = expected_cache(k_out, k, ks, loc)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(k_out, expected)


# ---- errors (raised before any launch) ----
def test_downcast_fp8_cpu_and_non_tensors():
    k = torch.zeros(4, 2, 8, dtype=torch.bfloat16)
    out = torch.zeros(8, 2, 8, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"^downcast_fp8: k device: expected a CUDA device, got cpu$"):
        downcast_fp8(k, k, out, out.clone(), torch.ones(1), torch.ones(1), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"^downcast_fp8: k type: expected a torch.Tensor, got list$"):
        downcast_fp8([1.0], k, out, out, k, k, k)


def _args() -> list:
    return [*make(8, 2, 16, torch.bfloat16, 16), torch.randperm(16, device="cuda")[:8]]


@requires_cuda
@pytest.mark.parametrize(
    "position,replacement,pattern",
    [
        (0, lambda a: a[0].float(), r"^downcast_fp8: k dtype: expected one of float16, bfloat16, got float32$"),
        (
            0,
            lambda a: a[0].view(8, 32),
            r"^downcast_fp8: k shape: expected \[num_tokens, num_kv_heads, head_dim\], "
            r"got \(8, 32\)$",
        ),
        (1, lambda a: a[1].half(), r"^downcast_fp8: v dtype: expected bfloat16 \(the dtype of k\), got float16$"),
        (1, lambda a: a[1][:7], r"^downcast_fp8: v shape: expected \(8, 2, 16\) \(the shape of k\), got \(7, 2, 16\)$"),
        (
            2,
            lambda a: a[2].view(torch.int8),
            r"^downcast_fp8: k_out dtype: expected one of uint8, float8_e4m3fn, "
            r"got int8$",
        ),
        (
            2,
            lambda a: sentinel_filled((16, 2, 8), torch.uint8),
            r"^downcast_fp8: k_out shape: expected \[num_slots, "
            r"num_kv_heads=2, head_dim=16\], got \(16, 2, 8\)$",
        ),
        (
            3,
            lambda a: sentinel_filled((17, 2, 16), torch.uint8),
            r"^downcast_fp8: v_out shape: expected \(16, 2, 16\) "
            r"\(the shape of k_out\), got \(17, 2, 16\)$",
        ),
        (4, lambda a: a[4].half(), r"^downcast_fp8: k_scale dtype: expected float32, got float16$"),
        (
            5,
            lambda a: torch.ones(2, device="cuda"),
            r"^downcast_fp8: v_scale shape: expected \[1\] \(one float32 on "
            r"the device\), got \(2,\)$",
        ),
        (4, lambda a: torch.ones(1), r"^downcast_fp8: k_scale device: expected a CUDA device, got cpu$"),
        (6, lambda a: a[6].float(), r"^downcast_fp8: loc dtype: expected one of int32, int64, got float32$"),
        (6, lambda a: a[6][:7], r"^downcast_fp8: loc shape: expected \[num_tokens=8\], got \(7,\)$"),
        (0, lambda a: source((8, 2, 32), torch.bfloat16)[:, :, ::2], r"^downcast_fp8: k last-dim stride: expected 1 "),
        (
            2,
            lambda a: a[0].view(torch.uint8).view(16, 2, 16),
            r"^downcast_fp8: k_out overlaps k: expected disjoint memory, got ",
        ),
        (3, lambda a: a[2], r"^downcast_fp8: v_out overlaps k_out: expected disjoint memory, got "),
    ],
)
def test_downcast_fp8_bad_tensors(position, replacement, pattern):
    args = _args()
    args[position] = replacement(args)
    before = [a.clone() for a in args[2:4]]
    with pytest.raises(RuntimeError, match=pattern):
        downcast_fp8(*args)
    for a, b in zip(args[2:4], before):
        assert_bits_equal(a, b)


@requires_cuda
def test_downcast_fp8_bad_scalars():
    args = _args()
    with pytest.raises(TypeError, match=r"^downcast_fp8: mult type: expected an int, got float$"):
        downcast_fp8(*args, 2.0)
    with pytest.raises(TypeError, match=r"^downcast_fp8: offset type: expected an int, got bool$"):
        downcast_fp8(*args, 1, True)
    with pytest.raises(
        ValueError,
        match=r"^downcast_fp8: mult value: expected >= -9223372036854775808 and "
        r"<= 9223372036854775807, got 18446744073709551616$",
    ):
        downcast_fp8(*args, 2**64)


@requires_cuda
def test_downcast_fp8_ffi_rejects_mismatch_from_cpp():
    """The launcher's TensorMatcher is the second line: bad tensors straight to the module raise a
    RuntimeError naming the tensor, never a CUDA fault."""
    from sglang.jit_kernel.cast import _jit_downcast_fp8_module

    module = _jit_downcast_fp8_module(torch.bfloat16)
    k, v, k_out, v_out, ks, vs, loc = _args()
    with pytest.raises(RuntimeError, match="k_out"):
        module.downcast_fp8(k, v, k_out.view(torch.int8), v_out, ks, vs, loc, 1, 0)
    with pytest.raises(RuntimeError, match="k_scale"):
        module.downcast_fp8(k, v, k_out, v_out, ks.half(), vs, loc, 1, 0)
    with pytest.raises(RuntimeError, match="loc"):
        module.downcast_fp8(k, v, k_out, v_out, ks, vs, loc[:7], 1, 0)
    with pytest.raises(RuntimeError, match="overlaps"):
        module.downcast_fp8(k, v, k_out, k_out, ks, vs, loc, 1, 0)
    with pytest.raises(RuntimeError):
        module.downcast_fp8(k.half(), v.half(), k_out, v_out, ks, vs, loc, 1, 0)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))


def test_overlap_check_tells_same_view_from_other_width_views():
    """_validate.check_no_partial_overlap: views of one buffer at one pointer, shape and strides but of
    element types of other widths span different bytes: "a partial overlap", never "the same tensor",
    and allow_same does not accept them as an in-place call. No GPU: CPU tensors."""
    from sglang.jit_kernel._validate import check_no_partial_overlap

    buffer = torch.zeros(512, dtype=torch.uint8)
    wide, narrow = buffer[:256].view(torch.bfloat16).view(4, 32), buffer[:128].view(4, 32)
    for allow_same in (False, True):
        with pytest.raises(RuntimeError, match=r"^op: out overlaps input: expected disjoint memory.*, got a partial"):
            check_no_partial_overlap("op", "out", narrow, wide, "input", allow_same=allow_same)
    check_no_partial_overlap("op", "out", wide, wide, "input", allow_same=True)  # in place: accepted
    with pytest.raises(RuntimeError, match=r"got the same tensor"):
        check_no_partial_overlap("op", "out", wide, wide, "input", allow_same=False)
