"""An op is its four files: registration lives with the op, no central list to edit.

A new op written as the tutorial's four files (kernel, wrapper with its ``register_op`` call, test,
benchmark) into a temporary copy of the package shows up in ``build --all``, in ``check``, in
``prebuild()`` and in the CI runner's listing; the registry refuses malformed registrations; every
torch.library op of the package lives in its own namespace, never ``sgl_kernel``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sglang.jit_kernel.registry import TORCH_LIBRARY, all_ops, register_module, register_op
from sglang.jit_kernel.testing import requires_nvcc
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="stage-a-kernel-cpu")

REPO = Path(__file__).resolve().parents[4]

# The four files of a new op, "double_it" (out = 2 * src), in the tutorial's layout.
KERNEL = """\
#include <sgl_kernel/tensor.h>   // For TensorMatcher, SymbolicSize, SymbolicDevice
#include <sgl_kernel/utils.cuh>  // For LaunchKernel

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

namespace {

template <typename T>
__global__ void double_it_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = static_cast<T>(2.0f * static_cast<float>(src[i]));
}

template <typename T>
void double_it(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  using namespace host;
  // Validate
  SymbolicSize n_{"num_elements"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({n_}).with_dtype<T>().with_device<kDLCUDA>(device_).verify(dst).verify(src);
  // Unwrap, configure, launch
  const int64_t n = n_.unwrap();
  if (n == 0) return;
  LaunchKernel(static_cast<uint32_t>((n + 255) / 256), 256, device_.unwrap())(
      double_it_kernel<T>, static_cast<T*>(dst.data_ptr()), static_cast<const T*>(src.data_ptr()), n);
}

}  // namespace
"""

WRAPPER = '''\
from __future__ import annotations

import torch

from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args


@cache_once
def _jit_double_it_module(dtype: torch.dtype):
    args = make_cpp_args(dtype)
    return load_jit("double_it", *args, cuda_files=["elementwise/double_it.cuh"],
                    cuda_wrappers=[("double_it", f"double_it<{args}>")])


def double_it(src: torch.Tensor) -> torch.Tensor:
    """out = 2 * src."""
    out = torch.empty_like(src)
    _jit_double_it_module(src.dtype).double_it(out, src)
    return out


def _check_cases() -> list[CheckCase]:
    def make():
        return (torch.randn(1 << 20, device="cuda"),)

    return [CheckCase("[1048576] fp32", make, double_it, lambda x: x * 2, 8 << 20, torch.float32)]


register_op("double_it", build=_jit_double_it_module, variants=[(torch.float32,)], check_cases=_check_cases)
'''

TEST = """\
import pytest
import torch
from sglang.jit_kernel.double_it import double_it
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=10, suite="stage-b-kernel-unit-1-gpu-large")


def test_double_it():
    x = torch.randn(1000, device="cuda")
    torch.testing.assert_close(double_it(x), x * 2)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
"""

BENCH = """\
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=5, suite="stage-b-kernel-benchmark-1-gpu-large")

if __name__ == "__main__":
    import torch
    from sglang.jit_kernel.benchmark.utils import run_benchmark
    from sglang.jit_kernel.double_it import double_it

    x = torch.randn(1 << 20, device="cuda")
    print(run_benchmark(lambda: double_it(x)))
