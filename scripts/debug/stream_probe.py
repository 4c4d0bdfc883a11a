"""In-place vs separate writes for the fused add's access pattern (stream_probe.cuh) at
[16384, 4096] bf16, cold L2, CUDA-graph median; each code measured in place and into separate
buffers, twice, interleaved, next to the real fused_add_rmsnorm and rmsnorm(out=x).
Usage: python stream_probe.py [codes...] (default: every code of stream_probe.cuh)."""

import os
import sys

import torch

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import bench_rotating, copy_roof_gbps, num_rotating_sets
from sglang.jit_kernel.utils import load_jit

bf16 = torch.bfloat16
CODES = [
    (221100, "row 256x2 4s reduce"),
    (221000, "row 256x2 4s no-reduce"),
    (221101, "row 256x2 4s reduce, st.cs"),
    (221102, "row 256x2 4s reduce, st evict_first"),
    (221103, "row 256x2 4s reduce, st evict_last"),
    (221110, "row 256x2 4s reduce, ld evict_first"),
    (221120, "row 256x2 4s reduce, ld.cs"),
    (221111, "row 256x2 4s reduce, ld ef + st.cs"),
    (221132, "row 256x2 4s reduce, ld el + st ef"),
    (411100, "row 512x1 4s reduce"),
    (141100, "row 128x4 4s reduce"),
    (220100, "row 256x2 2s reduce"),
    (220101, "row 256x2 2s reduce, st.cs"),
    (220110, "row 256x2 2s reduce, ld evict_first"),
    (1111000, "flat 128x1 4s"),
    (1141000, "flat 128x4 4s"),
    (1221000, "flat 256x2 4s"),
    (1140000, "flat 128x4 2s"),
    (1011000, "flat 64x1 4s"),
    (1211000, "flat 256x1 4s"),
    (1411000, "flat 512x1 4s"),
    (1121000, "flat 128x2 4s"),
    (1111003, "flat 128x1 4s, st evict_last"),
    (411103, "row 512x1 4s reduce, st evict_last"),
    (411000, "row 512x1 4s no-reduce"),
    (221130, "row 256x2 4s reduce, ld evict_last"),
    (221133, "row 256x2 4s reduce, ld el + st el"),
    (141103, "row 128x4 4s reduce, st evict_last"),
    (2111100, "cluster 4x128x1 4s reduce"),
    (2111103, "cluster 4x128x1 4s reduce, st el"),
    (2211100, "cluster 2x256x1 4s reduce"),
    (2211103, "cluster 2x256x1 4s reduce, st el"),
    (2121100, "cluster 2x128x2 4s reduce"),
]


def main():
    codes = [int(c) for c in sys.argv[1:]] or [c for c, _ in CODES]
    names = dict(CODES)
    roof = copy_roof_gbps()
    print(f"copy roof {roof:.0f} GB/s", flush=True)
    m = load_jit("stream_probe", cuda_files=[os.path.abspath("scripts/debug/stream_probe.cuh")],
                 cuda_wrappers=[("stream_probe", "stream_probe")])
    rows, h = 16384, 4096
    nsets = num_rotating_sets(8 * rows * h)
    sets = [tuple(torch.randn(rows, h, dtype=bf16, device="cuda") for _ in range(4)) +
            (torch.rand(h, dtype=bf16, device="cuda") + 0.5,) for _ in range(nsets)]
    four = 8 * rows * h
    two = 4 * rows * h

    def pct(nbytes, t):
        return nbytes / t / 1e3 / roof * 100

    for code in codes:
        q = m.stream_probe(*sets[0][:4], code, True)
        print(f"{code:>7} {names.get(code, ''):<36} registers {q // 100}, CTAs per SM {q % 100}", flush=True)
    for rep in range(2):
        t = bench_rotating(lambda x, r, xo, ro, w: N.fused_add_rmsnorm(x, r, w), sets)[0]
        print(f"[{rep}] fused_add_rmsnorm in place {t:.2f} us ({pct(four, t):.1f} %)", flush=True)
        t_s = bench_rotating(lambda x, r, xo, ro, w: N.rmsnorm(x, w, out=xo), sets)[0]
        t_i = bench_rotating(lambda x, r, xo, ro, w: N.rmsnorm(x, w, out=x), sets)[0]
        print(f"[{rep}] rmsnorm separate {t_s:.2f} us ({pct(two, t_s):.1f} %), in place {t_i:.2f} ({pct(two, t_i):.1f} %)",
              flush=True)
        for code in codes:
            nb = four if (code // 1000) % 10 else two
            t_s = bench_rotating(lambda x, r, xo, ro, w: m.stream_probe(x, r, xo, ro, code, False), sets)[0]
            t_i = bench_rotating(lambda x, r, xo, ro, w: m.stream_probe(x, r, x, r, code, False), sets)[0]
            print(f"[{rep}] {code:>7} {names.get(code, ''):<36} separate {t_s:7.2f} us ({pct(nb, t_s):5.1f} %)  "
                  f"in place {t_i:7.2f} us ({pct(nb, t_i):5.1f} %)", flush=True)


if __name__ == "__main__":
    main()
