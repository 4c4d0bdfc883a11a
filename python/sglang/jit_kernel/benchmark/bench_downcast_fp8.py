"""Benchmark downcast_fp8 against torch (divide, clamp, e4m3 cast, index_copy_; eager and torch.compile)
and the copy roof.

CUDA-graph median per call. Cold-L2 rows rotate input sets (sources, caches, loc) past 4x the L2 size
(bench_rotating; decode sizes stay partly L2-resident, like a decode step's input); one-input rows
replay one set (the tutorial's method). GB/s from the bytes the op must move, % of a 1 GiB device copy
measured in the same process:
  downcast_fp8   2*T*H*D*(2 + 1) + T*8   (read k and v in bf16, write one e4m3 byte each, read loc)
Shapes: k, v [T, H, 128] bf16 into uint8 caches [4T + 1, H, 128] at distinct random rows; H = 8 for
T in {1, 64, 2048, 16384} and the issue's decode case 64 x 32 x 128. At these shapes the launcher
takes the lean kernel (16-element vectors; downcast_fp8.cuh). The floors:
benchmark/probe_downcast_floor.py; the figures and the kernels tried: docs/perf_notes.md.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.benchmark.utils import (
    BenchRow,
    compiled_once,
    copy_roof_gbps,
    eager_wall_us,
    exit_unless_gpu,
    format_rows,
    get_benchmark_range,
    sweep_rows,
)
from sglang.jit_kernel.cast import downcast_fp8
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=90, suite="stage-b-kernel-benchmark-1-gpu-large")

DTYPE = torch.bfloat16
HEAD_DIM = 128
# (tokens, kv heads)
CASES = get_benchmark_range(
    full_range=[(1, 8), (64, 8), (64, 32), (2048, 8), (16384, 8)], ci_range=[(64, 32), (16384, 8)]
)


def torch_downcast(k, v, k_out, v_out, k_scale, v_scale, loc) -> None:
    for x, out, scale in ((k, k_out, k_scale), (v, v_out, v_scale)):
        q = (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        out.index_copy_(0, loc, q)


def make_set(case: tuple[int, int]) -> tuple:
    """k, v [t, h, 128] bf16; caches [4t + 1, h, 128] uint8; scales; t distinct random rows."""
    t, h = case
    slots = 4 * t + 1
    k, v = ((torch.randn(t, h, HEAD_DIM, device="cuda") * 50).to(DTYPE) for _ in range(2))
    k_out, v_out = (torch.zeros(slots, h, HEAD_DIM, dtype=torch.uint8, device="cuda") for _ in range(2))
    scales = torch.tensor([0.37, 1.7], device="cuda")
    return k, v, k_out, v_out, scales[0:1], scales[1:2], torch.randperm(slots, device="cuda")[:t]


def bytes_moved(case: tuple[int, int]) -> int:
    t, h = case
    return 2 * t * h * HEAD_DIM * (2 + 1) + t * 8


def rows() -> list[BenchRow]:
    providers = {
        "jit": downcast_fp8,
        "torch eager": torch_downcast,
        "torch.compile": lambda *a: compiled_once("downcast_fp8", torch_downcast)(*a),
    }
    return sweep_rows(
        "downcast_fp8",
        CASES,
        providers,
        make_set,
        lambda c: f"[{c[0]}, {c[1]}, {HEAD_DIM}] -> [{4 * c[0] + 1}]",
        bytes_moved,
    )


def eager_table() -> str:
    """Host wall time per eager call at 64 x 32 x 128 (the launch overhead a decode step pays)."""
    args = make_set((64, 32))
    results = {
        "jit downcast_fp8": eager_wall_us(lambda: downcast_fp8(*args)),
        "torch eager": eager_wall_us(lambda: torch_downcast(*args)),
    }
    lines = ["# eager wall time per call, downcast_fp8 [64, 32, 128] bf16, 10000 calls, one sync"]
    lines += [f"{name:<28} {us:8.2f} us" for name, us in results.items()]
    return "\n".join(lines)


def main() -> None:
    exit_unless_gpu("bench_downcast_fp8.py")
    print(f"# {torch.cuda.get_device_name()}")
    roof = copy_roof_gbps()
    print(format_rows(rows(), roof))
    print(eager_table())


if __name__ == "__main__":
    main()
