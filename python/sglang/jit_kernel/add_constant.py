"""add_constant: ``out = src + constant`` on int32 tensors, ``constant`` compiled into the kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import check_scalar, check_tensor, prepare_elementwise_out, tracing
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


@cache_once
def _jit_add_constant_module(constant: int) -> Module:
    """Compile (first use) and cache the module for one ``constant`` (a template argument)."""
    args = make_cpp_args(constant)
    return load_jit(
        "add_constant",
        *args,
        cuda_files=["add_constant.cuh"],
        cuda_wrappers=[("add_constant", f"add_constant<{args}>")],
    )


@torch.library.custom_op("sglang_jit_kernel::add_constant_out", mutates_args=("out",), device_types="cuda")
def _add_constant_out_op(out: torch.Tensor, src: torch.Tensor, constant: int) -> None:
    _jit_add_constant_module(constant).add_constant(out.view(-1), src.view(-1))


@_add_constant_out_op.register_fake
def _(out: torch.Tensor, src: torch.Tensor, constant: int) -> None:
    return None


def add_constant(src: torch.Tensor, constant: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Element-wise ``out = src + constant`` on int32, wrapping on overflow (two's complement).

    ``constant`` is a compile-time template argument: each distinct value builds its own module
    (the build marker is ``("add_constant", constant)``).

    Parameters
    ----------
    src : torch.Tensor
        int32 CUDA tensor of any shape on any device index; a non-contiguous ``src`` is copied to a
        contiguous tensor first. Not modified (unless it is also ``out``).
    constant : int
        In [-2**31, 2**31 - 1].
    out : torch.Tensor, optional
        Contiguous int32 tensor of the shape and device of ``src``; may be ``src`` (in place), must
        not partially overlap it. Allocated when omitted.

    Returns
    -------
    torch.Tensor
        ``out`` (the same object when given; else a new contiguous int32 tensor like ``src``). With 0
        elements nothing is launched.

    Raises
    ------
    TypeError
        If ``constant`` is not an int, or ``src``/``out`` not a tensor.
    ValueError
        If ``constant`` does not fit in int32.
    RuntimeError
        If ``src`` is not CUDA or not int32, or ``out`` does not match ``src`` (shape, dtype, device),
        is not contiguous or partially overlaps it. Raised before any launch, as
        ``add_constant: <arg> <what>: expected X, got Y``.
    """
    check_scalar("add_constant", "constant", constant, int, minimum=_INT32_MIN, maximum=_INT32_MAX)
    check_tensor("add_constant", "src", src, dtypes=(torch.int32,))
    src, out = prepare_elementwise_out("add_constant", src, out)
    if src.numel() == 0:
        return out
    if tracing():
        torch.ops.sglang_jit_kernel.add_constant_out(out, src, constant)
    else:
        _jit_add_constant_module(constant).add_constant(out.view(-1), src.view(-1))
    return out


def _check_cases() -> list[CheckCase]:
    """``check``: 2^24 int32 elements plus 1, compared exactly."""
    n = 1 << 24

    def make() -> tuple:
        src = torch.randint(-(2**20), 2**20, (n,), dtype=torch.int32, device="cuda")
        return src, torch.empty_like(src)

    return [
        CheckCase(
            label=f"[{n}] int32 +1",
            make_inputs=make,
            call=lambda src, out: add_constant(src, 1, out=out),
            reference=lambda src, out: (src.long() + 1).to(torch.int32),
            bytes_moved=2 * n * 4,  # read src, write out
            dtype=torch.int32,
        )
    ]


register_op("add_constant", build=_jit_add_constant_module, variants=[(1,)], check_cases=_check_cases)
