"""Shared test helpers: capability markers, the per-dtype tolerance table, poisoned buffers, views.

Used by ``tests/test_*.py``; importable without a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
NUM_GPUS = torch.cuda.device_count() if HAS_CUDA else 0

#: GPU-only tests: skipped, with the reason, on machines without a CUDA device.
requires_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA GPU (none visible); run it on a machine with an NVIDIA GPU"
)
#: Tests that need two GPUs.
requires_two_gpus = pytest.mark.skipif(NUM_GPUS < 2, reason=f"needs 2 CUDA GPUs ({NUM_GPUS} visible)")


def _has_nvcc() -> bool:
    from sglang.jit_kernel._build import find_cuda_home  # noqa: PLC0415

    try:
        find_cuda_home()
    except RuntimeError:
        return False
    return shutil.which("c++") is not None or bool(os.environ.get("CXX"))


HAS_NVCC = _has_nvcc()
#: Compile-only tests: need nvcc and a host compiler, not a GPU.
requires_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="needs the CUDA toolkit (nvcc) and a C++ compiler")

_PTXAS_KERNEL_RE = re.compile(r"Function properties for (\S+)")
_PTXAS_LOCAL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def kernels_without_local_memory(log: Path) -> list[str]:
    """The kernels of one JIT build log (``<cache>/<module>/build.log``, written with ptxas'
    ``--resource-usage``), in report order, after asserting that each has a resource report and uses
    no local memory (0 bytes of stack frame, spill stores and spill loads)."""
    text = Path(log).read_text()
    kernels = _PTXAS_KERNEL_RE.findall(text)
    reports = _PTXAS_LOCAL_RE.findall(text)
    assert kernels and len(kernels) == len(reports), f"no ptxas resource report per kernel in {log}"
    for kernel, (stack, stores, loads) in zip(kernels, reports):
        assert (int(stack), int(stores), int(loads)) == (0, 0, 0), (
            f"{kernel} uses local memory ({stack} B stack, {stores} B spill stores, {loads} B loads); see {log}"
        )
    return kernels


#: (rtol, atol) for comparing an op's output with an fp32 reference rounded to the output dtype:
#: about one unit in the last place of the dtype (fp16 2^-10, bf16 2^-7), fp32 a few ulps.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (8e-3, 1e-5),
}

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: (num_tokens, num_q_heads, num_kv_heads, head_dim, rope_dim) reaching each kernel rope.cuh's KV
#: launcher picks (tests/test_rope.py with caches of the model dtype, tests/test_rope_fp8_kvcache.py
#: with fp8 caches): the bench shape at 1 / 64 tokens (early kernel with v rows) and 2048 (past
#: kL2HintMinBytes: the split copy, L2-hinted), more heads than one pass of rows, partial R, 64 kv
#: heads, 64 + 64 heads (no room for v rows: rope_kernel's kKvMode 0, below and above the L2-hint
#: size), 308 heads (the early kernel's heads past its first pass), R/2 = 4104 (more chunks than a
#: CTA's 512 lanes: no v rows, lanes rotating two chunks, the position loaded for each).
ROPE_KV_KERNEL_SHAPES = [
    (1, 32, 8, 128, 128),
    (64, 32, 8, 128, 128),
    (2048, 32, 8, 128, 128),
    (3, 200, 3, 64, 64),
    (5, 8, 8, 256, 80),
    (9, 4, 64, 128, 128),
    (9, 64, 64, 128, 128),
    (300, 64, 64, 128, 128),
    (2, 300, 8, 128, 128),
    (2, 2, 1, 8208, 8208),
]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """``torch.testing.assert_close`` with the tolerance of ``dtype`` (default: ``actual.dtype``);
    NaN never equals NaN."""
    rtol, atol = TOLERANCE[dtype or actual.dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=False)


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device = "cuda") -> torch.Tensor:
    """An uninitialised-looking output: NaN for floats, a sentinel (-0x5A5A5A5A) for integers."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if dtype.is_floating_point:
        t.fill_(float("nan"))
    else:
        t.fill_(-0x5A5A5A5A if dtype == torch.int32 else -91)
    return t


def padded(tensor: torch.Tensor, pad: int = 37) -> tuple[torch.Tensor, torch.Tensor]:
    """Place a flat copy of ``tensor`` inside a larger poisoned buffer, at element offset ``pad``.

    Returns (view, buffer): the view has ``tensor``'s shape and values, a storage offset of ``pad``
    elements (so its data pointer is usually not 16-byte aligned), and the buffer around it holds
    poison so stray writes show.
    """
    n = tensor.numel()
    buffer = poisoned((n + 2 * pad,), tensor.dtype, tensor.device)
    view = buffer[pad : pad + n].view(tensor.shape)
    view.copy_(tensor)
    return view, buffer


def assert_poison_intact(buffer: torch.Tensor, pad: int, n: int) -> None:
    """The ``pad`` elements on each side of ``buffer[pad:pad+n]`` still hold poison."""
    outside = torch.cat([buffer[:pad], buffer[pad + n :]])
    if buffer.dtype.is_floating_point:
        assert torch.isnan(outside).all(), "an op wrote outside its output view"
    else:
        expected = poisoned((1,), buffer.dtype, buffer.device)[0]
        assert (outside == expected).all(), "an op wrote outside its output view"


# ---- bit copies (KV-cache writes, concatenations): compare raw bytes, any dtype including fp8 ----
#: The byte every element of a sentinel buffer holds before a copy op runs.
SENTINEL_BYTE = 0xA5


def random_of(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device = "cuda") -> torch.Tensor:
    """Standard-normal values cast to ``dtype`` (fp8 too: through a float32 cast)."""
    return torch.randn(shape, device=device).to(dtype)


def sentinel_filled(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device = "cuda") -> torch.Tensor:
    """A buffer whose every byte is ``SENTINEL_BYTE``, so that any byte a copy op should not touch
    shows it kept its value."""
    t = torch.empty(shape, dtype=dtype, device=device)
    t.view(torch.uint8).fill_(SENTINEL_BYTE)
    return t


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` as uint8, last dim scaled by the element size (a view when ``t`` is
    contiguous, else of a contiguous copy; a 0-d tensor is read as 1-d)."""
    t = t.contiguous()
    return (t.reshape(1) if t.dim() == 0 else t).view(torch.uint8)


def assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same shape and the same bytes (NaN payloads and -0.0 included); names the first differing byte."""
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = as_bytes(actual), as_bytes(expected)
    if not torch.equal(a, e):
        bad = (a != e).nonzero()
        raise AssertionError(f"{len(bad)} bytes differ; first at byte index {bad[0].tolist()}")
