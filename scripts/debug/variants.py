"""A/B of compile-time norm kernel variants on the issue's sizes, one process.

Usage (device): python3 scripts/debug/variants.py base: v1:-DMY_SWITCH=1,-DOTHER=2 old@dir: [--sweep=v1 ...]
(name[@dir]:comma-separated nvcc flags; @dir builds the .cuh files of dir/elementwise, e.g. a copy
of the kernels at an earlier commit). The kernels carry no switches between experiments: add
`#ifndef MY_SWITCH` blocks to the .cuh for the experiment and remove the losers afterwards.
Builds every variant's bf16 module in parallel, then times each variant's ops through norm.py
(the module functions are swapped in). Prints one table per variant; --sweep=name adds forced
geometries (bps = blocks_per_sm of the override: > 0 a persistent grid, <= 0 the default);
--hazard prints bench_norm.l2_after_table per variant (the next kernel's L2 after each op);
--no-measure skips the timing table; --decode-only times the decode sizes only.
"""

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import BenchRow, bench_rotating, copy_roof_gbps, format_rows, num_rotating_sets
from sglang.jit_kernel.utils import load_jit, make_cpp_args

bf16 = torch.bfloat16


def has_l2_hint(root):
    """Whether the kernels under root (or the package's) have the L2-hint override."""
    path = f"{root}elementwise/rmsnorm.cuh" if root else os.path.join(
        os.path.dirname(N.__file__), "csrc", "elementwise", "rmsnorm.cuh")
    return "set_norm_l2_hint_override" in open(path).read()


def build(spec):
    name, _, flags = spec.partition(":")
    name, _, root = name.partition("@")  # name@dir: the .cuh files from dir/elementwise (e.g. an old copy)
    root = os.path.abspath(root) + "/" if root else ""
    args = make_cpp_args(bf16)
    return load_jit(
        "normvariant", name, *args,
        cuda_files=[f"{root}elementwise/{f}.cuh" for f in ("rmsnorm", "fused_add_rmsnorm", "qknorm")],
        cuda_wrappers=[
            ("rmsnorm", f"rmsnorm<{args}>"),
            ("fused_add_rmsnorm", f"fused_add_rmsnorm<{args}>"),
            ("fused_inplace_qknorm", f"fused_inplace_qknorm<{args}>"),
            ("_set_geometry_override", "set_norm_geometry_override"),
        ] + ([("_set_l2_hint_override", "set_norm_l2_hint_override")] if has_l2_hint(root) else []),
        extra_cuda_cflags=[f for f in flags.split(",") if f],
    )


def use(module):
    N._jit_norm_module = lambda dtype: module
    N._RMSNORM_FNS[bf16] = module.rmsnorm
    N._FUSED_ADD_RMSNORM_FNS[bf16] = module.fused_add_rmsnorm
    N._QKNORM_FNS[bf16] = module.fused_inplace_qknorm


def check(module):
    x = torch.randn(4099, 4096, dtype=bf16, device="cuda")
    w = torch.rand(4096, dtype=bf16, device="cuda") + 0.5
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
    out = N.rmsnorm(x, w)
    err = (out.float() - ref).abs().max().item()
    r = torch.randn_like(x)
    x2, r2 = x.clone(), r.clone()
    N.fused_add_rmsnorm(x2, r2, w)
    s = (x.float() + r.float()).to(bf16).float()
    ref2 = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    err2 = (x2.float() - ref2).abs().max().item()
    return err, err2


def measure_cold_decode():
    """Decode rows as bench_norm builds them: every set its own x, weight, out (and residual)."""
    rows = []
    for n, h in [(1, 4096), (8, 4096), (64, 4096)]:
        sets = []
        for _ in range(num_rotating_sets(4 * n * h + 2 * h)):
            x = torch.randn(n, h, dtype=bf16, device="cuda")
            sets.append((x, torch.rand(h, dtype=bf16, device="cuda") + 0.5, torch.empty_like(x), torch.randn_like(x)))
        rows.append(BenchRow("rmsnorm", f"[{n}, {h}]", "jit bench sets",
                             bench_rotating(lambda x, w, o, r: N.rmsnorm(x, w, out=o), sets)[0], 4 * n * h + 2 * h))
        rows.append(BenchRow("fused_add_rmsnorm", f"[{n}, {h}]", "jit bench sets",
                             bench_rotating(lambda x, w, o, r: N.fused_add_rmsnorm(x, r, w), sets)[0], 8 * n * h + 2 * h))
    return rows


