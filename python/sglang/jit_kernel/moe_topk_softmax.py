"""topk_softmax: MoE routing by softmax, the top-k experts of every token."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._moe import (
    ROUTING_VARIANTS,
    check_routing_args,
    launch_routing,
    load_routing_module,
    routing_check_inputs,
    routing_engine,
)
from sglang.jit_kernel._validate import check_finite_float32, check_scalar, tracing
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["topk_softmax"]

_OP = "topk_softmax"


@cache_once
def _jit_topk_softmax_module(dtype: torch.dtype, engines: str) -> Module:
    """Compile (first use) and cache topk_softmax's module for gating dtype ``dtype`` and ``engines`` (only topk_softmax's kernels)."""
    return load_routing_module("topk_softmax", dtype, engines)


@torch.library.custom_op(
    "sglang_jit_kernel::topk_softmax", mutates_args=("topk_weights", "topk_ids"), device_types="cuda"
)
def _topk_softmax_op(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating_output: torch.Tensor,
    correction_bias: torch.Tensor,
    renormalize: bool,
    moe_softcapping: float,
) -> None:
    launch_routing(
        _jit_topk_softmax_module,
        "topk_softmax",
        gating_output.dtype,
        routing_engine(gating_output.shape[1], topk_ids.shape[1]),
        topk_weights,
        topk_ids,
        gating_output,
        correction_bias,
        renormalize,
        moe_softcapping,
    )


@_topk_softmax_op.register_fake
def _(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating_output: torch.Tensor,
    correction_bias: torch.Tensor,
    renormalize: bool,
    moe_softcapping: float,
) -> None:
    return None


def topk_softmax(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating_output: torch.Tensor,
    renormalize: bool = False,
    moe_softcapping: float = 0.0,
    correction_bias: torch.Tensor | None = None,
) -> None:
    """Softmax MoE routing: the ``topk`` most probable experts of every token, in place.

    Per row of ``gating_output``, in fp32:

    1. ``x <- cap * tanh(x / cap)`` when ``moe_softcapping = cap > 0``;
    2. ``x <- x + correction_bias[e]`` when a bias is given;
    3. ``p = softmax(x)`` over the experts (``exp(x - max) / sum``);
    4. the ``topk`` largest ``p`` in decreasing order, ties to the lower expert index.

    ``topk_weights[t, i]`` gets the i-th ``p`` (divided by the sum of the ``topk`` chosen ones with
    ``renormalize``), ``topk_ids[t, i]`` its expert. A NaN logit is read as ``-inf`` before step 1
    (probability 0 unless softcapped; such experts are chosen last); a row of only ``-inf`` has NaN
    probabilities and gets experts ``0..topk-1`` (without a softcap; a softcapped ``-inf`` is
    ``-cap``). Deterministic: the same input gives the same bits. Rows of at most 1024 experts with
    ``topk <= 32`` are ranked on the fp32 logit of step 2 (the softmax is monotone in it), so two
    experts whose fp32 probabilities round to the same value are still ordered by their logits;
    larger rows and topk are ranked on the fp32 probability. Equal keys go to the lower index.

    Parameters
    ----------
    topk_weights : torch.Tensor
        float32 ``[num_tokens, topk]`` (its width sets ``topk``, ``1 <= topk <= num_experts``), last dim
        contiguous (any row stride); written.
    topk_ids : torch.Tensor
        int32 ``[num_tokens, topk]``, last dim contiguous (any row stride); written.
    gating_output : torch.Tensor
        ``[num_tokens, num_experts]`` float16 / bfloat16 / float32 logits, last dim contiguous (any
        row stride); any ``num_experts >= topk`` (and ``>= 1``); read only.
    renormalize : bool
        Rescale the chosen weights to sum 1. Default False.
    moe_softcapping : float
        ``cap >= 0``; 0 (default) disables the softcap.
    correction_bias : torch.Tensor, optional
        ``[num_experts]`` float16 / bfloat16 / float32 on the device of ``gating_output``, any stride,
        added to the logits before the softmax (converted to contiguous fp32 first). Default None.

    Returns
    -------
    None
        ``topk_weights`` and ``topk_ids`` are written in place; with 0 tokens nothing is launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, or a scalar of the wrong type.
    ValueError
        ``moe_softcapping`` negative, NaN, infinite or past the float32 range.
    RuntimeError
        A tensor off CUDA or on another device than ``gating_output``, a wrong dtype, a shape that
        does not match (``topk`` outside ``[1, num_experts]``, a bias of another length), a
        non-contiguous last dim, an output with overlapping elements (expanded), or outputs
        overlapping each other, the input or the bias; raised before any
        launch as ``topk_softmax: <arg> <what>: expected X, got Y``.
    """
    bias = check_routing_args(_OP, topk_weights, topk_ids, gating_output, correction_bias)
    check_scalar(_OP, "renormalize", renormalize, bool)
    check_scalar(_OP, "moe_softcapping", moe_softcapping, float, minimum=0.0)
    check_finite_float32(_OP, "moe_softcapping", moe_softcapping)  # inf would make every weight NaN
    if gating_output.shape[0] == 0:
        return
    if tracing():
        torch.ops.sglang_jit_kernel.topk_softmax(
            topk_weights, topk_ids, gating_output, bias, renormalize, float(moe_softcapping)
        )
    else:
        launch_routing(
            _jit_topk_softmax_module,
            "topk_softmax",
            gating_output.dtype,
            routing_engine(gating_output.shape[1], topk_ids.shape[1]),
            topk_weights,
            topk_ids,
            gating_output,
            bias,
            renormalize,
            float(moe_softcapping),
        )


def _check_cases() -> list[CheckCase]:
    """``check``: DeepSeek-sized rows (4096 tokens, 256 experts, top 8), the fp32 weights against an
    fp32 torch softmax + topk of the same logits."""
    num_tokens, num_experts, topk = 4096, 256, 8

    def make() -> tuple:
        return routing_check_inputs(num_tokens, num_experts, topk)

    def call(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        topk_softmax(weights, ids, logits)
        return weights

    def reference(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits, dim=-1).topk(topk, dim=-1).values

    return [
        CheckCase(
            f"[{num_tokens}, {num_experts}] fp32 top{topk}",
            make,
            call,
            reference,
            bytes_moved=num_tokens * (num_experts * 4 + topk * 8),
            dtype=torch.float32,
        )
    ]


register_op(_OP, build=_jit_topk_softmax_module, variants=ROUTING_VARIANTS, check_cases=_check_cases)
