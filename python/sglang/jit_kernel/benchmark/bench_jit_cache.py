"""Benchmark the JIT build cache as a server start sees it: every number comes from fresh processes.

* warm load: one ``load_jit`` (through the op's module builder) in a fresh process whose imports are
  done, the module already cached; median of several processes, per registered variant;
* the same for ``tvm_ffi.cpp.load_inline`` on an equivalent scale source (its warm hit runs ninja);
* cold build of ``scale[bfloat16]`` on an empty cache (the build call only, after imports);
* wall time of ``python -m sglang.jit_kernel build --all -j 16`` on an empty cache (whole command).

Without a GPU (the benchmark suite on a compile-only machine) only the scale module is built and
loaded (``build scale``): ``build --all`` takes about 15 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sglang.jit_kernel._build import CSRC_DIR, INCLUDE_DIR, find_cuda_home
from sglang.jit_kernel.benchmark.utils import is_in_ci
from sglang.jit_kernel.registry import all_modules
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=240, suite="stage-b-kernel-benchmark-1-gpu-large")

REPEATS = 3 if is_in_ci() else 7
BUILD_JOBS = 16

# Child: time one module load (builder call) of variant argv[2] of module argv[1]; imports are untimed.
JIT_LOAD = """\
import json, sys, time
import torch, tvm_ffi, tvm_ffi.libinfo
from sglang.jit_kernel.registry import all_modules
entry = next(m for m in all_modules() if m.name == sys.argv[1])
args = entry.variants[int(sys.argv[2])]
start = time.perf_counter()
entry.build(*args)
print(json.dumps(time.perf_counter() - start))
"""

# Child: the same scale<bf16_t> kernel through tvm_ffi.cpp.load_inline (cache: TVM_FFI_CACHE_DIR).
INLINE_LOAD = """\
import json, sys, time
import torch, tvm_ffi, tvm_ffi.cpp
source = '''
#include "{scale_cuh}"
void scale_bf16(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, double factor) {{
  scale<bf16_t>(dst, src, factor);
}}
'''
start = time.perf_counter()
tvm_ffi.cpp.load_inline(
    "scale_bf16_inline",
    cuda_sources=source,
    functions=["scale_bf16"],
    extra_cuda_cflags=["-std=c++20", "--expt-relaxed-constexpr", "-O3"],
    extra_ldflags=["-L{cuda_lib}", "-Wl,-rpath,{cuda_lib}"],
    extra_include_paths=["{include_dir}"],
)
print(json.dumps(time.perf_counter() - start))
"""


def target_arch() -> str:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return os.environ.get("SGLANG_JIT_CUDA_ARCH", "9.0")


def run_child(code: str, argv: list[str], env: dict[str, str]) -> float:
    """Run ``code`` in a fresh interpreter; return the seconds it prints (its last stdout line)."""
    result = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({argv}):\n{result.stderr[-4000:]}")
    return float(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> int:
    arch = target_arch()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (compile only)"
    print(
        f"# JIT cache: {device}; target sm_{arch.replace('.', '')}; {os.cpu_count()} CPUs; "
        f"median of {REPEATS} fresh processes"
    )
    full = torch.cuda.is_available()
    modules = [m for m in all_modules() if full or m.name == "scale"]
    targets = ["--all"] if full else ["scale"]
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="jit-cache-bench-") as tmp:
        base_env = {
            **os.environ,
            "SGLANG_JIT_CUDA_ARCH": arch,
            "TVM_FFI_CUDA_ARCH_LIST": arch,
            "PYTHONWARNINGS": "ignore",
        }
        for name in ("SGLANG_JIT_FORCE_RECOMPILE", "SGLANG_JIT_CRASH_ON_COMPILE"):
            base_env.pop(name, None)

        # Prebuild every variant (compile-only machine: the scale module) on an empty cache: the whole
        # command's wall time.
        env = {**base_env, "SGLANG_JIT_CACHE_DIR": str(Path(tmp) / "prebuilt")}
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "sglang.jit_kernel", "build", *targets, "-j", str(BUILD_JOBS)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        build_all_s = time.perf_counter() - start
        if result.returncode != 0:
            print(result.stdout + result.stderr, file=sys.stderr)
            return 1
        num_variants = sum(len(module.variants) for module in modules)

        # Warm loads from that cache.
        for entry in modules:
            for index, label in enumerate(entry.variant_names()):
                times = [run_child(JIT_LOAD, [entry.name, str(index)], env) for _ in range(REPEATS)]
                rows.append((f"warm load {label} (load_jit)", f"{1e3 * statistics.median(times):9.2f} ms"))

        # tvm_ffi.cpp.load_inline on the same kernel: one cold build, then warm hits.
        inline_env = {**base_env, "TVM_FFI_CACHE_DIR": str(Path(tmp) / "tvm-ffi")}
        inline = INLINE_LOAD.format(
            scale_cuh=CSRC_DIR / "elementwise" / "scale.cuh",
            include_dir=INCLUDE_DIR,
            cuda_lib=find_cuda_home() / "lib64",
        )
        run_child(inline, [], inline_env)
        times = [run_child(inline, [], inline_env) for _ in range(REPEATS)]
        rows.append(("warm load scale_bf16 (tvm_ffi load_inline)", f"{1e3 * statistics.median(times):9.2f} ms"))

        # Cold build of one module, on an empty cache each time (a build is slow: two runs).
        bf16_index = next(m for m in modules if m.name == "scale").variant_names().index("scale[bfloat16]")
        cold = []
        for run in range(2):
            cold_env = {**base_env, "SGLANG_JIT_CACHE_DIR": str(Path(tmp) / f"cold-{run}")}
            cold.append(run_child(JIT_LOAD, ["scale", str(bf16_index)], cold_env))
        rows.append(("cold build scale[bfloat16]", f"{statistics.median(cold):9.2f} s "))
        what = "--all" if full else "scale"
        rows.append(
            (f"build {what} -j {BUILD_JOBS} ({num_variants} variants, whole command)", f"{build_all_s:9.2f} s ")
        )

    width = max(len(case) for case, _ in rows)
    print(f"{'case':<{width}}  {'time':>12}")
    for case, value in rows:
        print(f"{case:<{width}}  {value:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
