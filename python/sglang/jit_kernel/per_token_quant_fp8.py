"""per_token_quant_fp8: fp8 e4m3 quantization with one scale per row."""

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
    VIEW_ERRORS,
    check_scalar,
    check_shape,
    check_tensor,
    fail,
    launcher_errors,
    tracing,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["per_token_quant_fp8"]

_OP = "per_token_quant_fp8"
FP8_MAX = 448.0


@cache_once
def _jit_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the module for input ``dtype`` (its kernels only)."""
    args = make_cpp_args(dtype)
    return load_jit(
        _OP,
        *args,
        cuda_files=["quantization/per_token_quant_fp8.cuh"],
        cuda_wrappers=[(_OP, f"per_token_quant_fp8<{args}>")],
    )


# The exported function by input dtype, filled when its module is loaded (the eager fast path).
_FNS: dict[torch.dtype, Callable[..., None]] = {}


def _fn(dtype: torch.dtype) -> Callable[..., None]:
    fn = _jit_module(dtype).per_token_quant_fp8
    _FNS[dtype] = fn
    return fn


@torch.library.custom_op(
    "sglang_jit_kernel::per_token_quant_fp8", mutates_args=("output_q", "output_s"), device_types="cuda"
)
def _per_token_quant_fp8_op(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, eps: float) -> None:
    _launch(input, output_q, output_s, eps)


@_per_token_quant_fp8_op.register_fake
def _(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, eps: float) -> None:
    return None


def _launch(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, eps: float) -> None:
    num_tokens = output_s.numel()
    try:
        scales = output_s.view(num_tokens)
    except VIEW_ERRORS:
        fail(
            RuntimeError,
            _OP,
            "output_s",
            "layout",
            "dims that flatten to one stride (a view of [num_tokens])",
            f"shape {tuple(output_s.shape)} with strides {output_s.stride()}",
        )
    rows_in = as_rows(_OP, "input", input, num_tokens, copy_ok=True)
    rows_q = as_rows(_OP, "output_q", output_q, num_tokens, copy_ok=False)
    with launcher_errors(_OP):  # the launcher's exact overlap checks, named for the op
        _fn(input.dtype)(rows_in, rows_q, scales, eps)


def _check(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, eps: float) -> torch.Tensor:
    check_tensor(_OP, "input", input, dtypes=FLOAT_DTYPES)
    if input.dim() == 0:
        fail(RuntimeError, _OP, "input", "dims", "at least 1 ([..., hidden_size])", "a 0-d tensor")
    check_tensor(_OP, "output_q", output_q, dtypes=(torch.float8_e4m3fn,), device_as=(input, "input"))
    check_tensor(_OP, "output_s", output_s, dtypes=(torch.float32,), device_as=(input, "input"))
    check_scalar(_OP, "eps", eps, float, minimum=0.0)
    if output_q.shape != input.shape:
        fail(
            RuntimeError, _OP, "output_q", "shape", f"{tuple(input.shape)} (the shape of input)", tuple(output_q.shape)
        )
    leading = [(f"dim{i}", n) for i, n in enumerate(input.shape[:-1])]
    num_tokens = 1
    for n in input.shape[:-1]:
        num_tokens *= n
    if tuple(output_s.shape[: len(leading)]) != tuple(input.shape[:-1]) or not (
        output_s.dim() == len(leading) or (output_s.dim() == len(leading) + 1 and output_s.shape[-1] == 1)
    ):
        check_shape(_OP, "output_s", output_s, [*leading, ("1", 1)])
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


def per_token_quant_fp8(
    input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, *, eps: float = 1e-10
) -> None:
    """Quantize each row to fp8 e4m3 with its own scale.

    Per row ``x`` (fp32 arithmetic, IEEE roundings, in this order)::

        s = clamp(max(max|x|, eps) / 448, FLT_MIN, FLT_MAX)
        q = round(clamp(x * (1 / s), -448, 448))       # round-to-nearest-even to fp8 e4m3

    An all-zero or tiny row gets ``s = eps / 448`` (FLT_MIN when that is smaller; > 0) and zeros,
    never NaN; a row holding inf gets ``s = FLT_MAX``; NaN inputs are ignored by the maximum and
    quantize to NaN. Moves ``M*K*s_in + M*K + 4*M`` bytes.

    Parameters
    ----------
    input : torch.Tensor
        ``[..., hidden_size]`` CUDA tensor, float16 / bfloat16 / float32, any ``hidden_size``;
        leading dims flatten to ``num_tokens``. Row strides are read as laid out; leading dims that do
        not flatten, or a non-contiguous last dim, are copied first (exactly the result of
        ``input.contiguous()``). Not modified.
    output_q : torch.Tensor
        Written: ``torch.float8_e4m3fn``, the shape of ``input``, last dim contiguous, any row stride.
    output_s : torch.Tensor
        Written: ``float32 [...]`` (the leading dims of ``input``, e.g. ``[num_tokens]``) or
        ``[..., 1]``, on the device of ``input``; any stride as long as its dims flatten to one
        stride (a view as ``[num_tokens]``; any 1-D stride qualifies).
    eps : float, keyword-only
        Floor of each row's maximum (>= 0). Default 1e-10 (the original had none: a zero row gave NaN).

    Returns
    -------
    None
        ``output_q`` and ``output_s`` are written in place; with 0 rows nothing is launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, ``eps`` not a number.
    ValueError
        ``eps`` negative or NaN.
    RuntimeError
        Before any launch, naming the argument: not on CUDA or on another device than ``input``, an
        unsupported dtype (``output_q`` not float8_e4m3fn, ``output_s`` not float32), ``input`` 0-d, a
        shape mismatch, ``output_q`` with a strided last dim or leading dims that do not flatten,
        ``output_s`` whose dims do not flatten to one stride, outputs overlapping ``input`` or each
        other (``per_token_quant_fp8: output_q shape: expected (4, 64) (the shape of input), got ...``).
    """
    if not tracing():
        try:  # the launcher checks shapes, dtypes, devices, layouts and overlaps
            fn = _FNS.get(input.dtype) if input.dim() == 2 and output_s.dim() == 1 else None
            if fn is not None and isinstance(eps, float) and eps >= 0:  # a bool or int eps: the checked path
                fn(input, output_q, output_s, eps)
                return
        except (AttributeError, *FAST_PATH_REFUSALS):  # raised before any launch: the checked path explains
            pass
    input = _check(input, output_q, output_s, eps)
    eps = float(eps)  # the FFI takes a double: an int past int64 would not pass as one
    if output_s.numel() == 0:
        return
    if tracing():
        torch.ops.sglang_jit_kernel.per_token_quant_fp8(input, output_q, output_s, eps)
    else:
        _launch(input, output_q, output_s, eps)


def reference(x: torch.Tensor, eps: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` of the kernel's fp32 arithmetic for ``x [M, K]``: fp8 ``[M, K]``, fp32 ``[M]``."""
    s = emulate_scale(emulate_amax(x, dim=-1), eps, FP8_MAX)
    return emulate_quant(x, s.unsqueeze(-1), -FP8_MAX, FP8_MAX, torch.float8_e4m3fn), s


def _check_cases() -> list[CheckCase]:
    """``check``: [16384, 4096] bf16."""
    m, k = 16384, 4096

    def make() -> tuple:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="cuda")
        return x, q, torch.empty(m, dtype=torch.float32, device="cuda")

    def call(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
        per_token_quant_fp8(x, q, s)

    def packed(result: None, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.cat([q.view(torch.uint8).flatten(), s.view(torch.uint8)])

    def expected(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        rq, rs = reference(x)
        return torch.cat([rq.view(torch.uint8).flatten(), rs.view(torch.uint8)])

    return [
        CheckCase(
            label=f"[{m}, {k}] bf16",
            make_inputs=make,
            call=call,
            reference=expected,
            bytes_moved=m * k * 2 + m * k + 4 * m,  # read bf16, write fp8 + fp32 scales
            dtype=torch.uint8,  # bit-exact against the kernel's fp32 arithmetic
            output=packed,
        )
    ]


register_op(_OP, build=_jit_module, variants=[(d,) for d in FLOAT_DTYPES], check_cases=_check_cases)
