"""moe_align_block_size: group the routed tokens by expert, each segment padded to a block multiple."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    INDEX_DTYPES,
    check_indices,
    check_no_partial_overlap,
    check_scalar,
    check_tensor,
    fail,
    tracing,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["moe_align_block_size", "max_num_tokens_padded"]

_OP = "moe_align_block_size"
#: topk_ids dtype -> C++ index type
_INDEX_TYPE = {torch.int32: "int32_t", torch.int64: "int64_t"}
#: The largest num_experts (MoeAlignConfig::kMaxExperts: its shared-memory table fits every sm80+ GPU).
MAX_EXPERTS = 8192
#: The largest block_size (MoeAlignConfig::kMaxBlockSize).
MAX_BLOCK_SIZE = 1024
_INT32_MAX = 2**31 - 1
#: MoeAlignSplitConfig::kMaxCtas: rows of the split kernel's count table.
_SPLIT_MAX_CTAS = 64
#: MoeAlignSplitConfig::kMaxExperts: wider rows run the one-CTA kernel.
_SPLIT_MAX_EXPERTS = 1024
#: From this many routed ids (and at most 1024 experts) the two-launch "split" kernels run; below it
#: the one-launch "small" kernel (up to 8 CTAs with PDL; rows of more than 1024 experts: the one-CTA
#: kernel). The crossover: docs/perf_notes.md, moe_align.
SPLIT_MIN_NUMEL = 4096


@cache_once
def _jit_moe_align_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the module of topk_ids dtype ``dtype``: ``moe_align_block_size``
    (the "small" kernel, or the one-CTA kernel past 1024 experts) and ``moe_align_block_size_split``."""
    cpp = _INDEX_TYPE[dtype]
    return load_jit(
        "moe_align",
        cpp,
        cuda_files=["moe/moe_align.cuh"],
        cuda_wrappers=[
            ("moe_align_block_size", f"moe_align_block_size_small<{cpp}>"),
            ("moe_align_block_size_split", f"moe_align_block_size_split<{cpp}>"),
        ],
    )


def max_num_tokens_padded(numel: int, num_experts: int, block_size: int) -> int:
    """The worst-case padded total: ``numel + min(numel, num_experts) * (block_size - 1)`` (every
    non-empty expert wastes at most ``block_size - 1`` slots).

    Parameters
    ----------
    numel : int
        ``topk_ids.numel()`` (routed (token, k) pairs, ``>= 0``).
    num_experts : int
        Segments, as passed to :func:`moe_align_block_size`.
    block_size : int
        As passed to :func:`moe_align_block_size`.

    Returns
    -------
    int
        The length ``sorted_token_ids`` needs; ``// block_size`` gives the length of ``expert_ids``.
        Plain integer arithmetic: the arguments are not checked (no exception of its own).
    """
    return numel + min(numel, num_experts) * (block_size - 1)


def _launch(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    cumsum_buffer: torch.Tensor,
    pad_sorted_token_ids: bool,
) -> None:
    if topk_ids.numel() == 0:  # no kernel: the outputs of an empty routing, written by torch
        num_tokens_post_pad.zero_()
        cumsum_buffer[: num_experts + 1].zero_()
        if pad_sorted_token_ids:
            sorted_token_ids.zero_()  # the padding value numel() is 0
        return
    module = _jit_moe_align_module(topk_ids.dtype)
    launch, scratch = module.moe_align_block_size, ()
    if topk_ids.numel() >= SPLIT_MIN_NUMEL and num_experts <= _SPLIT_MAX_EXPERTS:
        # The count table of the split kernels (scratch: any contents; the caching allocator, no launch).
        launch = module.moe_align_block_size_split
        scratch = (torch.empty(_SPLIT_MAX_CTAS * num_experts, dtype=torch.int32, device=topk_ids.device),)
    launch(
        topk_ids,
        num_experts,
        block_size,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_pad,
        cumsum_buffer,
        pad_sorted_token_ids,
        *scratch,
    )


