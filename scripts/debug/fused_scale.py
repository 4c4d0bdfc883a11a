"""rmsnorm and fused_add_rmsnorm (bf16) over several row counts: t(N) = a + b * bytes gives the
fixed cost a and the marginal bandwidth 1 / b of each; plus forced geometries of the fused add
(one CTA per group) at [16384, 4096 / 8192]. bench_norm's sets (x, r, w per set), cold L2."""

import torch

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import bench_rotating, copy_roof_gbps, num_rotating_sets

bf16 = torch.bfloat16


def sets_for(n, h):
    return [(torch.randn(n, h, dtype=bf16, device="cuda"), torch.randn(n, h, dtype=bf16, device="cuda"),
             torch.rand(h, dtype=bf16, device="cuda") + 0.5) for _ in range(num_rotating_sets(8 * n * h))]


def main():
    roof = copy_roof_gbps()
    print(f"copy roof {roof:.0f} GB/s", flush=True)
    module = N._load(bf16)
    for h, ns in ((4096, (8192, 16384, 32768, 65536)), (8192, (8192, 16384, 32768))):
        pts = {"rmsnorm": [], "fused": []}
        for n in ns:
            sets = sets_for(n, h)
            out = torch.empty(n, h, dtype=bf16, device="cuda")
            t_r = bench_rotating(lambda x, r, w: N.rmsnorm(x, w, out=out), sets)[0]
            t_f = bench_rotating(lambda x, r, w: N.fused_add_rmsnorm(x, r, w), sets)[0]
            pts["rmsnorm"].append((4 * n * h, t_r))
            pts["fused"].append((8 * n * h, t_f))
            print(f"[{n}, {h}] rmsnorm {t_r:.2f} us ({4 * n * h / t_r / 1e3 / roof * 100:.1f} %)  "
                  f"fused {t_f:.2f} us ({8 * n * h / t_f / 1e3 / roof * 100:.1f} %)", flush=True)
            if n == 16384:
                geoms = [(512, 1), (128, 4)] if h == 4096 else [(256, 4), (1024, 1)]
                for tpr, k in geoms:
                    module._set_geometry_override(tpr, k, 0)
                    t = bench_rotating(lambda x, r, w: N.fused_add_rmsnorm(x, r, w), sets)[0]
                    module._set_geometry_override(0, 0, 0)
                    print(f"    fused forced {tpr}x{k}: {t:.2f} us ({8 * n * h / t / 1e3 / roof * 100:.1f} %)", flush=True)
            del sets, out
            torch.cuda.empty_cache()
        for name, p in pts.items():
            xs = torch.tensor([b for b, _ in p], dtype=torch.float64)
            ys = torch.tensor([t for _, t in p], dtype=torch.float64)
            b = ((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum()
            a = ys.mean() - b * xs.mean()
            print(f"  H={h} {name}: fixed {a.item():.2f} us, marginal {1 / b.item() / 1e3:.0f} GB/s "
                  f"({100 / b.item() / 1e3 / roof:.1f} %)", flush=True)


if __name__ == "__main__":
    main()