def measure(module, sweep):
    rows = measure_cold_decode()
    decode_only = "--decode-only" in sys.argv
    for n, h in [(1, 4096), (8, 4096), (64, 4096)] + ([] if decode_only else [(16384, 4096), (16384, 8192)]):
        w = torch.rand(h, dtype=bf16, device="cuda") + 0.5
        sets = [(torch.randn(n, h, dtype=bf16, device="cuda"), torch.randn(n, h, dtype=bf16, device="cuda"))
                for _ in range(num_rotating_sets(8 * n * h))]
        out = torch.empty(n, h, dtype=bf16, device="cuda")
        rows.append(BenchRow("rmsnorm", f"[{n}, {h}]", "jit", bench_rotating(lambda x, r: N.rmsnorm(x, w, out=out), sets)[0],
                             4 * n * h + 2 * h))
        if n == 16384:
            rows.append(BenchRow("rmsnorm", f"[{n}, {h}]", "jit out=x", bench_rotating(lambda x, r: N.rmsnorm(x, w, out=x), sets)[0],
                                 4 * n * h + 2 * h))
        if sweep and n < 100:
            for tpr, k, bps in [(512, 1, 0), (256, 2, 0), (128, 4, 0)]:
                module._set_geometry_override(tpr, k, bps)
                rows.append(BenchRow("rmsnorm", f"[{n}, {h}]", f"{tpr}x{k} bps{bps}",
                                     bench_rotating(lambda x, r: N.rmsnorm(x, w, out=out), sets)[0], 4 * n * h + 2 * h))
                rows.append(BenchRow("fused_add_rmsnorm", f"[{n}, {h}]", f"{tpr}x{k} bps{bps}",
                                     bench_rotating(lambda x, r: N.fused_add_rmsnorm(x, r, w), sets)[0], 8 * n * h + 2 * h))
                module._set_geometry_override(0, 0, 0)
        if sweep and n == 16384:
            for tpr, k, bps in [(256, 2, 4), (128, 4, 0)] if h == 4096 else [(512, 2, 0)]:
                module._set_geometry_override(tpr, k, bps)
                rows.append(BenchRow("rmsnorm", f"[{n}, {h}]", f"{tpr}x{k} bps{bps}",
                                     bench_rotating(lambda x, r: N.rmsnorm(x, w, out=out), sets)[0], 4 * n * h + 2 * h))
                module._set_geometry_override(0, 0, 0)
        rows.append(BenchRow("fused_add_rmsnorm", f"[{n}, {h}]", "jit",
                             bench_rotating(lambda x, r: N.fused_add_rmsnorm(x, r, w), sets)[0], 8 * n * h + 2 * h))
        if sweep and n == 16384:
            for tpr, k, bps in [(128, 4, -1)] if h == 4096 else [(512, 2, -1)]:
                module._set_geometry_override(tpr, k, bps)
                rows.append(BenchRow("fused_add_rmsnorm", f"[{n}, {h}]", f"{tpr}x{k} bps{bps}",
                                     bench_rotating(lambda x, r: N.fused_add_rmsnorm(x, r, w), sets)[0], 8 * n * h + 2 * h))
                module._set_geometry_override(0, 0, 0)
        del sets
        torch.cuda.empty_cache()
    qw = torch.rand(128, dtype=bf16, device="cuda") + 0.5
    for n in (1, 64) if decode_only else (1, 64, 16384):
        sets = []
        for _ in range(num_rotating_sets(4 * n * 40 * 128)):
            qkv = torch.randn(n, 48 * 128, dtype=bf16, device="cuda")
            sets.append((qkv[:, : 32 * 128].view(n, 32, 128), qkv[:, 32 * 128 : 40 * 128].view(n, 8, 128)))
        rows.append(BenchRow("qknorm", f"[{n}, 32+8, 128]", "jit",
                             bench_rotating(lambda q, k: N.fused_inplace_qknorm(q, k, qw, qw), sets)[0], 4 * n * 40 * 128 + 512))
        if sweep and n == 1:
            for tpr, k, bps in [(16, 1, 0), (8, 2, 0), (32, 1, 0)]:
                module._set_geometry_override(tpr, k, bps)
                rows.append(BenchRow("qknorm", f"[{n}, 32+8, 128]", f"{tpr}x{k} bps{bps}",
                                     bench_rotating(lambda q, k: N.fused_inplace_qknorm(q, k, qw, qw), sets)[0], 4 * n * 40 * 128 + 512))
                module._set_geometry_override(0, 0, 0)
        if sweep and n == 16384:
            for tpr, k, bps in [(4, 4, 0), (16, 1, 0)]:
                module._set_geometry_override(tpr, k, bps)
                rows.append(BenchRow("qknorm", f"[{n}, 32+8, 128]", f"{tpr}x{k} bps{bps}",
                                     bench_rotating(lambda q, k: N.fused_inplace_qknorm(q, k, qw, qw), sets)[0], 4 * n * 40 * 128 + 512))
                module._set_geometry_override(0, 0, 0)
        del sets
    return rows


def main():
    variants = [a for a in sys.argv[1:] if not a.startswith("--")]
    sweep = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--sweep=")]
    t0 = time.time()
    with ThreadPoolExecutor(len(variants)) as pool:
        modules = dict(zip(variants, pool.map(build, variants)))
    print(f"built {variants} in {time.time() - t0:.1f} s", flush=True)
    roof = copy_roof_gbps()
    for v in variants:
        use(modules[v])
        print(f"== variant {v}: max |err| rmsnorm / fused add vs fp32 ref: {check(modules[v])}", flush=True)
        if "--hazard" in sys.argv:
            from sglang.jit_kernel.benchmark.bench_norm import l2_after_table

            print(l2_after_table(), flush=True)
        if "--no-measure" not in sys.argv:
            print(format_rows(measure(modules[v], v.partition(":")[0] in sweep), roof), flush=True)


if __name__ == "__main__":
    main()
