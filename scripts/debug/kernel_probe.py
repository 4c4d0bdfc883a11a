"""Launch each norm/scale op a few times at decode and at large sizes, for ncu to time the kernels.

Usage (device): ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,\
dram__throughput.avg.pct_of_peak_sustained_elapsed --csv python3 scripts/debug/kernel_probe.py
Kernel names appear in launch order: each case launches its op REPEAT times after one warm-up.
``--decode``: only the one-token cases (for ncu sections on the small kernels).
"""

import torch

from sglang.jit_kernel.norm import fused_add_rmsnorm, fused_inplace_qknorm, rmsnorm
from sglang.jit_kernel.scale import scale

REPEAT = 3
bf16 = torch.bfloat16


def run(name, fn):
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(name)
    for _ in range(REPEAT):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print("case", name, flush=True)


def main():
    import sys

    decode_only = "--decode" in sys.argv
    w = torch.rand(4096, dtype=bf16, device="cuda") + 0.5
    for n in (1,) if decode_only else (1, 64, 16384):
        x = torch.randn(n, 4096, dtype=bf16, device="cuda")
        r = torch.randn_like(x)
        out = torch.empty_like(x)
        run(f"rmsnorm[{n},4096]", lambda: rmsnorm(x, w, out=out))
        run(f"fused_add[{n},4096]", lambda: fused_add_rmsnorm(x, r, w))
    qw = torch.rand(128, dtype=bf16, device="cuda") + 0.5
    for n in (1,) if decode_only else (1, 16384):
        qkv = torch.randn(n, 48 * 128, dtype=bf16, device="cuda")
        q, k = qkv[:, : 32 * 128].view(n, 32, 128), qkv[:, 32 * 128 : 40 * 128].view(n, 8, 128)
        run(f"qknorm[{n}]", lambda: fused_inplace_qknorm(q, k, qw, qw))
    s = torch.randn(4096, dtype=bf16, device="cuda")
    so = torch.empty_like(s)
    run("scale[4096]", lambda: scale(s, 2.0, out=so))
    run("torch.mul[4096]", lambda: torch.mul(s, 2.0, out=so))


if __name__ == "__main__":
    main()
