"""Architectures beyond the H200: every op compiles for A100 (8.0) and Blackwell (10.0), and GPUs
or targets below 8.0 are refused with a clear error before anything is compiled or launched.

Compile-only (nvcc, no GPU). ``test_build_all.py`` compiles every shipped variant for 9.0; here one
variant of each module is enough to catch an sm_90-only instruction or intrinsic that is not gated
by ``__CUDA_ARCH__``: ops that share a module builder (the norm ops) compile it once, and both
targets go into one nvcc call (``SGLANG_JIT_CUDA_ARCH="8.0 10.0"``: two ``-gencode``, the host code
compiled once, with ``SGL_CUDA_ARCH=800``), the modules in parallel on every core. On a 2-core
machine, one module for both targets took 13-16 s (scale, add_constant) and 55 s (norm), against
27-31 s and 69 s as two builds; the whole test 82 s (91 s of CPU). Each new module adds its own
compile time, spread over the cores.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang.jit_kernel import _arch, _build
from sglang.jit_kernel.registry import all_ops
from sglang.jit_kernel.testing import requires_nvcc
from sglang.jit_kernel.utils import load_jit
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=160, suite="stage-a-kernel-cpu")

ARCHS = "8.0 10.0"


def one_variant_per_module() -> dict[str, tuple]:
    """For each module builder, the first op that lists variants and its first variant's arguments."""
    chosen: dict[object, tuple[str, tuple]] = {}
    for entry in all_ops().values():
        if entry.variants:
            chosen.setdefault(entry.build, (entry.name, entry.variants[0]))
    return {name: (build, args) for build, (name, args) in chosen.items()}


@pytest.fixture
def target_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache and ``SGLANG_JIT_CUDA_ARCH="8.0 10.0"``; returns the cache root."""
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", ARCHS)
    for name in ("SGLANG_JIT_FORCE_RECOMPILE", "SGLANG_JIT_CRASH_ON_COMPILE"):
        monkeypatch.delenv(name, raising=False)
    return cache_dir


@requires_nvcc
def test_every_module_compiles_for_8_0_and_10_0(target_env: Path):
    import torch

    modules = one_variant_per_module()
    assert modules, "no op is registered"
    if torch.cuda.is_available():
        # load_jit leaves the builds this GPU cannot run unloaded (loaded, they would make the later
        # tests' own builds of the same kernels in this worker fail to launch: "no kernel image";
        # jit_cache.md, "Target architecture from Python"); with CUDA initialised it asks torch
        # which GPUs this process sees, not NVML which the host has.
        torch.cuda.init()

    def build(item: tuple[str, tuple]) -> str | None:
        name, (builder, args) = item
        try:
            # __wrapped__ skips the builder's per-process memo, which may hold this process's own target.
            getattr(builder, "__wrapped__", builder)(*args)
        except Exception as exc:  # report every module, not only the first failure
            return f"{name}{list(args)}: {type(exc).__name__}: {exc}"
        return None

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        failures = [error for error in pool.map(build, modules.items()) if error is not None]
    assert not failures, "\n\n".join(failures)

    manifests = [json.loads(p.read_text()) for p in target_env.glob("*/manifest.json")]
    assert len(manifests) == len(modules)
    for manifest in manifests:
        assert sorted(manifest["archs"]) == ["10.0", "8.0"], manifest["name"]
        gencodes = [flag for flag in manifest["cuda_cflags"] if flag.startswith("-gencode=")]
        assert gencodes == ["-gencode=arch=compute_100,code=sm_100", "-gencode=arch=compute_80,code=sm_80"]


@pytest.mark.parametrize("value, bad", [("7.5", "7.5"), ("8.0 70", "7.0"), ("9.0,6.1", "6.1")])
def test_cuda_arch_below_8_0_is_refused(value: str, bad: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", value)
    expected = rf"target architecture {bad} \(from SGLANG_JIT_CUDA_ARCH={value}\) is not supported: .* 8\.0 and newer"
    with pytest.raises(ValueError, match=expected):
        _build.resolve_cuda_archs()
    # load_jit refuses it while resolving the targets, before writing or compiling anything.
    with pytest.raises(ValueError, match=expected):
        load_jit("arch_refused", cuda_files=["elementwise/scale.cuh"], cuda_wrappers=[("scale", "scale<fp32_t>")])


def test_requested_arch_below_8_0_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SGLANG_JIT_CUDA_ARCH", raising=False)
    with pytest.raises(ValueError, match=r"target architecture 7\.0 \(from the requested architectures\)"):
        _build.resolve_cuda_archs(["9.0", "7.0"])
    assert _build.resolve_cuda_archs(["8.0", "8.6", "9.0a", "10.0", "12.0"]) == ("10.0", "12.0", "8.0", "8.6", "9.0a")


def fake_gpus(monkeypatch: pytest.MonkeyPatch, gpus: list[tuple[str, tuple[int, int]]]) -> None:
    """Make torch report ``gpus`` (name, capability) as the visible devices, with nothing memoized."""
    import torch

    monkeypatch.delenv("SGLANG_JIT_CUDA_ARCH", raising=False)
    monkeypatch.setattr(_build, "_memo", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: gpus[i][0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: gpus[i][1])


def test_visible_gpu_below_8_0_is_refused(monkeypatch: pytest.MonkeyPatch):
    fake_gpus(monkeypatch, [("NVIDIA H200", (9, 0)), ("Tesla V100-SXM2-32GB", (7, 0)), ("Tesla T4", (7, 5))])
    expected = (
        r"supports GPUs of compute capability 8\.0 and newer \(A100 and later\); this process sees "
        r"cuda:1 \(Tesla V100-SXM2-32GB, compute capability 7\.0\), cuda:2 \(Tesla T4, compute capability 7\.5\)\. "
        r"Hide it with CUDA_VISIBLE_DEVICES, or set SGLANG_JIT_CUDA_ARCH"
    )
    with pytest.raises(RuntimeError, match=expected):
        _build.resolve_cuda_archs()
    with pytest.raises(RuntimeError, match=expected):  # an op's first call: load_jit, before any launch
        load_jit("arch_refused", cuda_files=["elementwise/scale.cuh"], cuda_wrappers=[("scale", "scale<fp32_t>")])


def test_visible_gpus_from_8_0_are_targets(monkeypatch: pytest.MonkeyPatch):
    fake_gpus(monkeypatch, [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA B200", (10, 0)), ("NVIDIA A100", (8, 0))])
    assert _build.resolve_cuda_archs() == ("10.0", "8.0")
    assert _arch.MIN_CAPABILITY == (8, 0)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
