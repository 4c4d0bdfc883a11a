"""clamp_position: ``clamp_position_cuda(seq_lens) = max(seq_lens - 1, 0)``, the position of the last
token of each sequence (``csrc/elementwise/clamp_position.cuh``; one module, int32 and int64).

A launch-latency op (a decode batch is a few hundred entries): bytes moved ``2 * n * element_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import FAST_PATH_REFUSALS, INDEX_DTYPES, check_tensor, tracing
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["clamp_position_cuda"]


@cache_once
def _jit_clamp_position_module() -> Module:
    """Compile (first use) and cache the clamp_position module (int32 and int64 in one build)."""
    return load_jit(
        "clamp_position",
        cuda_files=["elementwise/clamp_position.cuh"],
        cuda_wrappers=[("clamp_position", "clamp_position")],
    )


# The exported function once loaded: the eager fast path (the launcher validates everything).
_FNS: dict[str, Callable[..., None]] = {}


def _load() -> Callable[..., None]:
    fn = _jit_clamp_position_module().clamp_position
    _FNS["clamp_position"] = fn
    return fn


@torch.library.custom_op("sglang_jit_kernel::clamp_position", mutates_args=(), device_types="cuda")
def _clamp_position_op(seq_lens: torch.Tensor) -> torch.Tensor:
    out = torch.empty(seq_lens.shape, dtype=seq_lens.dtype, device=seq_lens.device)
    _load()(out, seq_lens)
    return out


@_clamp_position_op.register_fake
def _(seq_lens: torch.Tensor) -> torch.Tensor:
    return torch.empty(seq_lens.shape, dtype=seq_lens.dtype, device=seq_lens.device)


def clamp_position_cuda(seq_lens: torch.Tensor) -> torch.Tensor:
    """Positions of the last tokens: ``out[i] = max(seq_lens[i] - 1, 0)``.

    Exact integer arithmetic, computed as ``seq_lens[i] - 1 if seq_lens[i] > 0 else 0``, so the most
    negative value of the dtype gives 0 (no wrap-around).

    Parameters
    ----------
    seq_lens : torch.Tensor
        ``[num_seqs]`` int32 or int64 on a CUDA device, any stride. Not modified.

    Returns
    -------
    torch.Tensor
        A new contiguous ``[num_seqs]`` tensor of the dtype and device of ``seq_lens``.

    Raises
    ------
    TypeError
        ``seq_lens`` is not a tensor.
    RuntimeError
        ``seq_lens`` not on a CUDA device, not int32/int64 or not 1-D. Raised before any launch, as
        ``clamp_position_cuda: seq_lens <what>: expected X, got Y``.
    """
    if not tracing():
        fn = _FNS.get("clamp_position")
        if fn is not None and isinstance(seq_lens, torch.Tensor):
            out = torch.empty(seq_lens.shape, dtype=seq_lens.dtype, device=seq_lens.device)
            try:
                fn(out, seq_lens)  # the launcher checks everything
                return out
            except FAST_PATH_REFUSALS:  # raised before any launch: the checked path explains
                pass
    op = "clamp_position_cuda"
    check_tensor(op, "seq_lens", seq_lens, dtypes=INDEX_DTYPES, dims=[("num_seqs", None)])
    if tracing():
        return torch.ops.sglang_jit_kernel.clamp_position(seq_lens)
    out = torch.empty(seq_lens.shape, dtype=seq_lens.dtype, device=seq_lens.device)
    if seq_lens.numel() > 0:
        _load()(out, seq_lens)
    return out


def _check_cases() -> list[CheckCase]:
    """``check``: a decode batch of 4096 int64 lengths in [-3, 100000), some 0 or negative."""
    n = 4096

    def make() -> tuple:
        return (torch.randint(-3, 100_000, (n,), device="cuda"),)

    def reference(seq_lens: torch.Tensor) -> torch.Tensor:
        return torch.where(seq_lens > 0, seq_lens - 1, torch.zeros_like(seq_lens))

    return [CheckCase(f"[{n}] int64", make, clamp_position_cuda, reference, bytes_moved=2 * n * 8, dtype=torch.int64)]


register_op("clamp_position", build=_jit_clamp_position_module, variants=[()], check_cases=_check_cases)
