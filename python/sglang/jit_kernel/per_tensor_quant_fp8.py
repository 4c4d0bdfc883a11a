"""per_tensor_quant_fp8: fp8 e4m3 quantization with one scale for the whole tensor."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._quant_8bit import (
    as_rows,
    check_outputs_disjoint,
    emulate_amax,
    emulate_quant,
    emulate_scale,
    last_dim_contiguous,
)
from sglang.jit_kernel._validate import (
    FAST_PATH_REFUSALS,
    FLOAT_DTYPES,
    check_scalar,
    check_tensor,
    fail,
    launcher_errors,
    tracing,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["per_tensor_quant_fp8"]

_OP = "per_tensor_quant_fp8"
FP8_MAX = 448.0


@cache_once
def _jit_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the module for input ``dtype`` (its kernels only)."""
    args = make_cpp_args(dtype)
    return load_jit(
        _OP,
        *args,
        cuda_files=["quantization/per_tensor_quant_fp8.cuh"],
        cuda_wrappers=[(_OP, f"per_tensor_quant_fp8<{args}>")],
    )


# The exported function by input dtype, filled when its module is loaded (the eager fast path).
_FNS: dict[torch.dtype, Callable[..., None]] = {}


def _fn(dtype: torch.dtype) -> Callable[..., None]:
    fn = _jit_module(dtype).per_tensor_quant_fp8
    _FNS[dtype] = fn
    return fn


@torch.library.custom_op(
    "sglang_jit_kernel::per_tensor_quant_fp8", mutates_args=("output_q", "output_s"), device_types="cuda"
)
def _per_tensor_quant_fp8_op(
    input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, is_static: bool, eps: float, accumulate: bool
) -> None:
    _launch(input, output_q, output_s, is_static, eps, accumulate)


@_per_tensor_quant_fp8_op.register_fake
def _(
    input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, is_static: bool, eps: float, accumulate: bool
) -> None:
    return None


def _launch(
    input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, is_static: bool, eps: float, accumulate: bool
) -> None:
    # A contiguous tensor is one row of numel elements (one grid over it, and the single-block pass
    # when it is small); otherwise [num_tokens, hidden_size] rows with their strides.
    if input.is_contiguous() and output_q.is_contiguous():
        rows_in, rows_q = input.view(1, -1), output_q.view(1, -1)
    else:
        hidden_size = input.shape[-1]
        num_tokens = input.numel() // hidden_size
        rows_in = as_rows(_OP, "input", input, num_tokens, copy_ok=True)
        rows_q = as_rows(_OP, "output_q", output_q, num_tokens, copy_ok=False)
    with launcher_errors(_OP):  # the launcher's exact overlap checks, named for the op
        _fn(input.dtype)(rows_in, rows_q, output_s.view(1), is_static, eps, accumulate)


def _check(
    input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, is_static: bool, eps: float, accumulate: bool
) -> torch.Tensor:
    check_tensor(_OP, "input", input, dtypes=FLOAT_DTYPES)
    if input.dim() == 0:
        fail(RuntimeError, _OP, "input", "dims", "at least 1 ([..., hidden_size])", "a 0-d tensor")
    check_tensor(_OP, "output_q", output_q, dtypes=(torch.float8_e4m3fn,), device_as=(input, "input"))
    check_tensor(_OP, "output_s", output_s, dtypes=(torch.float32,), device_as=(input, "input"))
    check_scalar(_OP, "is_static", is_static, bool)
    check_scalar(_OP, "eps", eps, float, minimum=0.0)
    check_scalar(_OP, "accumulate", accumulate, bool)
    if output_q.shape != input.shape:
        fail(
            RuntimeError, _OP, "output_q", "shape", f"{tuple(input.shape)} (the shape of input)", tuple(output_q.shape)
        )
    if output_s.numel() != 1:
        fail(RuntimeError, _OP, "output_s", "shape", "one element ([1] or [])", tuple(output_s.shape))
    if output_q.stride(-1) != 1 and input.shape[-1] > 1:
        fail(
            RuntimeError,
            _OP,
            "output_q",
            "last-dim stride",
            "1 (a contiguous last dim)",
            f"{output_q.stride(-1)} (shape {tuple(output_q.shape)} with strides {output_q.stride()})",
        )
    check_outputs_disjoint(_OP, input, output_q, output_s)
    return last_dim_contiguous(input)


