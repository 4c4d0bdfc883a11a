"""grouped_topk: DeepSeek-V3-style grouped sigmoid routing, the top-k experts of every token."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._moe import (
    ROUTING_VARIANTS,
    launch_routing,
    load_routing_module,
    no_bias,
    routing_engine,
)
from sglang.jit_kernel._validate import FLOAT_DTYPES, check_finite_float32, check_scalar, check_tensor, fail, tracing
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["grouped_topk"]

_OP = "grouped_topk"
#: Most expert groups a row may have (one lane of the warp per group).
MAX_GROUPS = 32


@cache_once
def _jit_grouped_topk_module(dtype: torch.dtype, engines: str) -> Module:
    """Compile (first use) and cache grouped_topk's module for gating dtype ``dtype`` and ``engines`` (only grouped_topk's kernels)."""
    return load_routing_module("grouped_topk", dtype, engines)


@torch.library.custom_op("sglang_jit_kernel::grouped_topk", mutates_args=(), device_types="cuda")
def _grouped_topk_op(
    scores: torch.Tensor,
    bias: torch.Tensor,
    num_expert_group: int,
    topk_group: int,
    topk: int,
    renormalize: bool,
    scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.empty(scores.shape[0], topk, dtype=torch.float32, device=scores.device)
    indices = torch.empty(scores.shape[0], topk, dtype=torch.int32, device=scores.device)
    if scores.shape[0] > 0:
        launch_routing(
            _jit_grouped_topk_module,
            "grouped_topk",
            scores.dtype,
            routing_engine(scores.shape[1], topk, num_expert_group),
            values,
            indices,
            scores,
            bias,
            num_expert_group,
            topk_group,
            renormalize,
            scaling_factor,
        )
    return values, indices


@_grouped_topk_op.register_fake
def _(
    scores: torch.Tensor,
    bias: torch.Tensor,
    num_expert_group: int,
    topk_group: int,
    topk: int,
    renormalize: bool,
    scaling_factor: float,
):
    return (
        scores.new_empty(scores.shape[0], topk, dtype=torch.float32),
        scores.new_empty(scores.shape[0], topk, dtype=torch.int32),
    )


def grouped_topk(
    scores: torch.Tensor,
    bias: torch.Tensor | None,
    num_expert_group: int,
    topk_group: int,
    topk: int,
    renormalize: bool,
    scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped sigmoid routing (DeepSeek-V3: 256 experts, 8 groups, topk_group 4, top 8).

    Per row of ``scores``, in fp32: ``p = sigmoid(x)``, ``s = p + bias[e]``; the experts split into
    ``num_expert_group`` consecutive groups of ``G = num_experts / num_expert_group``; a group scores
    the sum of its two largest ``s`` (its largest when ``G == 1``); the ``topk_group`` best groups
    are kept (ties to the lower group); the ``topk`` experts of the kept groups with the largest
    ``s`` are chosen in decreasing order (ties to the lower expert). Their weights are the un-biased
    ``p``, divided by ``(sum of the chosen p + 1e-20)`` with ``renormalize``, then multiplied by
    ``scaling_factor``. A NaN logit is read as ``-inf`` (``p = 0``); NaN scores rank last.
    Deterministic.

    Parameters
    ----------
    scores : torch.Tensor
        ``[num_tokens, num_experts]`` float16 / bfloat16 / float32 router logits, last dim contiguous
        (any row stride). Not modified.
    bias : torch.Tensor or None
        ``[num_experts]`` float16 / bfloat16 / float32 correction bias on the device of ``scores``,
        any stride (converted to contiguous fp32 first), or None for none.
    num_expert_group : int
        Groups, in ``[1, 32]``, dividing ``num_experts``.
    topk_group : int
        Groups kept, in ``[1, num_expert_group]``.
    topk : int
        Experts chosen, in ``[1, topk_group * G]``.
    renormalize : bool
        Divide the chosen weights by their sum (+1e-20).
    scaling_factor : float
        Multiplies every weight (the routed scaling factor), finite in float32. Default 1.0.

    Returns
    -------
    (topk_values, topk_indices) : tuple of torch.Tensor
        New contiguous float32 and int32 ``[num_tokens, topk]`` tensors on the device of ``scores``
        (nothing launched with 0 tokens).

    Raises
    ------
    TypeError
        ``scores`` / ``bias`` not tensors, or a scalar of the wrong type (ints for the counts, a bool
        for ``renormalize``, a real number for ``scaling_factor``).
    ValueError
        ``num_expert_group``, ``topk_group`` or ``topk`` out of range (``num_expert_group`` not a divisor
        of ``num_experts`` included: ``grouped_topk: num_expert_group value: expected a divisor of
        num_experts = 256, got 7``), or ``scaling_factor`` NaN, inf or past the float32 range.
    RuntimeError
        ``scores`` or ``bias`` off CUDA, on different devices, of a wrong dtype or shape, or a
        non-contiguous last dim of ``scores``; raised before any launch as
        ``grouped_topk: <arg> <what>: expected X, got Y``.
    """
    check_tensor(
        _OP,
        "scores",
        scores,
        dtypes=FLOAT_DTYPES,
        dims=[("num_tokens", None), ("num_experts", None)],
        last_dim_contiguous=True,
    )
    check_scalar(_OP, "num_expert_group", num_expert_group, int, minimum=1, maximum=MAX_GROUPS)
    check_scalar(_OP, "topk_group", topk_group, int, minimum=1, maximum=num_expert_group)
    check_scalar(_OP, "topk", topk, int, minimum=1)
    check_scalar(_OP, "renormalize", renormalize, bool)
    check_scalar(_OP, "scaling_factor", scaling_factor, float)
    check_finite_float32(_OP, "scaling_factor", scaling_factor)
    num_tokens, num_experts = scores.shape
    if num_experts % num_expert_group != 0:
        fail(
            ValueError, _OP, "num_expert_group", "value", f"a divisor of num_experts = {num_experts}", num_expert_group
        )
    group_size = num_experts // num_expert_group
    if topk > topk_group * group_size:
        fail(
            ValueError,
            _OP,
            "topk",
            "value",
            f"<= topk_group * group_size = {topk_group} * {group_size} = {topk_group * group_size}",
            topk,
        )
    if bias is None:
        bias = no_bias(scores.device)
    else:
        check_tensor(
            _OP, "bias", bias, dtypes=FLOAT_DTYPES, device_as=(scores, "scores"), dims=[("num_experts", num_experts)]
        )
        if bias.dtype != torch.float32 or not bias.is_contiguous():
            bias = bias.to(torch.float32).contiguous()
    if tracing():
        return torch.ops.sglang_jit_kernel.grouped_topk(
            scores, bias, num_expert_group, topk_group, topk, renormalize, float(scaling_factor)
        )
    values = torch.empty(num_tokens, topk, dtype=torch.float32, device=scores.device)
    indices = torch.empty(num_tokens, topk, dtype=torch.int32, device=scores.device)
    if num_tokens > 0:
        launch_routing(
            _jit_grouped_topk_module,
            "grouped_topk",
            scores.dtype,
            routing_engine(scores.shape[1], topk, num_expert_group),
            values,
            indices,
            scores,
            bias,
            num_expert_group,
            topk_group,
            renormalize,
            float(scaling_factor),
        )
    return values, indices


