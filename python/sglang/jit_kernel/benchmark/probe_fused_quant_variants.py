"""Same-process A/B of the FP8 fusion kernels against copies of ``csrc/``: rmsnorm_quant and
fused_add_rmsnorm_quant (``elementwise/norm_quant.cuh``), and per_token_group_quant with
``fuse_silu_and_mul`` (``quantization/per_token_group_quant.cuh``).

    python python/sglang/jit_kernel/benchmark/probe_fused_quant_variants.py [--ops norm,act] NAME=DIR[:FLAGS] ...

``NAME=DIR[:FLAGS]`` is a variant built from the kernel files under ``DIR`` (a copy of ``csrc/``:
``git archive`` of an earlier commit, or one with an experimental change) with comma-separated
extra nvcc flags (e.g. ``-DMY_SWITCH=1`` for an ``#ifdef`` in the copy). The package's own build is
the first column and the reference of the bit check: every variant's outputs (q, the scales, the
updated residual) must equal it on the check cases (odd row counts, group sizes 16 to 512, ue8m0,
column-major scales, token and static modes, int8, a NaN, the masked MoE layout). A difference is
printed and the script exits 1 after the tables. Timing: each op family's table, CUDA-graph medians
with cold L2 (``bench_rotating``), GB/s of the op's minimum bytes and % of a 1 GiB copy measured in
the same process. Every call goes through the public wrapper with the module builder swapped for
the variant's, so the launcher's rules (geometry, steps per lane) are the variant's own. Build the
package's code twice (two NAMEs of one copy) to see the spread between modules of identical code.
Not a CI benchmark (no bench_ prefix).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import torch

import sglang.jit_kernel.norm_quant as NQ
import sglang.jit_kernel.per_token_group_quant as PQ
from sglang.jit_kernel.benchmark.utils import (
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    exit_unless_gpu,
    format_rows,
    num_rotating_sets,
)
from sglang.jit_kernel.utils import load_jit, make_cpp_args

FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16
MLP = 14336  # Llama-3-8B intermediate size: the activation input is [T, 2 * MLP]
GROUP = 128


@dataclass(frozen=True)
class Variant:
    """A build of the kernels: ``root`` is a copy of csrc/ ("" for the package's own files)."""

    name: str
    root: str = ""
    flags: tuple[str, ...] = ()


def parse_variant(spec: str) -> Variant:
    """``NAME=DIR[:FLAGS]`` -> Variant; raises SystemExit naming the spec when it is malformed."""
    name, sep, rest = spec.partition("=")
    root, _, flags = rest.partition(":")
    if not sep or not name or not os.path.isdir(root):
        raise SystemExit(f"variant {spec!r}: expected NAME=DIR[:FLAGS] with DIR a copy of csrc/")
    return Variant(name, os.path.abspath(root), tuple(f for f in flags.split(",") if f))


def builders(variant: Variant) -> dict[tuple[ModuleType, str], Callable[..., object]]:
    """The module builders to swap in for ``variant``: (wrapper module, attribute) -> builder."""
    if not variant.root:
        return {}

    def norm(op: str) -> Callable[..., object]:
        @functools.cache
        def build(in_dtype: torch.dtype, out_dtype: torch.dtype) -> object:
            args = make_cpp_args(in_dtype, out_dtype)
            return load_jit(
                f"probe_{op}",
                variant.name,
                *args,
                cuda_files=[os.path.join(variant.root, "elementwise/norm_quant.cuh")],
                cuda_wrappers=[(op, f"norm_quant<{args}, NormKind::{NQ._KINDS[op]}>")],
                extra_cuda_cflags=list(variant.flags),
            )

        return build

    @functools.cache
    def act(in_dtype: torch.dtype, out_dtype: torch.dtype, activation: str) -> object:
        args = make_cpp_args(in_dtype, out_dtype)
        return load_jit(
            f"probe_{PQ._OP}",
            variant.name,
            *args,
            activation,
            cuda_files=[os.path.join(variant.root, "quantization/per_token_group_quant.cuh")],
            cuda_wrappers=[(PQ._OP, f"per_token_group_quant<{args}, {PQ.ACTIVATIONS[activation]}>")],
            extra_cuda_cflags=list(variant.flags),
        )

    return {
        (NQ, "_jit_rmsnorm_quant_module"): norm("rmsnorm_quant"),
        (NQ, "_jit_fused_add_rmsnorm_quant_module"): norm("fused_add_rmsnorm_quant"),
        (PQ, "_jit_module"): act,
    }


@contextlib.contextmanager
def swapped(table: dict[tuple[ModuleType, str], Callable[..., object]]) -> Iterator[None]:
    """Route the wrappers' module builders to ``table``'s for the duration (restored after)."""
    saved = {key: getattr(*key) for key in table}
    for (module, attr), build in table.items():
        setattr(module, attr, build)
    try:
        yield
    finally:
        for (module, attr), build in saved.items():
            setattr(module, attr, build)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as bytes (a contiguous copy), for a bit-exact comparison."""
    return t.contiguous().view(torch.uint8)


def norm_checks() -> Iterator[tuple[str, Callable[[], list[torch.Tensor]]]]:
    """(label, call) pairs of the norm ops; a call returns every output, the residual included."""
    for n, h in [
        (1, 4096),
        (5, 4096),
        (4099, 4096),
        (3, 7168),
        (33, 256),
        (7, 128),
        (9, 16384),
        (2401, 512),
        (1, 2048),
        (601, 2048),
        (1201, 896),
    ]:
        x = torch.randn(n, h, dtype=BF16, device="cuda") * 3
        x[0, 5] = float("nan")
        w = torch.rand(h, dtype=BF16, device="cuda") + 0.5
        r0 = torch.randn(n, h, dtype=BF16, device="cuda")
        for out in (FP8, torch.int8):
            modes = [dict(group_size=128), dict(group_size=64, column_major_scales=True), dict(group_size=16)]
            modes += [dict(group_size=32)]
            modes += [dict(group_size=None), dict(scale=torch.tensor([0.37], device="cuda"))]
            if out == FP8:
                modes.append(dict(group_size=128, scale_ue8m0=True))
            for kw in modes:
                if kw.get("group_size") and h % kw["group_size"]:
                    continue
                label = f"[{n}, {h}] {out} {kw}"

                def plain(x=x, w=w, out=out, kw=kw) -> list[torch.Tensor]:
                    return list(NQ.rmsnorm_quant(x, w, out_dtype=out, **kw))

                def fused(x=x, w=w, r0=r0, out=out, kw=kw) -> list[torch.Tensor]:
                    r = r0.clone()
                    return [*NQ.fused_add_rmsnorm_quant(x, r, w, out_dtype=out, **kw), r]

                yield f"rmsnorm_quant {label}", plain
                yield f"fused_add_rmsnorm_quant {label}", fused


def act_checks() -> Iterator[tuple[str, Callable[[], list[torch.Tensor]]]]:
    """(label, call) pairs of the activation-fused group quant, the masked layout last."""
    combos = [
        (BF16, FP8, "silu"),
        (BF16, torch.int8, "gelu_tanh"),
        (torch.float16, FP8, "gelu"),
        (torch.float32, FP8, "silu"),
    ]
    for dtype, out, activation in combos:
        top = PQ.max_fused_group_size(dtype)
        for t, h, g in [
            (1, MLP, 128),
            (5, 2048, 16),
            (37, 1024, top),
            (300, 7168, 128),
            (64, 256, 64),
            (19, 384, 32),
            (4097, 384, 128),
        ]:
            x = torch.randn(t, 2 * h, dtype=dtype, device="cuda") * 2
            x[-1, 7] = float("nan")
            for mode in PQ.MODES:
                for ue8m0, col in ((False, False), (True, False), (False, True)):
                    if ue8m0 and out != FP8:
                        continue

                    def call(x=x, g=g, ue8m0=ue8m0, out=out, col=col, mode=mode, activation=activation):
                        return list(
                            PQ.per_token_group_quant(
                                x, None, None, g, ue8m0, True, out_dtype=out, column_major_scales=col,
                                silu_and_mul_mode=mode, activation=activation,
                            )
                        )  # fmt: skip

                    yield f"{activation} {dtype} -> {out} [{t}, 2 x {h}] group {g} {mode} ue8m0={ue8m0} col={col}", call
    x = torch.randn(4, 37, 2 * 2048, dtype=BF16, device="cuda")
    masked_m = torch.tensor([0, 5, 37, 20], dtype=torch.int32, device="cuda")

    def masked() -> list[torch.Tensor]:
        q, s = PQ.per_token_group_quant(x, None, None, GROUP, False, True, masked_m, 16)
        # Rows at or past masked_m[e] are not written: compare the computed rows only.
        return [torch.cat([t[e, : int(masked_m[e])].flatten() for e in range(4)]) for t in (q, s)]

    yield "silu masked [4, 37, 2 x 2048], masked_m 0 / 5 / 37 / 20", masked


def bit_check(variants: list[Variant], tables: list[dict], checks: list[tuple[str, Callable]]) -> int:
    """Runs every check under every variant; prints each difference from the first. Returns the count."""
    differ = 0
    for label, call in checks:
        outputs = []
        try:
            for table in tables:
                with swapped(table):
                    outputs.append([as_bytes(t) for t in call()])
        except (RuntimeError, ValueError, TypeError) as error:  # a case some variant refuses
            print(f"# check not run: {label}: {type(error).__name__}: {str(error)[:160]}", flush=True)
            continue
        for variant, got in zip(variants[1:], outputs[1:]):
            if any(not torch.equal(a, b) for a, b in zip(got, outputs[0], strict=True)):
                differ += 1
                print(f"# BITS DIFFER: {variant.name}: {label}", flush=True)
    print(f"# bits: {len(checks)} cases x {len(variants) - 1} variants, {differ} differ", flush=True)
    return differ


def norm_rows(variants: list[Variant], tables: list[dict]) -> list[BenchRow]:
    """rmsnorm_quant / fused_add_rmsnorm_quant group-128 rows at the issue's sizes, per variant."""
    rows = []
    for op, fused in (("rmsnorm_quant", False), ("fused_add_rmsnorm_quant", True)):
        for n, h in [
            (1, 4096),
            (64, 4096),
            (256, 4096),
            (2048, 4096),
            (16384, 4096),
            (16384, 2048),
            (16384, 7168),
            (8192, 8192),
        ]:
            nbytes = n * h * 2 * (3 if fused else 1) + h * 2 + n * h + n * (h // GROUP) * 4
            sets = [
                (
                    torch.randn(n, h, dtype=BF16, device="cuda"),
                    torch.randn(n, h, dtype=BF16, device="cuda") if fused else None,
                    torch.empty(n, h, dtype=FP8, device="cuda"),
                    torch.empty(n, h // GROUP, device="cuda"),
                )
                for _ in range(num_rotating_sets(nbytes))
            ]
            w = torch.rand(h, dtype=BF16, device="cuda") + 0.5

            def call(x, r, q, s, fused=fused, w=w) -> None:
                if fused:
                    NQ.fused_add_rmsnorm_quant(x, r, w, output_q=q, output_s=s)
                else:
                    NQ.rmsnorm_quant(x, w, output_q=q, output_s=s)

            for variant, table in zip(variants, tables):
                with swapped(table):
                    rows.append(BenchRow(op, f"[{n}, {h}]", variant.name, bench_rotating(call, sets)[0], nbytes))
            del sets
    return rows


def act_rows(variants: list[Variant], tables: list[dict]) -> list[BenchRow]:
    """Silu + group-128 quant [T, 2 x 14336] bf16 -> fp8 rows from decode to prefill sizes, per variant."""
    rows = []
    for t in (1, 4, 16, 64, 256, 2048, 16384):
        nbytes = t * 2 * MLP * 2 + t * MLP + t * (MLP // GROUP) * 4
        sets = [
            (
                torch.randn(t, 2 * MLP, dtype=BF16, device="cuda"),
                torch.empty(t, MLP, dtype=FP8, device="cuda"),
                torch.empty(t, MLP // GROUP, device="cuda"),
            )
            for _ in range(num_rotating_sets(nbytes))
        ]

        def call(x, q, s) -> None:
            PQ.per_token_group_quant(x, q, s, GROUP, False, True)

        for variant, table in zip(variants, tables):
            with swapped(table):
                rows.append(
                    BenchRow("silu + group quant", f"T={t}", variant.name, bench_rotating(call, sets)[0], nbytes)
                )
        del sets
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help="NAME=DIR[:FLAGS]: a copy of csrc/ and extra nvcc flags")
    parser.add_argument("--ops", default="norm,act", help="comma-separated families: norm, act")
    args = parser.parse_args()  # --help and argument errors work without a GPU
    families = set(args.ops.split(","))
    if not families <= {"norm", "act"}:
        raise SystemExit(f"--ops: expected names from norm, act, got {args.ops!r}")
    variants = [Variant("package"), *map(parse_variant, args.variants)]
    exit_unless_gpu(__file__)  # before anything imports triton, which a CPU-only install lacks
    tables = [builders(v) for v in variants]
    checks = (list(norm_checks()) if "norm" in families else []) + (list(act_checks()) if "act" in families else [])
    differ = bit_check(variants, tables, checks)
    roof = copy_roof_gbps()
    rows = (norm_rows(variants, tables) if "norm" in families else []) + (
        act_rows(variants, tables) if "act" in families else []
    )
    print(format_rows(rows, roof))
    if differ:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
