"""Benchmark scale against torch (eager and torch.compile) and the device copy roof.

Bytes moved per call: read src + write out = 2 * num_elements * element_size.
"""

import itertools

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("bench_scale.py")  # before importing triton, which a CPU-only install lacks

import triton  # noqa: E402
import triton.testing  # noqa: E402

from sglang.jit_kernel.benchmark.utils import (  # noqa: E402
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    BenchRow,
    bench_rotating,
    bench_rotating_events,
    copy_roof_gbps,
    eager_wall_us,
    format_rows,
    get_benchmark_range,
    num_rotating_sets,
    run_benchmark,
    same_size_note,
)
from sglang.jit_kernel.scale import scale as jit_scale  # noqa: E402
from sglang.test.ci.ci_register import register_cuda_ci  # noqa: E402

register_cuda_ci(est_time=60, suite="stage-b-kernel-benchmark-1-gpu-large")

SIZE_LIST = get_benchmark_range(
    full_range=[2**n for n in (12, 16, 20, 24, 28)],
    ci_range=[2**12, 2**24],
)
FACTOR = 2.0
EAGER_CALLS = 10_000


@triton.testing.perf_report(
    triton.testing.Benchmark(
        x_names=["size"],
        x_vals=list(itertools.product(SIZE_LIST)),
        line_arg="provider",
        line_vals=["jit", "torch"],
        line_names=["SGL JIT Kernel", "PyTorch"],
        styles=[("blue", "-"), ("red", "--")],
        ylabel="us",
        plot_name="scale-performance",
        args={},
    )
)
def benchmark(size: int, provider: str):
    src = torch.randn(size, dtype=DEFAULT_DTYPE, device=DEFAULT_DEVICE)
    if provider == "jit":
        fn = lambda: jit_scale(src, FACTOR)
    else:
        fn = lambda: src * FACTOR
    return run_benchmark(fn)


def bandwidth_rows() -> list[BenchRow]:
    """Cold-L2 CUDA-graph rows: jit, torch eager, torch.compile for each size."""
    compiled = torch.compile(lambda x, y: torch.mul(x, FACTOR, out=y))
    providers = {
        "jit": lambda src, out: jit_scale(src, FACTOR, out=out),
        "torch": lambda src, out: torch.mul(src, FACTOR, out=out),
        "torch.compile": lambda src, out: compiled(src, out),
    }
    rows = []
    for size in SIZE_LIST:
        nbytes = 2 * size * torch.finfo(DEFAULT_DTYPE).bits // 8
        n_sets = num_rotating_sets(nbytes)
        sets = []
        for _ in range(n_sets):
            src = torch.randn(size, dtype=DEFAULT_DTYPE, device=DEFAULT_DEVICE)
            sets.append((src, torch.empty_like(src)))
        for name, call in providers.items():
            median, _, _ = bench_rotating(call, sets)
            rows.append(BenchRow("scale", f"[{size}] bf16", name, median, nbytes))
        if size >= 2**20:  # same-size copy roof (events, eager launches): see same_size_note
            for name, call in (
                ("copy (events)", lambda src, out: out.copy_(src)),
                ("jit (events)", providers["jit"]),
                ("torch (events)", providers["torch"]),
            ):
                rows.append(BenchRow("scale", f"[{size}] bf16", name, bench_rotating_events(call, sets), nbytes))
        del sets
        torch.cuda.empty_cache()
    return rows


def eager_rows() -> str:
    src = torch.randn(4096, dtype=DEFAULT_DTYPE, device=DEFAULT_DEVICE)
    out = torch.empty_like(src)
    results = {
        "jit scale(src, f)": eager_wall_us(lambda: jit_scale(src, FACTOR)),
        "jit scale(src, f, out=)": eager_wall_us(lambda: jit_scale(src, FACTOR, out=out)),
        "torch.mul(src, f, out=)": eager_wall_us(lambda: torch.mul(src, FACTOR, out=out)),
        "torch src * f": eager_wall_us(lambda: src * FACTOR),
    }
    lines = [f"# eager wall time per call, [4096] bf16, {EAGER_CALLS} calls, one sync"]
    lines += [f"{name:<28} {us:8.2f} us" for name, us in results.items()]
    return "\n".join(lines)


if __name__ == "__main__":  # exit_unless_gpu ran at the top, before triton was imported
    benchmark.run(print_data=True)
    roof = copy_roof_gbps()
    rows = bandwidth_rows()
    print(format_rows(rows, roof))
    print(same_size_note(rows))
    print(eager_rows())