def _check_cases() -> list[CheckCase]:
    """``check``: the DeepSeek-V3 shape at 4096 tokens against an fp32 torch emulation of the routing."""
    num_tokens, num_experts, groups, topk_group, topk, factor = 4096, 256, 8, 4, 8, 2.5

    def make() -> tuple:
        logits = torch.randint(-256, 256, (num_tokens, num_experts), device="cuda").float() / 64
        bias = torch.randint(-8, 8, (num_experts,), device="cuda").float() / 8
        return logits, bias

    def call(logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return grouped_topk(logits, bias, groups, topk_group, topk, True, factor)[0]

    def reference(logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(logits)
        s = p + bias
        group_scores = s.view(num_tokens, groups, -1).topk(2, dim=-1).values.sum(dim=-1)
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_group, dim=-1).indices, 1.0)
        masked = s.masked_fill(keep.repeat_interleave(num_experts // groups, dim=1) == 0, float("-inf"))
        w = p.gather(1, masked.topk(topk, dim=-1).indices)
        return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * factor

    return [
        CheckCase(
            f"[{num_tokens}, {num_experts}] fp32 g{groups} tg{topk_group} top{topk}",
            make,
            call,
            reference,
            bytes_moved=num_tokens * (num_experts * 4 + topk * 8),
            dtype=torch.float32,
        )
    ]


register_op(_OP, build=_jit_grouped_topk_module, variants=ROUTING_VARIANTS, check_cases=_check_cases)
