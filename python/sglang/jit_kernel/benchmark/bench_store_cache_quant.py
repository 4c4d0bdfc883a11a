"""Benchmark store_cache_quant against torch (multiply, clamp, e4m3 cast, index_copy_; eager and
torch.compile) and the copy roof.

CUDA-graph median per call. Cold-L2 rows rotate input sets (sources, caches, indices) past 4x the L2
size (bench_rotating; decode sizes stay partly L2-resident, like a decode step's input); one-input rows
replay one set (the tutorial's method). GB/s from the bytes the op must move, % of a 1 GiB device copy
measured in the same process:
  store_cache_quant   2*T*R*(2 + 1) + T*8   (read k and v rows of R bf16 elements, write one e4m3
                                            byte each, read the int64 indices; the scale is 4 bytes)
Shapes: k, v [T, H * 128] bf16 into float8_e4m3fn caches [4T + 1, H * 128] at distinct random slots,
k with a device scale, v with an inverse scale; H = 8 (Llama-3-8B) for T in {1, 64, 2048, 16384} and
the decode case 64 x 32 heads. At these shapes the launcher takes 16-byte source vectors.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.benchmark.utils import (
    compiled_once,
    copy_roof_gbps,
    eager_wall_us,
    exit_unless_gpu,
    format_rows,
    get_benchmark_range,
    sweep_rows,
)
from sglang.jit_kernel.kvcache import store_cache_quant
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=90, suite="stage-b-kernel-benchmark-1-gpu-large")

DTYPE = torch.bfloat16
HEAD_DIM = 128
V_INV_SCALE = 1 / 1.7
# (tokens, kv heads)
CASES = get_benchmark_range(
    full_range=[(1, 8), (64, 8), (64, 32), (2048, 8), (16384, 8)], ci_range=[(64, 32), (16384, 8)]
)


def torch_store_cache_quant(k, v, k_cache, v_cache, indices, k_scale) -> None:
    for x, cache, inv in ((k, k_cache, 1.0 / k_scale), (v, v_cache, V_INV_SCALE)):
        q = (x.float() * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        cache.view(torch.uint8).index_copy_(0, indices, q.view(torch.uint8))


def jit_store_cache_quant(k, v, k_cache, v_cache, indices, k_scale) -> None:
    store_cache_quant(k, v, k_cache, v_cache, indices, k_scale, v_inv_scale=V_INV_SCALE)


def make_set(case: tuple[int, int]) -> tuple:
    """k, v [t, h * 128] bf16; caches [4t + 1, h * 128] e4m3; the k scale; t distinct random slots."""
    t, h = case
    slots, row = 4 * t + 1, h * HEAD_DIM
    k, v = ((torch.randn(t, row, device="cuda") * 50).to(DTYPE) for _ in range(2))
    k_cache, v_cache = (torch.zeros(slots, row, dtype=torch.float8_e4m3fn, device="cuda") for _ in range(2))
    k_scale = torch.tensor([0.37], device="cuda")
    return k, v, k_cache, v_cache, torch.randperm(slots, device="cuda")[:t], k_scale


def bytes_moved(case: tuple[int, int]) -> int:
    t, h = case
    return 2 * t * h * HEAD_DIM * (2 + 1) + t * 8


PROVIDERS = {
    "jit": jit_store_cache_quant,
    "torch eager": torch_store_cache_quant,
    "torch.compile": lambda *a: compiled_once("store_cache_quant", torch_store_cache_quant)(*a),
}


def main() -> None:
    """The table of every case and provider, then the host wall time per eager call at the decode
    case 64 x 32 x 128 (the launch overhead a decode step pays)."""
    exit_unless_gpu("bench_store_cache_quant.py")
    print(f"# {torch.cuda.get_device_name()}")
    roof = copy_roof_gbps()
    label = lambda c: f"[{c[0]}, {c[1] * HEAD_DIM}] -> [{4 * c[0] + 1}]"  # noqa: E731 - one-line label
    print(format_rows(sweep_rows("store_cache_quant", CASES, PROVIDERS, make_set, label, bytes_moved), roof))
    args = make_set((64, 32))
    print("# eager wall time per call, store_cache_quant [64, 32 * 128] bf16, 10000 calls, one sync")
    for name in ("jit", "torch eager"):
        print(f"{name:<28} {eager_wall_us(lambda f=PROVIDERS[name]: f(*args)):8.2f} us")


if __name__ == "__main__":
    main()
