"""Decode floor: the bare probe kernel (probe_decode_floor.cuh) next to norm.rmsnorm on the same sets.

Per-call µs at [1 / 8 / 64, 4096] bf16, L2-warm (x rotated over sets that fit in L2, one shared
weight and out) and cold (bench_norm's sets: x, weight and out per set). Columns: rmsnorm; the
probe at 512 x 1, 256 x 2, 128 x 4, 64 x 8, 32 x 16 (threads x vectors per thread); 256 x 2 with a
weight copy per CTA (is the shared weight an L2 hot spot?) and with plain ld.global loads. What a
row of this told so far: docs/perf_notes.md (sessions 5 and 7). Not a CI benchmark (no bench_
prefix); run it on a GPU machine:

    python python/sglang/jit_kernel/benchmark/probe_decode_floor.py
"""

from __future__ import annotations

import os

import torch

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import bench_rotating, exit_unless_gpu, num_rotating_sets
from sglang.jit_kernel.utils import load_jit

DTYPE = torch.bfloat16
HIDDEN = 4096
PROBE_CUH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_decode_floor.cuh")
VECS = (1, 2, 4, 8, 16)
PLAIN_LOADS = 102  # row_probe code: 256 x 2 through plain ld.global


def main() -> None:
    exit_unless_gpu("probe_decode_floor.py")
    probe = load_jit("probe_decode_floor", cuda_files=[PROBE_CUH], cuda_wrappers=[("row_probe", "row_probe")])
    print(f"# {torch.cuda.get_device_name()}; µs per call, CUDA graph, middle of five captures", flush=True)
    for rows in (1, 8, 64):
        shared_w = torch.rand(HIDDEN, dtype=DTYPE, device="cuda") + 0.5
        shared_out = torch.empty(rows, HIDDEN, dtype=DTYPE, device="cuda")
        num_warm = max(2, min(64, (16 << 20) // (2 * rows * HIDDEN)))  # x sets fit in L2 (16 MB)
        warm = [(torch.randn(rows, HIDDEN, dtype=DTYPE, device="cuda"), shared_w, shared_out) for _ in range(num_warm)]
        cold = [
            (
                torch.randn(rows, HIDDEN, dtype=DTYPE, device="cuda"),
                torch.rand(HIDDEN, dtype=DTYPE, device="cuda") + 0.5,
                torch.empty(rows, HIDDEN, dtype=DTYPE, device="cuda"),
            )
            for _ in range(num_rotating_sets(4 * rows * HIDDEN + 2 * HIDDEN))
        ]
        x, w, out = cold[0]
        ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        for code in VECS + (PLAIN_LOADS,):
            probe.row_probe(out, x, w, code, 0)
            err = (out.float() - ref).abs().max().item()
            assert err < 0.05, f"probe code {code}: max |err| {err} vs the fp32 reference"
        w_per_cta = torch.rand(rows, HIDDEN, dtype=DTYPE, device="cuda") + 0.5
        line = [f"[{rows}, {HIDDEN}]"]
        for name, sets in (("warm", warm), ("cold", cold)):
            t = bench_rotating(lambda x, w, o: N.rmsnorm(x, w, out=o), sets)[0]
            line.append(f"{name}: rmsnorm {t:.3f}")
            for vecs in VECS:
                t = bench_rotating(lambda x, w, o, v=vecs: probe.row_probe(o, x, w, v, 0), sets)[0]
                line.append(f"{512 // vecs}x{vecs} {t:.3f}")
            t = bench_rotating(lambda x, w, o: probe.row_probe(o, x, w_per_cta, 2, HIDDEN), sets)[0]
            line.append(f"256x2 weight per CTA {t:.3f}")
            t = bench_rotating(lambda x, w, o: probe.row_probe(o, x, w, PLAIN_LOADS, 0), sets)[0]
            line.append(f"256x2 plain ld.global {t:.3f}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
