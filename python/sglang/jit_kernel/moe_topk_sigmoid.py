"""topk_sigmoid: MoE routing by sigmoid scores, the top-k experts of every token."""

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
from sglang.jit_kernel._validate import check_scalar, tracing
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["topk_sigmoid"]

_OP = "topk_sigmoid"


@cache_once
def _jit_topk_sigmoid_module(dtype: torch.dtype, engines: str) -> Module:
    """Compile (first use) and cache topk_sigmoid's module for gating dtype ``dtype`` and ``engines`` (only topk_sigmoid's kernels)."""
    return load_routing_module("topk_sigmoid", dtype, engines)


@torch.library.custom_op(
    "sglang_jit_kernel::topk_sigmoid", mutates_args=("topk_weights", "topk_ids"), device_types="cuda"
)
def _topk_sigmoid_op(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating_output: torch.Tensor,
    correction_bias: torch.Tensor,
    renormalize: bool,
) -> None:
    launch_routing(
        _jit_topk_sigmoid_module,
        "topk_sigmoid",
        gating_output.dtype,
        routing_engine(gating_output.shape[1], topk_ids.shape[1]),
        topk_weights,
        topk_ids,
        gating_output,
        correction_bias,
        renormalize,
    )


@_topk_sigmoid_op.register_fake
def _(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating_output: torch.Tensor,
    correction_bias: torch.Tensor,
    renormalize: bool,
) -> None:
    return None


def topk_sigmoid(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating_output: torch.Tensor,
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
) -> None:
    """Sigmoid MoE routing: the ``topk`` best-scored experts of every token, in place.

    Per row of ``gating_output``, in fp32: ``p = sigmoid(x) = 1 / (1 + exp(-x))``; the ``topk``
    experts with the largest ``p + correction_bias[e]`` (``p`` without a bias) in decreasing order,
    ties to the lower expert index. ``topk_weights[t, i]`` gets the un-biased ``p`` of the i-th
    (divided by ``sum of the topk chosen p + 1e-20`` with ``renormalize``), ``topk_ids[t, i]`` its
    expert. A NaN logit is read as ``-inf`` (``p = 0``); a NaN biased score ranks below every
    number. Deterministic: the same input gives the same bits. Without a bias, rows of at most 1024
    experts with ``topk <= 32`` are ranked on the logit ``x`` (sigmoid is monotone), so logits whose
    fp32 ``p`` round equal (``x > ~17`` gives ``p = 1``) are still ordered by ``x``; larger rows and
    topk are ranked on ``p``. Equal keys go to the lower index.

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
        Divide the chosen weights by their sum (+1e-20). Default False.
    correction_bias : torch.Tensor, optional
        ``[num_experts]`` float16 / bfloat16 / float32 on the device of ``gating_output``, any stride,
        added to ``p`` for the choice only (converted to contiguous fp32 first). Default None.

    Returns
    -------
    None
        ``topk_weights`` and ``topk_ids`` are written in place; with 0 tokens nothing is launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, or ``renormalize`` not a bool.
    RuntimeError
        A tensor off CUDA or on another device than ``gating_output``, a wrong dtype, a shape that
        does not match (``topk`` outside ``[1, num_experts]``, a bias of another length), a
        non-contiguous last dim, an output with overlapping elements (expanded), or outputs
        overlapping each other, the input or the bias; raised before any
        launch as ``topk_sigmoid: <arg> <what>: expected X, got Y``.
    """
    bias = check_routing_args(_OP, topk_weights, topk_ids, gating_output, correction_bias)
    check_scalar(_OP, "renormalize", renormalize, bool)
    if gating_output.shape[0] == 0:
        return
    if tracing():
        torch.ops.sglang_jit_kernel.topk_sigmoid(topk_weights, topk_ids, gating_output, bias, renormalize)
    else:
        launch_routing(
            _jit_topk_sigmoid_module,
            "topk_sigmoid",
            gating_output.dtype,
            routing_engine(gating_output.shape[1], topk_ids.shape[1]),
            topk_weights,
            topk_ids,
            gating_output,
            bias,
            renormalize,
        )


def _check_cases() -> list[CheckCase]:
    """``check``: 4096 tokens, 256 experts, top 8, renormalised, against fp32 torch."""
    num_tokens, num_experts, topk = 4096, 256, 8

    def make() -> tuple:
        return routing_check_inputs(num_tokens, num_experts, topk)

    def call(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        topk_sigmoid(weights, ids, logits, renormalize=True)
        return weights

    def reference(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        values = torch.sigmoid(logits).topk(topk, dim=-1).values
        return values / (values.sum(dim=-1, keepdim=True) + 1e-20)

    return [
        CheckCase(
            f"[{num_tokens}, {num_experts}] fp32 top{topk} renorm",
            make,
            call,
            reference,
            bytes_moved=num_tokens * (num_experts * 4 + topk * 8),
            dtype=torch.float32,
        )
    ]


register_op(_OP, build=_jit_topk_sigmoid_module, variants=ROUTING_VARIANTS, check_cases=_check_cases)
