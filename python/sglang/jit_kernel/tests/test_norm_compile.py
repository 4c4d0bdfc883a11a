"""norm: every registered variant compiles for sm_90 without a GPU, no kernel spills, and each op's
module compiles only its own kernels.

Runs on the CPU CI machine (nvcc and a host compiler, no GPU): SGLANG_JIT_CUDA_ARCH=9.0, the
session's sm_90 cache (conftest's sm90_cache_dir: modules test_build_all compiled are loaded, others
compiled), then the ptxas report of each build log is read for stack frames and spills.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from sglang.jit_kernel.testing import kernels_without_local_memory, requires_nvcc
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=150, suite="stage-a-kernel-cpu")
register_cuda_ci(est_time=150, suite="stage-b-kernel-unit-1-gpu-large")

# Each module (one per dtype and vector widths, wide and narrow) and the ops it serves: rmsnorm's serves gemma_rmsnorm and rmsnorm_hf
# (runtime parameters of its kernels), fused_add_rmsnorm's the gemma form, qknorm's both qk ops.
NORM_MODULES = {
    "rmsnorm": ("rmsnorm", "gemma_rmsnorm", "rmsnorm_hf"),
    "fused_add_rmsnorm": ("fused_add_rmsnorm", "gemma_fused_add_rmsnorm"),
    "fused_inplace_qknorm": ("fused_inplace_qknorm", "fused_inplace_qknorm_across_heads"),
}
# The exports of each module.
NORM_EXPORTS = {
    "rmsnorm": ("rmsnorm",),
    "fused_add_rmsnorm": ("fused_add_rmsnorm",),
    "fused_inplace_qknorm": ("fused_inplace_qknorm", "fused_inplace_qknorm_across_heads"),
}
# The kernel template each module instantiates, and no other: rmsnorm.cuh's own rmsnorm_kernel, or
# norm_rows_kernel<T, kVecN, kKind, ...> of the module's NormKind.
_KERNEL_RE = re.compile(r"(rmsnorm_kernel|norm_rows_kernel)I")
_KIND_RE = re.compile(r"NormKindE(\d)")  # mangled: ...NormKindE<value>...
_MODULE_KERNELS = {
    "rmsnorm": ({"rmsnorm_kernel"}, set()),
    "fused_add_rmsnorm": ({"norm_rows_kernel"}, {"1"}),
    "fused_inplace_qknorm": ({"norm_rows_kernel"}, {"2"}),
}


_VEC_RE = re.compile(r"(?:rmsnorm_kernel|norm_rows_kernel)I(6__half|13__nv_bfloat16|f)Li(\d+)E")  # <T, kVecN, ...>
_ELEMENT_BYTES = {"6__half": 2, "13__nv_bfloat16": 2, "f": 4}


def _vector_bytes(log: Path, kernel: str) -> int:
    """The vector bytes (kVecN * sizeof(T)) of a mangled rmsnorm_kernel / norm_rows_kernel name."""
    match = _VEC_RE.search(kernel)
    assert match, f"{log}: not a norm kernel: {kernel}"
    return _ELEMENT_BYTES[match.group(1)] * int(match.group(2))


@requires_nvcc
def test_every_norm_variant_compiles_without_spills(monkeypatch, sm90_cache_dir):
    import sglang.jit_kernel.norm as norm
    from sglang.jit_kernel.registry import all_ops

    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(sm90_cache_dir))
    builders = (norm._jit_rmsnorm_module, norm._jit_fused_add_rmsnorm_module, norm._jit_qknorm_module)
    for build in builders:
        build.cache_clear()  # load from sm90_cache_dir, not from this process's earlier loads

    ops = all_ops()
    jobs = []
    for name, served in NORM_MODULES.items():
        module = ops[name].module
        assert module.name == name and sorted(module.ops) == sorted(served), (name, module.ops)
        assert len(module.variants) == 6, "one module per dtype (fp16, bf16, fp32) and widths (wide, narrow)"
        # CI: the bfloat16 modules (test_build_all's); SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1: all six
        variants = get_ci_test_range(module.variants, [v for v in module.variants if v[0] == torch.bfloat16])
        jobs += [(name, module.build, args) for args in variants]
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            modules = list(pool.map(lambda job: (job[0], job[1](*job[2])), jobs))
        for name, module in modules:
            for export in NORM_EXPORTS[name]:
                assert callable(getattr(module, export))
    finally:
        for build in builders:
            build.cache_clear()

    for name in NORM_MODULES:
        logs = sorted(Path(sm90_cache_dir).glob(f"{name}_*_NormWidths_k*/build.log"))
        assert len(logs) >= len(jobs) // len(NORM_MODULES), (
            f"expected the {name} builds in {sm90_cache_dir}, found {[str(p) for p in logs]}"
        )
        for log in logs:
            kernels = kernels_without_local_memory(log)
            templates = {template for kernel in kernels for template in _KERNEL_RE.findall(kernel)}
            kinds = {kind for kernel in kernels for kind in _KIND_RE.findall(kernel)}
            assert (templates, kinds) == _MODULE_KERNELS[name], (
                f"{log}: kernels {sorted(templates)}, NormKind {sorted(kinds)}"
            )
            # <T, kVecN, ...>: a wide module builds 16-byte vectors only, a narrow one none.
            vec_bytes = {_vector_bytes(log, kernel) for kernel in kernels}
            if "kWide" in log.parent.name:
                assert vec_bytes == {16}, f"{log}: vector bytes {sorted(vec_bytes)}"
            else:
                assert 16 not in vec_bytes and vec_bytes, f"{log}: vector bytes {sorted(vec_bytes)}"


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
