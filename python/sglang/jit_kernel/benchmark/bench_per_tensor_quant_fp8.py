"""Benchmark per_tensor_quant_fp8 (dynamic and static, [T, 4096] bf16 -> fp8) against torch eager and
torch.compile, with the device copy roof measured in the same run.

Bytes moved per call (the issue's count): read T*K bf16 once + write T*K fp8 + one fp32 scale. The
dynamic op reads the input twice above one block's worth (2048 16-byte chunks); two passes bound it
near 60 % of copy by this count, less what the second pass finds in L2. The dynamic "jit" rows include the
zeroing of output_s the caller owes (a fill kernel in the graph), as a caller of the original's contract
pays it; "jit no zero_" calls with accumulate=False, which overwrites output_s and needs no zeroing.
"jit late loads" rows: SGLANG_PER_TENSOR_EARLY=0, the quantize pass loading its input after its PDL wait
(the default loads each block's first row before it, under the absmax pass).
"jit cluster" rows: the opt-in cluster pass (SGLANG_PER_TENSOR_CLUSTER=1; one launch up to 262144
bf16 elements, i.e. T <= 64 here; the default's passes above, so those rows repeat "jit"; on the H200
it lost at 64 tokens, 4.96 against 4.74 us without zero_, and stays opt-in).
"jit grid" rows: the opt-in grid pass (SGLANG_PER_TENSOR_GRID=1; one cooperative launch over every SM
while one resident wave holds the input in registers: 4 chunks a thread, the co-resident blocks
queried per device, e.g. 8.6M bf16 elements at two 1024-thread blocks on each of 132 SMs; the
default's passes above, so those rows repeat "jit"). A first version (the compare-and-swap fmax, two
barriers without accumulate) lost on the H200 at 64 tokens, 6.90 against 4.73 us without zero_ (6.54
against 5.21 with it); the current one (one atomicMax per block) is not measured yet.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("bench_per_tensor_quant_fp8.py")  # before importing triton

from sglang.jit_kernel.benchmark.bench_per_token_group_quant_8bit import quant_rows  # noqa: E402
from sglang.jit_kernel.benchmark.utils import copy_roof_gbps, format_rows, get_benchmark_range, with_env  # noqa: E402
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
            # the baseline of the default's early loads (the quantize pass loading after its PDL wait)
            "jit late loads": with_env("SGLANG_PER_TENSOR_EARLY", "0", jit_dynamic),
            "jit late loads no zero_": with_env(
                "SGLANG_PER_TENSOR_EARLY", "0", lambda x, q, s: per_tensor_quant_fp8(x, q, s, accumulate=False)
            ),
            # opt-in: one launch of one 8-CTA cluster up to 262144 bf16 elements (the default's passes
            # above; SGLANG_PER_TENSOR_CLUSTER=1)
            "jit cluster": with_env("SGLANG_PER_TENSOR_CLUSTER", "1", jit_dynamic),
            "jit cluster no zero_": with_env(
                "SGLANG_PER_TENSOR_CLUSTER", "1", lambda x, q, s: per_tensor_quant_fp8(x, q, s, accumulate=False)
            ),
            # opt-in: one cooperative launch over every SM, a grid barrier between the maximum and the
            # bytes, while one resident wave holds the input (the default's passes above;
            # SGLANG_PER_TENSOR_GRID=1)
            "jit grid": with_env("SGLANG_PER_TENSOR_GRID", "1", jit_dynamic),
            "jit grid no zero_": with_env(
                "SGLANG_PER_TENSOR_GRID", "1", lambda x, q, s: per_tensor_quant_fp8(x, q, s, accumulate=False)
            ),
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
