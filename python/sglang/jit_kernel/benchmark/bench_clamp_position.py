"""Benchmark clamp_position_cuda against torch (``(x - 1).clamp(min=0)``, eager and torch.compile).

A launch-latency op (a decode batch of a few hundred int32/int64 lengths moves at most kilobytes), so
the table reports CUDA-graph median microseconds only, plus the eager host wall time per call: GB/s
and % of copy would say nothing at these sizes.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.benchmark.utils import (
    compiled_once,
    eager_wall_us,
    exit_unless_gpu,
    get_benchmark_range,
    run_benchmark,
)
from sglang.jit_kernel.clamp_position import clamp_position_cuda
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=30, suite="stage-b-kernel-benchmark-1-gpu-large")

SIZES = get_benchmark_range(full_range=[1, 64, 512, 4096, 65536], ci_range=[64, 4096])


def torch_clamp_position(seq_lens: torch.Tensor) -> torch.Tensor:
    return (seq_lens - 1).clamp(min=0)


def main() -> None:
    exit_unless_gpu("bench_clamp_position.py")
    print(f"# {torch.cuda.get_device_name()}")
    print("# clamp_position_cuda int64: CUDA-graph median us (eager host wall us per call)")
    print(f"{'n':>8} {'jit':>16} {'torch eager':>16} {'torch.compile':>16}")
    for n in SIZES:
        x = torch.randint(-2, 100_000, (n,), device="cuda")
        providers = {
            "jit": lambda: clamp_position_cuda(x),
            "torch eager": lambda: torch_clamp_position(x),
            "torch.compile": lambda: compiled_once("clamp_position", torch_clamp_position)(x),
        }
        cells = []
        for call in providers.values():
            call()  # compile / load outside the timing
            median, _, _ = run_benchmark(call)
            cells.append(f"{median:7.2f} ({eager_wall_us(call, calls=2000):5.1f})")
        print(f"{n:>8} " + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