def per_tensor_quant_fp8(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    is_static: bool = False,
    *,
    eps: float = 1e-10,
    accumulate: bool = True,
) -> None:
    """Quantize a whole tensor to fp8 e4m3 with one scale.

    fp32 arithmetic, IEEE roundings, in this order::

        dynamic: output_s = max(output_s, clamp(max(max|x|, eps) / 448, FLT_MIN, FLT_MAX))
                 (accumulate=False: output_s = clamp(max(max|x|, eps) / 448, FLT_MIN, FLT_MAX))
        q = round(clamp(x * (1 / s), -448, 448))      # s = clamp(output_s, FLT_MIN, FLT_MAX)

    Dynamic mode max-reduces into ``output_s``: the caller zeroes it first (as in the original); with
    ``accumulate=False`` it overwrites ``output_s`` and needs no zeroing (one launch instead of a fill
    plus a launch for small inputs; the two-pass path resets it in a one-thread kernel).
    ``accumulate=False`` is the decode path: it saves the caller's zero fill, a launch of its own.
    Static mode reads the given scale (a zero or NaN scale is floored at FLT_MIN, so no NaN). An
    all-zero or tiny tensor gets ``s = eps / 448`` and zeros; NaN inputs are ignored by the maximum
    and quantize to NaN. Moves ``N*s_in + N + 4`` bytes (dynamic reads the input twice unless it is
    small: one row of at most 2048 16-byte chunks is done by one block in a single pass).

    Parameters
    ----------
    input : torch.Tensor
        CUDA tensor of any shape (``[..., hidden_size]``), float16 / bfloat16 / float32. Row strides
        are read as laid out; leading dims that do not flatten, or a non-contiguous last dim, are
        copied first (exactly the result of ``input.contiguous()``). Not modified.
    output_q : torch.Tensor
        Written: ``torch.float8_e4m3fn``, the shape of ``input``, last dim contiguous.
    output_s : torch.Tensor
        ``float32``, one element (``[1]`` or ``[]``), on the device of ``input``. Dynamic: written
        (max-reduced into, zero it first); static: read.
    is_static : bool
        Use the scale in ``output_s`` instead of computing it. Default False.
    eps : float, keyword-only
        Floor of the tensor's maximum (>= 0). Default 1e-10.
    accumulate : bool, keyword-only
        Dynamic mode: max with the value already in ``output_s`` (the original's contract, default
        True), or overwrite it (False). Ignored in static mode.

    Returns
    -------
    None
        ``output_q`` is written in place, and ``output_s`` in dynamic mode; with 0 elements nothing is
        launched (``output_s`` is left as it is).

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, ``is_static`` or ``accumulate`` not a bool, ``eps`` not
        a number.
    ValueError
        ``eps`` negative or NaN.
    RuntimeError
        Before any launch, naming the argument: not on CUDA or on another device than ``input``, an
        unsupported dtype (``output_q`` not float8_e4m3fn, ``output_s`` not float32), ``input`` 0-d, a
        shape mismatch (``output_s`` not one element), ``output_q`` with a
        strided last dim or leading dims that do not flatten, outputs overlapping ``input`` or each other.
    """
    if not tracing():
        try:  # the launcher checks shapes, dtypes, devices, layouts and overlaps
            fn = _FNS.get(input.dtype)
            if (
                fn is not None
                and type(is_static) is bool
                and type(accumulate) is bool
                and type(eps) is float
                and eps >= 0
                and input.is_contiguous()
                and output_q.is_contiguous()
                and output_q.shape == input.shape
            ):
                fn(input.view(1, -1), output_q.view(1, -1), output_s.view(1), is_static, eps, accumulate)
                return
        except (AttributeError, *FAST_PATH_REFUSALS):  # raised before any launch: the checked path explains
            pass
    input = _check(input, output_q, output_s, is_static, eps, accumulate)
    eps = float(eps)  # the FFI takes a double: an int past int64 would not pass as one
    if input.numel() == 0:
        return
    if tracing():
        torch.ops.sglang_jit_kernel.per_tensor_quant_fp8(input, output_q, output_s, is_static, eps, accumulate)
    else:
        _launch(input, output_q, output_s, is_static, eps, accumulate)


def reference(
    x: torch.Tensor, scale: torch.Tensor | None = None, eps: float = 1e-10
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` of the kernel's fp32 arithmetic: dynamic (``scale`` None: computed from a zeroed
    ``output_s``) or static (the given one-element ``scale``)."""
    s = emulate_scale(emulate_amax(x), eps, FP8_MAX).reshape(1) if scale is None else scale.float().reshape(1)
    return emulate_quant(x, s.reshape([1] * x.dim()), -FP8_MAX, FP8_MAX, torch.float8_e4m3fn), s


def _check_cases() -> list[CheckCase]:
    """``check``: [16384, 4096] bf16, dynamic."""
    m, k = 16384, 4096

    def make() -> tuple:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        return x, torch.empty(m, k, dtype=torch.float8_e4m3fn, device="cuda"), torch.zeros(1, device="cuda")

    def call(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
        per_tensor_quant_fp8(x, q, s)  # s from make() is zero; repeated calls max-reduce the same scale

    def packed(result: None, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.cat([q.view(torch.uint8).flatten(), s.view(torch.uint8)])

    def expected(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        rq, rs = reference(x)
        return torch.cat([rq.view(torch.uint8).flatten(), rs.view(torch.uint8)])

    return [
        CheckCase(
            label=f"[{m}, {k}] bf16 dynamic",
            make_inputs=make,
            call=call,
            reference=expected,
            bytes_moved=m * k * 2 + m * k + 4,  # the fewest: read bf16 once, write fp8 and the scale
            dtype=torch.uint8,  # bit-exact against the kernel's fp32 arithmetic
            output=packed,
        )
    ]


register_op(_OP, build=_jit_module, variants=[(d,) for d in FLOAT_DTYPES], check_cases=_check_cases)
