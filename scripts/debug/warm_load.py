"""Warm load (fresh process, module cached) of every registered variant, median of argv[1] (3)
processes, timed like bench_jit_cache.py (target arch in the environment, so the child does not
initialise CUDA): issue 4's <= 2 ms check after a module changed. Needs the cache built (build --all).
Usage: warm_load.py [repeats] [op ...] (default: every op)."""
import os
import statistics
import sys

from sglang.jit_kernel.benchmark.bench_jit_cache import JIT_LOAD, run_child, target_arch
from sglang.jit_kernel.registry import all_ops

repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
only = set(sys.argv[2:])
arch = target_arch()
env = {**os.environ, "PYTHONWARNINGS": "ignore", "SGLANG_JIT_CUDA_ARCH": arch, "TVM_FFI_CUDA_ARCH_LIST": arch}
for entry in all_ops().values():
    if only and entry.name not in only:
        continue
    for index, label in enumerate(entry.variant_names()):
        times = [run_child(JIT_LOAD, [entry.name, str(index)], env) for _ in range(repeats)]
        print(f"warm load {label:<40} {1e3 * statistics.median(times):7.2f} ms  "
              f"(all: {', '.join(f'{1e3 * t:.2f}' for t in times)})", flush=True)
