"""Helpers shared by the MoE routing ops (``topk_softmax``, ``topk_sigmoid``, ``grouped_topk``).

Each op has its own modules per gating dtype (float16, bfloat16, float32), built from its own
``csrc/moe/<op>.cuh`` over the routing engine ``csrc/moe/topk_rows.cuh``: six per gating dtype,
engine v2 by run length (rows of <= 32 / 64 / 128 / 256 / 1024 experts) and the first engine, each
built on the first call that needs it (``routing_engine`` names it). An op's modules instantiate only the kernels its calls can reach
(``RoutingOp`` in the engine): the first call of one op compiles none of its siblings' specialised
kernels, nor the first engine's.

The engine picks a kernel by shape, the same bits whichever kernel of an engine it picks: engine v2 (a lane owns a run
of consecutive experts; rows of <= 1024 experts, ``topk <= 32``, groups made of whole lane runs),
with the lookahead kernels for rows of <= 256 experts (specialised at top-8 for each option set,
sorted for full rows of 128 / 256 experts from 2048 tokens and for DeepSeek-V3's grouping, several
rows per warp for fp32 rows of 128 experts from 4096 tokens), and the first engine (experts strided
across lanes, 64-bit codes) for every other shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FLOAT_DTYPES,
    check_no_partial_overlap,
    check_no_self_overlap,
    check_shape,
    check_tensor,
    fail,
    launcher_errors,
    tracing,
    unit_last_stride,
)
from sglang.jit_kernel.utils import load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module


#: The engines of a routing module (``RoutingEngines`` in the engine): engine v2 by run length of
#: the experts over a warp's lanes ("v2_run1": <= 32 experts, "v2_run2": <= 64, "v2_run4": <= 128,
#: "v2_run8": <= 256, "v2_run16": <= 1024), and "v1", the first engine, for every other shape. Each
#: is compiled on the first call that needs it (routing_engine picks it).
ROUTING_ENGINES = ("v2_run1", "v2_run2", "v2_run4", "v2_run8", "v2_run16", "v1")
_ENGINE_ENUMS = {
    "v2_run1": "kV2Run1",
    "v2_run2": "kV2Run2",
    "v2_run4": "kV2Run4",
    "v2_run8": "kV2Run8",
    "v2_run16": "kV2Run16",
    "v1": "kV1",
}
_ENGINE_OF_RUN = {1: "v2_run1", 2: "v2_run2", 4: "v2_run4", 8: "v2_run8", 16: "v2_run16", 32: "v2_run16"}


def routing_engine(num_experts: int, topk: int, num_groups: int = 1) -> str:
    """The engine a routing call of ``num_experts`` experts, ``topk`` and ``num_groups`` expert
    groups runs on (the rule of ``v2_run_length`` in ``csrc/moe/topk_rows.cuh``): engine v2 with
    runs of ``per`` experts a lane (the fewest of 1 ... 32 with ``per * 32 >= num_experts``) when
    ``num_experts <= 1024``, ``topk <= 32`` and, with groups, each group is a power-of-two number of
    whole runs; else "v1"."""
    per = next((p for p in (1, 2, 4, 8, 16, 32) if num_experts <= 32 * p), 0)
    if per == 0 or topk > 32:
        return "v1"
    if num_groups > 1:
        group_size = num_experts // num_groups
        lanes = group_size // per
        if group_size % per != 0 or lanes & (lanes - 1) != 0:
            return "v1"
    return _ENGINE_OF_RUN[per]


def load_routing_module(op: str, dtype: torch.dtype, engines: str) -> Module:
    """Compile (first use) or load op ``op``'s module for gating dtype ``dtype`` and ``engines``:
    ``csrc/moe/<op>.cuh`` exporting ``<op><T, kEngines>`` (the callers' ``@cache_once`` builders
    memoize it)."""
    if engines not in ROUTING_ENGINES:
        raise ValueError(f"{op} module: engines: expected one of {ROUTING_ENGINES}, got {engines!r}")
    args = make_cpp_args(dtype, f"moe_routing::RoutingEngines::{_ENGINE_ENUMS[engines]}")
    return load_jit(op, *args, cuda_files=[f"moe/{op}.cuh"], cuda_wrappers=[(op, f"{op}<{args}>")])


def launch_routing(build: Callable[..., Module], op: str, dtype: torch.dtype, engine: str, *args: object) -> None:
    """Runs op ``op`` of gating dtype ``dtype`` with ``args`` on the module of ``engine``
    (routing_engine of the call's shape; compiled on first use). Raises RuntimeError if that module
    declines the shape (routing_engine and the launcher disagree), which launches nothing. A 2-D
    tensor with a last dim of size 1 (topk = 1, one expert) goes with that dim's stride set to 1:
    torch leaves it free, the launchers require 1, and it addresses nothing."""
    args = tuple(unit_last_stride(a) if isinstance(a, torch.Tensor) else a for a in args)
    with launcher_errors(op):  # the launcher's exact overlap checks, named for the op
        launched = getattr(build(dtype, engine), op)(*args)
    if not launched:
        raise RuntimeError(f"{op}: internal error: the {engine} module declined the call's shape")


#: The build arguments every routing op ships with (six modules per gating dtype).
ROUTING_VARIANTS = [(d, e) for d in FLOAT_DTYPES for e in ROUTING_ENGINES]

#: Stands for "no correction_bias" in the kernels' calls (length 0), one per device.
_NO_BIAS: dict[torch.device, torch.Tensor] = {}


def no_bias(device: torch.device) -> torch.Tensor:
    """A cached empty fp32 tensor on ``device``: the kernels' "no bias"."""
    t = _NO_BIAS.get(device)
    if t is None:
        t = _NO_BIAS[device] = torch.empty(0, dtype=torch.float32, device=device)
    return t


def check_routing_args(
    op: str,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating: torch.Tensor,
    bias: torch.Tensor | None,
    gating_arg: str = "gating_output",
    weights_arg: str = "topk_weights",
    ids_arg: str = "topk_ids",
    bias_arg: str = "correction_bias",
) -> torch.Tensor:
    """The checks shared by the routing ops (see their Raises); returns the bias as the kernels take
    it: fp32 contiguous, or the empty "no bias"."""
    check_tensor(
        op,
        gating_arg,
        gating,
        dtypes=FLOAT_DTYPES,
        dims=[("num_tokens", None), ("num_experts", None)],
        last_dim_contiguous=True,
    )
    num_tokens, num_experts = gating.shape
    if num_experts == 0:
        fail(RuntimeError, op, gating_arg, "shape", "[num_tokens, num_experts >= 1]", tuple(gating.shape))
    check_tensor(op, weights_arg, topk_weights, dtypes=(torch.float32,), device_as=(gating, gating_arg))
    check_shape(op, weights_arg, topk_weights, [("num_tokens", num_tokens), ("topk", None)])
    topk = topk_weights.shape[1]
    if not 1 <= topk <= num_experts:
        fail(
            RuntimeError,
            op,
            weights_arg,
            "shape",
            f"[num_tokens={num_tokens}, topk in [1, num_experts={num_experts}]]",
            tuple(topk_weights.shape),
        )
    check_tensor(
        op,
        ids_arg,
        topk_ids,
        dtypes=(torch.int32,),
        device_as=(gating, gating_arg),
        dims=[("num_tokens", num_tokens), ("topk", topk)],
    )
    for arg, t in ((weights_arg, topk_weights), (ids_arg, topk_ids)):
        if t.stride(-1) != 1 and topk > 1:
            fail(
                RuntimeError,
                op,
                arg,
                "last-dim stride",
                "1 (a contiguous last dim)",
                f"{t.stride(-1)} (shape {tuple(t.shape)} with strides {t.stride()})",
            )
    if bias is not None:
        check_tensor(
            op, bias_arg, bias, dtypes=FLOAT_DTYPES, device_as=(gating, gating_arg), dims=[("num_experts", num_experts)]
        )
    if not tracing():
        # The launcher's aliasing checks, named for the op. dense_only: interleaved views that share
        # no element are left to the launcher's exact test. The bias is checked as given (the
        # launcher may get an fp32 copy of it).
        check_no_self_overlap(op, weights_arg, topk_weights)
        check_no_self_overlap(op, ids_arg, topk_ids)
        # the launcher sees gating itself, and the bias itself only when it is fp32 and contiguous
        # (else an fp32 copy: the byte-range test here is the only one)
        inputs = ((gating_arg, gating, True),) + (
            ((bias_arg, bias, bias.dtype == torch.float32 and bias.is_contiguous()),) if bias is not None else ()
        )
        check_no_partial_overlap(op, weights_arg, topk_weights, topk_ids, ids_arg, allow_same=False, dense_only=True)
        for output_arg, output in ((weights_arg, topk_weights), (ids_arg, topk_ids)):
            for input_arg, t, exact in inputs:
                check_no_partial_overlap(op, output_arg, output, t, input_arg, allow_same=False, dense_only=exact)
    if bias is None:
        return no_bias(gating.device)
    if bias.dtype != torch.float32 or not bias.is_contiguous():
        bias = bias.to(torch.float32).contiguous()
    return bias


def routing_check_inputs(num_tokens: int, num_experts: int, topk: int) -> tuple:
    """``check`` inputs of the routing ops: fp32 logits on a 1/64 grid (distinct logit values differ
    by 1/64, > 1.5 % in softmax probability, so the choice is unambiguous in any precision) and
    empty outputs."""
    logits = torch.randint(-256, 256, (num_tokens, num_experts), device="cuda").float() / 64
    return (
        logits,
        torch.empty(num_tokens, topk, dtype=torch.float32, device="cuda"),
        torch.empty(num_tokens, topk, dtype=torch.int32, device="cuda"),
    )