@torch.library.custom_op(
    "sglang_jit_kernel::moe_align_block_size",
    mutates_args=("sorted_token_ids", "expert_ids", "num_tokens_post_pad", "cumsum_buffer"),
    device_types="cuda",
)
def _moe_align_block_size_op(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    cumsum_buffer: torch.Tensor,
    pad_sorted_token_ids: bool,
) -> None:
    # the wrapper's host index check is left out while tracing: here it runs on the real tensors
    check_indices(_OP, "topk_ids", topk_ids, num_experts, skip_value=-1, dim_name="num_experts")
    _launch(
        topk_ids,
        num_experts,
        block_size,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_pad,
        cumsum_buffer,
        pad_sorted_token_ids,
    )


@_moe_align_block_size_op.register_fake
def _(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    cumsum_buffer: torch.Tensor,
    pad_sorted_token_ids: bool,
) -> None:
    return None


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    cumsum_buffer: torch.Tensor,
    pad_sorted_token_ids: bool = False,
) -> None:
    """Group the routed (token, k) pairs by expert, each expert's segment padded to a multiple of
    ``block_size``, for the block-sparse expert GEMMs (the vLLM / sgl-kernel contract).

    With ``x = topk_ids.flatten()`` (row-major), ``numel = x.numel()``, ``c[e] = #{i : x[i] == e}``
    and ``padded[e] = ceil(c[e] / block_size) * block_size``, expert ``e``'s segment is
    ``[start[e], start[e] + padded[e])`` with ``start[e] = sum(padded[:e])``, and:

    * ``sorted_token_ids[start[e] + j]`` for ``j < c[e]`` is the j-th smallest ``i`` with
      ``x[i] == e`` (ascending flat index: a stable counting sort, the same bits every run);
    * ``expert_ids[b] = e`` for every block ``b`` of the segment (slots ``[b * block_size, (b + 1) *
      block_size)``);
    * ``num_tokens_post_pad[0] = sum(padded)``; ``cumsum_buffer[:num_experts + 1]`` gets ``start``
      followed by that total (scratch: its other entries are not touched).

    ``num_experts`` is the number of segments: ids are in ``[0, num_experts)``. sglang's callers pass
    one more than the model's experts (and size the buffers for it): the extra expert then has no
    tokens and no blocks, and every output is the same as with the model's count (``cumsum_buffer``
    gets one more, equal entry). An id outside ``[0, num_experts)`` (``-1``: a token routed to no
    local expert) is skipped: not counted, its flat index written nowhere. With
    ``SGLANG_JIT_CHECK_INDICES=1`` an id outside the range other than ``-1`` raises IndexError (a
    host read; not while a CUDA graph is being captured).

    Slots that hold no token, the segments' padding and ``sorted_token_ids[sum(padded):]``, get
    ``numel`` with ``pad_sorted_token_ids`` and keep what the caller put there without it.
    ``expert_ids[sum(padded) // block_size:]`` is not written. ``numel == 0`` launches no kernel:
    torch writes ``num_tokens_post_pad = 0``, ``cumsum_buffer[:num_experts + 1] = 0`` and, with
    padding, zeros (``numel``) into ``sorted_token_ids``. One launch of up to 8 CTAs below 4096
    routed ids (rows of more than 1024 experts: one CTA at any size), two launches over up to 64
    CTAs from there with at most 1024 experts (the same bits); no host sync (CUDA-graph safe).

    Parameters
    ----------
    topk_ids : torch.Tensor
        int32 / int64 on a CUDA device, any shape (``[num_tokens, topk]`` usually), any strides; read
        only. A view whose elements are not one contiguous run is copied first.
    num_experts : int
        Segments, in ``[1, 8192]``.
    block_size : int
        A power of two in ``[1, 1024]`` (the GEMM's BLOCK_M: 16 to 256).
    sorted_token_ids : torch.Tensor
        int32 ``[max_num_tokens_padded]``, contiguous, at least
        ``max_num_tokens_padded(numel, num_experts, block_size) = numel + min(numel, num_experts) *
        (block_size - 1)`` (callers that allocate ``numel + num_experts * (block_size - 1)`` have
        enough); written.
    expert_ids : torch.Tensor
        int32 ``[max_num_blocks]``, contiguous, at least ``max_num_tokens_padded // block_size``;
        written.
    num_tokens_post_pad : torch.Tensor
        int32 ``[1]``; written.
    cumsum_buffer : torch.Tensor
        int32 ``[>= num_experts + 1]``, contiguous; written (scratch).
    pad_sorted_token_ids : bool
        Fill the slots that hold no token with ``numel``. Default False.

    Returns
    -------
    None
        The four buffers are written in place (``expert_ids`` and ``sorted_token_ids`` only as above).

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, or a scalar of the wrong type.
    ValueError
        ``num_experts`` outside ``[1, 8192]``, ``block_size`` not a power of two in ``[1, 1024]``.
    IndexError
        With ``SGLANG_JIT_CHECK_INDICES=1``: an id outside ``[0, num_experts)`` other than ``-1``.
    RuntimeError
        A tensor off CUDA or on another device than ``topk_ids``, a wrong dtype, a buffer that is not
        1-D contiguous or too small for the worst case, ``num_tokens_post_pad`` not of shape ``(1,)``,
        a worst case past int32, or tensors sharing memory; raised before any launch as
        ``moe_align_block_size: <arg> <what>: expected X, got Y``.
    """
    check_tensor(_OP, "topk_ids", topk_ids, dtypes=INDEX_DTYPES)
    check_scalar(_OP, "num_experts", num_experts, int, minimum=1, maximum=MAX_EXPERTS)
    check_scalar(_OP, "block_size", block_size, int, minimum=1, maximum=MAX_BLOCK_SIZE)
    if block_size & (block_size - 1):
        fail(ValueError, _OP, "block_size", "value", f"a power of two in [1, {MAX_BLOCK_SIZE}]", block_size)
    check_scalar(_OP, "pad_sorted_token_ids", pad_sorted_token_ids, bool)
    numel = topk_ids.numel()
    max_padded = max_num_tokens_padded(numel, num_experts, block_size)
    if max_padded > _INT32_MAX:
        fail(
            RuntimeError,
            _OP,
            "topk_ids",
            "numel",
            f"numel + min(numel, num_experts) * (block_size - 1) <= {_INT32_MAX} (int32 slots)",
            f"{numel} (worst case {max_padded})",
        )
    needs = (
        (
            "sorted_token_ids",
            sorted_token_ids,
            "max_num_tokens_padded",
            max_padded,
            "numel + min(numel, num_experts) * (block_size - 1), the worst case",
        ),
        (
            "expert_ids",
            expert_ids,
            "max_num_blocks",
            max_padded // block_size,
            "max_num_tokens_padded // block_size, the worst case",
        ),
        ("cumsum_buffer", cumsum_buffer, "num_experts_plus_1", num_experts + 1, "num_experts + 1"),
    )
    for arg, t, dim, need, why in needs:
        check_tensor(
            _OP, arg, t, dtypes=(torch.int32,), device_as=(topk_ids, "topk_ids"), dims=[(dim, None)], contiguous=True
        )
        if t.numel() < need:
            fail(RuntimeError, _OP, arg, "size", f"at least {need} ({why})", t.numel())
    check_tensor(
        _OP, "num_tokens_post_pad", num_tokens_post_pad, dtypes=(torch.int32,), device_as=(topk_ids, "topk_ids")
    )
    if tuple(num_tokens_post_pad.shape) != (1,):
        fail(RuntimeError, _OP, "num_tokens_post_pad", "shape", "(1,)", tuple(num_tokens_post_pad.shape))
    flat = topk_ids.reshape(-1).contiguous()  # a copy only where no contiguous view exists
    if not tracing():
        outputs = (
            ("sorted_token_ids", sorted_token_ids),
            ("expert_ids", expert_ids),
            ("num_tokens_post_pad", num_tokens_post_pad),
            ("cumsum_buffer", cumsum_buffer),
        )
        for i, (arg, t) in enumerate(outputs):
            check_no_partial_overlap(_OP, arg, t, topk_ids, "topk_ids", allow_same=False)
            for other_arg, other in outputs[:i]:
                check_no_partial_overlap(_OP, arg, t, other, other_arg, allow_same=False)
        check_indices(_OP, "topk_ids", topk_ids, num_experts, skip_value=-1, dim_name="num_experts")
        _launch(
            flat,
            num_experts,
            block_size,
            sorted_token_ids,
            expert_ids,
            num_tokens_post_pad,
            cumsum_buffer,
            pad_sorted_token_ids,
        )
    else:
        torch.ops.sglang_jit_kernel.moe_align_block_size(
            flat,
            num_experts,
            block_size,
            sorted_token_ids,
            expert_ids,
            num_tokens_post_pad,
            cumsum_buffer,
            pad_sorted_token_ids,
        )


