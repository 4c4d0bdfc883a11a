"""The fp8 KV-cache writes (store_cache_quant; apply_rope_inplace_with_kvcache into float8_e4m3fn caches)
compile for sm_90 without a GPU, no kernel uses local memory (stack or spills), and each module holds
only its own kernels: store_cache_quant's four (two vector widths x two index types), none of the
row_scatter kernels of store_cache; the fp8 rope module rope.cuh's KV-store kernels with the quantizing
store only (per pair layout: the early kernel, the L2-hinted split build, the no-v-rows builds with
and without the L2 hint, and one narrow build per narrower vector width), none of the bit-copy or
rotation-only ones.

Runs on the CPU CI machine (nvcc and a host compiler, no GPU): SGLANG_JIT_CUDA_ARCH=9.0, the session's
sm_90 cache (conftest's sm90_cache_dir: modules test_build_all compiled are loaded, others compiled),
then the ptxas report of each of these modules' build logs is read. CI builds the bf16 module of each op;
SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1 builds all six shipped variants.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from sglang.jit_kernel.testing import kernels_without_local_memory, requires_nvcc
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="stage-a-kernel-cpu")

FP8 = torch.float8_e4m3fn
# module directory prefix -> what every kernel name of the module contains
_KERNEL_OF = {
    "store_cache_quant": "store_cache_quant_kernel",
    "apply_rope_inplace_with_kvcache_fp8": "RopeKvFp8",
}
_VEC_ELEMENTS = {"bf16_t": 8, "fp16_t": 8, "fp32_t": 4}  # elements of a 16-byte vector


def _expected_kernels(prefix: str, module_dir: str) -> int:
    """store_cache_quant: 4; the fp8 rope module: per pair layout 4 + log2(16-byte vector elements)."""
    if prefix == "store_cache_quant":
        return 4
    vec = next(n for dtype, n in _VEC_ELEMENTS.items() if dtype in module_dir)
    return 2 * (4 + vec.bit_length() - 1)


def _jobs() -> list[tuple]:
    """(builder, build arguments, export) of each module built."""
    from sglang.jit_kernel import kvcache, rope  # noqa: PLC0415

    full = [(kvcache._jit_store_cache_quant_module, (d,), "store_cache_quant") for d in kvcache.QUANT_SOURCE_DTYPES]
    full += [
        (rope._jit_apply_rope_inplace_with_kvcache_module, (d, FP8), "apply_rope_inplace_with_kvcache")
        for d in kvcache.QUANT_SOURCE_DTYPES
    ]
    return get_ci_test_range(full_range=full, ci_range=[job for job in full if job[1][0] == torch.bfloat16])


@requires_nvcc
def test_fp8_kv_modules_compile_without_local_memory(monkeypatch, sm90_cache_dir):
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    monkeypatch.setenv("SGLANG_JIT_LOG_RESOURCE_USAGE", "1")
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(sm90_cache_dir))
    jobs = _jobs()
    # __wrapped__ skips the builders' per-process memo, which may hold this process's earlier loads
    with ThreadPoolExecutor(max_workers=2) as pool:
        modules = list(pool.map(lambda job: getattr(job[0], "__wrapped__", job[0])(*job[1]), jobs))
    for module, (_, args, export) in zip(modules, jobs):
        assert callable(getattr(module, export, None)), (export, args)

    logs = sorted(p for prefix in _KERNEL_OF for p in Path(sm90_cache_dir).glob(f"{prefix}_*/build.log"))
    assert len(logs) >= len(jobs), [str(p) for p in logs]
    for log in logs:
        prefix = next(p for p in sorted(_KERNEL_OF, key=len, reverse=True) if log.parent.name.startswith(p))
        kernels = kernels_without_local_memory(log)
        expected = _expected_kernels(prefix, log.parent.name)
        assert len(kernels) == expected, f"expected {expected} kernels in {log}: {kernels}"
        for kernel in kernels:
            assert _KERNEL_OF[prefix] in kernel, f"{kernel} in the {prefix} module ({log})"


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
