"""Benchmark the KV-cache writes against torch (index_copy_, eager and torch.compile) and the copy roof.

CUDA-graph median per call. Cold-L2 rows rotate input sets (sources, caches and slot maps) past 4x
the L2 size (see bench_rotating; decode sizes stay partly L2-resident, like a decode step's input);
one-input rows replay one set (the tutorial's method, and how the issue's sglang numbers were taken).
GB/s from the bytes each op must move, % of a 1 GiB device copy measured in the same process:
  store_cache        2*T*(k_row + v_row)*s + T*8   (read k and v, write their slots, read the indices)
  set_mla_kv_buffer  2*T*(nope + rope)*s + T*8     (read k_nope and k_rope, write the slots, read loc)
with s = 2 (bf16), int64 indices. Shapes: store_cache k, v [T, 8 x 128] into [4T + 1, 1024]
(the issue's table); set_mla_kv_buffer DeepSeek [T, 1, 512 + 64] into [4T + 1, 1, 576]. Slots are
distinct and random. store_cache's "jit" moves two 16-byte vectors a thread from 32 MiB of k + v
rows on (16384 tokens here), one below (store_cache.cuh); "jit num_split=1" is the warp kernel that
an explicit num_split selects (row_scatter.cuh).
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
from sglang.jit_kernel.kvcache import set_mla_kv_buffer, store_cache
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="stage-b-kernel-benchmark-1-gpu-large")

DTYPE = torch.bfloat16
ROW = 8 * 128  # store_cache: 8 kv heads x head_dim 128
NOPE, ROPE = 512, 64
TOKENS = get_benchmark_range(full_range=[1, 64, 2048, 16384], ci_range=[1, 16384])


def torch_store(k, v, k_cache, v_cache, indices) -> None:
    k_cache.index_copy_(0, indices, k)
    v_cache.index_copy_(0, indices, v)


def torch_set_mla(kv, loc, k_nope, k_rope) -> None:
    kv.index_copy_(0, loc, torch.cat([k_nope, k_rope], dim=-1))


def store_set(t: int) -> tuple:
    """k, v [t, ROW]; caches [4t + 1, ROW]; t distinct random slots."""
    slots = 4 * t + 1
    k, v = (torch.randn(t, ROW, dtype=DTYPE, device="cuda") for _ in range(2))
    k_cache, v_cache = (torch.zeros(slots, ROW, dtype=DTYPE, device="cuda") for _ in range(2))
    return k, v, k_cache, v_cache, torch.randperm(slots, device="cuda")[:t]


def mla_set(t: int) -> tuple:
    """kv [4t + 1, 1, NOPE + ROPE]; loc: t distinct random slots; k_nope [t, 1, NOPE], k_rope [t, 1, ROPE]."""
    slots = 4 * t + 1
    kv = torch.zeros(slots, 1, NOPE + ROPE, dtype=DTYPE, device="cuda")
    loc = torch.randperm(slots, device="cuda")[:t]
    k_nope = torch.randn(t, 1, NOPE, dtype=DTYPE, device="cuda")
    return kv, loc, k_nope, torch.randn(t, 1, ROPE, dtype=DTYPE, device="cuda")


def store_cache_rows() -> list[BenchRow]:
    providers = {
        "jit": store_cache,
        "jit num_split=1": lambda *a: store_cache(*a, num_split=1),  # the warp kernel
        "torch index_copy_": torch_store,
        "torch.compile": lambda *a: compiled_once("store", torch_store)(*a),
    }
    return sweep_rows(
        "store_cache",
        TOKENS,
        providers,
        store_set,
        lambda t: f"[{t}, {ROW}] -> [{4 * t + 1}]",
        lambda t: 2 * t * (ROW + ROW) * 2 + t * 8,
    )


def set_mla_rows() -> list[BenchRow]:
    providers = {
        "jit": set_mla_kv_buffer,
        "torch index_copy_": torch_set_mla,
        "torch.compile": lambda *a: compiled_once("mla", torch_set_mla)(*a),
    }
    return sweep_rows(
        "set_mla_kv_buffer",
        TOKENS,
        providers,
        mla_set,
        lambda t: f"[{t}, {NOPE}+{ROPE}] -> [{4 * t + 1}]",
        lambda t: 2 * t * (NOPE + ROPE) * 2 + t * 8,
    )


def eager_table() -> str:
    """Host wall time per eager call at one token (launch overhead a decode step pays)."""
    k, v = (torch.randn(1, ROW, dtype=DTYPE, device="cuda") for _ in range(2))
    k_cache, v_cache = (torch.zeros(5, ROW, dtype=DTYPE, device="cuda") for _ in range(2))
    indices = torch.tensor([3], device="cuda")
    results = {
        "jit store_cache": eager_wall_us(lambda: store_cache(k, v, k_cache, v_cache, indices)),
        "torch index_copy_ x2": eager_wall_us(lambda: torch_store(k, v, k_cache, v_cache, indices)),
    }
    lines = ["# eager wall time per call, store_cache [1, 1024] bf16, 10000 calls, one sync"]
    lines += [f"{name:<28} {us:8.2f} us" for name, us in results.items()]
    return "\n".join(lines)


def main() -> None:
    exit_unless_gpu("bench_kvcache.py")
    roof = copy_roof_gbps()
    rows = store_cache_rows() + set_mla_rows()
    print(format_rows(rows, roof))
    print(eager_table())


if __name__ == "__main__":
    main()
