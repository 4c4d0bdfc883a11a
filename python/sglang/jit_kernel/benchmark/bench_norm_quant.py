"""Benchmark rmsnorm_quant and fused_add_rmsnorm_quant against the unfused composition of our own ops,
torch eager and torch.compile.

CUDA-graph median per call with inputs rotated past 4x the L2 size (cold L2; decode sizes timed in
five captures, see bench_rotating), GB/s from the bytes each op must move, and % of a device copy
measured in the same process. Bytes moved (bf16 in, s = 2; fp8 out; group g = 128, fp32 scales):
  rmsnorm_quant            N*H*s + H*s + N*H + 4*N*H/g      (read x and w, write q and the scales)
  fused_add_rmsnorm_quant  3*N*H*s + H*s + N*H + 4*N*H/g    (read x and residual, write residual, ...)
Per token: 4*N scale bytes instead of 4*N*H/g; static: none written (4 read).
Providers: "jit" (the fused op), "jit unfused" (rmsnorm / fused_add_rmsnorm, then
per_token_group_quant_8bit / per_token_quant_fp8 / static per_tensor_quant_fp8: two launches and the
normalised row written and read back), "torch" (eager, fp32 arithmetic) and "torch.compile" of it.
Then one-input rows (the tutorial's run_benchmark: one input set replayed, partly L2-resident).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang.jit_kernel.benchmark.utils import (
    BenchRow,
    bench_rotating,
    compiled_once,
    copy_roof_gbps,
    exit_unless_gpu,
    format_rows,
    num_rotating_sets,
    run_benchmark,
)
from sglang.jit_kernel.norm import fused_add_rmsnorm, rmsnorm
from sglang.jit_kernel.norm_quant import fused_add_rmsnorm_quant, rmsnorm_quant
from sglang.jit_kernel.per_tensor_quant_fp8 import per_tensor_quant_fp8
from sglang.jit_kernel.per_token_group_quant_8bit import per_token_group_quant_8bit
from sglang.jit_kernel.per_token_quant_fp8 import per_token_quant_fp8
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=240, suite="stage-b-kernel-benchmark-1-gpu-large")

DTYPE = torch.bfloat16
FP8 = torch.float8_e4m3fn
EPS = 1e-6
GROUP = 128
# The decode-layer chain's token counts at Llama-3-8B's hidden size, then prefill and DeepSeek's 7168.
SHAPES = [(1, 4096), (64, 4096), (256, 4096), (2048, 4096), (16384, 4096), (16384, 7168)]
MODE_SHAPES = [(1, 4096), (256, 4096), (16384, 4096)]


# ---------------------------------------------------------------------------------------------
# torch baselines (fp32 arithmetic like the kernels)
# ---------------------------------------------------------------------------------------------
def torch_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def torch_quant(y: torch.Tensor, mode: str, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, h = y.shape
    yf = y.float().view(n, h // GROUP, GROUP) if mode == "group" else y.float().view(n, 1, h)
    if mode == "static":
        s = scale.view(1, 1, 1)
    else:
        s = (yf.abs().amax(-1, keepdim=True).clamp_min(1e-10) / 448.0).clamp_min(2.0**-126)
    return (yf * (1.0 / s)).clamp(-448.0, 448.0).to(FP8).view(n, h), s


def torch_rmsnorm_quant(x: torch.Tensor, w: torch.Tensor, mode: str, scale: torch.Tensor) -> tuple:
    return torch_quant(torch_rmsnorm(x, w), mode, scale)


def torch_fused_add_rmsnorm_quant(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, mode: str, scale: torch.Tensor):
    r.copy_((x.float() + r.float()).to(r.dtype))
    return torch_quant(torch_rmsnorm(r, w), mode, scale)


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------
def scale_bytes(n: int, h: int, mode: str) -> int:
    return {"group": 4 * n * (h // GROUP), "token": 4 * n, "static": 4}[mode]


def kwargs_of(mode: str, scale: torch.Tensor) -> dict:
    return {"group": {"group_size": GROUP}, "token": {"group_size": None}, "static": {"scale": scale}}[mode]


def unfused_quant(y: torch.Tensor, q: torch.Tensor, s: torch.Tensor, mode: str, scale: torch.Tensor) -> None:
    if mode == "group":
        per_token_group_quant_8bit(y, q, s, GROUP, 1e-10, -448.0, 448.0)
    elif mode == "token":
        per_token_quant_fp8(y, q, s.view(-1))
    else:
        per_tensor_quant_fp8(y, q, scale, is_static=True)


def providers_of(fused: bool, mode: str) -> dict[str, Callable]:
    """Providers taking (x, r, w, q, s, y, scale): r is None for rmsnorm_quant; y a scratch row."""
    if fused:

        def jit(x, r, w, q, s, y, scale):
            kw = kwargs_of(mode, scale)
            fused_add_rmsnorm_quant(x, r, w, EPS, output_q=q, output_s=None if mode == "static" else s, **kw)

        def unfused(x, r, w, q, s, y, scale):
            fused_add_rmsnorm(x, r, w, EPS)  # in place, as the unfused layer runs it
            unfused_quant(x, q, s, mode, scale)

        def eager(x, r, w, q, s, y, scale):
            torch_fused_add_rmsnorm_quant(x, r, w, mode, scale)

        compiled = compiled_once(
            f"fused {mode}", lambda x, r, w, scale: torch_fused_add_rmsnorm_quant(x, r, w, mode, scale)
        )
        return {
            "jit": jit,
            "jit unfused": unfused,
            "torch": eager,
            "torch.compile": lambda x, r, w, q, s, y, scale: compiled(x, r, w, scale),
        }

    def jit(x, r, w, q, s, y, scale):
        rmsnorm_quant(x, w, EPS, output_q=q, output_s=None if mode == "static" else s, **kwargs_of(mode, scale))

    def unfused(x, r, w, q, s, y, scale):
        rmsnorm(x, w, EPS, out=y)
        unfused_quant(y, q, s, mode, scale)

    compiled = compiled_once(f"rms {mode}", lambda x, w, scale: torch_rmsnorm_quant(x, w, mode, scale))
    return {
        "jit": jit,
        "jit unfused": unfused,
        "torch": lambda x, r, w, q, s, y, scale: torch_rmsnorm_quant(x, w, mode, scale),
        "torch.compile": lambda x, r, w, q, s, y, scale: compiled(x, w, scale),
    }


def make_set(n: int, h: int, fused: bool, mode: str) -> tuple:
    x = torch.randn(n, h, dtype=DTYPE, device="cuda")
    r = torch.randn_like(x) if fused else None
    w = torch.rand(h, dtype=DTYPE, device="cuda") + 0.5
    q = torch.empty(n, h, dtype=FP8, device="cuda")
    s = torch.empty(n, h // GROUP if mode == "group" else 1, device="cuda")
    return x, r, w, q, s, torch.empty_like(x), torch.tensor([0.02], device="cuda")


def nbytes_of(n: int, h: int, fused: bool, mode: str) -> int:
    return (3 if fused else 1) * n * h * 2 + h * 2 + n * h + scale_bytes(n, h, mode)


def op_rows(fused: bool, mode: str, shapes: list[tuple[int, int]]) -> list[BenchRow]:
    op = ("fused_add_rmsnorm_quant" if fused else "rmsnorm_quant") + ("" if mode == "group" else f" {mode}")
    rows = []
    for n, h in shapes:
        nbytes = nbytes_of(n, h, fused, mode)
        sets = [make_set(n, h, fused, mode) for _ in range(num_rotating_sets(nbytes))]
        for name, call in providers_of(fused, mode).items():
            try:
                median, _, _ = bench_rotating(call, sets)
            except Exception as exc:  # noqa: BLE001 - a baseline that cannot run this case
                print(f"# {op} [{n}, {h}] {name}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})")
                continue
            rows.append(BenchRow(op, f"[{n}, {h}]", name, median, nbytes))
        del sets
        torch.cuda.empty_cache()
    return rows


def one_input_rows() -> list[BenchRow]:
    """jit, one input set replayed (the tutorial's run_benchmark), next to the cold rows above."""
    rows = []
    for fused in (False, True):
        for n, h in [(16384, 4096), (16384, 7168)]:
            inputs = make_set(n, h, fused, "group")
            call = providers_of(fused, "group")["jit"]
            median = run_benchmark(lambda inputs=inputs, call=call: call(*inputs))[0]
            op = "fused_add_rmsnorm_quant" if fused else "rmsnorm_quant"
            rows.append(BenchRow(op, f"[{n}, {h}]", "jit one input", median, nbytes_of(n, h, fused, "group")))
            del inputs
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    exit_unless_gpu("bench_norm_quant.py")
    roof = copy_roof_gbps()
    print(f"# {torch.cuda.get_device_name()}, bf16 in, fp8 e4m3 out, group {GROUP} unless named")
    rows = op_rows(False, "group", SHAPES) + op_rows(True, "group", SHAPES)
    for mode in ("token", "static"):
        rows += op_rows(True, mode, MODE_SHAPES)
    print(format_rows(rows, roof))
    print("# timing method: one input replayed (the tutorial's run_benchmark)")
    print(format_rows(one_input_rows(), roof))


if __name__ == "__main__":
    main()
