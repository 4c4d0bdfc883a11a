"""norm: every registered variant compiles for sm_90 without a GPU, and no kernel spills.

Runs on the CPU CI machine (nvcc and a host compiler, no GPU): SGLANG_JIT_CUDA_ARCH=9.0, a fresh
cache directory, then the ptxas report of each build log is read for stack frames and spills.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang.jit_kernel.testing import requires_nvcc
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=150, suite="stage-a-kernel-cpu")
register_cuda_ci(est_time=150, suite="stage-b-kernel-unit-1-gpu-large")

NORM_OPS = (
    "rmsnorm",
    "rmsnorm_hf",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "fused_inplace_qknorm",
    "fused_inplace_qknorm_across_heads",
)
# The module's exports (rmsnorm serves gemma_rmsnorm and rmsnorm_hf, fused_add_rmsnorm the gemma form).
NORM_EXPORTS = ("rmsnorm", "fused_add_rmsnorm", "fused_inplace_qknorm", "fused_inplace_qknorm_across_heads")
_SPILL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_KERNEL_RE = re.compile(r"Function properties for (\S+)")


@requires_nvcc
def test_every_norm_variant_compiles_without_spills(monkeypatch, tmp_path):
    import sglang.jit_kernel.norm as norm
    from sglang.jit_kernel.registry import all_ops

    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(tmp_path))
    norm._jit_norm_module.cache_clear()  # build into tmp_path, not from this process's earlier loads

    ops = all_ops()
    norm_module = ops["rmsnorm"].module
    assert all(ops[name].module is norm_module for name in NORM_OPS), "one module serves every norm op"
    jobs = [(norm_module.build, args) for args in norm_module.variants]
    assert len(jobs) == 3, "one norm module per dtype (fp16, bf16, fp32)"
    try:
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            modules = list(pool.map(lambda job: job[0](*job[1]), jobs))
        for module in modules:
            for name in NORM_EXPORTS:
                assert callable(getattr(module, name))
    finally:
        norm._jit_norm_module.cache_clear()

    logs = sorted(Path(tmp_path).glob("norm_*/build.log"))
    assert len(logs) == 3, f"expected 3 norm builds in {tmp_path}, found {[str(p) for p in logs]}"
    for log in logs:
        text = log.read_text()
        kernels = _KERNEL_RE.findall(text)
        reports = _SPILL_RE.findall(text)
        assert kernels and len(kernels) == len(reports), f"no ptxas resource report in {log}"
        for kernel, (stack, stores, loads) in zip(kernels, reports):
            assert (int(stack), int(stores), int(loads)) == (0, 0, 0), (
                f"{kernel} uses local memory ({stack} B stack, {stores} B spill stores, {loads} B loads); see {log}"
            )


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
