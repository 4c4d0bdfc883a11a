"""Per-call time of one-CTA probe kernels in a CUDA graph of back-to-back launches (decode floor)."""

import os

import torch

from sglang.jit_kernel.benchmark.utils import run_benchmark
from sglang.jit_kernel.utils import load_jit


def main():
    m = load_jit("pdl_floor", cuda_files=[os.path.abspath("scripts/debug/pdl_floor.cuh")],
                 cuda_wrappers=[("floor_probe", "floor_probe")])
    x = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    for pdl in (1, 0):
        for mode, threads in [(0, 512), (1, 512), (2, 512), (3, 32), (2, 256)]:
            if mode == 3:
                xs = torch.randn(256, dtype=torch.bfloat16, device="cuda")
                ys = torch.empty_like(xs)
                fn = lambda: [m.floor_probe(ys, xs, mode, threads, pdl) for _ in range(64)]
            else:
                fn = lambda: [m.floor_probe(y, x, mode, threads, pdl) for _ in range(64)]
            t = run_benchmark(fn)[0] / 64
            print(f"pdl={pdl} mode={mode} threads={threads}: {t:.3f} us/call", flush=True)


if __name__ == "__main__":
    main()
