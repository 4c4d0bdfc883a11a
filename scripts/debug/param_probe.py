"""Does the size of a kernel's parameter block cost decode latency? decode_floor's 256 x 2 probe
with 8 / 256+8 / 512+8 bytes of extra parameters next to norm.rmsnorm (NormParams), bench_norm's
sets, [1 / 8 / 64, 4096] bf16; each timed in five separate CUDA-graph captures (bench_rotating(..., captures=1) five times),
interleaved."""

import os

import torch

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import bench_rotating, num_rotating_sets
from sglang.jit_kernel.utils import load_jit

bf16 = torch.bfloat16


def main():
    m = load_jit("decode_floor_pad", cuda_files=[os.path.abspath("scripts/debug/decode_floor.cuh")],
                 cuda_wrappers=[("row_probe", "row_probe")])
    h = 4096
    for n in (1, 8, 64):
        sets = []
        for _ in range(num_rotating_sets(4 * n * h + 2 * h)):
            x = torch.randn(n, h, dtype=bf16, device="cuda")
            sets.append((x, torch.rand(h, dtype=bf16, device="cuda") + 0.5, torch.empty_like(x)))
        cases = {
            "probe pad 8": lambda x, w, o: m.row_probe(o, x, w, 2, 0),
            "probe pad 264": lambda x, w, o: m.row_probe(o, x, w, 302, 0),
            "probe pad 520": lambda x, w, o: m.row_probe(o, x, w, 402, 0),
            "rmsnorm": lambda x, w, o: N.rmsnorm(x, w, out=o),
        }
        times = {k: [] for k in cases}
        for _ in range(5):
            for k, f in cases.items():
                times[k].append(bench_rotating(f, sets, captures=1)[0])
        for k, v in times.items():
            print(f"[{n}, {h}] {k:<14} " + " ".join(f"{t:.3f}" for t in v), flush=True)
        del sets


if __name__ == "__main__":
    main()
