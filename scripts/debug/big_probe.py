"""Launch the large norm cases once per variant (and scale at the same bytes) for ncu metrics.

Usage (device): ncu --clock-control none --metrics ... python3 scripts/debug/big_probe.py base: v1:-DMY_SWITCH=1
(variant specs as in variants.py)
"""

import sys

import torch

sys.path.insert(0, "scripts/debug")
import variants  # noqa: E402

import sglang.jit_kernel.norm as N  # noqa: E402
from sglang.jit_kernel.scale import scale  # noqa: E402

bf16 = torch.bfloat16


def main():
    specs = [a for a in sys.argv[1:] if not a.startswith("--")]
    mods = {s: variants.build(s) for s in specs}
    x = torch.randn(16384, 4096, dtype=bf16, device="cuda")
    w = torch.rand(4096, dtype=bf16, device="cuda") + 0.5
    out = torch.empty_like(x)
    r = torch.randn_like(x)
    s = torch.randn(1 << 27, dtype=bf16, device="cuda")
    so = torch.empty_like(s)
    scale(s, 2.0, out=so)
    torch.cuda.synchronize()
    print("case scale 2^27", flush=True)
    scale(s, 2.0, out=so)
    torch.cuda.synchronize()
    for spec in specs:
        m = mods[spec]
        variants.use(m)
        for geo in [(0, 0, 0), (256, 2, 2), (256, 2, -1)]:
            m._set_geometry_override(*geo)
            N.rmsnorm(x, w, out=out)
            torch.cuda.synchronize()
            print("case", spec, geo, flush=True)
            N.rmsnorm(x, w, out=out)
            torch.cuda.synchronize()
        m._set_geometry_override(0, 0, 0)
        N.fused_add_rmsnorm(x, r, w)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
