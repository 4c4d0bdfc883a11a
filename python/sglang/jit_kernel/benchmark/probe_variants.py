"""Same-process A/B of compile-time variants of the bf16 norm module at the issue's sizes.

    python python/sglang/jit_kernel/benchmark/probe_variants.py                       # the package's build only
    python python/sglang/jit_kernel/benchmark/probe_variants.py base: v1:-DMY_SWITCH=1,-DOTHER=2 old@DIR:
        [--sweep=v1 ...] [--hazard] [--no-measure] [--decode-only]

A variant is ``name[@DIR]:flags``: comma-separated extra nvcc flags, and with ``@DIR`` the .cuh
files of ``DIR/elementwise`` instead of the package's (e.g. a copy of ``csrc/`` at an earlier commit,
to put old and new kernels in one process). The kernels carry no switches between experiments: add
``#ifndef MY_SWITCH`` blocks to the .cuh for one, and remove the losers afterwards.

Every variant's module is built in parallel; then each is swapped into norm.py in turn (so calls go
through the public wrappers) and timed: a correctness line (max |err| against fp32 references), then
one table of rows (CUDA-graph medians, GB/s and % of the copy roof of this process). Decode rows
come twice: "jit bench sets" rotate bench_norm's sets (own x, weight and out per set: cold), "jit"
rows rotate x and r over sets with one weight (64 sets of a decode row fit in L2: warm).
``--sweep=name`` adds forced geometries to that variant's table (``TPRxK bpsB``: threads per row x
vectors per thread, B = blocks_per_sm of the override, > 0 a persistent grid, <= 0 the default);
``--hazard`` prints bench_norm.l2_after_table per variant (the next kernel's L2 after each op);
``--no-measure`` skips the table; ``--decode-only`` times the decode sizes only. Without variants
it times the package's own build (automatic geometry). Decode rows of identical code move by up to
0.15 µs between modules (buffer placement, capture mode): build each variant twice to see the
spread (docs/perf_notes.md, sessions 5-7). Not a CI benchmark (no bench_ prefix).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import (
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    exit_unless_gpu,
    format_rows,
    num_rotating_sets,
)
from sglang.jit_kernel.utils import load_jit, make_cpp_args

DTYPE = torch.bfloat16
DECODE_SHAPES = [(1, 4096), (8, 4096), (64, 4096)]
LARGE_SHAPES = [(16384, 4096), (16384, 8192)]
NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
NORM_FILES = ("rmsnorm", "fused_add_rmsnorm", "qknorm")


def _has_export(root: str, symbol: str) -> bool:
    """Whether the kernels under ``root`` (or the package's, when empty) define ``symbol``: the
    override hooks exist only in older copies of the kernels (the package ships none)."""
    folder = f"{root}elementwise" if root else os.path.join(os.path.dirname(N.__file__), "csrc", "elementwise")
    for name in ("rmsnorm.cuh", "norm_rows.cuh"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path) as f:
                if symbol in f.read():
                    return True
    return False


def build(spec: str):
    """The bf16 norm module of one variant spec ``name[@DIR]:flags`` (compiled on first use)."""
    name, _, flags = spec.partition(":")
    name, _, root = name.partition("@")
    root = os.path.abspath(root) + "/" if root else ""
    # Kernels with NormWidths build the wide module: the probe's rows are 16-byte aligned.
    args = make_cpp_args(DTYPE, *(["NormWidths::kWide"] if _has_export(root, "NormWidths") else []))
    wrappers = [
        ("rmsnorm", f"rmsnorm<{args}>"),
        ("fused_add_rmsnorm", f"fused_add_rmsnorm<{args}>"),
        ("fused_inplace_qknorm", f"fused_inplace_qknorm<{args}>"),
    ]
    if _has_export(root, "set_norm_geometry_override"):
        wrappers.append(("_set_geometry_override", "set_norm_geometry_override"))
    if _has_export(root, "set_norm_l2_hint_override"):
        wrappers.append(("_set_l2_hint_override", "set_norm_l2_hint_override"))
    return load_jit(
        "normvariant",
        name,
        *args,
        cuda_files=[f"{root}elementwise/{f}.cuh" for f in NORM_FILES],
        cuda_wrappers=wrappers,
        extra_cuda_cflags=[f for f in flags.split(",") if f],
    )


def use(module) -> None:
    """Route norm.py's bf16 calls (fast and checked paths) to ``module``. norm.py's own ``_load``
    is replaced too: it registers every op of the package's module, some of which a variant (three
    kernel files, perhaps an older copy) does not export."""

    def launched(fn):
        # The fast paths take a launcher's True as "launched"; launchers of older kernel copies
        # return nothing (None), which would send the call down the checked path a second time.
        def call(*args):
            result = fn(*args)
            return True if result is None else result

        return call

    def load(dtype: torch.dtype):
        N._RMSNORM_FNS[dtype] = launched(module.rmsnorm)
        N._FUSED_ADD_RMSNORM_FNS[dtype] = launched(module.fused_add_rmsnorm)
        N._QKNORM_FNS[dtype] = launched(module.fused_inplace_qknorm)
        return module

    N._load_rmsnorm = lambda dtype: load(dtype).rmsnorm
    N._load_fused_add_rmsnorm = lambda dtype: load(dtype).fused_add_rmsnorm
    N._load_qknorm = lambda dtype, across_heads: getattr(
        load(dtype), "fused_inplace_qknorm_across_heads" if across_heads else "fused_inplace_qknorm"
    )
    load(DTYPE)


def max_errors() -> tuple[float, float]:
    """Max |err| of rmsnorm and fused_add_rmsnorm [4099, 4096] against fp32 references."""
    x = torch.randn(4099, 4096, dtype=DTYPE, device="cuda")
    w = torch.rand(4096, dtype=DTYPE, device="cuda") + 0.5
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    err = (N.rmsnorm(x, w).float() - ref).abs().max().item()
    r = torch.randn_like(x)
    x2, r2 = x.clone(), r.clone()
    N.fused_add_rmsnorm(x2, r2, w)
    s = (x.float() + r.float()).to(DTYPE).float()
    ref2 = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    return err, (x2.float() - ref2).abs().max().item()


class Table:
    """Rows of one variant; ``forced`` times a call under a geometry override, then restores it."""

    def __init__(self, module) -> None:
        self.module = module
        self.rows: list[BenchRow] = []

    def add(self, op: str, case: str, label: str, call: Callable, sets: list, nbytes: int) -> None:
        self.rows.append(BenchRow(op, case, label, bench_rotating(call, sets)[0], nbytes))

    def forced(self, geometries, op: str, case: str, call: Callable, sets: list, nbytes: int) -> None:
        if not hasattr(self.module, "_set_geometry_override"):  # kernels without the hook
            return
        for tpr, k, bps in geometries:
            self.module._set_geometry_override(tpr, k, bps)
            try:
                self.add(op, case, f"{tpr}x{k} bps{bps}", call, sets, nbytes)
            finally:
                self.module._set_geometry_override(0, 0, 0)


def cold_decode_rows(table: Table) -> None:
    """Decode rows as bench_norm builds them: every set its own x, weight, out and residual."""
    for n, h in DECODE_SHAPES:
        sets = []
        for _ in range(num_rotating_sets(4 * n * h + 2 * h)):
            x = torch.randn(n, h, dtype=DTYPE, device="cuda")
            sets.append((x, torch.rand(h, dtype=DTYPE, device="cuda") + 0.5, torch.empty_like(x), torch.randn_like(x)))
        table.add(
            "rmsnorm",
            f"[{n}, {h}]",
            "jit bench sets",
            lambda x, w, o, r: N.rmsnorm(x, w, out=o),
            sets,
            4 * n * h + 2 * h,
        )
        table.add(
            "fused_add_rmsnorm",
            f"[{n}, {h}]",
            "jit bench sets",
            lambda x, w, o, r: N.fused_add_rmsnorm(x, r, w),
            sets,
            8 * n * h + 2 * h,
        )


def measure(module, sweep: bool, decode_only: bool = False) -> list[BenchRow]:
    """The table of the norm module now in use (``module``: its geometry override, for sweeps)."""
    table = Table(module)
    cold_decode_rows(table)
    for n, h in DECODE_SHAPES + ([] if decode_only else LARGE_SHAPES):
        case, rms_bytes, fused_bytes = f"[{n}, {h}]", 4 * n * h + 2 * h, 8 * n * h + 2 * h
        w = torch.rand(h, dtype=DTYPE, device="cuda") + 0.5
        sets = [
            (torch.randn(n, h, dtype=DTYPE, device="cuda"), torch.randn(n, h, dtype=DTYPE, device="cuda"))
            for _ in range(num_rotating_sets(8 * n * h))
        ]
        out = torch.empty(n, h, dtype=DTYPE, device="cuda")
        rms = lambda x, r: N.rmsnorm(x, w, out=out)  # noqa: E731
        fused = lambda x, r: N.fused_add_rmsnorm(x, r, w)  # noqa: E731
        table.add("rmsnorm", case, "jit", rms, sets, rms_bytes)
        if n == 16384:
            table.add("rmsnorm", case, "jit out=x", lambda x, r: N.rmsnorm(x, w, out=x), sets, rms_bytes)
        if sweep and n < 100:
            geometries = [(512, 1, 0), (256, 2, 0), (128, 4, 0)]
            table.forced(geometries, "rmsnorm", case, rms, sets, rms_bytes)
            table.forced(geometries, "fused_add_rmsnorm", case, fused, sets, fused_bytes)
        if sweep and n == 16384:
            geometries = [(256, 2, 4), (128, 4, 0)] if h == 4096 else [(512, 2, 0)]
            table.forced(geometries, "rmsnorm", case, rms, sets, rms_bytes)
        table.add("fused_add_rmsnorm", case, "jit", fused, sets, fused_bytes)
        if sweep and n == 16384:
            table.forced(
                [(128, 4, -1)] if h == 4096 else [(512, 2, -1)], "fused_add_rmsnorm", case, fused, sets, fused_bytes
            )
        del sets
        torch.cuda.empty_cache()
    qw = torch.rand(HEAD_DIM, dtype=DTYPE, device="cuda") + 0.5
    heads = NUM_Q_HEADS + NUM_KV_HEADS
    for n in (1, 64) if decode_only else (1, 64, 16384):
        case, nbytes = f"[{n}, {NUM_Q_HEADS}+{NUM_KV_HEADS}, {HEAD_DIM}]", 4 * n * heads * HEAD_DIM + 4 * HEAD_DIM
        sets = []
        for _ in range(num_rotating_sets(4 * n * heads * HEAD_DIM)):
            qkv = torch.randn(n, (heads + NUM_KV_HEADS) * HEAD_DIM, dtype=DTYPE, device="cuda")
            q = qkv[:, : NUM_Q_HEADS * HEAD_DIM].view(n, NUM_Q_HEADS, HEAD_DIM)
            k = qkv[:, NUM_Q_HEADS * HEAD_DIM : heads * HEAD_DIM].view(n, NUM_KV_HEADS, HEAD_DIM)
            sets.append((q, k))
        qknorm = lambda q, k: N.fused_inplace_qknorm(q, k, qw, qw)  # noqa: E731
        table.add("qknorm", case, "jit", qknorm, sets, nbytes)
        if sweep and n == 1:
            table.forced([(16, 1, 0), (8, 2, 0), (32, 1, 0)], "qknorm", case, qknorm, sets, nbytes)
        if sweep and n == 16384:
            table.forced([(4, 4, 0), (16, 1, 0)], "qknorm", case, qknorm, sets, nbytes)
        del sets
    return table.rows


def main() -> None:
    exit_unless_gpu("probe_variants.py")
    specs = [a for a in sys.argv[1:] if not a.startswith("--")]
    swept = {a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--sweep=")}
    decode_only = "--decode-only" in sys.argv
    roof = copy_roof_gbps()
    if not specs:
        module = build("package:")
        use(module)
        print(f"== package build: max |err| rmsnorm / fused add vs fp32 ref: {max_errors()}", flush=True)
        print(format_rows(measure(module, sweep=False, decode_only=decode_only), roof), flush=True)
        return
    t0 = time.time()
    with ThreadPoolExecutor(len(specs)) as pool:
        modules = dict(zip(specs, pool.map(build, specs)))
    print(f"built {specs} in {time.time() - t0:.1f} s", flush=True)
    for spec in specs:
        use(modules[spec])
        print(f"== variant {spec}: max |err| rmsnorm / fused add vs fp32 ref: {max_errors()}", flush=True)
        if "--hazard" in sys.argv:
            from sglang.jit_kernel.benchmark.bench_norm import l2_after_table  # noqa: PLC0415

            print(l2_after_table(), flush=True)
        if "--no-measure" not in sys.argv:
            print(format_rows(measure(modules[spec], spec.partition(":")[0] in swept, decode_only), roof), flush=True)


if __name__ == "__main__":
    main()
