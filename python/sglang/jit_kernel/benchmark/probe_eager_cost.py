"""Eager host cost per call of the hot ops: 10k back-to-back eager calls, one sync, µs per call.

The time a decode step pays on the host for each call (Python wrapper, FFI call, launch), not kernel
time: the kernels here take about 1 µs, so the host is the bottleneck and the mean wall time per call
is the wrapper's cost. Each row is measured ``ROUNDS`` times, interleaved with the other rows, and
the minimum and the median are printed (the minimum is the number to compare; the median shows the
host's noise). Targets (issue 14): ``rmsnorm(x, w, out=o)`` at [1, 4096] bf16 <= 5.3 µs on the
H200 host, and ``scale(x, f, out=o)`` below ``torch.mul(x, f, out=o)`` at [4096] bf16; (issue 15)
``silu_and_mul(x, out=o)`` at [1, 2 x 14336] bf16 <= 5.5 µs.

    python -m sglang.jit_kernel.benchmark.probe_eager_cost
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from sglang.jit_kernel.benchmark.utils import eager_wall_us, exit_unless_gpu

CALLS = 10_000
ROUNDS = 5
HIDDEN, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 4096, 32, 8, 128
DTYPE = torch.bfloat16


def cases() -> dict[str, Callable[[], Any]]:
    from sglang.jit_kernel.activation import silu_and_mul
    from sglang.jit_kernel.norm import (
        fused_add_rmsnorm,
        fused_inplace_qknorm,
        fused_inplace_qknorm_across_heads,
        rmsnorm,
        rmsnorm_hf,
    )
    from sglang.jit_kernel.scale import scale

    x = torch.randn(1, HIDDEN, dtype=DTYPE, device="cuda")
    w = torch.rand(HIDDEN, dtype=DTYPE, device="cuda") + 0.5
    o, r = torch.empty_like(x), torch.randn_like(x)
    qkv = torch.randn(1, (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, dtype=DTYPE, device="cuda")
    q2 = qkv[:, : NUM_Q_HEADS * HEAD_DIM]
    k2 = qkv[:, NUM_Q_HEADS * HEAD_DIM : (NUM_Q_HEADS + NUM_KV_HEADS) * HEAD_DIM]
    q, k = q2.view(1, NUM_Q_HEADS, HEAD_DIM), k2.view(1, NUM_KV_HEADS, HEAD_DIM)
    hw = torch.rand(HEAD_DIM, dtype=DTYPE, device="cuda") + 0.5
    qw, kw = torch.rand_like(q2[0]) + 0.5, torch.rand_like(k2[0]) + 0.5
    v, vo = torch.randn(HIDDEN, dtype=DTYPE, device="cuda"), torch.empty(HIDDEN, dtype=DTYPE, device="cuda")
    g, go = torch.randn(1, 2 * 14336, dtype=DTYPE, device="cuda"), torch.empty(1, 14336, dtype=DTYPE, device="cuda")
    return {
        "rmsnorm(x, w, out=o) [1, 4096]": lambda: rmsnorm(x, w, out=o),
        "rmsnorm(x, w) [1, 4096]": lambda: rmsnorm(x, w),
        "rmsnorm_hf(x, w, out=o) [1, 4096]": lambda: rmsnorm_hf(x, w, out=o),
        "fused_add_rmsnorm(x, r, w) [1, 4096]": lambda: fused_add_rmsnorm(x, r, w),
        "fused_inplace_qknorm 1 x 32+8 x 128": lambda: fused_inplace_qknorm(q, k, hw, hw),
        "  ... head_dim=128": lambda: fused_inplace_qknorm(q, k, hw, hw, head_dim=HEAD_DIM),
        "fused_inplace_qknorm_across_heads 1 x 4096+1024": lambda: fused_inplace_qknorm_across_heads(q2, k2, qw, kw),
        "scale(x, f, out=o) [4096]": lambda: scale(v, 1.5, out=vo),
        "torch.mul(x, f, out=o) [4096]": lambda: torch.mul(v, 1.5, out=vo),
        "silu_and_mul(x, out=o) [1, 2 x 14336]": lambda: silu_and_mul(g, go),
        "F.rms_norm(x, (H,), w) [1, 4096] (reference)": lambda: torch.nn.functional.rms_norm(x, (HIDDEN,), w, 1e-6),
    }


def main() -> None:
    exit_unless_gpu("probe_eager_cost.py")
    table = cases()
    for fn in table.values():  # compile / load every module before timing
        fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(ROUNDS):
        for name, fn in table.items():
            samples[name].append(eager_wall_us(fn, calls=CALLS))
    print(
        f"# {torch.cuda.get_device_name()}: eager wall time per call, {CALLS} calls then one sync, {ROUNDS} rounds (µs)"
    )
    print(f"{'call':<50} {'min':>7} {'median':>7}")
    for name, values in samples.items():
        print(f"{name:<50} {min(values):7.2f} {statistics.median(values):7.2f}")
    rms = min(samples["rmsnorm(x, w, out=o) [1, 4096]"])
    sc, mul = min(samples["scale(x, f, out=o) [4096]"]), min(samples["torch.mul(x, f, out=o) [4096]"])
    print(f"# target rmsnorm(x, w, out=o) <= 5.3 us: {'met' if rms <= 5.3 else 'MISSED'} ({rms:.2f})")
    print(f"# target scale < torch.mul: {'met' if sc < mul else 'MISSED'} ({sc:.2f} vs {mul:.2f})")
    silu = min(samples["silu_and_mul(x, out=o) [1, 2 x 14336]"])
    print(f"# target silu_and_mul(x, out=o) <= 5.5 us: {'met' if silu <= 5.5 else 'MISSED'} ({silu:.2f})")


if __name__ == "__main__":
    main()