"""

# Runs the CLI of the copied package; every variant but the new op's is reported cached without
# compiling, so that the test compiles one small module, not the whole catalogue.
DRIVER = textwrap.dedent(
    """\
    import sys
    import sglang.jit_kernel.cache as cache

    real = cache._build_one

    def only_new_op(name, build, args, on_start=None):
        if name.startswith("double_it["):
            return real(name, build, args, on_start)
        if on_start is not None:
            on_start(name)
        return cache.VariantResult(name, None, 0.0, True)

    cache._build_one = only_new_op
    if sys.argv[1] == "prebuild":
        print(sorted(cache.prebuild()))
        sys.exit(0)
    from sglang.jit_kernel.__main__ import main
    sys.exit(main(sys.argv[1:]))
    """
)


def _copy_with_new_op(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "python", root / "python", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(REPO / "test", root / "test", ignore=shutil.ignore_patterns("__pycache__"))
    jk = root / "python" / "sglang" / "jit_kernel"
    (jk / "csrc" / "elementwise" / "double_it.cuh").write_text(KERNEL)
    (jk / "double_it.py").write_text(WRAPPER)
    (jk / "tests" / "test_double_it.py").write_text(TEST)
    (jk / "benchmark" / "bench_double_it.py").write_text(BENCH)
    (root / "driver.py").write_text(DRIVER)
    return root


def _run(root: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "python"), os.environ.get("PYTHONPATH")])),
        "SGLANG_JIT_CACHE_DIR": str(tmp_path / "cache"),
        "SGLANG_JIT_CUDA_ARCH": "9.0",
        "CUDA_VISIBLE_DEVICES": "",  # `check` takes its compile-only path
        "PYTHONWARNINGS": "ignore",
    }
    return subprocess.run(
        [sys.executable, str(root / "driver.py"), *args],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@requires_nvcc
def test_new_op_in_four_files_shows_up_in_build_check_and_ci(tmp_path: Path):
    root = _copy_with_new_op(tmp_path)
    build = _run(root, tmp_path, "build", "--all", "-j", "1")
    assert build.returncode == 0, build.stdout + build.stderr
    assert "double_it: 1 variant(s), serves double_it" in build.stdout
    assert "  start  double_it[float32]" in build.stdout
    assert "double_it[float32]" in build.stdout and "built" in build.stdout

    check = _run(root, tmp_path, "check", "-j", "1")
    assert check.returncode == 0, check.stdout + check.stderr
    rows = [line for line in check.stdout.splitlines() if line.startswith("double_it ")]
    assert rows and "compiled; not run (no GPU)" in rows[0], check.stdout
    assert "double_it[float32]" in check.stdout and "cached" in check.stdout  # built by the step above

    prebuilt = _run(root, tmp_path, "prebuild")
    assert prebuilt.returncode == 0, prebuilt.stderr
    assert "'double_it[float32]'" in prebuilt.stdout

    listing = subprocess.run(
        [sys.executable, "run_suite.py", "--hw", "cuda", "--suite", "stage-b-kernel-unit-1-gpu-large", "--list"],
        cwd=root / "test",
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "python"), os.environ.get("PYTHONPATH")])),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listing.returncode == 0, listing.stderr
    assert "test_double_it.py" in listing.stdout


def test_registration_errors_name_the_problem():
    with pytest.raises(TypeError, match="expected exactly one of module= or build=, got neither"):
        register_op("nothing_to_build")
    with pytest.raises(TypeError, match="variants item type: expected a tuple of build arguments, got dtype"):
        register_op("bad_variants", build=lambda dtype: None, variants=[torch.float32])
    with pytest.raises(
        ValueError,
        match=r"expected a name not yet registered, got 'fused_add_rmsnorm' \(already registered by "
        r"sglang.jit_kernel.norm\)",
    ):
        all_ops()  # a shipped op that the tutorial's files (which replace scale's) leave registered
        register_op("fused_add_rmsnorm", build=lambda: None)
    with pytest.raises(ValueError, match="already registered by sglang.jit_kernel.norm"):
        register_module("rmsnorm", lambda dtype: None, [])


def test_every_shipped_op_is_registered_by_its_own_wrapper():
    ops = all_ops()
    assert {"scale", "add_constant", "rmsnorm", "fused_inplace_qknorm"} <= set(ops)
    for name, entry in ops.items():
        assert entry.source.startswith("sglang.jit_kernel."), (name, entry.source)
        assert entry.module.variants, f"{name}: its module lists no variant"


def test_torch_library_ops_never_use_the_sgl_kernel_namespace():
    """The sgl-kernel package owns ``sgl_kernel``: a process importing both must never collide."""
    all_ops()  # imports every wrapper, which registers its torch.library ops
    names = torch._C._dispatch_get_all_op_names()
    ours = [n for n in names if n.startswith(f"{TORCH_LIBRARY}::")]
    assert ours, f"no op registered under {TORCH_LIBRARY}"
    assert not [n for n in names if n.startswith("sgl_kernel::")], "an op is registered under sgl_kernel"
    package = REPO / "python" / "sglang" / "jit_kernel"
    offenders = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.name != Path(__file__).name and ("sgl_kernel::" in p.read_text() or "ops.sgl_kernel" in p.read_text())
    ]
    assert not offenders, f"sources naming the sgl_kernel torch.library namespace: {offenders}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
