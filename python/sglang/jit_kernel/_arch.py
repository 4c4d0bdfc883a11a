"""Which GPUs the JIT kernels support: compute capability 8.0 (A100) and newer.

The kernels rely on SM80 features (bf16 arithmetic, L2 cache-policy loads and stores); Hopper-only
paths (Programmatic Dependent Launch) are gated inside the kernels and their launcher, so 8.x, 9.x,
10.x and later all build and run. Older GPUs are refused here, in one place, before anything is
compiled or launched: ``_build.resolve_cuda_archs`` calls these checks when ``load_jit`` resolves a
module's target architectures. The eager hot path never gets here (ops keep their module functions
after the first call), so the checks cost nothing per call.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

#: The oldest compute capability any op supports (A100).
MIN_CAPABILITY = (8, 0)

_SUPPORTED = (
    f"sglang.jit_kernel supports GPUs of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
    "and newer (A100 and later)"
)


def check_target_arch(major: int, minor: int, suffix: str, source: str) -> None:
    """Refuse a build target below ``MIN_CAPABILITY``.

    Parameters
    ----------
    major, minor, suffix : int, int, str
        A parsed architecture (``_build.parse_arch``): ``(7, 5, "")`` for ``"7.5"``.
    source : str
        Where the target came from, for the message: ``"SGLANG_JIT_CUDA_ARCH=7.5"``.

    Raises
    ------
    ValueError
        Naming the source and the architecture, when ``(major, minor)`` is below 8.0.
    """
    if (major, minor) < MIN_CAPABILITY:
        raise ValueError(f"target architecture {major}.{minor}{suffix} (from {source}) is not supported: {_SUPPORTED}")


def check_devices(devices: Sequence[tuple[int, str, tuple[int, int]]]) -> None:
    """Refuse any visible GPU below ``MIN_CAPABILITY``.

    Parameters
    ----------
    devices : sequence of (index, name, (major, minor))
        The visible GPUs, e.g. ``[(0, "NVIDIA H200", (9, 0))]``.

    Raises
    ------
    RuntimeError
        Naming every GPU below 8.0 (``cuda:1 (Tesla V100-SXM2-32GB, compute capability 7.0)``) and
        the two ways out: hide it, or target only the GPUs the ops run on.
    """
    old = [(i, name, cap) for i, name, cap in devices if tuple(cap) < MIN_CAPABILITY]
    if old:
        listed = ", ".join(f"cuda:{i} ({name}, compute capability {cap[0]}.{cap[1]})" for i, name, cap in old)
        raise RuntimeError(
            f"{_SUPPORTED}; this process sees {listed}. Hide it with CUDA_VISIBLE_DEVICES, or set "
            "SGLANG_JIT_CUDA_ARCH to the architectures of the GPUs the ops run on"
        )


def visible_device_archs() -> tuple[str, ...]:
    """The compute capabilities of every visible GPU, sorted and normalised (``("8.0", "9.0")``);
    ``()`` when no GPU is visible.

    Raises
    ------
    RuntimeError
        If a visible GPU is older than 8.0 (see ``check_devices``).
    """
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        return ()
    devices = [
        (i, torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
        for i in range(torch.cuda.device_count())
    ]
    check_devices(devices)
    return tuple(sorted({f"{major}.{minor}" for _, _, (major, minor) in devices}))


def host_device_archs() -> tuple[str, ...] | None:
    """The compute capabilities of every GPU of the host, sorted and normalised, asked of NVML
    (``cuda.bindings.nvml``, a dependency of torch's CUDA 13 builds); None when NVML cannot answer
    (no driver, no bindings, a device in a bad state); ``()`` when ``CUDA_VISIBLE_DEVICES`` hides
    every GPU (empty, or its first entry not a device: ``-1``, ``none``).

    NVML starts no CUDA context, so a process that has not initialised CUDA can ask without losing
    the use of CUDA in a later fork. Otherwise it counts every GPU of the host: a list in
    ``CUDA_VISIBLE_DEVICES`` does not narrow it (NVML's order is not CUDA's)."""
    import importlib  # noqa: PLC0415

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        first = visible.split(",")[0].strip()
        if not (first.isdigit() or first.startswith(("GPU-", "MIG-"))):
            return ()
    try:
        nvml = importlib.import_module("cuda.bindings.nvml")
    except ImportError:
        return None
    try:
        nvml.init_v2()
    except Exception:  # noqa: BLE001 - the library missing (RuntimeError) or NVML's own NvmlError
        return None
    try:
        handles = [nvml.device_get_handle_by_index_v2(i) for i in range(nvml.device_get_count_v2())]
        capabilities = {tuple(nvml.device_get_cuda_compute_capability(h)) for h in handles}
    except Exception:  # noqa: BLE001 - NvmlError of a device NVML cannot query
        return None
    finally:
        with contextlib.suppress(Exception):  # an answer already read stands
            nvml.shutdown()
    return tuple(sorted(f"{major}.{minor}" for major, minor in capabilities))
