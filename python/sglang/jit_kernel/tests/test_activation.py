"""Gated activations (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, run_activation): values against
fp32 references of the same inputs (<= 1 ulp for fp16 / bf16), the half-widths that crash other
libraries, poisoned outputs inside larger buffers, strided / offset / N-D views, 0 rows, the expert
filter (skipped rows keep their poison), > 2^31 elements, PDL on and off, graphs, torch.compile,
other devices, and every error (the CPU-tensor ones run without a GPU)."""

from __future__ import annotations

import pytest
import torch

from sglang.jit_kernel.activation import (
    SUPPORTED_ACTIVATIONS,
    activation_reference,
    gated_reference,
    gelu_and_mul,
    gelu_tanh_and_mul,
    run_activation,
    silu_and_mul,
)
from sglang.jit_kernel.testing import FLOAT_DTYPES, requires_cuda, requires_two_gpus
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=300, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=600, suite="nightly-kernel-1-gpu", nightly=True)

OPS = {"silu": silu_and_mul, "gelu": gelu_and_mul, "gelu_tanh": gelu_tanh_and_mul}
NAMES = sorted(OPS)

HALF_WIDTHS = get_ci_test_range(
    full_range=[1, 4, 7, 12, 64, 1234, 3420, 4096, 14336, 18432],
    ci_range=[1, 4, 7, 12, 64, 1234, 3420],
)
NUM_TOKENS = get_ci_test_range(full_range=[0, 1, 7, 129, 4097], ci_range=[0, 1, 7, 129])

#: Output error budget, in units in the last place of the output dtype. fp16 / bf16: the kernel and
#: the reference compute the same fp32 operations; an activation that lands near a rounding midpoint
#: of the dtype may round either way (libm ulps), and the comparison then accepts the product of
#: either rounding (see reference_pair), each to 1 ulp. fp32: nothing hides the libm ulps of
#: expf / erff / tanhf (<= 2 each) and the product's rounding, hence 4.
ULPS = {torch.float16: 1, torch.bfloat16: 1, torch.float32: 4}
#: Where `1 + erf(...)` / `1 + tanh(...)` cancel (gate << 0) one fp32 ulp of erf / tanh near -1 is
#: all of the result: an absolute slack of CANCEL_ULPS * 2^-24 * |gate * up| covers that (silu does
#: not cancel).
CANCEL_ULPS = {"silu": 0, "gelu": 4, "gelu_tanh": 4}
#: How close (fp32 ulps of the activation) to a rounding midpoint of the dtype the reference activation
#: may lie for either 16-bit rounding to pass: libm ulps and the 16-byte kernels' approximations (the
#: branch-free silu and logistic gelu_tanh: within 8 ulps, scripts/silu_branch_free_model.py and
#: scripts/gelu_logistic_fit.py), and for the logistic gelu its fit (up to ~33 ulps for -3.6 < gate < 0:
#: the one fp16 gate it rounds across a midpoint, -1.890625, lies 13 ulps from it; the fit script
#: checks every 16-bit gate's rounding against this window).
MIDPOINT_ULPS = {"silu": 8, "gelu": 16, "gelu_tanh": 8}


# ---------------------------------------------------------------------------------------------
# References and the ulp comparison
# ---------------------------------------------------------------------------------------------
def spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distance between neighbouring values of ``dtype`` at |values| (float64; subnormal
    spacing below the smallest normal)."""
    info = torch.finfo(dtype)
    mantissa_bits = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[dtype]
    exponent = torch.floor(torch.log2(values.double().abs().clamp_min(info.tiny)))
    return torch.exp2(exponent - mantissa_bits)


def activation_float64(name: str, gate: torch.Tensor) -> torch.Tensor:
    """``act(gate)`` in float64 without the fp32 formula's cancellation (gelu by erfc, gelu_tanh and
    silu as ``g * sigmoid(z)``): the value the fp32 formula approximates."""
    g = gate.double()
    if name == "silu":
        return g * torch.sigmoid(g)
    if name == "gelu":
        return g * 0.5 * torch.special.erfc(-g * 0.7071067811865476)
    return g * torch.sigmoid(2 * 0.7978845608 * (g + 0.044715 * g**3))


def reference_pair(
    name: str, x: torch.Tensor, act: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(expected, alternative, ambiguous)`` for ``x = [..., 2H]``.

    ``expected = round(float(round(act)) * up)`` with ``act`` the fp32 activation written as the
    kernel computes it (activation_reference), unless given. Where ``act`` lies within
    ``MIDPOINT_ULPS[name]`` fp32 ulps of a rounding midpoint of the dtype (``ambiguous``), a kernel
    whose libm or approximation differs by a few ulps rounds the activation the other way:
    ``alternative`` is the product of that other rounding.
    """
    h = x.shape[-1] // 2
    if act is None:
        act = activation_reference(name, x[..., :h])  # fp32
    up = x[..., h:].float()
    near = act.to(x.dtype)
    other = (2 * act.double() - near.double()).to(x.dtype)  # the neighbour across the midpoint, if near it
    midpoint = (near.double() + other.double()) / 2
    ambiguous = (act.double() - midpoint).abs() <= MIDPOINT_ULPS[name] * spacing(act, torch.float32)
    expected = (near.float() * up).to(x.dtype)
    alternative = (other.float() * up).to(x.dtype)
    return expected, alternative, ambiguous & (other != near)


