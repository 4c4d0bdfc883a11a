"""Benchmark the MLA concatenations against torch (two copies / torch.cat, eager and torch.compile) and
the copy roof.

CUDA-graph median per call; cold-L2 rows rotate input sets past 4x the L2 size (bench_rotating),
one-input rows replay one set (the tutorial's method; the issue's sglang numbers were taken so).
GB/s from the bytes each op must move, % of a 1 GiB device copy measured in the same process (bf16, s = 2):
  concat_mla_k         T*H*(nope + rope)*s + T*H*nope*s + T*rope*s   (write k, read k_nope, read k_rope once)
  concat_mla_absorb_q  2*T*H*(A + B)*s                              (read a and b, write out)
DeepSeek shapes: k [T, 128, 128 + 64] from k_nope [T, 128, 128] and k_rope [T, 1, 64]; q [T, 128, 512 + 64].
"jit" takes the token-major block order from 1024 tokens on (concat_mla.cuh).
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.benchmark.utils import (
    compiled_once,
    copy_roof_gbps,
    exit_unless_gpu,
    format_rows,
    get_benchmark_range,
    sweep_rows,
)
from sglang.jit_kernel.concat_mla import concat_mla_absorb_q, concat_mla_k
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="stage-b-kernel-benchmark-1-gpu-large")

DTYPE = torch.bfloat16
HEADS, NOPE, ROPE, Q_NOPE = 128, 128, 64, 512
TOKENS = get_benchmark_range(full_range=[1, 64, 2048, 16384], ci_range=[1, 16384])


def torch_concat_k(k, k_nope, k_rope) -> None:
    k[..., :NOPE].copy_(k_nope)
    k[..., NOPE:].copy_(k_rope)  # broadcast over the heads


def torch_absorb_q(a, b) -> torch.Tensor:
    return torch.cat([a, b], dim=-1)


def k_set(t: int) -> tuple:
    k = torch.empty(t, HEADS, NOPE + ROPE, dtype=DTYPE, device="cuda")
    k_nope = torch.randn(t, HEADS, NOPE, dtype=DTYPE, device="cuda")
    return k, k_nope, torch.randn(t, 1, ROPE, dtype=DTYPE, device="cuda")


def q_set(t: int) -> tuple:
    a = torch.randn(t, HEADS, Q_NOPE, dtype=DTYPE, device="cuda")
    return a, torch.randn(t, HEADS, ROPE, dtype=DTYPE, device="cuda")


def main() -> None:
    exit_unless_gpu("bench_concat_mla.py")
    roof = copy_roof_gbps()
    k_providers = {
        "jit": concat_mla_k,
        "torch two copies": torch_concat_k,
        "torch.compile": lambda *a: compiled_once("k", torch_concat_k)(*a),
    }
    q_providers = {
        "jit": concat_mla_absorb_q,
        "torch.cat": torch_absorb_q,
        "torch.compile": lambda *a: compiled_once("q", torch_absorb_q)(*a),
    }
    rows = sweep_rows(
        "concat_mla_k",
        TOKENS,
        k_providers,
        k_set,
        lambda t: f"[{t}, {HEADS}, {NOPE}+{ROPE}]",
        lambda t: t * HEADS * (NOPE + ROPE) * 2 + t * HEADS * NOPE * 2 + t * ROPE * 2,
    )
    rows += sweep_rows(
        "concat_mla_absorb_q",
        TOKENS,
        q_providers,
        q_set,
        lambda t: f"[{t}, {HEADS}, {Q_NOPE}+{ROPE}]",
        lambda t: 2 * t * HEADS * (Q_NOPE + ROPE) * 2,
    )
    print(format_rows(rows, roof))


if __name__ == "__main__":
    main()
