"""Quick A/B timing of the norm ops at the issue's sizes (automatic geometry, cold L2 / decode hot)."""

import torch

from sglang.jit_kernel.benchmark.utils import BenchRow, bench_rotating, copy_roof_gbps, format_rows, num_rotating_sets
from sglang.jit_kernel.norm import fused_add_rmsnorm, fused_inplace_qknorm, rmsnorm

bf16 = torch.bfloat16


def main():
    roof = copy_roof_gbps()
    rows = []
    for n, h in [(1, 4096), (8, 4096), (64, 4096), (16384, 4096), (16384, 8192)]:
        w = torch.rand(h, dtype=bf16, device="cuda") + 0.5
        sets = [(torch.randn(n, h, dtype=bf16, device="cuda"), torch.randn(n, h, dtype=bf16, device="cuda"))
                for _ in range(num_rotating_sets(8 * n * h))]
        out = torch.empty(n, h, dtype=bf16, device="cuda")
        rows.append(BenchRow("rmsnorm", f"[{n}, {h}]", "jit", bench_rotating(lambda x, r: rmsnorm(x, w, out=out), sets)[0],
                             4 * n * h + 2 * h))
        rows.append(BenchRow("fused_add_rmsnorm", f"[{n}, {h}]", "jit",
                             bench_rotating(lambda x, r: fused_add_rmsnorm(x, r, w), sets)[0], 8 * n * h + 2 * h))
        del sets
        torch.cuda.empty_cache()
    qw = torch.rand(128, dtype=bf16, device="cuda") + 0.5
    for n in (1, 16384):
        sets = []
        for _ in range(num_rotating_sets(4 * n * 40 * 128)):
            qkv = torch.randn(n, 48 * 128, dtype=bf16, device="cuda")
            sets.append((qkv[:, : 32 * 128].view(n, 32, 128), qkv[:, 32 * 128 : 40 * 128].view(n, 8, 128)))
        rows.append(BenchRow("qknorm", f"[{n}, 32+8, 128]", "jit",
                             bench_rotating(lambda q, k: fused_inplace_qknorm(q, k, qw, qw), sets)[0], 4 * n * 40 * 128 + 512))
    print(format_rows(rows, roof))


if __name__ == "__main__":
    main()
