"""Benchmark the gated activations against torch (eager, torch.compile) and the device copy roof.

Cases: ``[T, 2 x 14336]`` bf16 for T in 1, 64, 2048, 16384 (CI: 1, 2048), every op. Bytes moved per
call: read gate and up, write out = ``3 * T * H * 2``. Two timings per provider, both CUDA-graph
medians (calls under 5 us: the middle of five captures, see bench_rotating):
  cold       inputs rotated past 4x the L2 size (the main rows; % of copy is held to these)
  one input  one input set replayed (the method of the issue's sglang numbers; small cases stay in L2)
Then: the expert filter with half the rows skipped, PDL on / off at decode sizes, eager wall time per
call at T = 1, and the issue's targets checked against this run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from sglang.jit_kernel.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from sglang.jit_kernel.benchmark.utils import (
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    eager_wall_us,
    exit_unless_gpu,
    format_rows,
    get_benchmark_range,
    num_rotating_sets,
)
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=180, suite="stage-b-kernel-benchmark-1-gpu-large")

DTYPE = torch.bfloat16
HIDDEN = 14336
TOKENS = get_benchmark_range(full_range=[1, 64, 2048, 16384], ci_range=[1, 2048])
EAGER_CALLS = 10_000

JIT = {"silu_and_mul": silu_and_mul, "gelu_and_mul": gelu_and_mul, "gelu_tanh_and_mul": gelu_tanh_and_mul}
TORCH_ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu_and_mul": F.silu,
    "gelu_and_mul": F.gelu,
    "gelu_tanh_and_mul": lambda g: F.gelu(g, approximate="tanh"),
}

#: The issue's measurements of sglang 0.5.23's JIT kernels, one input replayed in a CUDA graph on an
#: H200 (us), [T, 2 x 14336] bf16; the one-input rows must not be slower.
SGLANG_ONE_INPUT_US = {
    "silu_and_mul": {1: 0.88, 64: 1.71, 2048: 41.45, 16384: 319.9},
    "gelu_tanh_and_mul": {1: 1.02, 16384: 319.9},
}
T64_TARGET_US = 1.5  # silu_and_mul at T = 64, one input
COLD_COPY_TARGET = 97.0  # % of the copy roof at T = 16384, cold rows
EAGER_TARGET_US = 5.5  # eager silu_and_mul(x, out=o) at T = 1


def nbytes(tokens: int, hidden: int = HIDDEN) -> int:
    return 3 * tokens * hidden * torch.finfo(DTYPE).bits // 8


def torch_gated(op: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    act = TORCH_ACT[op]

    def gated(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return torch.mul(act(x[..., :h]), x[..., h:], out=out)

    return gated


def torch_compiled(op: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    act = TORCH_ACT[op]

    def gated(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return act(x[..., :h]) * x[..., h:]

    compiled = torch.compile(gated)
    return lambda x, out: compiled(x)


def input_sets(tokens: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        (
            torch.randn(tokens, 2 * HIDDEN, dtype=DTYPE, device="cuda"),
            torch.empty(tokens, HIDDEN, dtype=DTYPE, device="cuda"),
        )
        for _ in range(count)
    ]


def timed(op: str, case: str, provider: str, call: Callable, sets: list, moved: int) -> BenchRow | None:
    try:
        median, _, _ = bench_rotating(call, sets)
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot run this case
        print(f"# {op} {case} {provider}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})")
        return None
    return BenchRow(op, case, provider, median, moved)


# ---------------------------------------------------------------------------------------------
# Main table
# ---------------------------------------------------------------------------------------------
def main_rows() -> list[BenchRow]:
    providers = {
        op: {"jit": lambda x, o, fn=fn: fn(x, o), "torch": torch_gated(op), "torch.compile": torch_compiled(op)}
        for op, fn in JIT.items()
    }
    rows = []
    for tokens in TOKENS:
        moved = nbytes(tokens)
        sets = input_sets(tokens, num_rotating_sets(moved))
        case = f"[{tokens}, 2 x {HIDDEN}]"
        for op in JIT:
            for name, call in providers[op].items():
                rows += [
                    r
                    for r in (
                        timed(op, case, name, call, sets, moved),
                        timed(op, case, f"{name} one input", call, sets[:1], moved),
                    )
                    if r
                ]
        del sets
        torch.cuda.empty_cache()
    return rows


def expert_filter_rows() -> list[BenchRow]:
    """silu_and_mul with every other row skipped (expert id -1): bytes of the kept rows plus the ids."""
    rows = []
    for tokens in [t for t in TOKENS if t >= 64]:
        kept = tokens // 2
        moved = nbytes(kept) + 4 * tokens
        ids = torch.zeros(tokens, dtype=torch.int32, device="cuda")
        ids[1::2] = -1
        sets = input_sets(tokens, num_rotating_sets(moved))
        row = timed(
            "silu_and_mul",
            f"[{tokens}, 2 x {HIDDEN}] half",
            "jit expert_ids",
            lambda x, o: silu_and_mul(x, o, ids),
            sets,
            moved,
        )
        rows += [row] if row else []
        del sets
        torch.cuda.empty_cache()
    return rows


def pdl_rows() -> list[BenchRow]:
    """Decode sizes, 64 input sets in one graph, PDL on and off."""
    rows = []
    for tokens in (1, 64):
        sets = input_sets(tokens, 64)
        for op in ("silu_and_mul", "gelu_tanh_and_mul"):
            for pdl in (True, False):
                call = lambda x, o, fn=JIT[op], pdl=pdl: fn(x, o, enable_pdl=pdl)
                row = timed(op, f"[{tokens}, 2 x {HIDDEN}]", f"jit pdl={pdl}", call, sets, nbytes(tokens))
                rows += [row] if row else []
        del sets
    return rows


def eager_table() -> tuple[str, float]:
    x = torch.randn(1, 2 * HIDDEN, dtype=DTYPE, device="cuda")
    out = torch.empty(1, HIDDEN, dtype=DTYPE, device="cuda")
    gated = torch_gated("silu_and_mul")
    results = {
        "jit silu_and_mul(x, out=o)": eager_wall_us(lambda: silu_and_mul(x, out)),
        "jit silu_and_mul(x)": eager_wall_us(lambda: silu_and_mul(x)),
        "jit gelu_tanh_and_mul(x, o)": eager_wall_us(lambda: gelu_tanh_and_mul(x, out)),
        "torch silu(g) * u (out=)": eager_wall_us(lambda: gated(x, out)),
    }
    lines = [f"# eager wall time per call, [1, 2 x {HIDDEN}] bf16, {EAGER_CALLS} calls, one sync"]
    lines += [f"{name:<30} {us:8.2f} us" for name, us in results.items()]
    return "\n".join(lines), results["jit silu_and_mul(x, out=o)"]


def targets_table(rows: list[BenchRow], roof: float, eager_us: float) -> str:
    """The issue's targets, each against the numbers of this run."""
    by_key = {(r.op, r.case, r.provider): r for r in rows}
    lines = ["# targets (issue 15): jit one-input rows vs sglang 0.5.23 (issue's H200 numbers), cold % of copy"]

    def verdict(ok: bool) -> str:
        return "ok  " if ok else "MISS"

    for op, numbers in SGLANG_ONE_INPUT_US.items():
        for tokens, sglang_us in numbers.items():
            row = by_key.get((op, f"[{tokens}, 2 x {HIDDEN}]", "jit one input"))
            if row is None:
                continue
            limit = min(sglang_us, T64_TARGET_US) if (op == "silu_and_mul" and tokens == 64) else sglang_us
            lines.append(
                f"{verdict(row.median_us <= limit)} {op:<18} T={tokens:<6} {row.median_us:9.2f} us "
                f"(<= {limit:.2f}; sglang {sglang_us:.2f})"
            )
    for op in JIT:
        row = by_key.get((op, f"[16384, 2 x {HIDDEN}]", "jit"))
        if row is not None:
            pct = 100 * row.gbps / roof
            lines.append(
                f"{verdict(pct >= COLD_COPY_TARGET)} {op:<18} T=16384  cold {pct:6.1f} % of copy "
                f"(>= {COLD_COPY_TARGET:.0f} %)"
            )
    lines.append(
        f"{verdict(eager_us <= EAGER_TARGET_US)} eager silu_and_mul(x, out=o) T=1 {eager_us:.2f} us "
        f"(<= {EAGER_TARGET_US})"
    )
    return "\n".join(lines)


def main() -> None:
    exit_unless_gpu("bench_activation.py")
    roof = copy_roof_gbps()
    eager, eager_us = eager_table()
    print(eager)
    rows = main_rows()
    print(format_rows(rows, roof))
    print("# expert filter: every other row skipped (bytes: kept rows + 4 per id)")
    print(format_rows(expert_filter_rows(), roof))
    print("# PDL at decode sizes (64 input sets per graph)")
    print(format_rows(pdl_rows(), roof))
    print(targets_table(rows, roof, eager_us))


if __name__ == "__main__":
    main()
