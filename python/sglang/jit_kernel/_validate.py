"""Argument checks shared by the op wrappers.

Each check raises before any launch, with a message that names the op, the argument, what was
expected and what was given. They are plain attribute tests, cheap enough for the eager hot path.
"""

from __future__ import annotations

from typing import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_cuda(op: str, name: str, tensor: torch.Tensor) -> None:
    """Raise RuntimeError unless ``tensor`` is a CUDA tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cuda:
        raise RuntimeError(f"{op}: {name} must be a CUDA tensor, got device {tensor.device}")


def check_dtype(op: str, name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    """Raise RuntimeError unless ``tensor.dtype`` is one of ``allowed``."""
    if tensor.dtype not in allowed:
        raise RuntimeError(
            f"{op}: {name} has unsupported dtype {str(tensor.dtype).replace('torch.', '')}; "
            f"expected one of {_dtype_names(allowed)}"
        )


def check_like(op: str, name: str, tensor: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    """Raise RuntimeError unless ``tensor`` has the shape, dtype and device of ``ref``."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.shape != ref.shape:
        raise RuntimeError(
            f"{op}: {name} shape must match {ref_name}: expected {tuple(ref.shape)}, got {tuple(tensor.shape)}"
        )
    if tensor.dtype != ref.dtype:
        raise RuntimeError(
            f"{op}: {name} dtype must match {ref_name}: expected {str(ref.dtype).replace('torch.', '')}, "
            f"got {str(tensor.dtype).replace('torch.', '')}"
        )
    if tensor.device != ref.device:
        raise RuntimeError(
            f"{op}: {name} device must match {ref_name}: expected {ref.device}, got {tensor.device}"
        )


def check_contiguous(op: str, name: str, tensor: torch.Tensor) -> None:
    """Raise RuntimeError unless ``tensor`` is contiguous."""
    if not tensor.is_contiguous():
        raise RuntimeError(
            f"{op}: {name} must be contiguous, got shape {tuple(tensor.shape)} with strides {tensor.stride()}"
        )


def prepare_elementwise_out(
    op: str, src: torch.Tensor, out: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, out)`` for an element-wise op: ``src`` made contiguous (a copy if it was not), ``out``
    allocated like it or checked to match it (shape, dtype, device) and be contiguous."""
    if not src.is_contiguous():
        src = src.contiguous()
    if out is None:
        return src, torch.empty_like(src)
    check_like(op, "out", out, src, "src")
    check_contiguous(op, "out", out)
    return src, out
