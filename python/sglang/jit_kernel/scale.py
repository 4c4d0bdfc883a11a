"""scale: element-wise ``out = src * factor`` (the tutorial's op, production-grade)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FAST_PATH_REFUSALS,
    FLOAT_DTYPES,
    check_scalar,
    check_tensor,
    prepare_elementwise_out,
    tracing,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module


@cache_once
def _jit_scale_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the scale module for ``dtype``."""
    args = make_cpp_args(dtype)
    return load_jit(
        "scale",
        *args,
        cuda_files=["elementwise/scale.cuh"],
        cuda_wrappers=[("scale", f"scale<{args}>")],
    )


# The exported function by dtype, filled when a dtype's module is loaded: the eager fast path for
# 1-D tensors is a dict lookup plus the FFI call, whose C++ launcher validates everything it needs.
_SCALE_FNS: dict[torch.dtype, Callable[..., None]] = {}


def _load(dtype: torch.dtype) -> Module:
    module = _jit_scale_module(dtype)
    _SCALE_FNS[dtype] = module.scale
    return module


@torch.library.custom_op("sglang_jit_kernel::scale_out", mutates_args=("out",), device_types="cuda")
def _scale_out_op(out: torch.Tensor, src: torch.Tensor, factor: float) -> None:
    _load(src.dtype).scale(out.view(-1), src.view(-1), factor)


@_scale_out_op.register_fake
def _(out: torch.Tensor, src: torch.Tensor, factor: float) -> None:
    return None


def scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Element-wise scale: ``out = src * factor``.

    Computed in fp32 (``float(src) * float32(factor)``), rounded once to the dtype of ``src``.
    Moves ``2 * src.numel() * src.element_size()`` bytes.

    Parameters
    ----------
    src : torch.Tensor
        CUDA tensor of any shape, float16 / bfloat16 / float32, on any device index. A
        non-contiguous ``src`` is first copied to a contiguous tensor. Not modified (unless it is
        also ``out``).
    factor : float
        The multiplier (an int or float; bools refused), rounded to fp32 before use (a value beyond
        the fp32 range becomes +-inf).
    out : torch.Tensor, optional
        Where to write the result: contiguous, the shape, dtype and device of ``src``; may be
        ``src`` itself (in place). Allocated when omitted.

    Returns
    -------
    torch.Tensor
        ``out`` (the same object when given; else a new contiguous tensor like ``src``). With 0
        elements nothing is launched.

    Raises
    ------
    TypeError
        If ``src`` or ``out`` is not a tensor, or ``factor`` is not an int or float.
    RuntimeError
        If ``src`` is not on a CUDA device or not float16 / bfloat16 / float32, or ``out`` differs from ``src`` in
        shape, dtype or device, is not contiguous, or partially overlaps ``src`` in memory (``out``
        may be ``src`` itself). Raised before any launch, as ``scale: <arg> <what>: expected X, got Y``.
    """
    if not tracing():
        try:
            fn = _SCALE_FNS.get(src.dtype) if src.is_cuda and src.dim() == 1 else None
        except AttributeError:  # not a tensor: the checked path raises TypeError
            fn = None
        # exact types only: the FFI would take a bool or a numpy scalar (the checked path raises TypeError)
        if fn is not None and type(factor) in (float, int) and (out is None or getattr(out, "ndim", None) == 1):
            result = torch.empty_like(src) if out is None else out
            try:
                fn(result, src, float(factor))  # the launcher checks shapes, dtypes, devices, layout, overlap
                return result
            except FAST_PATH_REFUSALS:  # raised before any launch: the checked path explains
                pass
    check_tensor("scale", "src", src, dtypes=FLOAT_DTYPES)
    check_scalar("scale", "factor", factor, float)
    factor = float(factor)  # the FFI takes a double: an int past int64 would not pass as one
    src, out = prepare_elementwise_out("scale", src, out)
    if src.numel() == 0:
        return out
    if tracing():
        torch.ops.sglang_jit_kernel.scale_out(out, src, factor)
    else:
        _load(src.dtype).scale(out.view(-1), src.view(-1), factor)
    return out


def _check_cases() -> list[CheckCase]:
    """``check``: 2^24 bf16 elements against the fp32 product rounded once."""
    n, factor = 1 << 24, 1.5

    def make() -> tuple:
        src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
        return src, torch.empty_like(src)

    return [
        CheckCase(
            label=f"[{n}] bf16",
            make_inputs=make,
            call=lambda src, out: scale(src, factor, out=out),
            reference=lambda src, out: (src.float() * factor).to(src.dtype),
            bytes_moved=2 * n * 2,  # read src, write out
            dtype=torch.bfloat16,
        )
    ]


register_op("scale", build=_jit_scale_module, variants=[(d,) for d in FLOAT_DTYPES], check_cases=_check_cases)
