"""Is the decode timing bimodal per CUDA-graph capture? The same module, the same input sets, timed
by bench_rotating with captures=1 (one capture each) eight times in a row; then the same with fresh sets per
repetition. rmsnorm / fused add [1 / 8 / 64, 4096] bf16, bench_norm's sets (own x, weight, out)."""

import torch

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import bench_rotating, num_rotating_sets

bf16 = torch.bfloat16


def make_sets(n, h):
    sets = []
    for _ in range(num_rotating_sets(4 * n * h + 2 * h)):
        x = torch.randn(n, h, dtype=bf16, device="cuda")
        sets.append((x, torch.rand(h, dtype=bf16, device="cuda") + 0.5, torch.empty_like(x), torch.randn_like(x)))
    return sets


def main():
    h = 4096
    for n in (1, 8, 64):
        sets = make_sets(n, h)
        same = [bench_rotating(lambda x, w, o, r: N.rmsnorm(x, w, out=o), sets, captures=1)[0] for _ in range(8)]
        fused = [bench_rotating(lambda x, w, o, r: N.fused_add_rmsnorm(x, r, w), sets, captures=1)[0] for _ in range(8)]
        fresh = []
        for _ in range(6):
            del sets
            sets = make_sets(n, h)
            fresh.append(bench_rotating(lambda x, w, o, r: N.rmsnorm(x, w, out=o), sets, captures=1)[0])
        fmt = lambda v: " ".join(f"{t:.3f}" for t in v)
        print(f"[{n}, {h}] rmsnorm same sets: {fmt(same)}", flush=True)
        print(f"[{n}, {h}] fused   same sets: {fmt(fused)}", flush=True)
        print(f"[{n}, {h}] rmsnorm fresh sets: {fmt(fresh)}", flush=True)
        del sets


if __name__ == "__main__":
    main()
