"""One-token launches for ncu: rmsnorm of a variant module (argv[1] spec) and the floor probes."""
import os
import sys

import torch

sys.path.insert(0, "scripts/debug")
import variants  # noqa: E402

import sglang.jit_kernel.norm as N  # noqa: E402
from sglang.jit_kernel.utils import load_jit  # noqa: E402


def main():
    m = variants.build(sys.argv[1])
    variants.use(m)
    f = load_jit("pdl_floor", cuda_files=[os.path.abspath("scripts/debug/pdl_floor.cuh")],
                 cuda_wrappers=[("floor_probe", "floor_probe")])
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.rand(4096, dtype=torch.bfloat16, device="cuda") + 0.5
    out = torch.empty_like(x)
    xs, ys = x.view(-1), out.view(-1)
    for _ in range(3):
        N.rmsnorm(x, w, out=out)
        f.floor_probe(ys, xs, 2, 256, 1)
        f.floor_probe(ys, xs, 1, 512, 1)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
