"""Benchmark add_constant against torch (eager ``src + c`` and torch.compile) and the device copy roof.

Bytes moved per call: read src + write out = 2 * num_elements * 4 (int32). At 2^24 elements that is
128 MiB, about 32 us at the H200's ~4.2 TB/s copy roof.

Rows per size: cold L2 (inputs rotated past the L2 size, CUDA-graph median) for jit, torch and
torch.compile; one input replayed (the tutorial's run_benchmark, L2-warm below ~50 MB) for jit and
torch; from 2^20 elements a same-size device copy with jit and torch beside it, timed with events.

    python python/sglang/jit_kernel/benchmark/bench_add_constant.py
"""

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("bench_add_constant.py")  # before anything imports triton, which a CPU-only install lacks

from sglang.jit_kernel.add_constant import add_constant as jit_add_constant  # noqa: E402
from sglang.jit_kernel.benchmark.utils import (  # noqa: E402
    DEFAULT_DEVICE,
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
from sglang.test.ci.ci_register import register_cuda_ci  # noqa: E402

register_cuda_ci(est_time=60, suite="stage-b-kernel-benchmark-1-gpu-large")

SIZE_LIST = get_benchmark_range(
    full_range=[2**n for n in (12, 16, 20, 24, 28)],
    ci_range=[2**12, 2**24],
)
CONSTANT = 1  # the check case's constant: its module is the prebuilt variant
ELEMENT_BYTES = 4  # int32


def random_src(size: int) -> torch.Tensor:
    return torch.randint(-(2**20), 2**20, (size,), dtype=torch.int32, device=DEFAULT_DEVICE)


def bandwidth_rows() -> list[BenchRow]:
    """Every row of every size (see the module docstring)."""
    compiled = torch.compile(lambda x, y: torch.add(x, CONSTANT, out=y))
    cold = {
        "jit": lambda src, out: jit_add_constant(src, CONSTANT, out=out),
        "torch": lambda src, out: torch.add(src, CONSTANT, out=out),
        "torch.compile": lambda src, out: compiled(src, out),
    }
    events = {
        "copy (events)": lambda src, out: out.copy_(src),
        "jit (events)": cold["jit"],
        "torch (events)": cold["torch"],
    }
    rows = []
    for size in SIZE_LIST:
        case = f"[{size}] int32 +{CONSTANT}"
        nbytes = 2 * size * ELEMENT_BYTES
        sets = [(src, torch.empty_like(src)) for src in (random_src(size) for _ in range(num_rotating_sets(nbytes)))]
        timed = [(name, bench_rotating(call, sets)[0]) for name, call in cold.items()]
        timed += [
            (f"{name} one input", run_benchmark(lambda call=cold[name], first=sets[0]: call(*first))[0])
            for name in ("jit", "torch")
        ]
        if size >= 2**20:  # the same-size copy roof: see same_size_note
            timed += [(name, bench_rotating_events(call, sets)) for name, call in events.items()]
        rows += [BenchRow("add_constant", case, name, us, nbytes) for name, us in timed]
        del sets
        torch.cuda.empty_cache()
    return rows


def eager_rows() -> str:
    """Host wall time per eager call at a decode size: launch overhead, not kernel time."""
    src = random_src(4096)
    out = torch.empty_like(src)
    results = {
        "jit add_constant(src, c)": eager_wall_us(lambda: jit_add_constant(src, CONSTANT)),
        "jit add_constant(src, c, out=)": eager_wall_us(lambda: jit_add_constant(src, CONSTANT, out=out)),
        "torch.add(src, c, out=)": eager_wall_us(lambda: torch.add(src, CONSTANT, out=out)),
        "torch src + c": eager_wall_us(lambda: src + CONSTANT),
    }
    lines = ["# eager wall time per call, [4096] int32, 10000 calls, one sync"]
    lines += [f"{name:<32} {us:8.2f} us" for name, us in results.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    rows = bandwidth_rows()
    print(format_rows(rows, copy_roof_gbps()))
    print(same_size_note(rows))
    print(eager_rows())
