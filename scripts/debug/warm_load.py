"""Warm load (fresh process, module cached) of every registered variant, median of argv[1] (3)
processes: issue 4's <= 2 ms check after a module grew. Needs the cache built (build --all)."""
import statistics
import sys

from sglang.jit_kernel.benchmark.bench_jit_cache import JIT_LOAD, run_child
from sglang.jit_kernel.registry import all_ops
import os

repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
env = {**os.environ, "PYTHONWARNINGS": "ignore"}
for entry in all_ops().values():
    for index, label in enumerate(entry.variant_names()):
        times = [run_child(JIT_LOAD, [entry.name, str(index)], env) for _ in range(repeats)]
        print(f"warm load {label:<40} {1e3 * statistics.median(times):7.2f} ms  (all: {', '.join(f'{1e3 * t:.2f}' for t in times)})", flush=True)
