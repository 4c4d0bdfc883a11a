"""per_token_group_quant_8bit: fp64 references, the kernel's fp32 arithmetic bit for bit, scale layouts
(row-major, column-major, ue8m0), special values, views, empty and huge inputs, graphs, compile, errors."""

import math

import pytest
import torch

from sglang.jit_kernel.per_token_group_quant_8bit import max_group_size, per_token_group_quant_8bit, reference
from sglang.jit_kernel.testing import requires_cuda, requires_two_gpus
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=90, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=240, suite="nightly-kernel-1-gpu", nightly=True)

FP8 = torch.float8_e4m3fn
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BOUNDS = {FP8: (-448.0, 448.0), torch.int8: (-128.0, 127.0)}
TYPE_MAX = {FP8: 448.0, torch.int8: 127.0}
EPS = 1e-10
FLT_MIN = 2.0**-126

SHAPES = get_ci_test_range(
    full_range=[(1, 128), (7, 256), (129, 512), (33, 7168), (4097, 1024), (2048, 7168), (3, 16384)],
    ci_range=[(1, 128), (7, 256), (129, 512), (33, 7168)],
)
GROUP_SIZES = get_ci_test_range(full_range=[16, 32, 64, 128, 256, 512], ci_range=[16, 64, 128, 256])
#: A value may sit one 8-bit step off the fp64 reference only where the fp64 quotient lies within this
#: relative distance of the midpoint between the two (the kernel's fp32 s, 1 / s and x * (1 / s) are
#: three roundings of at most 2^-24 each, so its quotient is within 3 * 2^-24 of the fp64 one).
TIE_RTOL = 2.0**-21


def ordinal(q: torch.Tensor) -> torch.Tensor:
    """Position of each 8-bit value on its grid: int8 as is; fp8 e4m3 (sign-magnitude) as -mag / +mag,
    so neighbouring representable values differ by 1."""
    if q.dtype == torch.int8:
        return q.long()
    bits = q.view(torch.uint8).long()
    magnitude = bits & 0x7F
    return torch.where(bits >= 0x80, -magnitude, magnitude)


def fp64_reference(x: torch.Tensor, group_size: int, dtype: torch.dtype, eps: float = EPS):
    """``(q, s, y)`` from fp64 arithmetic on the same inputs: s = clamp(max(amax, eps) / q_type_max),
    y = clamp(x / s) and q = y rounded once to ``dtype``."""
    m, k = x.shape
    groups = x.double().reshape(m, k // group_size, group_size)
    s = (groups.abs().amax(-1).clamp_min(eps) / TYPE_MAX[dtype]).clamp(FLT_MIN, torch.finfo(torch.float32).max)
    lo, hi = BOUNDS[dtype]
    y = (groups / s.unsqueeze(-1)).clamp(lo, hi).reshape(m, k)
    q = y.round().to(torch.int8) if dtype == torch.int8 else y.float().to(dtype)
    return q, s, y


def assert_on_grid(q: torch.Tensor, q_ref: torch.Tensor, y: torch.Tensor) -> None:
    """q equals the fp64 reference ``q_ref`` (``y``, the fp64 quotient x / s clamped, rounded once),
    except one 8-bit step off where ``y`` is a rounding midpoint up to the fp32 error.

    Why: the kernel divides in fp32 (s = amax / q_max, then x * (1 / s): three roundings of 2^-24
    each), the reference in fp64; only where x / s lies within those few fp32 ulps of a midpoint
    between two 8-bit values can the two round to neighbours. Such ties are not rare for fp16 / bf16
    inputs: with 8 or 11 significant bits, x / s hits a midpoint exactly for whole classes of x when
    the maximum has certain mantissas (x = amax / 2 is 63.5 for int8; a bf16 tensor maximum of 34.5
    puts 0.7 % of the fp8 values on midpoints), so their share is data-dependent and not bounded
    here; every off-by-one must be such a tie instead.
    """
    if not q.numel():
        return
    diff = (ordinal(q) - ordinal(q_ref)).abs()
    assert int(diff.max()) <= 1, f"max grid distance {int(diff.max())}"
    off = diff == 1
    if bool(off.any()):
        y_off = y.double()[off]
        midpoint = (q.double()[off] + q_ref.double()[off]) / 2
        distance = ((y_off - midpoint).abs() / y_off.abs()).max()
        assert float(distance) <= TIE_RTOL, (
            f"{int(off.sum())} values one step off, one of them {float(distance):.3g} (relative) from the midpoint"
        )


def assert_bitwise(q, s, q_ref, s_ref) -> None:
    """Exactly the kernel's fp32 arithmetic (``reference`` emulates it with IEEE torch ops)."""
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s.float(), s_ref.float())


