"""Host cost per eager call (10k calls, one sync), [1, 4096] bf16: the norm launcher with and without
PDL, minimal launchers (decode_floor.row_probe, pdl_floor.floor_probe) with and without PDL."""

import os

import torch

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import eager_wall_us
from sglang.jit_kernel.utils import load_jit

bf16 = torch.bfloat16


def main():
    fl = load_jit("pdl_floor", cuda_files=[os.path.abspath("scripts/debug/pdl_floor.cuh")],
                  cuda_wrappers=[("floor_probe", "floor_probe")])
    x = torch.randn(1, 4096, dtype=bf16, device="cuda")
    w = torch.randn(4096, dtype=bf16, device="cuda")
    o = torch.empty_like(x)
    N.rmsnorm(x, w)
    fn = N._RMSNORM_FNS[bf16]
    cases = [
        ("rmsnorm(x, w)", lambda: N.rmsnorm(x, w)),
        ("rmsnorm(x, w, out=o)", lambda: N.rmsnorm(x, w, out=o)),
        ("rmsnorm(..., enable_pdl=False)", lambda: N.rmsnorm(x, w, out=o, enable_pdl=False)),
        ("module direct pdl auto", lambda: fn(o, x, w, 1e-6, 0.0, False, -1)),
        ("module direct pdl 0", lambda: fn(o, x, w, 1e-6, 0.0, False, 0)),
        ("floor_probe empty pdl 1", lambda: fl.floor_probe(o, x, 0, 256, 1)),
        ("floor_probe empty pdl 0", lambda: fl.floor_probe(o, x, 0, 256, 0)),
        ("torch.empty_like", lambda: torch.empty_like(x)),
        ("F.rms_norm", lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)),
    ]
    for rep in range(2):
        for name, f in cases:
            print(f"rep{rep} {name:<32} {eager_wall_us(f, calls=10000, warmup=300):7.2f} us", flush=True)


def pieces():
    m = load_jit("launch_cost", cuda_files=[os.path.abspath("scripts/debug/launch_cost.cuh")],
                 cuda_wrappers=[("piece", "piece")])
    x = torch.randn(1, 4096, dtype=bf16, device="cuda")
    names = ["ffi call only", "+ env stream", "+ cudaGetDevice", "+ <<<>>> launch", "+ LaunchKernelEx", "+ LaunchKernelEx PDL"]
    for rep in range(2):
        for which, name in enumerate(names):
            print(f"rep{rep} {name:<32} {eager_wall_us(lambda: m.piece(x, which), calls=10000, warmup=300):7.2f} us", flush=True)


if __name__ == "__main__":
    pieces() if os.environ.get("PIECES") else main()