def matches(name: str, out: torch.Tensor, x: torch.Tensor, act: torch.Tensor | None = None) -> torch.Tensor:
    """Per element: within ULPS[dtype] of the reference (or, where the activation's rounding is
    ambiguous, of the alternative), plus the cancellation slack; NaN never passes."""
    expected, alternative, ambiguous = reference_pair(name, x, act)
    h = x.shape[-1] // 2
    slack = CANCEL_ULPS[name] * 2.0**-24 * (x[..., :h].double() * x[..., h:].double()).abs()
    budget = ULPS[out.dtype] * spacing(expected, out.dtype) + slack
    got = out.double()
    ok = (got - expected.double()).abs() <= budget
    alt_budget = ULPS[out.dtype] * spacing(alternative, out.dtype) + slack
    ok |= ambiguous & ((got - alternative.double()).abs() <= alt_budget)
    ok |= got == expected.double()  # equal infinities (an overflowing product)
    return ok & ~torch.isnan(got)


def assert_matches_reference(name: str, out: torch.Tensor, x: torch.Tensor, or_float64: bool | None = None) -> None:
    """Every element of ``out`` matches the fp32 reference (``matches``). With ``or_float64`` (default:
    gelu and gelu_tanh) an element may instead match the float64 activation the same way: where the
    fp32 formula cancels (1 + erf, 1 + tanh for gate << 0) it can misround a 16-bit gate that a more
    accurate kernel (the logistic default of 16-bit gelu / gelu_tanh) rounds right."""
    expected, _, _ = reference_pair(name, x)
    ok = matches(name, out, x)
    if or_float64 is None:
        or_float64 = CANCEL_ULPS[name] > 0
    if or_float64:
        ok |= matches(name, out, x, activation_float64(name, x[..., : x.shape[-1] // 2]))
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:4].tolist()
        first = tuple(bad[0])
        raise AssertionError(
            f"{name}: {int((~ok).sum())} of {ok.numel()} elements beyond {ULPS[out.dtype]} ulp; first at {bad}: "
            f"got {out[first].item()!r}, expected {expected[first].item()!r}"
        )


def rows_for_16_byte_vectors(n: int) -> int:
    """Rows of ``n`` 16-bit gates each that keep 16-byte vectors: the launcher narrows the vectors of
    launches with fewer 16-byte vectors than two 64-thread CTAs per SM (its decode rule)."""
    vecs_per_row = n * 2 // 16
    return max(2, -(-2 * 64 * torch.cuda.get_device_properties(0).multi_processor_count // vecs_per_row))


def every_gate_rows(dtype: torch.dtype, up: float = 1.5) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: rows of every finite 16-bit gate of ``dtype`` (a multiple of 8 of them, so 16-byte
    vectors fit) with the given up value, repeated over enough rows that the launch keeps 16-byte
    vectors (rows_for_16_byte_vectors: the fast kernels of 16-bit types), and one row of every
    non-finite gate (NaN, +-inf) likewise."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    every = bits.view(dtype)
    gate = every[torch.isfinite(every)].cuda()
    gate = gate[: gate.numel() // 8 * 8]
    special = every[~torch.isfinite(every)].cuda()
    special = special[: special.numel() // 8 * 8]  # 256 (bf16) / 2048 (fp16): all of them
    rows = tuple(torch.cat([g, torch.full_like(g, up)]).view(1, -1) for g in (gate, special))
    return tuple(r.expand(rows_for_16_byte_vectors(r.shape[1] // 2), -1).contiguous() for r in rows)


def at_element_offset(x: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of ``x`` whose storage starts ``offset`` elements into a buffer: a 16-bit ``x`` with
    16-byte-multiple rows then allows vectors of ``2 * offset`` bytes at most (offset 1, 2, 4: the
    2-, 4- and 8-byte kernels, which compute the formulas)."""
    flat = torch.empty(x.numel() + offset, dtype=x.dtype, device=x.device)
    view = flat[offset:].view(x.shape)
    view.copy_(x)
    return view


def assert_specials_as_formula(name: str, got: torch.Tensor, y: torch.Tensor) -> None:
    """Non-finite gates (NaN, +-inf): the fp32 formula's value from torch (NaN where it is NaN, with
    any payload; +inf from +inf gates, NaN from -inf gates: -inf / inf, -inf * 0)."""
    want = gated_reference(name, y)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN where the formula has none, or the reverse"
    assert torch.equal(got[~nan], want[~nan])


def make_input(shape: tuple[int, ...], dtype: torch.dtype, scale: float = 3.0) -> torch.Tensor:
    """Gate and up values spread over the activations' curved range (|g| up to ~10)."""
    return (torch.randn(shape, device="cuda") * scale).to(dtype)


def poisoned_view(rows: int, cols: int, dtype: torch.dtype, pad: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``[rows, cols]`` view at (1, pad) of a NaN-filled ``[rows + 2, cols + 2 * pad]`` buffer. With
    the default pad the view keeps 16-byte alignment whenever ``cols`` allows it (the vector path);
    an odd pad misaligns it (the narrow paths)."""
    buffer = torch.full((rows + 2, cols + 2 * pad), float("nan"), dtype=dtype, device="cuda")
    return buffer[1 : rows + 1, pad : pad + cols], buffer


def assert_poison_around(buffer: torch.Tensor, rows: int, cols: int, pad: int = 8) -> None:
    """Everything of ``buffer`` outside the view of poisoned_view still NaN."""
    mask = torch.ones(buffer.shape, dtype=torch.bool, device=buffer.device)
    mask[1 : rows + 1, pad : pad + cols] = False
    assert torch.isnan(buffer[mask]).all(), "an op wrote outside its output view"


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hidden_size", HALF_WIDTHS)
@pytest.mark.parametrize("num_tokens", NUM_TOKENS)
def test_values_in_poisoned_out(name, dtype, hidden_size, num_tokens):
    x = make_input((num_tokens, 2 * hidden_size), dtype)
    before = x.clone()
    out, buffer = poisoned_view(num_tokens, hidden_size, dtype)
    assert OPS[name](x, out) is out
    assert_matches_reference(name, out, x)
    assert_poison_around(buffer, num_tokens, hidden_size)
    assert torch.equal(x, before), "the op modified its input"


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hidden_size", [1, 7, 4096])
def test_allocated_out(name, dtype, hidden_size):
    x = make_input((129, 2 * hidden_size), dtype)
    out = OPS[name](x)
    assert out.shape == (129, hidden_size) and out.dtype == dtype and out.device == x.device and out.is_contiguous()
    assert_matches_reference(name, out, x)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
def test_run_activation_matches_the_ops(name):
    x = make_input((7, 2 * 1234), torch.bfloat16)
    out = torch.empty(7, 1234, dtype=torch.bfloat16, device="cuda")
    assert run_activation(name, x, out) is out
    assert torch.equal(out, OPS[name](x))
    assert torch.equal(run_activation(name, x, None), out)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_extreme_gates(name, dtype):
    """Large |gate| (exp overflow, erf / tanh saturation), zeros, signed zeros, tiny values."""
    info = torch.finfo(dtype)
    gate = torch.tensor(
        [
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            20.0,
            -20.0,
            88.0,
            -88.0,
            100.0,
            -100.0,
            1e4,
            -1e4,
            info.max,
            -info.max,
            info.tiny,
            -info.tiny,
        ],
        device="cuda",
    ).to(dtype)
    up = torch.full_like(gate, 1.5)
    x = torch.cat([gate, up]).view(1, -1)
    out = OPS[name](x)
    assert_matches_reference(name, out, x)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("enable_pdl", [None, True, False])
def test_pdl_on_and_off_agree(name, enable_pdl):
    x = make_input((64, 2 * 14336), torch.bfloat16)
    expected = OPS[name](x, enable_pdl=False)
    assert torch.equal(OPS[name](x, enable_pdl=enable_pdl), expected)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(
    "num_tokens,hidden_size", [(1, 14336), (64, 14336), (2100, 14336), (129, 64), (4097, 4), (7, 1234)]
)
def test_launch_geometries(name, dtype, num_tokens, hidden_size):
    """The launch shapes the heuristics pick: decode rows on narrowed vectors, one wave of the largest
    even CTAs, one-shot grids of 256-thread CTAs, several rows per CTA, several chunks per row."""
    x = make_input((num_tokens, 2 * hidden_size), dtype)
    out, buffer = poisoned_view(num_tokens, hidden_size, dtype)
    OPS[name](x, out)
    assert_matches_reference(name, out, x)
    assert_poison_around(buffer, num_tokens, hidden_size)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_logistic_every_16_bit_gate(dtype):
    """The logistic gelu / gelu_tanh (16-bit types on 16-byte vectors) on every finite 16-bit gate, up =
    1.5 and up = 1 (the activation's own rounding): gelu_tanh against the fp32 reference, gelu against
    it or the float64 activation (the fp32 formula's 1 + erf cancels near gate -3, where it misrounds 3
    fp16 gates that the fit rounds as float64 does: scripts/gelu_logistic_fit.py). Non-finite gates give
    the formula's values."""
    x, y = every_gate_rows(dtype)
    up_one, _ = every_gate_rows(dtype, up=1.0)
    h = x.shape[1] // 2
    for name in ("gelu_tanh", "gelu"):
        got = OPS[name](x)
        got_up_one = OPS[name](up_one)
        assert_matches_reference(name, got, x, or_float64=name == "gelu")
        # up = 1: the rounded activation itself, exactly the rounding of the formula or of the float64
        # value (or across a midpoint within MIDPOINT_ULPS of it); the formula's cancellation region
        # (gate <= -3.6) is left to the slack of assert_matches_reference
        assert_matches_reference(name, got_up_one, up_one, or_float64=name == "gelu")
        ok = up_one[:, :h] <= -3.6
        for act in (None, activation_float64(name, up_one[:, :h])):
            expected, alternative, ambiguous = reference_pair(name, up_one, act)
            ok |= (got_up_one == expected) | (ambiguous & (got_up_one == alternative))
        assert bool(ok.all()), up_one[:, :h][~ok][:8].tolist()
        assert_specials_as_formula(name, OPS[name](y), y)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_branch_free_silu_every_16_bit_gate(dtype):
    """The branch-free silu (16-bit types on 16-byte vectors) on every finite 16-bit gate: against the
    fp32 reference at up = 1.5, and at up = 1 the rounded activation itself, exactly the formula's
    rounding or (within MIDPOINT_ULPS of a midpoint) its neighbour (scripts/silu_branch_free_model.py
    models both on the CPU; bf16 gates -87.5 .. -88.5 keep their tiny normal results). Non-finite
    gates give the formula's values (+inf from +inf, NaN from -inf and NaN)."""
    x, y = every_gate_rows(dtype)
    up_one, _ = every_gate_rows(dtype, up=1.0)
    assert_matches_reference("silu", silu_and_mul(x), x, or_float64=False)
    got_up_one = silu_and_mul(up_one)
    assert_matches_reference("silu", got_up_one, up_one, or_float64=False)
    expected, alternative, ambiguous = reference_pair("silu", up_one)
    ok = (got_up_one == expected) | (ambiguous & (got_up_one == alternative))
    assert bool(ok.all()), up_one[:, : x.shape[1] // 2][~ok][:8].tolist()
    assert_specials_as_formula("silu", silu_and_mul(y), y)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_formula_kernels_every_16_bit_gate(name, dtype):
    """The 2-, 4- and 8-byte kernels of 16-bit types (the formulas) on every 16-bit gate pattern in a
    fixed shuffle (NaN, infinities, zeros, subnormals included), up = 1.5: the same bits from every
    width, within the fp32 reference's ulps. silu's division by __fdiv_rn's instruction sequence
    (silu_quotient_rn) is exact only inside its range: 2-byte vectors (one gate) take it wherever the
    gate allows, while at 4 and 8 bytes almost every vector holds a gate outside the range and is
    recomputed through __fdiv_rn, so equal bits show the sequence equals __fdiv_rn."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    order = torch.randperm(bits.numel(), generator=torch.Generator().manual_seed(15))
    gate = bits[order].view(dtype).cuda()
    row = torch.cat([gate, torch.full_like(gate, 1.5)]).view(1, -1)
    x = row.expand(rows_for_16_byte_vectors(gate.numel()), -1).contiguous()  # 8-byte vectors kept
    outs = [OPS[name](at_element_offset(x, offset)) for offset in (1, 2, 4)]
    for out in outs[1:]:
        assert torch.equal(out.view(torch.int16), outs[0].view(torch.int16))
    finite = torch.isfinite(gate)
    finite_x = torch.cat([gate[finite], torch.full_like(gate[finite], 1.5)]).view(1, -1)
    assert_matches_reference(name, outs[0][0, finite].view(1, -1), finite_x)
    assert_specials_as_formula(name, outs[0][0, ~finite], torch.cat([gate[~finite], row[0, gate.numel() :][~finite]]))


# ---------------------------------------------------------------------------------------------
# Layouts: strided rows, unaligned pointers, N-D inputs, empty inputs, > 2^31 elements
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hidden_size", [1, 12, 1234, 4096])
@pytest.mark.parametrize("in_col,extra_cols", [(0, 0), (0, 8), (1, 3), (3, 8), (8, 16)])
def test_strided_and_offset_input(name, dtype, hidden_size, in_col, extra_cols):
    """input: a column slice (row stride 2H + extra, pointer offset in_col elements) of a wider buffer."""
    wide = make_input((129, 2 * hidden_size + in_col + extra_cols), dtype)
    x = wide[:, in_col : in_col + 2 * hidden_size]
    pad = 8 if in_col % 8 == 0 else in_col + 1  # out aligned like input, or not
    out, buffer = poisoned_view(129, hidden_size, dtype, pad=pad)
    OPS[name](x, out)
    assert_matches_reference(name, out, x)
    assert_poison_around(buffer, 129, hidden_size, pad=pad)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset", [1, 2, 3, 4, 7])
def test_unaligned_data_pointers(name, dtype, offset):
    """Storage offsets that break 16-byte alignment of input and of out, separately and together."""
    h = 4096
    flat = make_input((7 * 2 * h + offset,), dtype)
    x = flat[offset:].view(7, 2 * h)
    out_flat = torch.full((7 * h + 2 * offset,), float("nan"), dtype=dtype, device="cuda")
    out = out_flat[offset : offset + 7 * h].view(7, h)
    OPS[name](x, out)
    assert_matches_reference(name, out, x)
    assert torch.isnan(out_flat[:offset]).all() and torch.isnan(out_flat[offset + 7 * h :]).all()
    aligned = make_input((7, 2 * h), dtype)
    OPS[name](aligned, out)  # only out unaligned
    assert_matches_reference(name, out, aligned)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
def test_nd_input_and_out(name):
    x = make_input((3, 5, 2 * 64), torch.bfloat16)
    out = OPS[name](x)
    assert out.shape == (3, 5, 64)
    assert_matches_reference(name, out, x)
    given = torch.empty(3, 5, 64, dtype=torch.bfloat16, device="cuda")
    assert OPS[name](x, given) is given and torch.equal(given, out)
    one_row = make_input((2 * 1234,), torch.float16)  # 1-D: a single row
    assert_matches_reference(name, OPS[name](one_row), one_row)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
def test_leading_dims_that_do_not_flatten(name):
    """input whose leading dims have no single row stride is copied first; out must flatten."""
    base = make_input((5, 3, 2 * 64), torch.bfloat16)
    x = base.transpose(0, 1)  # [3, 5, 128], leading strides (128, 384)
    out = OPS[name](x)
    assert out.shape == (3, 5, 64)
    assert_matches_reference(name, out, x)
    bad_out = torch.empty(5, 3, 64, dtype=torch.bfloat16, device="cuda").transpose(0, 1)
    with pytest.raises(RuntimeError, match=r"^\w+: out layout: expected leading dims that flatten"):
        OPS[name](x, bad_out)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(0, 2 * 4096), (0, 2), (2, 0, 2 * 7), (3, 0)])
def test_empty(name, shape):
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    out = OPS[name](x)
    assert out.shape == (*shape[:-1], shape[-1] // 2)
    given = torch.empty(out.shape, dtype=torch.bfloat16, device="cuda")
    assert OPS[name](x, given) is given


@requires_cuda
def test_more_than_2_pow_31_elements():
    """64-bit offsets: out has 2^31 + 16384 elements, input twice that (13 GiB in all, bf16)."""
    t, h = (1 << 17) + 1, 1 << 14
    need = 3 * t * h * 2
    free, _ = torch.cuda.mem_get_info()
    if free < need + (4 << 30):
        pytest.skip(f"needs {need / 2**30:.0f} GiB free GPU memory (+4 for the check), {free / 2**30:.0f} GiB free")
    x = torch.empty(t, 2 * h, dtype=torch.bfloat16, device="cuda").uniform_(-6, 6)
    out = torch.empty(t, h, dtype=torch.bfloat16, device="cuda")
    out[-64:].fill_(float("nan"))
    silu_and_mul(x, out)
    for lo in (0, t // 2, t - 64):  # rows past 2^31 elements of input and of out at the end
        assert_matches_reference("silu", out[lo : lo + 64], x[lo : lo + 64])
    del x, out
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Expert filter
# ---------------------------------------------------------------------------------------------
def expert_ids_for(num_tokens: int, step: int, extra: int = 0, seed: int = 0) -> torch.Tensor:
    """ceil(num_tokens / step) + extra int32 ids, about a third of them -1."""
    n = -(-num_tokens // step) + extra
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 8, (n,), generator=g, dtype=torch.int32)
    ids[torch.rand(n, generator=g) < 0.35] = -1
    if n:
        ids[0] = -1
    return ids.cuda()


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_tokens,hidden_size", [(129, 4096), (7, 1234), (4097, 12), (64, 1)])
@pytest.mark.parametrize("step,extra", [(1, 0), (1, 5), (2, 0), (4, 3), (7, 0)])
def test_expert_filter_leaves_skipped_rows_untouched(name, dtype, num_tokens, hidden_size, step, extra):
    x = make_input((num_tokens, 2 * hidden_size), dtype)
    ids = expert_ids_for(num_tokens, step, extra)
    ids_before = ids.clone()
    out, buffer = poisoned_view(num_tokens, hidden_size, dtype)
    assert OPS[name](x, out, ids, step) is out
    kept = ids[torch.arange(num_tokens, device="cuda") // step] != -1
    assert torch.isnan(out[~kept]).all(), "a row filtered out by expert_ids was written"
    assert_matches_reference(name, out[kept], x[kept])
    assert_poison_around(buffer, num_tokens, hidden_size)
    assert torch.equal(ids, ids_before)


@requires_cuda
def test_expert_filter_all_skipped_and_none_skipped():
    x = make_input((33, 2 * 64), torch.bfloat16)
    out = torch.full((33, 64), float("nan"), dtype=torch.bfloat16, device="cuda")
    silu_and_mul(x, out, torch.full((33,), -1, dtype=torch.int32, device="cuda"))
    assert torch.isnan(out).all()
    silu_and_mul(x, out, torch.zeros(17, dtype=torch.int32, device="cuda"), expert_step=2)
    assert torch.equal(out, silu_and_mul(x))


# ---------------------------------------------------------------------------------------------
# Graphs, streams, torch.compile, devices
# ---------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("with_ids", [False, True])
def test_cuda_graph_capture_and_replay(name, with_ids):
    x = make_input((64, 2 * 14336), torch.bfloat16)
    ids = expert_ids_for(64, 1) if with_ids else None
    out = torch.full((64, 14336), float("nan"), dtype=torch.bfloat16, device="cuda")
    OPS[name](x, out, ids)  # load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        OPS[name](x, out, ids)
    x.copy_(make_input(x.shape, x.dtype))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    kept = torch.ones(64, dtype=torch.bool, device="cuda") if ids is None else ids != -1
    assert_matches_reference(name, out[kept], x[kept])
    assert torch.isnan(out[~kept]).all()


@requires_cuda
def test_side_stream():
    x = make_input((129, 2 * 4096), torch.float16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = gelu_tanh_and_mul(x)
    stream.synchronize()
    assert_matches_reference("gelu_tanh", out, x)


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["alloc", "out", "ids", "nd"])
def test_torch_compile_fullgraph(name, mode):
    torch._dynamo.reset()
    op = OPS[name]
    ids = expert_ids_for(129, 2)

    def f(x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if mode == "alloc":
            return op(y) + 1
        if mode == "out":
            op(y, o)
            return o + 1
        if mode == "ids":
            op(y, o, ids, 2)
            return o
        return op(y.view(3, 43, -1)) + 1

    x = make_input((129, 2 * 1234), torch.bfloat16, scale=1.5)
    o = torch.zeros(129, 1234, dtype=torch.bfloat16, device="cuda")
    o_eager = o.clone()
    compiled = torch.compile(f, fullgraph=True)
    got = compiled(x, o)
    expected = f(x, o_eager)
    torch.testing.assert_close(got.view(129, 1234), expected.view(129, 1234), rtol=0, atol=0)
    torch.testing.assert_close(o, o_eager, rtol=0, atol=0)


@requires_two_gpus
def test_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    x = make_input((129, 2 * 4096), torch.bfloat16).to("cuda:1")
    ids = expert_ids_for(129, 1).to("cuda:1")
    out = torch.full((129, 4096), float("nan"), dtype=torch.bfloat16, device="cuda:1")
    silu_and_mul(x, out, ids)
    kept = ids != -1
    assert_matches_reference("silu", out[kept], x[kept])
    assert torch.isnan(out[~kept]).all()
    with pytest.raises(
        RuntimeError,
        match=r"^silu_and_mul: out device: expected cuda:1 \(the device of input\), "
        r"got cuda:0$",
    ):
        silu_and_mul(x, torch.empty(129, 4096, dtype=torch.bfloat16, device="cuda:0"))
    with pytest.raises(RuntimeError, match=r"^silu_and_mul: expert_ids device: expected cuda:1"):
        silu_and_mul(x, out, ids.to("cuda:0"))


# ---------------------------------------------------------------------------------------------
# Errors: raised before any launch, naming the argument; nothing the caller passed is changed
# ---------------------------------------------------------------------------------------------
def test_supported_activations():
    assert SUPPORTED_ACTIVATIONS == {"silu", "gelu", "gelu_tanh"}


@pytest.mark.parametrize("op_name", ["relu", "SILU", "", None, 3])
def test_run_activation_unknown_name(op_name):
    x = torch.zeros(2, 8)
    with pytest.raises(
        ValueError, match=r"^run_activation: op_name value: expected one of gelu, gelu_tanh, silu, got "
    ):
        run_activation(op_name, x, None)


@pytest.mark.parametrize("name", NAMES)
def test_cpu_input(name):
    op = f"{name}_and_mul"
    with pytest.raises(RuntimeError, match=rf"^{op}: input device: expected a CUDA device, got cpu$"):
        OPS[name](torch.zeros(4, 8))


@pytest.mark.parametrize("name", NAMES)
def test_not_a_tensor(name):
    with pytest.raises(TypeError, match=rf"^{name}_and_mul: input type: expected a torch.Tensor, got list$"):
        OPS[name]([1.0, 2.0])


@requires_cuda
@pytest.mark.parametrize("name", NAMES)
def test_bad_arguments(name):
    op = f"{name}_and_mul"
    fn = OPS[name]
    x = make_input((8, 2 * 64), torch.bfloat16)
    fn(x)  # load the module: the calls below try the fast path first, then explain
    out = torch.full((8, 64), float("nan"), dtype=torch.bfloat16, device="cuda")
    cases = [
        (
            dict(input=make_input((8, 129), torch.bfloat16)),
            RuntimeError,
            rf"^{op}: input last dim: expected even \(2 \* hidden_size\), got 129$",
        ),
        (
            dict(input=x.to(torch.float64)),
            RuntimeError,
            rf"^{op}: input dtype: expected one of float16, bfloat16, float32, got float64$",
        ),
        (dict(input=x.to(torch.int32)), RuntimeError, rf"^{op}: input dtype: expected one of "),
        (
            dict(input=make_input((8, 256), torch.bfloat16)[:, ::2]),
            RuntimeError,
            rf"^{op}: input last-dim stride: expected 1 \(a contiguous last dim\), got 2 ",
        ),
        (
            dict(out=torch.empty(8, 63, dtype=torch.bfloat16, device="cuda")),
            RuntimeError,
            rf"^{op}: out shape: expected \(8, 64\) \(the shape of input with the last dim halved\), got \(8, 63\)$",
        ),
        (
            dict(out=torch.empty(8, 128, dtype=torch.bfloat16, device="cuda")),
            RuntimeError,
            rf"^{op}: out shape: expected \(8, 64\) ",
        ),
        (
            dict(out=torch.empty(8, 64, dtype=torch.float16, device="cuda")),
            RuntimeError,
            rf"^{op}: out dtype: expected bfloat16 \(the dtype of input\), got float16$",
        ),
        (
            dict(out=torch.empty(8, 64, dtype=torch.bfloat16)),
            RuntimeError,
            rf"^{op}: out device: expected a CUDA device, got cpu$",
        ),
        (
            dict(out=torch.empty(8, 128, dtype=torch.bfloat16, device="cuda")[:, ::2]),
            RuntimeError,
            rf"^{op}: out last-dim stride: expected 1 \(a contiguous last dim\), got 2 ",
        ),
        (
            dict(out=torch.empty(1, 64, dtype=torch.bfloat16, device="cuda").expand(8, 64)),
            RuntimeError,
            rf"^{op}: out row stride: expected >= hidden_size = 64 \(rows that do not overlap\), got 0$",
        ),
        (dict(out=x[:, :64]), RuntimeError, rf"^{op}: out overlaps input: expected disjoint memory[ ,]"),
        (dict(out="out"), TypeError, rf"^{op}: out type: expected a torch.Tensor, got str$"),
        (
            dict(expert_ids=torch.zeros(8, dtype=torch.int64, device="cuda")),
            RuntimeError,
            rf"^{op}: expert_ids dtype: expected int32, got int64$",
        ),
        (
            dict(expert_ids=torch.zeros(7, dtype=torch.int32, device="cuda")),
            RuntimeError,
            rf"^{op}: expert_ids length: expected >= 8 \(ceil\(num_tokens / expert_step\) = ceil\(8 / 1\)\), got 7$",
        ),
        (
            dict(expert_ids=torch.zeros(3, dtype=torch.int32, device="cuda"), expert_step=2),
            RuntimeError,
            rf"^{op}: expert_ids length: expected >= 4 \(ceil\(num_tokens / expert_step\) = ceil\(8 / 2\)\), got 3$",
        ),
        (
            dict(expert_ids=torch.zeros(8, dtype=torch.int32)),
            RuntimeError,
            rf"^{op}: expert_ids device: expected a CUDA device, got cpu$",
        ),
        (
            dict(expert_ids=torch.zeros(2, 8, dtype=torch.int32, device="cuda")),
            RuntimeError,
            rf"^{op}: expert_ids shape: expected \[num_expert_ids\], got \(2, 8\)$",
        ),
        (
            dict(expert_ids=torch.zeros(16, dtype=torch.int32, device="cuda")[::2]),
            RuntimeError,
            rf"^{op}: expert_ids layout: expected contiguous, got shape \(8,\) with strides \(2,\)$",
        ),
        (
            dict(expert_ids=out.view(-1).view(torch.int32)[:8]),
            RuntimeError,
            rf"^{op}: out overlaps expert_ids: expected disjoint memory, got ",
        ),
        (dict(expert_ids=[0] * 8), TypeError, rf"^{op}: expert_ids type: expected a torch.Tensor, got list$"),
        (
            dict(expert_step=0),
            ValueError,
            rf"^{op}: expert_step value: expected >= 1 and <= 9223372036854775807, got 0$",
        ),
        (
            dict(expert_step=-3),
            ValueError,
            rf"^{op}: expert_step value: expected >= 1 and <= 9223372036854775807, got -3$",
        ),
        (dict(expert_step=2.0), TypeError, rf"^{op}: expert_step type: expected an int, got float$"),
        (dict(expert_step=True), TypeError, rf"^{op}: expert_step type: expected an int, got bool$"),
        (dict(enable_pdl=1), TypeError, rf"^{op}: enable_pdl type: expected a bool or None, got int$"),
    ]
    for overrides, error, pattern in cases:
        args = dict(input=x, out=out, expert_ids=None, expert_step=1)
        args.update(overrides)
        pdl = args.pop("enable_pdl", None)
        before = x.clone()
        with pytest.raises(error, match=pattern):
            fn(args["input"], args["out"], args["expert_ids"], args["expert_step"], enable_pdl=pdl)
        assert torch.equal(x, before)
        assert torch.isnan(out).all(), f"{overrides}: out written by a refused call"


@requires_cuda
def test_ffi_rejects_mismatches_from_cpp():
    """The launcher's TensorMatcher is the second line: the modules called directly with bad tensors
    raise RuntimeError naming the tensor, never a CUDA fault."""
    from sglang.jit_kernel.activation import (
        _jit_gelu_and_mul_module,
        _jit_gelu_tanh_and_mul_module,
        _jit_silu_and_mul_module,
    )

    silu = _jit_silu_and_mul_module(torch.bfloat16).silu_and_mul
    gelu = _jit_gelu_and_mul_module(torch.bfloat16).gelu_and_mul
    gelu_tanh = _jit_gelu_tanh_and_mul_module(torch.bfloat16).gelu_tanh_and_mul
    x = make_input((8, 128), torch.bfloat16)
    out = torch.empty(8, 64, dtype=torch.bfloat16, device="cuda")
    ids = torch.zeros(8, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="input"):
        silu(out, x.float(), None, 1, -1)
    with pytest.raises(RuntimeError, match="even"):
        silu(out, x[:, :127], None, 1, -1)
    with pytest.raises(RuntimeError, match="hidden_size"):
        gelu(out[:, :63], x, None, 1, -1)
    with pytest.raises(RuntimeError, match="expert_step"):
        gelu_tanh(out, x, ids, 0, -1)
    with pytest.raises(RuntimeError, match="expert_ids"):
        silu(out, x, ids[:7], 1, -1)
    with pytest.raises(RuntimeError, match="expert_ids"):
        silu(out, x, ids.long(), 1, -1)
    with pytest.raises(RuntimeError, match="overlaps|share memory"):
        silu(x[:, :64], x, None, 1, -1)


@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_each_op_builds_its_own_module(op, dtype, monkeypatch):
    """An op's first call compiles its module alone: named for the op and dtype, the one header, and
    one export, the launcher of its own activation (not its siblings')."""
    from sglang.jit_kernel import activation

    calls = []
    monkeypatch.setattr(activation, "load_jit", lambda *marker, **kwargs: calls.append((marker, kwargs)))
    activation._load_gated_module(op, dtype)
    [(marker, kwargs)] = calls
    enum = {"silu_and_mul": "kSilu", "gelu_and_mul": "kGelu", "gelu_tanh_and_mul": "kGeluTanh"}[op]
    cpp_type = {torch.float16: "fp16_t", torch.bfloat16: "bf16_t", torch.float32: "fp32_t"}[dtype]
    assert marker == (op, cpp_type)
    assert kwargs["cuda_files"] == ["elementwise/activation.cuh"]
    assert kwargs["cuda_wrappers"] == [(op, f"gated_act_and_mul<{cpp_type}, GatedActivation::{enum}>")]


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
