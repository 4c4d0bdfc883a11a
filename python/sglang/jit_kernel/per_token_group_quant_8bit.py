"""per_token_group_quant_8bit: fp8 e4m3 / int8 quantization with one scale per group of a row."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._quant_8bit import (
    TYPE_MAX,
    as_rows,
    check_outputs_disjoint,
    emulate_amax,
    emulate_quant,
    emulate_scale,
    last_dim_contiguous,
)
from sglang.jit_kernel._validate import (
    FAST_PATH_REFUSALS,
    FLOAT32_MAX,
    FLOAT_DTYPES,
    check_finite_float32,
    check_scalar,
    check_shape,
    check_tensor,
    dtype_name,
    fail,
    launcher_errors,
    tracing,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["per_token_group_quant_8bit"]

_OP = "per_token_group_quant_8bit"
_OUT_DTYPES = (torch.float8_e4m3fn, torch.int8)


_FP8_MAX = TYPE_MAX[torch.float8_e4m3fn]


def _clamps(fp8_min: float, fp8_max: float) -> bool:
    """Whether bounds need the clamping build: any inside +-448 (int8's always are); wider fp8
    bounds are the satfinite conversion's own."""
    return fp8_min > -_FP8_MAX or fp8_max < _FP8_MAX


@cache_once
def _jit_module(in_dtype: torch.dtype, out_dtype: torch.dtype, clamp: bool) -> Module:
    """Compile (first use) and cache the module for ``in_dtype`` -> ``out_dtype``, with the clamp or
    without (int8 output: with), its kernels only."""
    args = make_cpp_args(in_dtype, out_dtype, clamp)
    return load_jit(
        _OP,
        *args,
        cuda_files=["quantization/per_token_group_quant_8bit.cuh"],
        cuda_wrappers=[(_OP, f"per_token_group_quant_8bit<{args}>")],
    )


# The exported function by (input dtype, output_q dtype, clamp), filled when its module is loaded
# (the eager fast path).
_FNS: dict[tuple[torch.dtype, torch.dtype, bool], Callable[..., None]] = {}


def _fn(in_dtype: torch.dtype, out_dtype: torch.dtype, clamp: bool) -> Callable[..., None]:
    fn = _jit_module(in_dtype, out_dtype, clamp).per_token_group_quant_8bit
    _FNS[(in_dtype, out_dtype, clamp)] = fn
    return fn


def max_group_size(dtype: torch.dtype) -> int:
    """Largest group_size for input ``dtype``: 32 lanes x 4 chunks of 16 bytes (1024 for 16-bit
    inputs, 512 for float32)."""
    return 32 * 4 * (16 // torch.empty((), dtype=dtype).element_size())


@torch.library.custom_op(
    "sglang_jit_kernel::per_token_group_quant_8bit", mutates_args=("output_q", "output_s"), device_types="cuda"
)
def _per_token_group_quant_8bit_op(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    group_size: int,
    eps: float,
    fp8_min: float,
    fp8_max: float,
    scale_ue8m0: bool,
) -> None:
    _launch(input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0)


@_per_token_group_quant_8bit_op.register_fake
def _(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    group_size: int,
    eps: float,
    fp8_min: float,
    fp8_max: float,
    scale_ue8m0: bool,
) -> None:
    return None


def _launch(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    group_size: int,
    eps: float,
    fp8_min: float,
    fp8_max: float,
    scale_ue8m0: bool,
) -> None:
    hidden_size = input.shape[-1]
    num_tokens = input.numel() // hidden_size
    rows = (
        as_rows(_OP, "input", input, num_tokens, copy_ok=True),
        as_rows(_OP, "output_q", output_q, num_tokens, copy_ok=False),
        as_rows(_OP, "output_s", output_s, num_tokens, copy_ok=False),
    )
    with launcher_errors(_OP):  # the launcher's exact overlap checks, named for the op
        fn = _fn(input.dtype, output_q.dtype, _clamps(fp8_min, fp8_max))
        fn(*rows, group_size, eps, fp8_min, fp8_max, scale_ue8m0)


def _check(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    group_size: int,
    eps: float,
    fp8_min: float,
    fp8_max: float,
    scale_ue8m0: bool,
) -> torch.Tensor:
    """Every check of the op, in argument order; returns ``input`` laid out for the kernel (last dim
    contiguous: a copy if it was not)."""
    check_tensor(_OP, "input", input, dtypes=FLOAT_DTYPES)
    if input.dim() == 0:
        fail(RuntimeError, _OP, "input", "dims", "at least 1 ([..., hidden_size])", "a 0-d tensor")
    check_tensor(_OP, "output_q", output_q, dtypes=_OUT_DTYPES, device_as=(input, "input"))
    check_scalar(_OP, "group_size", group_size, int, minimum=16, maximum=max_group_size(input.dtype))
    if group_size & (group_size - 1):
        fail(ValueError, _OP, "group_size", "value", "a power of two", group_size)
    check_scalar(_OP, "eps", eps, float, minimum=0.0)
    for arg, bound in (("fp8_min", fp8_min), ("fp8_max", fp8_max)):
        check_scalar(_OP, arg, bound, float)
        check_finite_float32(_OP, arg, bound)  # the kernel takes float32 bounds
    if not fp8_min < fp8_max:
        fail(ValueError, _OP, "fp8_min", "value", f"< fp8_max ({fp8_max})", fp8_min)
    if output_q.dtype == torch.int8:  # the rounded value is stored as int8: bounds past it would wrap
        check_scalar(_OP, "fp8_min", fp8_min, float, minimum=-128.0, maximum=127.0)
        check_scalar(_OP, "fp8_max", fp8_max, float, minimum=-128.0, maximum=127.0)
    check_scalar(_OP, "scale_ue8m0", scale_ue8m0, bool)
    if scale_ue8m0 and output_q.dtype != torch.float8_e4m3fn:
        fail(
            RuntimeError, _OP, "output_q", "dtype", "float8_e4m3fn (scale_ue8m0 is for fp8)", dtype_name(output_q.dtype)
        )

    hidden_size = input.shape[-1]
    if hidden_size % group_size:
        fail(
            RuntimeError,
            _OP,
            "input",
            "shape",
            f"hidden_size (last dim) a multiple of group_size={group_size}",
            tuple(input.shape),
        )
    if output_q.shape != input.shape:
        fail(
            RuntimeError, _OP, "output_q", "shape", f"{tuple(input.shape)} (the shape of input)", tuple(output_q.shape)
        )
    num_groups = hidden_size // group_size
    scale_cols = (num_groups + 3) // 4 if scale_ue8m0 else num_groups
    check_tensor(
        _OP, "output_s", output_s, dtypes=(torch.int32 if scale_ue8m0 else torch.float32,), device_as=(input, "input")
    )
    leading = [(f"dim{i}", n) for i, n in enumerate(input.shape[:-1])]
    num_tokens = input.numel() // hidden_size if hidden_size else 0
    col = ("num_groups / 4 rounded up" if scale_ue8m0 else "num_groups", scale_cols)
    if output_s.dim() == 2 and input.dim() != 2 and output_s.shape[0] == num_tokens:
        check_shape(_OP, "output_s", output_s, [("num_tokens", num_tokens), col])
    else:
        check_shape(_OP, "output_s", output_s, [*leading, col])
    if output_q.stride(-1) != 1 and hidden_size > 1:
        fail(
            RuntimeError,
            _OP,
            "output_q",
            "last-dim stride",
            "1 (a contiguous last dim)",
            f"{output_q.stride(-1)} (shape {tuple(output_q.shape)} with strides {output_q.stride()})",
        )
    if 0 in output_s.stride() and output_s.numel() > 1:
        fail(RuntimeError, _OP, "output_s", "layout", "no stride 0 (an expanded tensor)", output_s.stride())
    check_outputs_disjoint(_OP, input, output_q, output_s)
    return last_dim_contiguous(input)


def per_token_group_quant_8bit(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    group_size: int,
    eps: float,
    fp8_min: float,
    fp8_max: float,
    scale_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each group of ``group_size`` consecutive values of a row to 8 bits with its own scale.

    Per group ``x`` (fp32 arithmetic, IEEE roundings, in this order)::

        s = clamp(max(max|x|, eps) / q_type_max, FLT_MIN, FLT_MAX)   # q_type_max 448 (fp8), 127 (int8)
        s = 2 ** ceil(log2(s)), at most 2**127                        # scale_ue8m0 only
        q = round(clamp(x * (1 / s), fp8_min, fp8_max))               # to output_q's dtype

    ``round`` is round-to-nearest-even (fp8 e4m3 saturating, int8). The FLT_MIN floor keeps every
    scale finite and > 0, so all-zero or tiny groups give zeros, never NaN; a group holding inf gets
    s = FLT_MAX (+inf quantizes to fp8_max, -inf to fp8_min; fp8 saturates at +-448). NaN inputs are ignored by the maximum and quantize to NaN
    (fp8) or 0 (int8). Moves ``M*K*s_in + M*K + 4*M*K/group_size`` bytes (``M`` rows, ``K`` hidden_size).

    Parameters
    ----------
    input : torch.Tensor
        ``[..., hidden_size]`` CUDA tensor, float16 / bfloat16 / float32; leading dims flatten to
        ``num_tokens``. Row strides are read as laid out (``x[:, :K]`` of a wider buffer, storage
        offsets); leading dims that do not flatten, or a non-contiguous last dim (a transposed
        tensor), are copied first, giving exactly the result of ``input.contiguous()``. Not modified.
    output_q : torch.Tensor
        Written: the shape of ``input``, ``torch.float8_e4m3fn`` or ``torch.int8``, last dim
        contiguous, any row stride; must not overlap ``input``.
    output_s : torch.Tensor
        Written: ``float32 [..., num_groups]`` (``num_groups = hidden_size / group_size``), or
        ``[num_tokens, num_groups]``; any strides without repeats: row-major, or column-major (the
        transposed TMA-aligned layout ``torch.empty(num_groups, M_pad).T[:M]``), detected from the
        strides. With ``scale_ue8m0``: ``int32 [..., ceil(num_groups / 4)]``, four exponent bytes per
        word (group ``g`` in byte ``g % 4``, little-endian; bytes past the last group 0), usually
        column-major.
    group_size : int
        A power of two, 16 to 1024 (float32 input: 512), dividing ``hidden_size``.
    eps : float
        Floor of each group's maximum (>= 0; typically 1e-10).
    fp8_min, fp8_max : float
        Clamp bounds (``fp8_min < fp8_max``, both finite float32 values), e.g. -448 / 448 for fp8,
        -128 / 127 for int8 (int8 output: both within [-128, 127]).
    scale_ue8m0 : bool
        Power-of-two scales stored as exponent bytes (fp8 output only). Default False.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``(output_q, output_s)``, the same objects, written in place; with 0 elements nothing is
        launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, or a scalar of the wrong type.
    ValueError
        ``group_size`` not a power of two in range, ``eps`` negative or NaN, ``fp8_min >= fp8_max``,
        a bound NaN, infinite or past the float32 range, a bound outside [-128, 127] with int8
        output, e.g. ``per_token_group_quant_8bit: group_size value: expected a power of two, got
        48``.
    RuntimeError
        Before any launch, naming the argument: a tensor not on CUDA or on another device than
        ``input``, an unsupported dtype (``output_q`` not fp8 e4m3 / int8, ``output_s`` not float32 /
        int32 for ue8m0, ``output_q`` not float8_e4m3fn with ``scale_ue8m0``), ``input`` 0-d,
        ``hidden_size % group_size != 0``, a shape mismatch, ``output_q`` with a strided last dim or
        leading dims that do not flatten, ``output_s`` with a stride 0 or leading dims that do not
        flatten, outputs overlapping ``input`` or each other.
    """
    if not tracing():
        try:  # the launcher checks shapes, dtypes, devices, layouts, overlaps, group_size, the bounds
            if (
                input.dim() == 2
                and output_s.dim() == 2
                and type(group_size) is int
                and type(scale_ue8m0) is bool
                and type(eps) is float
                and type(fp8_min) is float
                and type(fp8_max) is float
                and eps >= 0
                and -FLOAT32_MAX <= fp8_min < fp8_max <= FLOAT32_MAX  # finite float32 bounds (NaN fails)
                # the module key's clamp flag is _clamps(fp8_min, fp8_max), inlined (no call per launch)
                and (fn := _FNS.get((input.dtype, output_q.dtype, fp8_min > -_FP8_MAX or fp8_max < _FP8_MAX)))
                is not None
            ):
                fn(input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0)
                return output_q, output_s
        except (AttributeError, *FAST_PATH_REFUSALS):  # raised before any launch: the checked path explains
            pass
    input = _check(input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0)
    # the FFI takes doubles: an int past int64 would not pass as one
    eps, fp8_min, fp8_max = float(eps), float(fp8_min), float(fp8_max)
    if input.numel() == 0:
        return output_q, output_s
    if tracing():
        torch.ops.sglang_jit_kernel.per_token_group_quant_8bit(
            input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0
        )
    else:
        _launch(input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0)
    return output_q, output_s


# ---------------------------------------------------------------------------------------------
# Registration: `check` compares the bytes of output_q and output_s with the fp32 emulation
# ---------------------------------------------------------------------------------------------
def reference(
    x: torch.Tensor, group_size: int, eps: float, q_min: float, q_max: float, dtype: torch.dtype, ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` of the kernel's fp32 arithmetic for ``x [M, K]``: ``q [M, K]`` of ``dtype``, ``s``
    fp32 ``[M, K / group_size]`` (the power-of-two scales with ``ue8m0``, not packed)."""
    m, k = x.shape
    groups = x.reshape(m, k // group_size, group_size)
    s = emulate_scale(emulate_amax(groups, dim=-1), eps, TYPE_MAX[dtype], ue8m0)
    q = emulate_quant(groups, s.unsqueeze(-1), q_min, q_max, dtype).reshape(m, k)
    return q, s


def _check_cases() -> list[CheckCase]:
    """``check``: [16384, 7168] bf16, group 128, fp8 with row-major scales."""
    m, k, g = 16384, 7168, 128

    def make() -> tuple:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="cuda")
        return x, q, torch.empty(m, k // g, dtype=torch.float32, device="cuda")

    def call(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return per_token_group_quant_8bit(x, q, s, g, 1e-10, -448.0, 448.0)

    def packed(result: tuple[torch.Tensor, torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        q, s = result
        return torch.cat([q.view(torch.uint8).flatten(), s.view(torch.uint8).flatten()])

    def expected(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        rq, rs = reference(x, g, 1e-10, -448.0, 448.0, torch.float8_e4m3fn)
        return torch.cat([rq.view(torch.uint8).flatten(), rs.view(torch.uint8).flatten()])

    return [
        CheckCase(
            label=f"[{m}, {k}] bf16 g{g} fp8",
            make_inputs=make,
            call=call,
            reference=expected,
            bytes_moved=m * k * 2 + m * k + 4 * m * (k // g),  # read bf16, write fp8 + fp32 scales
            dtype=torch.uint8,  # bit-exact: the reference is the kernel's own fp32 arithmetic
            output=packed,
        )
    ]


register_op(
    _OP,
    build=_jit_module,
    variants=[(d, o, c) for d in FLOAT_DTYPES for o in _OUT_DTYPES for c in (True, False) if c or o != torch.int8],
    check_cases=_check_cases,
)
