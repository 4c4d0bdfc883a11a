"""Benchmark per_token_quant_fp8 ([T, 4096] bf16 -> fp8, one scale per row) against torch eager and
torch.compile, with the device copy roof measured in the same run.

Bytes moved per call: read T*K bf16 + write T*K fp8 + T fp32 scales.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("bench_per_token_quant_fp8.py")  # before importing triton

from sglang.jit_kernel.benchmark.bench_per_token_group_quant_8bit import quant_rows  # noqa: E402
from sglang.jit_kernel.benchmark.utils import copy_roof_gbps, format_rows, get_benchmark_range  # noqa: E402
from sglang.test.ci.ci_register import register_cuda_ci  # noqa: E402

register_cuda_ci(est_time=60, suite="stage-b-kernel-benchmark-1-gpu-large")

TOKENS = get_benchmark_range(full_range=[1, 64, 2048, 16384], ci_range=[1, 2048])
HIDDEN, EPS = 4096, 1e-10
FP8 = torch.float8_e4m3fn


def _torch_per_token(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    xf = x.float()
    scale = xf.abs().amax(-1).clamp_min(EPS) / 448.0
    q.copy_((xf / scale.unsqueeze(-1)).clamp(-448.0, 448.0).to(FP8))
    s.copy_(scale)


def main() -> None:
    from sglang.jit_kernel.per_token_quant_fp8 import per_token_quant_fp8  # noqa: PLC0415

    def make(t: int) -> tuple:
        x = torch.randn(t, HIDDEN, dtype=torch.bfloat16, device="cuda")
        return x, torch.empty(t, HIDDEN, dtype=FP8, device="cuda"), torch.empty(t, device="cuda")

    providers = {
        "jit": lambda x, q, s: per_token_quant_fp8(x, q, s),
        "torch": _torch_per_token,
        "torch.compile": torch.compile(_torch_per_token),
    }
    roof = copy_roof_gbps()
    rows = quant_rows("per_token_quant_fp8", TOKENS, make, providers, lambda t: t * HIDDEN * 3 + 4 * t)
    print(f"# per_token_quant_fp8 [T, {HIDDEN}] bf16 -> fp8; bytes = T*K*2 + T*K + 4*T")
    print(format_rows(rows, roof))


if __name__ == "__main__":
    main()
