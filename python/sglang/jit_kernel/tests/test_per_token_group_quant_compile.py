"""per_token_group_quant: the fused modules compile for sm_90 without a GPU, no kernel uses local memory
(stack or spills), and each module holds only its own activation's kernels: three maths (legacy
branch-free, legacy formulas, dense) x two alignments for 16-bit inputs, one math x two for float32.

Runs on the CPU CI machine (nvcc and a host compiler, no GPU): SGLANG_JIT_CUDA_ARCH=9.0, the session's
sm_90 cache (conftest's sm90_cache_dir: modules test_build_all compiled are loaded, others compiled),
then the ptxas report of each build log is read (every fused module's there, at least the ones built here). CI reads one bfloat16 module per activation
(test_build_all's builds); SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1 builds all 18 shipped variants.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from sglang.jit_kernel.testing import kernels_without_local_memory, requires_nvcc
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=120, suite="stage-a-kernel-cpu")

_ACT_RE = re.compile(r"GatedActivationE(\d)")  # mangled template argument of the kernel
_ENUM = {"silu": "0", "gelu": "1", "gelu_tanh": "2"}
FP8 = torch.float8_e4m3fn
_FUSED_RE = re.compile(r"per_token_group_quant_(fp16|bf16|fp32)_t_")


def _variants() -> list[tuple]:
    from sglang.jit_kernel.registry import all_ops  # noqa: PLC0415

    shipped = list(all_ops()["per_token_group_quant"].variants)
    assert len(shipped) == 18, "3 input dtypes x 2 output dtypes x 3 activations"
    ci = [
        (torch.bfloat16, FP8, "silu"),
        (torch.bfloat16, FP8, "gelu"),
        (torch.bfloat16, torch.int8, "gelu_tanh"),
    ]
    assert all(v in shipped for v in ci)
    return get_ci_test_range(full_range=shipped, ci_range=ci)


@requires_nvcc
def test_fused_modules_compile_without_local_memory(monkeypatch, sm90_cache_dir):
    import sglang.jit_kernel.per_token_group_quant as op

    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(sm90_cache_dir))
    op._jit_module.cache_clear()  # load from sm90_cache_dir, not from this process's earlier loads
    variants = _variants()
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            modules = list(pool.map(lambda args: op._jit_module(*args), variants))
        for module in modules:
            assert callable(module.per_token_group_quant)
    finally:
        op._jit_module.cache_clear()

    # per_token_group_quant_<in>_t_..., not per_token_group_quant_8bit_...
    logs = sorted(
        p for p in Path(sm90_cache_dir).glob("per_token_group_quant_*/build.log") if _FUSED_RE.match(p.parent.name)
    )
    assert len(logs) >= len(variants), [str(p) for p in logs]
    for log in logs:
        kernels = kernels_without_local_memory(log)
        name = log.parent.name
        activation = next(a for a in ("gelu_tanh", "gelu", "silu") if f"_{a}-" in name)
        assert {k for kernel in kernels for k in _ACT_RE.findall(kernel)} == {_ENUM[activation]}, log
        assert len(kernels) == (2 if name.startswith("per_token_group_quant_fp32_t") else 6), (name, kernels)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
