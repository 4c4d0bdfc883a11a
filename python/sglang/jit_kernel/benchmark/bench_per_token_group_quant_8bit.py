"""Benchmark per_token_group_quant_8bit ([T, 7168] bf16, group 128, fp8) against torch eager and
torch.compile, with the device copy roof measured in the same run.

Bytes moved per call: read T*K bf16 + write T*K fp8 + T*K/128 fp32 scales.
``quant_rows`` is shared by bench_per_token_quant_fp8.py and bench_per_tensor_quant_fp8.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("bench_per_token_group_quant_8bit.py")  # before importing triton

from sglang.jit_kernel.benchmark.utils import (  # noqa: E402
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    format_rows,
    get_benchmark_range,
    num_rotating_sets,
)
from sglang.test.ci.ci_register import register_cuda_ci  # noqa: E402

register_cuda_ci(est_time=90, suite="stage-b-kernel-benchmark-1-gpu-large")

TOKENS = get_benchmark_range(full_range=[1, 64, 2048, 16384], ci_range=[1, 2048])
HIDDEN, GROUP, EPS = 7168, 128, 1e-10
FP8 = torch.float8_e4m3fn


def quant_rows(
    op: str,
    tokens: list[int],
    make: Callable[[int], tuple],
    providers: dict[str, Callable[..., Any]],
    nbytes: Callable[[int], int],
) -> list[BenchRow]:
    """For each T: cold-L2 rows (inputs rotated past L2) and one-input rows (the same buffers every
    call, as in a decode loop) for every provider; µs is the CUDA-graph median."""
    rows = []
    for t in tokens:
        n = nbytes(t)
        sets = [make(t) for _ in range(num_rotating_sets(n))]
        for name, call in providers.items():
            rows.append(BenchRow(op, f"T={t} cold", name, bench_rotating(call, sets)[0], n))
        for name, call in providers.items():
            rows.append(BenchRow(op, f"T={t} one input", name, bench_rotating(call, sets[:1])[0], n))
        del sets
        torch.cuda.empty_cache()
    return rows


def _torch_group_quant(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    t, k = x.shape
    groups = x.float().view(t, k // GROUP, GROUP)
    scale = groups.abs().amax(-1).clamp_min(EPS) / 448.0
    q.copy_((groups / scale.unsqueeze(-1)).clamp(-448.0, 448.0).view(t, k).to(FP8))
    s.copy_(scale)


def main() -> None:
    from sglang.jit_kernel.per_token_group_quant_8bit import per_token_group_quant_8bit  # noqa: PLC0415

    def make(t: int) -> tuple:
        x = torch.randn(t, HIDDEN, dtype=torch.bfloat16, device="cuda")
        return x, torch.empty(t, HIDDEN, dtype=FP8, device="cuda"), torch.empty(t, HIDDEN // GROUP, device="cuda")

    providers = {
        "jit": lambda x, q, s: per_token_group_quant_8bit(x, q, s, GROUP, EPS, -448.0, 448.0),
        "torch": _torch_group_quant,
        "torch.compile": torch.compile(_torch_group_quant),
    }
    roof = copy_roof_gbps()
    rows = quant_rows(
        "per_token_group_quant", TOKENS, make, providers, lambda t: t * HIDDEN * 3 + 4 * t * (HIDDEN // GROUP)
    )
    print(
        f"# per_token_group_quant_8bit [T, {HIDDEN}] bf16 -> fp8, group {GROUP}, row-major scales; "
        "bytes = T*K*2 + T*K + 4*T*K/128"
    )
    print(format_rows(rows, roof))


if __name__ == "__main__":
    main()
