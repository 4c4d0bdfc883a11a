"""The MoE routing ops' shared module and helpers.

One ``moe_routing`` module per gating dtype (float16, bfloat16, float32) serves ``topk_softmax``,
``topk_sigmoid`` and ``grouped_topk`` (kernels: ``csrc/moe/topk_rows.cuh``, one warp per token row).
Each op's wrapper registers itself with ``module=MOE_ROUTING_MODULE``.

Two engines share the module: v2 (the default: a lane owns a run of consecutive experts, one integer
warp reduction and one ballot per chosen expert; rows of <= 1024 experts, ``topk <= 32``, groups made
of whole lane runs) and the first one (experts strided across lanes, 64-bit codes; every other
shape). ``SGLANG_MOE_ROUTING_ENGINE=1`` in the environment, read at each call (so at graph capture),
makes every call use the first engine, for old-vs-new comparisons (``benchmark/bench_moe.py`` rows
"jit v1"). Both choose the same experts wherever the fp32 scores are not within a rounding of a tie.
Any other value of that variable (unset, ``2``, ``x``, ``"1 "``) selects v2. Likewise
``SGLANG_MOE_ALIGN_PEERS=match`` makes ``moe_align_block_size`` find same-expert lanes with
``__match_any_sync`` instead of ballots (identical output); any other value selects ballots. Both are
benchmark knobs: either engine gives correct results. Engine v2 rows of <= 256 experts run the lookahead kernel (the
default since bench_moe on the H200, 2026-12-01: every row faster, e.g. topk_softmax [1, 256] 1.98
against 2.96 us): scoring options as whole-run loops (no branch per expert), each lane's next
candidate computed while a step's warp reduction is in flight, the softmax denominator's butterfly
overlapped with the steps, and the weights computed from the chosen keys kept in registers instead of
a second read of the row. ``SGLANG_MOE_TOPK_WINNERS=regs`` (exactly that value; read at each call)
selects the register-winner kernel it replaced, ``SGLANG_MOE_TOPK_WINNERS=smem`` the shared-memory
winners before that (``benchmark/bench_moe.py`` rows "jit regs", "jit smem"); all three give the same
bits, and any other value, or unset, keeps the default. It does not change what SGLANG_MOE_ROUTING_ENGINE selects.
The calls the lookahead kernel takes that are top-8 without grouping (topk_softmax, topk_sigmoid at
``topk = 8``) run ``topk_rows_v2_special_kernel``: the lookahead kernel with k = 8 and the options
(softmax or sigmoid, renormalize, bias present, softcap on) fixed at compile time, one instantiation
per combination (12 per run length). The default since bench_moe on the H200 (2026-12-01, fifth
session: topk_softmax 128 experts, 1 / 64 / 4096 tokens, 1.23 / 1.31 / 4.95 us against 1.79 / 1.86 /
5.38 for the generic lookahead kernel; no row slower beyond noise). ``SGLANG_MOE_TOPK_SPECIALISED=0``
(exactly that value; read at each call) keeps the generic lookahead kernel for them (bench_moe rows
"jit generic"); ``SGLANG_MOE_TOPK_WINNERS=regs`` / ``smem`` still select those kernels. The same bits
either way.

Full rows of 128 or 256 experts of those calls, and grouped_topk at DeepSeek-V3's shape, have sorted
kernels: each lane sorts its run's keys packed with their expert (distinct), a step is one warp
maximum and a shift, and a warp whose 9 step results could order differently from the plain keys
(near ties) runs the lookahead steps instead, so the bits are the same. The default takes them for
grouped calls and for ungrouped ones from 2048 tokens (H200: [4096, 256] topk_softmax 7.17 -> 4.32
us, grouped_topk 9.25 -> 6.74; the lookahead kernels win up to 1024 tokens).
``SGLANG_MOE_TOPK_SORTED=1`` / ``0`` (exactly; read at each call) forces / never takes them
(bench_moe rows "jit sorted", "jit no sorted"); ``SGLANG_MOE_TOPK_MULTIROW=8`` / ``16`` (forced)
still takes its shapes first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import FLOAT_DTYPES, check_no_partial_overlap, check_shape, check_tensor, fail
from sglang.jit_kernel.registry import register_module
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module


@cache_once
def jit_moe_routing_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the routing module for gating dtype ``dtype``."""
    args = make_cpp_args(dtype)
    return load_jit(
        "moe_routing",
        *args,
        cuda_files=["moe/topk_softmax.cuh", "moe/topk_sigmoid.cuh", "moe/grouped_topk.cuh"],
        cuda_wrappers=[
            ("topk_softmax", f"topk_softmax<{args}>"),
            ("topk_sigmoid", f"topk_sigmoid<{args}>"),
            ("grouped_topk", f"grouped_topk<{args}>"),
        ],
    )


MOE_ROUTING_MODULE = register_module("moe_routing", jit_moe_routing_module, [(d,) for d in FLOAT_DTYPES])

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
    if bias is None:
        bias = no_bias(gating.device)
    else:
        check_tensor(
            op, bias_arg, bias, dtypes=FLOAT_DTYPES, device_as=(gating, gating_arg), dims=[("num_experts", num_experts)]
        )
        if bias.dtype != torch.float32 or not bias.is_contiguous():
            bias = bias.to(torch.float32).contiguous()
    if not torch.compiler.is_compiling():
        check_no_partial_overlap(op, weights_arg, topk_weights, topk_ids, ids_arg, allow_same=False)
        check_no_partial_overlap(op, weights_arg, topk_weights, gating, gating_arg, allow_same=False)
        check_no_partial_overlap(op, ids_arg, topk_ids, gating, gating_arg, allow_same=False)
    return bias


def routing_check_inputs(num_tokens: int, num_experts: int, topk: int) -> tuple:
    """``check`` inputs of the routing ops: fp32 logits on a 1/64 grid (distinct experts differ in
    probability by > 1.5 %, so the choice is unambiguous in any precision) and empty outputs."""
    logits = torch.randint(-256, 256, (num_tokens, num_experts), device="cuda").float() / 64
    return (
        logits,
        torch.empty(num_tokens, topk, dtype=torch.float32, device="cuda"),
        torch.empty(num_tokens, topk, dtype=torch.int32, device="cuda"),
    )
