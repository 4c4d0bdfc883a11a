"""Decode floor probes (decode_floor.cuh) next to norm.rmsnorm, same sets: per-call µs at
[1 / 8 / 64, 4096] bf16, L2-warm (x rotated over sets that fit in L2) and cold (bench_norm's
sets: x, weight and out per set)."""

import os

import torch

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import bench_rotating, num_rotating_sets
from sglang.jit_kernel.utils import load_jit

bf16 = torch.bfloat16


def main():
    m = load_jit("decode_floor", cuda_files=[os.path.abspath("scripts/debug/decode_floor.cuh")],
                 cuda_wrappers=[("row_probe", "row_probe")])
    for n in (1, 8, 64):
        h = 4096
        w0 = torch.rand(h, dtype=bf16, device="cuda") + 0.5
        o0 = torch.empty(n, h, dtype=bf16, device="cuda")
        count = max(2, min(64, (16 << 20) // (2 * n * h)))  # x sets fit in L2 (16 MB)
        warm = [(torch.randn(n, h, dtype=bf16, device="cuda"), w0, o0) for _ in range(count)]
        cold = [(torch.randn(n, h, dtype=bf16, device="cuda"), torch.rand(h, dtype=bf16, device="cuda") + 0.5,
                 torch.empty(n, h, dtype=bf16, device="cuda")) for _ in range(num_rotating_sets(4 * n * h + 2 * h))]
        x, w, o = cold[0]
        ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
        line = [f"[{n}, {h}]"]
        for name, sets in (("warm", warm), ("cold", cold)):
            t = bench_rotating(lambda x, w, o: N.rmsnorm(x, w, out=o), sets)[0]
            line.append(f"{name}: rmsnorm {t:.3f}")
            for vecs in (1, 2, 4, 8, 16):
                m.row_probe(o, x, w, vecs, 0)
                err = (o.float() - ref).abs().max().item()
                assert err < 0.05, (vecs, err)
                t = bench_rotating(lambda x, w, o, v=vecs: m.row_probe(o, x, w, v, 0), sets)[0]
                line.append(f"{512 // vecs}x{vecs} {t:.3f}")
        # Same, each CTA reading its own copy of the weight (is the shared weight an L2 hot spot?)
        wc = torch.rand(n, h, dtype=bf16, device="cuda") + 0.5
        for name, sets in (("warm", warm), ("cold", cold)):
            t = bench_rotating(lambda x, w, o: m.row_probe(o, x, wc, 2, 4096), sets)[0]
            line.append(f"{name} 256x2 weight per CTA {t:.3f}")
            t = bench_rotating(lambda x, w, o: m.row_probe(o, x, w, 102, 0), sets)[0]
            line.append(f"{name} 256x2 plain ld.global {t:.3f}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
