"""moe_sum_reduce: the combine step of an MoE layer, ``output = factor * input.sum(dim=1)``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FLOAT_DTYPES,
    check_finite_float32,
    check_no_partial_overlap,
    check_no_self_overlap,
    check_scalar,
    check_tensor,
    launcher_errors,
    tracing,
    unit_last_stride,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["moe_sum_reduce"]

_OP = "moe_sum_reduce"
_SUFFIX = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@cache_once
def _jit_moe_sum_reduce_module() -> Module:
    """Compile (first use) and cache the module: one exported function per dtype."""
    return load_jit(
        "moe_sum_reduce",
        cuda_files=["moe/moe_sum_reduce.cuh"],
        cuda_wrappers=[(f"moe_sum_reduce_{s}", f"moe_sum_reduce<{s}_t>") for s in _SUFFIX.values()],
    )


def _launch(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float) -> None:
    # hidden_size 1: the free stride of that dim set to 1, as the launcher requires
    with launcher_errors(_OP):  # the launcher's exact overlap checks, named for the op
        getattr(_jit_moe_sum_reduce_module(), f"moe_sum_reduce_{_SUFFIX[input.dtype]}")(
            unit_last_stride(input), unit_last_stride(output), routed_scaling_factor
        )


@torch.library.custom_op("sglang_jit_kernel::moe_sum_reduce", mutates_args=("output",), device_types="cuda")
def _moe_sum_reduce_op(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float) -> None:
    _launch(input, output, routed_scaling_factor)


@_moe_sum_reduce_op.register_fake
def _(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float) -> None:
    return None


def moe_sum_reduce(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float = 1.0) -> None:
    """Sum the top-k expert outputs of every token: ``output[t] = factor * sum_k input[t, k]``.

    The sum in fp32, in order ``k = 0, 1, ...``, times ``float32(routed_scaling_factor)``, rounded
    once to the dtype (``topk == 0`` writes zeros). Moves ``(topk + 1) * num_tokens * hidden_size``
    elements.

    Parameters
    ----------
    input : torch.Tensor
        ``[num_tokens, topk, hidden_size]`` float16 / bfloat16 / float32, last dim contiguous (any
        other strides); read only.
    output : torch.Tensor
        ``[num_tokens, hidden_size]`` of the dtype and device of ``input``, last dim contiguous (row
        stride free); written. May not share memory with ``input``.
    routed_scaling_factor : float
        The multiplier (an int or float), finite in float32. Default 1.0.

    Returns
    -------
    None
        ``output`` is written in place; with 0 elements nothing is launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, or a factor that is not a real number.
    ValueError
        A factor that is NaN, infinite or past the float32 range.
    RuntimeError
        A tensor off CUDA, on different devices, of another dtype or shape, a non-contiguous last
        dim, an output with overlapping rows (expanded), or overlapping tensors; raised before any
        launch as ``moe_sum_reduce: <arg> <what>: expected X, got Y``.
    """
    check_tensor(
        _OP,
        "input",
        input,
        dtypes=FLOAT_DTYPES,
        dims=[("num_tokens", None), ("topk", None), ("hidden_size", None)],
        last_dim_contiguous=True,
    )
    num_tokens, _, hidden_size = input.shape
    check_tensor(
        _OP,
        "output",
        output,
        dtype_as=(input, "input"),
        dims=[("num_tokens", num_tokens), ("hidden_size", hidden_size)],
        last_dim_contiguous=True,
    )
    check_scalar(_OP, "routed_scaling_factor", routed_scaling_factor, float)
    check_finite_float32(_OP, "routed_scaling_factor", routed_scaling_factor)
    if not tracing():
        # the launcher's checks, named for the op (interleaved views: its exact element test)
        check_no_self_overlap(_OP, "output", output)
        check_no_partial_overlap(_OP, "output", output, input, "input", allow_same=False, dense_only=True)
    if output.numel() == 0:
        return
    if tracing():
        torch.ops.sglang_jit_kernel.moe_sum_reduce(input, output, float(routed_scaling_factor))
    else:
        _launch(input, output, float(routed_scaling_factor))


def _check_cases() -> list[CheckCase]:
    """``check``: 4096 tokens x top 8 x 4096 bf16 against the fp32 sum rounded once."""
    t, k, h, factor = 4096, 8, 4096, 2.5

    def make() -> tuple:
        x = torch.randn(t, k, h, dtype=torch.bfloat16, device="cuda")
        return x, torch.empty(t, h, dtype=torch.bfloat16, device="cuda")

    def call(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        moe_sum_reduce(x, out, factor)
        return out

    return [
        CheckCase(
            f"[{t}, {k}, {h}] bf16",
            make,
            call,
            lambda x, out: (x.float().sum(dim=1) * factor).to(torch.bfloat16),
            bytes_moved=(k + 1) * t * h * 2,
            dtype=torch.bfloat16,
        )
    ]


register_op(_OP, build=_jit_moe_sum_reduce_module, variants=[()], check_cases=_check_cases)
