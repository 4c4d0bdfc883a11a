"""Sweep scale's launch configuration (vectors in flight per thread x threads per block) at the
bandwidth sizes, against torch's x * f and the copy roof; prints one row per configuration.

    python python/sglang/jit_kernel/benchmark/sweep_scale.py
"""

import torch

from sglang.jit_kernel.benchmark.utils import bench_rotating, copy_roof_gbps, exit_unless_gpu, num_rotating_sets
from sglang.jit_kernel.utils import load_jit

CONFIGS = [(u, t) for u in (1, 2, 4, 8) for t in (128, 256, 512)]


def main() -> None:
    exit_unless_gpu("sweep_scale.py")
    wrappers = [(f"scale_u{u}_t{t}", f"scale_with_config<bf16_t, ScaleConfig<{u}, {t}>>") for u, t in CONFIGS]
    module = load_jit("scale_sweep", cuda_files=["elementwise/scale.cuh"], cuda_wrappers=wrappers)
    roof = copy_roof_gbps()
    print(f"# {torch.cuda.get_device_name()}; copy roof {roof:.0f} GB/s")
    for size in (1 << 12, 1 << 20, 1 << 24, 1 << 28):
        nbytes = 4 * size
        sets = [(torch.randn(size, dtype=torch.bfloat16, device="cuda"),) for _ in range(num_rotating_sets(nbytes))]
        sets = [(s[0], torch.empty_like(s[0])) for s in sets]
        rows = []
        for name, _ in wrappers:
            fn = getattr(module, name)
            us, _, _ = bench_rotating(lambda src, out, fn=fn: fn(out, src, 2.0), sets)
            rows.append((name, us))
        us, _, _ = bench_rotating(lambda src, out: torch.mul(src, 2.0, out=out), sets)
        rows.append(("torch.mul", us))
        for name, us in sorted(rows, key=lambda r: r[1]):
            gbps = nbytes / (us * 1e-6) / 1e9
            print(f"[{size:>10}] {name:<16} {us:9.2f} us {gbps:7.0f} GB/s {100 * gbps / roof:6.1f}%")
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
