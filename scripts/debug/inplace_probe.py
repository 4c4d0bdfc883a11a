"""Does writing in place cost bandwidth on this GPU? torch elementwise in place vs out of place
(events, 1 GiB bf16), and norm.rmsnorm [16384, 4096] with out = x vs a separate out (graph, cold)."""

import os

import torch
import triton.testing

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import bench_rotating, copy_roof_gbps, num_rotating_sets
from sglang.jit_kernel.utils import load_jit

bf16 = torch.bfloat16


def main():
    roof = copy_roof_gbps()
    print(f"copy roof {roof:.0f} GB/s", flush=True)
    n = 1 << 29
    x = torch.randn(n, dtype=bf16, device="cuda")
    y = torch.empty_like(x)
    r = torch.randn(n, dtype=bf16, device="cuda")
    for name, fn, nbytes in (
        ("mul out of place", lambda: torch.mul(x, 1.0, out=y), 4 * n),
        ("mul_ in place", lambda: x.mul_(1.0), 4 * n),
        ("add out of place (2 reads)", lambda: torch.add(x, r, out=y), 6 * n),
        ("add_ in place (2 reads)", lambda: x.add_(r), 6 * n),
    ):
        ms = triton.testing.do_bench(fn, rep=200, return_mode="median")
        print(f"{name:<28} {ms * 1e3:8.1f} us  {nbytes / ms / 1e6:6.0f} GB/s  {nbytes / ms / 1e6 / roof * 100:5.1f} %", flush=True)
    del x, y, r
    torch.cuda.empty_cache()
    for h in (4096, 8192):
        rows = 16384
        sets = [(torch.randn(rows, h, dtype=bf16, device="cuda"), torch.randn(rows, h, dtype=bf16, device="cuda"),
                 torch.rand(h, dtype=bf16, device="cuda") + 0.5) for _ in range(num_rotating_sets(8 * rows * h))]
        nb = 4 * rows * h
        t_sep = bench_rotating(lambda x, o, w: N.rmsnorm(x, w, out=o), sets)[0]
        t_in = bench_rotating(lambda x, o, w: N.rmsnorm(x, w, out=x), sets)[0]
        t_f = bench_rotating(lambda x, o, w: N.fused_add_rmsnorm(x, o, w), sets)[0]
        if h == 4096:
            # The decode_floor probe (one CTA per row, 256 x 2, nothing else) at this size: is the
            # in-place cost in the structure (read, block reduction, write) or in our kernel?
            m = load_jit("decode_floor", cuda_files=[os.path.abspath("scripts/debug/decode_floor.cuh")],
                         cuda_wrappers=[("row_probe", "row_probe")])
            for code, what in ((2, "probe 256x2"), (202, "probe 256x2, no reduction")):
                t_ps = bench_rotating(lambda x, o, w: m.row_probe(o, x, w, code, 0), sets)[0]
                t_pi = bench_rotating(lambda x, o, w: m.row_probe(x, x, w, code, 0), sets)[0]
                print(f"{what} [{rows}, {h}] out separate {t_ps:.2f} us ({nb / t_ps / 1e3 / roof * 100:.1f} %), "
                      f"out = x {t_pi:.2f} us ({nb / t_pi / 1e3 / roof * 100:.1f} %)", flush=True)
        print(f"rmsnorm [{rows}, {h}] out separate {t_sep:.2f} us ({nb / t_sep / 1e3 / roof * 100:.1f} %), "
              f"out = x {t_in:.2f} us ({nb / t_in / 1e3 / roof * 100:.1f} %); fused {t_f:.2f} us "
              f"({2 * nb / t_f / 1e3 / roof * 100:.1f} %)", flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