def align_reference(
    topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The padded outputs of the definition, from a plain torch stable sort (``check``'s reference):
    ``(num_tokens_post_pad [1], cumsum [num_experts + 1], expert_ids [num_blocks],
    sorted_token_ids [sorted_len])``, padding and tail holding ``numel``."""
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    keep = (flat >= 0) & (flat < num_experts)
    counts = torch.bincount(flat[keep], minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    cumsum = torch.cat([padded.new_zeros(1), padded.cumsum(0)])
    total = int(cumsum[-1])
    order = torch.sort(torch.where(keep, flat, num_experts), stable=True).indices[: int(keep.sum())]
    experts = flat[order]
    rank = torch.arange(order.numel(), device=flat.device) - (counts.cumsum(0) - counts)[experts]
    sorted_ids = torch.full((sorted_len,), numel, dtype=torch.int32, device=flat.device)
    sorted_ids[cumsum[experts] + rank] = order.int()
    block_experts = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block_size)
    return (torch.tensor([total], dtype=torch.int32, device=flat.device), cumsum.int(), block_experts.int(), sorted_ids)


def _check_cases() -> list[CheckCase]:
    """``check``: 4096 tokens x top 8 x 256 experts, block 64, padded; every output (the block
    experts' unused tail pre-filled with -1) against the torch stable-sort reference."""
    num_tokens, topk, num_experts, block_size = 4096, 8, 256, 64
    sorted_len = max_num_tokens_padded(num_tokens * topk, num_experts, block_size)
    max_blocks = sorted_len // block_size

    def make() -> tuple:
        ids = torch.randint(0, num_experts, (num_tokens, topk), dtype=torch.int32, device="cuda")
        return (
            ids,
            torch.empty(sorted_len, dtype=torch.int32, device="cuda"),
            torch.full((max_blocks,), -1, dtype=torch.int32, device="cuda"),
            torch.empty(1, dtype=torch.int32, device="cuda"),
            torch.empty(num_experts + 1, dtype=torch.int32, device="cuda"),
        )

    def call(
        ids: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor, total: torch.Tensor, cumsum: torch.Tensor
    ) -> torch.Tensor:
        moe_align_block_size(ids, num_experts, block_size, sorted_ids, expert_ids, total, cumsum, True)
        return total

    def output(
        result: torch.Tensor,
        ids: torch.Tensor,
        sorted_ids: torch.Tensor,
        expert_ids: torch.Tensor,
        total: torch.Tensor,
        cumsum: torch.Tensor,
    ) -> torch.Tensor:
        return torch.cat([total, cumsum, expert_ids, sorted_ids])

    def reference(
        ids: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor, total: torch.Tensor, cumsum: torch.Tensor
    ) -> torch.Tensor:
        t, c, blocks, s = align_reference(ids, num_experts, block_size, sorted_len)
        tail = torch.full((max_blocks - blocks.numel(),), -1, dtype=torch.int32, device="cuda")
        return torch.cat([t, c, blocks, tail, s])

    return [
        CheckCase(
            f"[{num_tokens}, {topk}] int32 E{num_experts} block{block_size}",
            make,
            call,
            reference,
            bytes_moved=4 * (num_tokens * topk + sorted_len + max_blocks),
            dtype=torch.int32,
            output=output,
        )
    ]


register_op(_OP, build=_jit_moe_align_module, variants=[(d,) for d in INDEX_DTYPES], check_cases=_check_cases)
