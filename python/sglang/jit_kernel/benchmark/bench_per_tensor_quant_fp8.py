"""Benchmark per_tensor_quant_fp8 (dynamic and static, [T, 4096] bf16 -> fp8) against torch eager and
torch.compile, with the device copy roof measured in the same run.

Bytes moved per call (the issue's count): read T*K bf16 once + write T*K fp8 + one fp32 scale. The
dynamic op reads the input twice above one block's worth (2048 16-byte chunks), so by this count its
roof is below the copy's (docs/perf_notes.md). The dynamic "jit" rows include the
zeroing of output_s the caller owes (a fill kernel in the graph), as a caller of the original's contract
pays it; "jit no zero_" calls with accumulate=False, which overwrites output_s and needs no zeroing.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("bench_per_tensor_quant_fp8.py")  # before importing triton

from sglang.jit_kernel.benchmark.bench_per_token_group_quant_8bit import quant_rows  # noqa: E402
from sglang.jit_kernel.benchmark.utils import copy_roof_gbps, format_rows, get_benchmark_range  # noqa: E402
from sglang.test.ci.ci_register import register_cuda_ci  # noqa: E402

register_cuda_ci(est_time=60, suite="stage-b-kernel-benchmark-1-gpu-large")

TOKENS = get_benchmark_range(full_range=[1, 64, 2048, 16384], ci_range=[1, 2048])
HIDDEN, EPS = 4096, 1e-10
FP8 = torch.float8_e4m3fn


def _torch_dynamic(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    xf = x.float()
    scale = xf.abs().amax().clamp_min(EPS) / 448.0
    q.copy_((xf / scale).clamp(-448.0, 448.0).to(FP8))
    s.copy_(scale.reshape(1))


def _torch_static(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    q.copy_((x.float() / s).clamp(-448.0, 448.0).to(FP8))


def main() -> None:
    from sglang.jit_kernel.per_tensor_quant_fp8 import per_tensor_quant_fp8  # noqa: PLC0415

    def make(t: int) -> tuple:
        x = torch.randn(t, HIDDEN, dtype=torch.bfloat16, device="cuda")
        return x, torch.empty(t, HIDDEN, dtype=FP8, device="cuda"), torch.full((1,), 0.01, device="cuda")

    def jit_dynamic(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
        s.zero_()
        per_tensor_quant_fp8(x, q, s)

    roof = copy_roof_gbps()
    nbytes = lambda t: t * HIDDEN * 3 + 4  # noqa: E731
    rows = quant_rows(
        "per_tensor dynamic",
        TOKENS,
        make,
        {
            "jit": jit_dynamic,
            "torch": _torch_dynamic,
            "torch.compile": torch.compile(_torch_dynamic),
            # accumulate=False overwrites output_s: no zeroing node in the graph
            "jit no zero_": lambda x, q, s: per_tensor_quant_fp8(x, q, s, accumulate=False),
        },
        nbytes,
    )
    rows += quant_rows(
        "per_tensor static",
        TOKENS,
        make,
        {
            "jit": lambda x, q, s: per_tensor_quant_fp8(x, q, s, True),
            "torch": _torch_static,
            "torch.compile": torch.compile(_torch_static),
        },
        nbytes,
    )
    print(f"# per_tensor_quant_fp8 [T, {HIDDEN}] bf16 -> fp8; bytes = T*K*2 + T*K + 4")
    print(format_rows(rows, roof))


if __name__ == "__main__":
    main()
