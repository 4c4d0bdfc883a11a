"""Decode-layer chain floor: bench_decode_layer's fused chains next to a chain of four bare kernels.

The bare kernel is probe_decode_floor.cuh's row probe (256 threads x 2 vectors per [*, 4096] bf16 row,
one CTA a row: loads after the PDL wait, a row reduction, one store), launched with PDL like ours.
The bare chain has the fused FP8 chain's four launches on rows of about its bytes, T tokens:

    norm 1   [T, 4096]                 (fused_add_rmsnorm_quant)
    rope_kv  [ceil(1.5 T), 4096]       (q, k, v: 48 heads x 128 per token)
    norm 2   [T, 4096]
    act      [7 T, 4096]               (gate and up: 2 x 14336 per token)

each reading its rows and the weight and writing as many rows (at least the bytes the fused op
moves). Also its first one, two and three launches alone, which give the cost of one more launch in
the graph. All in one process and one CUDA graph per chain, cold (inputs rotated) and one input
replayed (the issue's table's method). Not a CI benchmark (no bench_ prefix); run it on a GPU machine:

    python python/sglang/jit_kernel/benchmark/probe_chain_floor.py
"""

from __future__ import annotations

import math
import os

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("probe_chain_floor.py")  # before importing triton, which a CPU-only install lacks

from sglang.jit_kernel.benchmark.bench_decode_layer import (  # noqa: E402
    FLAVOURS,
    MAX_POS,
    ROPE_BASE,
    UNFUSED,
    D,
    chain_bytes,
    make_caches,
    make_layer,
    ours_fused,
)
from sglang.jit_kernel.benchmark.utils import bench_rotating, num_rotating_sets  # noqa: E402
from sglang.jit_kernel.rope import make_cos_sin_cache  # noqa: E402
from sglang.jit_kernel.utils import load_jit  # noqa: E402

HIDDEN = 4096
PROBE_CUH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_decode_floor.cuh")
CODE_256X2 = 2  # row_probe: 256 threads x 2 vectors per thread
TOKENS = (1, 64, 256)


def chain_rows(t: int) -> list[int]:
    """Rows of [*, 4096] bf16 for the bare chain's four launches at T = t (module docstring)."""
    return [t, math.ceil(1.5 * t), t, 7 * t]


def main() -> None:
    exit_unless_gpu("probe_chain_floor.py")
    probe = load_jit("probe_decode_floor", cuda_files=[PROBE_CUH], cuda_wrappers=[("row_probe", "row_probe")])
    cos_sin = make_cos_sin_cache(MAX_POS, D, base=ROPE_BASE)
    print(f"# {torch.cuda.get_device_name()}; µs per chain, one CUDA graph, cold / one input", flush=True)
    for t in TOKENS:
        rows = chain_rows(t)
        w = torch.rand(HIDDEN, dtype=torch.bfloat16, device="cuda") + 0.5

        def buffers() -> tuple[torch.Tensor, ...]:
            x = [torch.randn(r, HIDDEN, dtype=torch.bfloat16, device="cuda") for r in rows]
            return tuple(x + [torch.empty_like(a) for a in x])

        sets = [buffers() for _ in range(num_rotating_sets(4 * sum(rows) * HIDDEN))]
        x, out = sets[0][:4], sets[0][4:]
        for a, o in zip(x, out):  # the probe's values against fp32
            probe.row_probe(o, a, w, CODE_256X2, 0)
            ref = a.float() * torch.rsqrt(a.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
            err = (o.float() - ref).abs().max().item()
            assert err < 0.05, f"row probe [{a.shape[0]}, {HIDDEN}]: max |err| {err} vs the fp32 reference"
        line = [f"T={t}"]
        for n in (1, 2, 3, 4):

            def chain(*bufs: torch.Tensor, n: int = n) -> None:
                for i in range(n):
                    probe.row_probe(bufs[4 + i], bufs[i], w, CODE_256X2, 0)

            cold = bench_rotating(chain, sets)[0]
            one = bench_rotating(chain, sets[:1])[0]
            line.append(f"bare x{n} {cold:.2f} / {one:.2f}")
        del sets
        for flavour in FLAVOURS:
            caches = make_caches(flavour)
            layers = [
                (make_layer(t, flavour, caches, cos_sin),)
                for _ in range(num_rotating_sets(chain_bytes(t, flavour, UNFUSED)))
            ]
            call = ours_fused(flavour)
            cold = bench_rotating(call, layers)[0]
            one = bench_rotating(call, layers[:1])[0]
            line.append(f"{flavour.name} fused {cold:.2f} / {one:.2f}")
            del layers, caches
        torch.cuda.empty_cache()
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