def column_major(rows: int, cols: int, dtype: torch.dtype = torch.float32, device="cuda") -> torch.Tensor:
    """``[rows, cols]`` scales in the transposed TMA-aligned layout: strides (1, rows rounded up to 4)."""
    padded_rows = (rows + 3) // 4 * 4
    return torch.full((cols, padded_rows), -7, dtype=dtype, device=device).T[:rows]


def packed_bytes(packed: torch.Tensor) -> torch.Tensor:
    """int32 [M, W] (any strides) -> its uint8 [M, 4 * W], the bytes of each row in order. A row-major
    copy first: ``contiguous()`` keeps a column-major [M, 1]'s strides (1, M_pad), which ``view`` of
    a smaller dtype rejects."""
    rows = torch.empty(packed.shape, dtype=packed.dtype, device=packed.device).copy_(packed)
    return rows.view(torch.uint8).view(packed.shape[0], -1)


def decode_ue8m0(packed: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 [M, ceil(G / 4)] of exponent bytes (group g at byte g % 4) -> fp32 scales [M, G]."""
    exponent_bytes = packed_bytes(packed)
    return torch.pow(2.0, exponent_bytes[:, :num_groups].double() - 127).float()


def run(x, group_size, dtype=FP8, scales="row", ue8m0=False):
    m, k = x.shape
    g = k // group_size
    q = torch.empty(m, k, dtype=dtype, device=x.device)
    if ue8m0:
        s = (
            column_major(m, (g + 3) // 4, torch.int32, x.device)
            if scales == "col"
            else torch.full((m, (g + 3) // 4), -7, dtype=torch.int32, device=x.device)
        )
    else:
        s = (
            column_major(m, g, device=x.device)
            if scales == "col"
            else torch.full((m, g), float("nan"), device=x.device)
        )
    lo, hi = BOUNDS[dtype]
    result = per_token_group_quant_8bit(x, q, s, group_size, EPS, lo, hi, scale_ue8m0=ue8m0)
    assert result[0] is q and result[1] is s
    return q, s


# ---- values ----
@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("out_dtype", [FP8, torch.int8])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_values_against_fp64_and_fp32_arithmetic(in_dtype, out_dtype, shape, group_size):
    m, k = shape
    if k % group_size or group_size > max_group_size(in_dtype):
        pytest.skip("group_size does not divide hidden_size or exceeds the dtype's maximum")
    x = (torch.randn(m, k, device="cuda") * torch.logspace(-3, 3, m, device="cuda").unsqueeze(1)).to(in_dtype)
    before = x.clone()
    q, s = run(x, group_size, out_dtype)
    assert torch.equal(x, before), "the op modified its input"
    q64, s64, y64 = fp64_reference(x, group_size, out_dtype)
    torch.testing.assert_close(s.double(), s64, rtol=1e-5, atol=0)
    assert_on_grid(q, q64, y64)
    assert_bitwise(q, s, *reference(x, group_size, EPS, *BOUNDS[out_dtype], out_dtype))


@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("group_size", [16, 128])
@pytest.mark.parametrize("m", [1, 7, 130])
def test_column_major_scales(in_dtype, group_size, m):
    """The transposed TMA-aligned scale layout (detected from the strides) holds the row-major values;
    the padding rows of the buffer keep their contents."""
    k = 7 * group_size
    x = torch.randn(m, k, dtype=in_dtype, device="cuda")
    q_row, s_row = run(x, group_size, scales="row")
    q_col, s_col = run(x, group_size, scales="col")
    assert s_col.stride() == (1, (m + 3) // 4 * 4)
    assert torch.equal(q_row.view(torch.uint8), q_col.view(torch.uint8))
    assert torch.equal(s_row, s_col)
    buffer = s_col.as_strided((k // group_size, (m + 3) // 4 * 4), ((m + 3) // 4 * 4, 1))  # the whole buffer
    assert torch.equal(buffer[:, :m], s_col.T)
    assert (buffer[:, m:] == -7).all(), "wrote into the padding rows of the column-major buffer"


@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_groups", [1, 3, 4, 56])
@pytest.mark.parametrize("layout", ["row", "col"])
def test_ue8m0_packing(in_dtype, num_groups, layout):
    """Power-of-two scales as exponent bytes, 4 per int32 (group g in byte g % 4), bytes past the last
    group 0; q uses the power-of-two scale."""
    m, g = 37, 128
    x = (torch.randn(m, num_groups * g, device="cuda") * 3).to(in_dtype)
    q, packed = run(x, g, scales=layout, ue8m0=True)
    scales = decode_ue8m0(packed, num_groups)
    q_ref, s_ref = reference(x, g, EPS, -448.0, 448.0, FP8, ue8m0=True)
    assert torch.equal(scales, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    # Each power-of-two scale is the smallest one >= the plain scale.
    plain = reference(x, g, EPS, -448.0, 448.0, FP8)[1]
    assert (scales >= plain).all() and (scales / 2 < plain).all()
    tail = packed_bytes(packed)[:, num_groups:]
    assert (tail == 0).all(), "bytes past the last group must be 0"
    # Against fp64: q within one step of x / s for the stored power-of-two s.
    y = (x.double().view(m, num_groups, g) / scales.double().unsqueeze(-1)).clamp(-448, 448).view(m, -1)
    assert_on_grid(q, y.float().to(FP8), y)


# ---- special values: never NaN in a scale ----
@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("out_dtype", [FP8, torch.int8])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_zero_and_tiny_groups_give_finite_scales(in_dtype, out_dtype, ue8m0):
    if ue8m0 and out_dtype == torch.int8:
        pytest.skip("ue8m0 is for fp8")
    x = torch.zeros(4, 512, dtype=in_dtype, device="cuda")
    x[1] = 1e-30 if in_dtype == torch.float32 else 1e-7  # tiny (fp16 / bf16 flush 1e-30 to 0)
    x[2, :128] = 1.0  # group 0 of row 2 normal, the rest zero
    q, s = run(x, 128, out_dtype, ue8m0=ue8m0)
    scales = decode_ue8m0(s, 4) if ue8m0 else s
    assert torch.isfinite(scales).all() and (scales > 0).all()
    assert torch.isfinite(q.float()).all()
    assert (q.float()[[0, 3]] == 0).all() and (q.float()[2, 128:] == 0).all()
    if not ue8m0:
        torch.testing.assert_close(
            s[0].double(),
            torch.full((4,), EPS / TYPE_MAX[out_dtype], device="cuda", dtype=torch.float64),
            rtol=1e-6,
            atol=0,
        )


@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
def test_boundaries_448(in_dtype):
    """A group whose maximum is 448 has scale 1: values on the fp8 grid come back exactly, +-448 too."""
    grid = torch.arange(0, 127, dtype=torch.uint8, device="cuda").view(FP8).float()  # every finite >= 0 value
    x = torch.cat([grid, -grid, torch.tensor([448.0, -448.0], device="cuda")])[:256].view(2, 128).to(in_dtype)
    x[:, 0] = 448.0
    q, s = run(x, 128)
    assert torch.equal(s, torch.ones_like(s))
    exact = x.float() == x.float().to(FP8).float()  # fp16 / bf16 inputs hold every fp8 value exactly
    assert torch.equal(q.float()[exact], x.float()[exact])


@requires_cuda
@pytest.mark.parametrize("out_dtype", [FP8, torch.int8])
def test_inf_and_nan_inputs(out_dtype):
    """Documented: inf gives s = FLT_MAX and +-q_max; NaN is ignored by the maximum and quantizes to NaN
    (fp8) or 0 (int8); other groups are unaffected; no scale is NaN."""
    x = torch.randn(3, 256, device="cuda")
    x[0, 5] = float("inf")
    x[0, 6] = float("-inf")
    x[1, 7] = float("nan")
    q, s = run(x, 128, out_dtype)
    assert torch.isfinite(s).all()
    assert s[0, 0] == torch.finfo(torch.float32).max
    lo, hi = BOUNDS[out_dtype]
    assert q.float()[0, 5] == hi and q.float()[0, 6] == lo
    if out_dtype == FP8:
        assert torch.isnan(q.float()[1, 7])
    else:
        assert q[1, 7] == 0
    x_clean = x.clone()
    x_clean[1, 7] = 0.0
    q_ref, s_ref = reference(x_clean, 128, EPS, lo, hi, out_dtype)
    assert torch.equal(s[1:], s_ref[1:]) and torch.equal(s[0, 1], s_ref[0, 1])
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[0, :128] = False
    keep[1, 7] = False
    assert torch.equal(q.view(torch.uint8)[keep], q_ref.view(torch.uint8)[keep])


#: One shape per kernel the launcher picks for bf16 / fp16 input (dispatch_per_token_group_quant_8bit;
#: fp32 takes the same branches where its 4-element chunks reach them): (rows, hidden_size,
#: group_size, input offset, output_q offset in elements, in rows 16 elements wider than hidden_size).
DISPATCH_PATHS = {
    "paired_tiles_small": (7, 7168, 128, 0, 0),  # <= 256 rows: TileShape<1, 2>
    "single_tiles_small_g1024": (5, 2048, 1024, 0, 0),  # a group longer than the paired tile
    "sectors_row_ends_in_tile": (300, 2176, 128, 0, 0),  # > 256 rows: the full-sector kernel
    "sectors_q_8_byte_aligned": (260, 1024, 64, 0, 8),  # pairs unaligned: the sector kernel still
    "paired_tiles_large_g16": (300, 384, 16, 0, 0),  # > 256 rows, 2-chunk groups: TileShape<2, 2>
    "single_tiles_pairs_unaligned": (200, 384, 128, 0, 8),  # output_q 8-byte aligned: TileShape<4, 1>
    "single_tiles_unaligned": (300, 512, 64, 1, 3),  # element-wise accesses
}


@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode", ["row", "col", "ue8m0", "int8", "clamp"])
@pytest.mark.parametrize("path", list(DISPATCH_PATHS))
def test_every_dispatch_path(in_dtype, mode, path):
    """Each kernel the launcher selects gives the fp32 emulation's bytes (and, for the plain bounds,
    values on the fp8 / int8 grid of the fp64 quotient) for row- and column-major scales, ue8m0,
    int8 and clamped fp8, in poisoned rows of wider buffers: nothing outside the views is written."""
    m, k, group_size, x_offset, q_offset = DISPATCH_PATHS[path]
    if group_size > max_group_size(in_dtype):
        pytest.skip("group_size exceeds the dtype's maximum")
    dtype = torch.int8 if mode == "int8" else FP8
    lo, hi = (-100.0, 300.0) if mode == "clamp" else BOUNDS[dtype]
    ue8m0 = mode == "ue8m0"
    g = k // group_size
    scale = torch.logspace(-3, 3, m, device="cuda").unsqueeze(1)
    x = (torch.randn(m, k + 16, device="cuda") * scale).to(in_dtype)[:, x_offset : x_offset + k]
    q_buffer = torch.full((m, k + 16), 0x7F, dtype=torch.uint8, device="cuda")
    q = q_buffer[:, q_offset : q_offset + k].view(dtype)
    if ue8m0:
        s = column_major(m, (g + 3) // 4, torch.int32)
    else:
        s = column_major(m, g) if mode == "col" else torch.full((m, g), float("nan"), device="cuda")
    per_token_group_quant_8bit(x, q, s, group_size, EPS, lo, hi, scale_ue8m0=ue8m0)
    q_ref, s_ref = reference(x, group_size, EPS, lo, hi, dtype, ue8m0)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    if ue8m0:
        assert torch.equal(decode_ue8m0(s, g), s_ref)
        assert (packed_bytes(s)[:, g:] == 0).all(), "bytes past the last group must be 0"
    else:
        assert torch.equal(s, s_ref)
    outside = torch.ones_like(q_buffer, dtype=torch.bool)
    outside[:, q_offset : q_offset + k] = False
    assert (q_buffer[outside] == 0x7F).all(), "wrote outside output_q"
    if mode in ("row", "col", "int8"):
        q64, s64, y64 = fp64_reference(x, group_size, dtype)
        torch.testing.assert_close(s.double(), s64, rtol=1e-5, atol=0)
        assert_on_grid(q, q64, y64)


@requires_cuda
@pytest.mark.parametrize("rows,x_offset", [(5, 0), (300, 0), (300, 1)], ids=["paired", "sectors", "unaligned"])
@pytest.mark.parametrize("out_dtype", [FP8, torch.int8])
def test_inf_and_nan_groups_every_path(rows, x_offset, out_dtype):
    """Groups holding inf / -inf / NaN, byte for byte the emulation's (inf in the maximum: s = FLT_MAX;
    NaN ignored), on the paired tiles, the sector kernel and the element-wise tiles."""
    x = torch.randn(rows, 256 + 8, device="cuda").to(torch.bfloat16)[:, x_offset : x_offset + 256]
    x[0, 3], x[1, 130], x[2, 0], x[3] = float("nan"), float("inf"), -float("inf"), 0.0
    x[4, 7], x[4, 8] = float("inf"), float("nan")  # inf and NaN in one group
    lo, hi = BOUNDS[out_dtype]
    q = torch.empty(rows, 256, dtype=out_dtype, device="cuda")
    s = torch.full((rows, 2), float("nan"), device="cuda")
    per_token_group_quant_8bit(x, q, s, 128, EPS, lo, hi)
    q_ref, s_ref = reference(x, 128, EPS, lo, hi, out_dtype)
    flt_max = torch.finfo(torch.float32).max
    assert s_ref[1, 1] == flt_max and s_ref[2, 0] == flt_max and s_ref[4, 0] == flt_max
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@requires_cuda
def test_rows_of_2_pow_30_chunks():
    """A row of 2^30 16-byte chunks takes the 1-D kernel (64-bit tile offsets), with output_q aligned
    and 1 byte in (element-wise); its first and last groups are checked."""
    k, g, n = 1 << 33, 1024, 1 << 20
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * k + (2 << 30):
        pytest.skip(f"needs {3 * k / 2**30:.0f} GiB free GPU memory, {free / 2**30:.0f} GiB free")
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    q_buffer = torch.empty(1, k + 16, dtype=torch.uint8, device="cuda")
    s = torch.full((1, k // g), float("nan"), device="cuda")
    ends = (slice(0, n), slice(k - n, k))
    want = [reference(x[:, part], g, EPS, -448.0, 448.0, FP8) for part in ends]
    for offset in (0, 1):
        q = q_buffer[:, offset : offset + k].view(FP8)
        s.fill_(float("nan"))
        per_token_group_quant_8bit(x, q, s, g, EPS, -448.0, 448.0)
        for part, (q_ref, s_ref) in zip(ends, want):
            groups = slice(part.start // g, part.stop // g)
            assert_bitwise(q[:, part], s[:, groups], q_ref, s_ref)
    del x, q_buffer, s
    torch.cuda.empty_cache()


# ---- layouts ----
@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_strided_and_offset_views_with_poisoned_outputs(in_dtype, offset):
    """Row slices of wider buffers at unaligned offsets read as laid out; outputs inside poisoned
    buffers: nothing outside the views is written."""
    m, k, g = 67, 512, 64
    wide = torch.randn(m, k + 40, dtype=in_dtype, device="cuda")
    x = wide[:, offset : offset + k]
    q_buffer = torch.full((m, k + 24), 0x7F, dtype=torch.uint8, device="cuda").view(FP8)  # NaN poison
    q = q_buffer[:, offset : offset + k]
    s_buffer = torch.full((m, k // g + 5), float("nan"), device="cuda")
    s = s_buffer[:, 2 : 2 + k // g]
    per_token_group_quant_8bit(x, q, s, g, EPS, -448.0, 448.0)
    q_ref, s_ref = reference(x.contiguous(), g, EPS, -448.0, 448.0, FP8)
    assert_bitwise(q, s, q_ref, s_ref)
    outside = torch.ones(m, k + 24, dtype=torch.bool, device="cuda")
    outside[:, offset : offset + k] = False
    assert (q_buffer.view(torch.uint8)[outside] == 0x7F).all(), "wrote outside output_q"
    assert torch.isnan(s_buffer[:, :2]).all() and torch.isnan(s_buffer[:, 2 + k // g :]).all()


@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES)
def test_transposed_and_3d_inputs_match_contiguous(in_dtype):
    x_t = torch.randn(256, 33, dtype=in_dtype, device="cuda").T  # [33, 256], last-dim stride 33
    q, s = run(x_t, 128)
    q_ref, s_ref = run(x_t.contiguous(), 128)
    assert_bitwise(q, s, q_ref, s_ref)
    x3 = torch.randn(3, 5, 256, dtype=in_dtype, device="cuda")
    q3 = torch.empty(3, 5, 256, dtype=FP8, device="cuda")
    s3 = torch.empty(3, 5, 2, device="cuda")
    per_token_group_quant_8bit(x3, q3, s3, 128, EPS, -448.0, 448.0)
    q_ref, s_ref = reference(x3.view(15, 256), 128, EPS, -448.0, 448.0, FP8)
    assert_bitwise(q3.view(15, 256), s3.view(15, 2), q_ref, s_ref)


@requires_cuda
@pytest.mark.parametrize("scales", ["row", "col"])
def test_zero_rows(scales):
    x = torch.empty(0, 512, dtype=torch.bfloat16, device="cuda")
    q, s = run(x, 128, scales=scales)
    assert q.shape == (0, 512) and s.shape == (0, 4)


@requires_cuda
def test_more_than_2_pow_31_elements():
    """64-bit offsets: 2^31 + 2^20 bf16 inputs (4 GiB in, 2 GiB out); the last rows checked."""
    k, g = 4096, 128
    m = (1 << 31) // k + 256
    free, _ = torch.cuda.mem_get_info()
    if free < m * k * 4 + (1 << 30):
        pytest.skip(f"needs {m * k * 4 / 2**30:.0f} GiB free GPU memory, {free / 2**30:.0f} GiB free")
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(m, k, dtype=FP8, device="cuda")
    s = torch.full((m, k // g), float("nan"), device="cuda")
    per_token_group_quant_8bit(x, q, s, g, EPS, -448.0, 448.0)
    for rows in (slice(0, 64), slice(m - 512, m)):
        assert_bitwise(q[rows], s[rows], *reference(x[rows], g, EPS, -448.0, 448.0, FP8))
    del x, q, s
    torch.cuda.empty_cache()


# ---- graphs, compile, devices ----
@requires_cuda
def test_cuda_graph_replay():
    x = torch.randn(64, 7168, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(64, 7168, dtype=FP8, device="cuda")
    s = column_major(64, 56)
    per_token_group_quant_8bit(x, q, s, 128, EPS, -448.0, 448.0)  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        per_token_group_quant_8bit(x, q, s, 128, EPS, -448.0, 448.0)
    x.copy_(torch.randn_like(x))
    s.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise(q, s, *reference(x, 128, EPS, -448.0, 448.0, FP8))


@requires_cuda
@pytest.mark.parametrize("ue8m0", [False, True])
def test_torch_compile_fullgraph(ue8m0):
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        q = torch.empty(y.shape, dtype=FP8, device=y.device)
        s = torch.empty(y.shape[0], 1 if ue8m0 else 4, dtype=torch.int32 if ue8m0 else torch.float32, device=y.device)
        per_token_group_quant_8bit(y, q, s, 128, EPS, -448.0, 448.0, scale_ue8m0=ue8m0)
        return q, s

    x = torch.randn(33, 512, dtype=torch.bfloat16, device="cuda")
    q, s = torch.compile(f, fullgraph=True)(x)
    q_ref, s_ref = f(x)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


@requires_two_gpus
def test_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    x = torch.randn(129, 512, dtype=torch.bfloat16, device="cuda:1")
    q, s = run(x, 128)
    assert q.device == x.device
    assert_bitwise(q, s, *reference(x, 128, EPS, -448.0, 448.0, FP8))


# ---- errors (raised before any launch; nothing written) ----
def test_not_a_tensor():
    with pytest.raises(TypeError, match=r"^per_token_group_quant_8bit: input type: expected a torch.Tensor, got list$"):
        per_token_group_quant_8bit([1.0], None, None, 128, EPS, -448.0, 448.0)


def test_cpu_input():
    x = torch.randn(4, 128)
    with pytest.raises(
        RuntimeError, match=r"^per_token_group_quant_8bit: input device: expected a CUDA device, got cpu$"
    ):
        per_token_group_quant_8bit(x, torch.empty(4, 128, dtype=FP8), torch.empty(4, 1), 128, EPS, -448.0, 448.0)


def _args(m=4, k=512, g=128, in_dtype=torch.bfloat16):
    x = torch.randn(m, k, dtype=in_dtype, device="cuda")
    return x, torch.empty(m, k, dtype=FP8, device="cuda"), torch.full((m, k // g), -1.0, device="cuda")


@requires_cuda
@pytest.mark.parametrize(
    "change,error,pattern",
    [
        (dict(group_size=96), ValueError, r"group_size value: expected a power of two, got 96"),
        (dict(group_size=8), ValueError, r"group_size value: expected >= 16 and <= 1024, got 8"),
        (dict(group_size=2048), ValueError, r"group_size value: expected >= 16 and <= 1024, got 2048"),
        (dict(group_size=128.0), TypeError, r"group_size type: expected an int, got float"),
        (dict(eps=-1.0), ValueError, r"eps value: expected >= 0.0, got -1.0"),
        (dict(fp8_min=448.0), ValueError, r"fp8_min value: expected < fp8_max \(448.0\), got 448.0"),
        (dict(fp8_min=2**31), ValueError, r"fp8_min value: expected < fp8_max \(448.0\), got 2147483648"),
        (dict(fp8_min=float("nan")), ValueError, r"fp8_min value: expected a finite number"),
        (dict(fp8_max=float("inf")), ValueError, r"fp8_max value: expected a finite number"),
        (dict(fp8_max="448"), TypeError, r"fp8_max type: expected a real number"),
        (dict(scale_ue8m0=1), TypeError, r"scale_ue8m0 type: expected a bool, got int"),
        # int8 output: bounds past its range would wrap in the store
        (dict(int8=True, fp8_max=448.0), ValueError, r"fp8_min value: expected >= -128.0 and <= 127.0, got -448.0"),
        (dict(int8=True, fp8_min=-128.0, fp8_max=200.0), ValueError, r"fp8_max value: expected >= -128.0"),
    ],
)
def test_bad_scalars(change, error, pattern):
    x, q, s = _args()
    kwargs = dict(group_size=128, eps=EPS, fp8_min=-448.0, fp8_max=448.0, scale_ue8m0=False)
    change = dict(change)
    if change.pop("int8", False):
        q = q.view(torch.int8)
        per_token_group_quant_8bit(x, q, s.clone(), 128, EPS, -128.0, 127.0)  # load the int8 module
    kwargs.update(change)
    run(x[:1], 128)  # load the module: the eager fast path is tried first
    with pytest.raises(error, match=r"^per_token_group_quant_8bit: " + pattern):
        per_token_group_quant_8bit(x, q, s, **kwargs)
    assert (s == -1).all(), "an output was written before the error"


@requires_cuda
def test_bad_tensors():
    x, q, s = _args()
    op = r"^per_token_group_quant_8bit: "
    cases = [
        ((x, q.view(torch.uint8), s), r"output_q dtype: expected one of float8_e4m3fn, int8, got uint8"),
        ((x.double(), q, s), r"input dtype: expected one of float16, bfloat16, float32, got float64"),
        ((x, q, s.double()), r"output_s dtype: expected float32, got float64"),
        ((x, q[:, :256], s), r"output_q shape: expected \(4, 512\) \(the shape of input\), got \(4, 256\)"),
        ((x, q, s[:, :3]), r"output_s shape: expected \[dim0=4, num_groups=4\], got \(4, 3\)"),
        ((x[:, :500], q[:, :500], s), r"input shape: expected hidden_size \(last dim\) a multiple of group_size=128"),
        ((x, q, s.cpu()), r"output_s device: expected a CUDA device, got cpu$"),
        ((x, q.T.contiguous().T, s), r"output_q last-dim stride: expected 1"),
        ((x, q, torch.empty(1, 1, device="cuda").expand(4, 4)), r"output_s layout: expected no stride 0"),
        ((x, q, x.view(torch.float32)[:, :4]), r"output_s overlaps input: expected disjoint memory"),
    ]
    for args, pattern in cases:
        with pytest.raises(RuntimeError, match=op + pattern):
            per_token_group_quant_8bit(*args, 128, EPS, -448.0, 448.0)
    with pytest.raises(RuntimeError, match=op + r"output_s dtype: expected int32, got float32"):
        per_token_group_quant_8bit(x, q, s, 128, EPS, -448.0, 448.0, scale_ue8m0=True)
    with pytest.raises(RuntimeError, match=op + r"output_q dtype: expected float8_e4m3fn \(scale_ue8m0 is for fp8\)"):
        per_token_group_quant_8bit(x, q.view(torch.int8), s.int()[:, :1], 128, EPS, -128.0, 127.0, scale_ue8m0=True)
    assert (s == -1).all()


@requires_cuda
def test_float32_max_group_size():
    x, q, s = _args(in_dtype=torch.float32, k=1024, g=1024)
    with pytest.raises(ValueError, match=r"group_size value: expected >= 16 and <= 512, got 1024"):
        per_token_group_quant_8bit(x, q, s[:, :1], 1024, EPS, -448.0, 448.0)


@requires_cuda
def test_launcher_rejects_mismatch_from_cpp():
    """The C++ TensorMatcher is the second line: the module called directly raises RuntimeError
    naming the tensor, never a CUDA fault."""
    from sglang.jit_kernel.per_token_group_quant_8bit import _fn

    fn = _fn(torch.bfloat16, FP8, False)
    x, q, s = _args()
    with pytest.raises(RuntimeError, match="output_q"):
        fn(x, q.view(torch.uint8), s, 128, EPS, -448.0, 448.0, False)
    with pytest.raises(RuntimeError, match="output_q"):  # the fp8 module takes no int8 output
        fn(x, q.view(torch.int8), s, 128, EPS, -128.0, 127.0, False)
    with pytest.raises(RuntimeError, match="group_size"):
        fn(x, q, s, 96, EPS, -448.0, 448.0, False)
    with pytest.raises(RuntimeError, match="output_s"):
        fn(x, q, s[:, :3], 128, EPS, -448.0, 448.0, False)
    with pytest.raises(RuntimeError, match="scale_ue8m0 is for fp8"):
        _fn(torch.bfloat16, torch.int8, True)(x, q.view(torch.int8), s.int()[:, :1], 128, EPS, -128.0, 127.0, True)
    with pytest.raises(RuntimeError, match="without a clamp takes bounds at or past"):  # the clamp build's bounds
        fn(x, q, s, 128, EPS, -100.0, 300.0, False)
    assert math.isclose(float(s[0, 0]), -1.0)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
