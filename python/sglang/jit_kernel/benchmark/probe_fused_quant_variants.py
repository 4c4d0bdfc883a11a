"""Same-process A/B of the FP8 fusion kernels against copies of ``csrc/``: rmsnorm_quant and
fused_add_rmsnorm_quant (``elementwise/norm_quant.cuh``), per_token_group_quant with
``fuse_silu_and_mul`` (``quantization/per_token_group_quant.cuh``), and apply_rope_inplace_with_kvcache
into fp8 and bf16 caches (``elementwise/rope_fp8_kvcache.cuh``, ``elementwise/rope.cuh``).

    python python/sglang/jit_kernel/benchmark/probe_fused_quant_variants.py [--ops norm,act,rope] NAME=DIR[:FLAGS] ...

``NAME=DIR[:FLAGS]`` is a variant built from the kernel files under ``DIR`` (a copy of ``csrc/``:
``git archive`` of an earlier commit, or one with an experimental change) with comma-separated
extra nvcc flags (e.g. ``-DMY_SWITCH=1`` for an ``#ifdef`` in the copy). The package's own build is
the first column and the reference of the bit check: every variant's outputs (q, the scales, the
updated residual) must equal it on the check cases (odd row counts, group sizes 16 to 512, ue8m0,
column-major scales, token and static modes, int8, a NaN, the masked MoE layout; for rope, q, k and
both caches over NeoX / GPT-J, partial rotation, device and inverse scales, an unaligned view, and
more heads than a CTA's v rows leave room for). A difference is
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
import sglang.jit_kernel.rope as R
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

    @functools.cache
    def rope_kv(dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> object:
        args = make_cpp_args(dtype)
        op = "apply_rope_inplace_with_kvcache"
        fp8 = cache_dtype not in (None, dtype)
        return load_jit(
            f"probe_{op}{'_fp8' if fp8 else ''}",
            variant.name,
            *args,
            cuda_files=[os.path.join(variant.root, f"elementwise/{'rope_fp8_kvcache' if fp8 else 'rope'}.cuh")],
            cuda_wrappers=[(op, f"{op}{'_fp8' if fp8 else ''}<{args}>")],
            extra_cuda_cflags=list(variant.flags),
        )

    return {
        (NQ, "_jit_rmsnorm_quant_module"): norm("rmsnorm_quant"),
        (NQ, "_jit_fused_add_rmsnorm_quant_module"): norm("fused_add_rmsnorm_quant"),
        (PQ, "_jit_module"): act,
        (R, "_jit_apply_rope_inplace_with_kvcache_module"): rope_kv,
    }


@contextlib.contextmanager
def swapped(table: dict[tuple[ModuleType, str], Callable[..., object]]) -> Iterator[None]:
    """Route the wrappers' module builders to ``table``'s for the duration (restored after)."""
    # rope's launcher memo holds the loaded functions: an empty one for the duration
    table = {**table, (R, "_ROPE_KV_FNS"): {}} if table else table
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
            if out == FP8:  # per token, static and ue8m0: fp8 only
                modes += [dict(group_size=None), dict(scale=torch.tensor([0.37], device="cuda"))]
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


HQ, HK, HEAD_DIM, MAX_POS = 32, 8, 128, 8192  # the decode layer's attention heads


def rope_inputs(n: int, hq: int, hk: int, d: int, slots: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k, v [n, heads, d] bf16, positions and distinct random cache rows (int64) of ``slots``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(n, h, d, device="cuda", generator=g).to(BF16) for h in (hq, hk, hk))
    positions = torch.randint(0, MAX_POS, (n,), device="cuda", generator=g)
    loc = torch.randperm(slots, device="cuda", generator=g)[:n]
    return q, k, v, positions, loc


def rope_checks() -> Iterator[tuple[str, Callable[[], list[torch.Tensor]]]]:
    """(label, call) pairs of apply_rope_inplace_with_kvcache; a call returns q, k and both caches."""
    for n, hq, hk, d, r in [
        (1, HQ, HK, HEAD_DIM, 0),
        (5, HQ, HK, HEAD_DIM, 0),
        (300, HQ, HK, HEAD_DIM, 64),
        (4099, HQ, HK, HEAD_DIM, 0),
        (33, 64, 64, HEAD_DIM, 0),  # 128 heads of 8 lanes fill a CTA: no v rows
        (2049, 64, 64, HEAD_DIM, 0),
        (7, 16, 2, 256, 128),
    ]:
        for neox in (True, False):
            for cache_dtype, scales in (
                (BF16, {}),
                (FP8, {"k_scale": torch.tensor([0.37], device="cuda"), "v_inv_scale": 1 / 1.7}),
                (FP8, {}),
            ):
                for unaligned in (False, True) if n == 5 else (False,):
                    label = f"rope+kv [{n}, {hq}+{hk}, {d}] rope_dim {r} neox={neox} {cache_dtype} {sorted(scales)}"
                    label += " unaligned" if unaligned else ""

                    def call(
                        n=n, hq=hq, hk=hk, d=d, r=r, neox=neox, cache_dtype=cache_dtype, scales=scales, u=unaligned
                    ):
                        q, k, v, positions, loc = rope_inputs(n, hq, hk, d, 2 * n + 3)
                        if u:  # every tensor one element off 16 bytes: the narrow kernels
                            q, k, v = (torch.cat([x.new_zeros(n, x.shape[1], 1), x], -1)[..., 1:] for x in (q, k, v))
                        k_cache = torch.zeros(2 * n + 3, hk * d, dtype=cache_dtype, device="cuda")
                        v_cache = torch.zeros_like(k_cache)
                        cos_sin = R.make_cos_sin_cache(MAX_POS, r or d)
                        R.apply_rope_inplace_with_kvcache(
                            q, k, v, k_cache, v_cache, cos_sin, positions, loc, is_neox=neox, rope_dim=r, **scales
                        )
                        return [q, k, k_cache, v_cache]

                    yield label, call


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


def rope_rows(variants: list[Variant], tables: list[dict]) -> list[BenchRow]:
    """apply_rope_inplace_with_kvcache [T, 32 + 8 heads, 128] bf16 into bf16 and fp8 caches (random
    rows of 2T + 4096 slots), per variant."""
    rows = []
    cos_sin = R.make_cos_sin_cache(MAX_POS, HEAD_DIM)
    for fp8 in (True, False):
        scales = {"k_scale": torch.tensor([0.37], device="cuda"), "v_inv_scale": 1 / 1.7} if fp8 else {}
        for n in (1, 64, 256, 2048, 16384):
            slots = 2 * n + 4096
            cache_element = 1 if fp8 else 2
            nbytes = 2 * n * (HQ + HK) * HEAD_DIM * 2 + n * HEAD_DIM * 4 + n * 8  # rotation
            nbytes += n * HK * HEAD_DIM * 2 + 2 * n * HK * HEAD_DIM * cache_element + n * 8  # v, caches, out_loc
            k_cache = torch.zeros(slots, HK * HEAD_DIM, dtype=FP8 if fp8 else BF16, device="cuda")
            v_cache = torch.zeros_like(k_cache)
            sets = [rope_inputs(n, HQ, HK, HEAD_DIM, slots, seed=i) for i in range(num_rotating_sets(nbytes))]

            def call(q, k, v, positions, loc, k_cache=k_cache, v_cache=v_cache, scales=scales) -> None:
                R.apply_rope_inplace_with_kvcache(
                    q, k, v, k_cache, v_cache, cos_sin, positions, loc, is_neox=True, **scales
                )  # fmt: skip

            op = f"rope + kv {'e4m3' if fp8 else 'bf16'}"
            for variant, table in zip(variants, tables):
                with swapped(table):
                    rows.append(BenchRow(op, f"[{n}, 32+8, 128]", variant.name, bench_rotating(call, sets)[0], nbytes))
            del sets, k_cache, v_cache
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help="NAME=DIR[:FLAGS]: a copy of csrc/ and extra nvcc flags")
    parser.add_argument("--ops", default="norm,act,rope", help="comma-separated families: norm, act, rope")
    args = parser.parse_args()  # --help and argument errors work without a GPU
    families = set(args.ops.split(","))
    if not families <= {"norm", "act", "rope"}:
        raise SystemExit(f"--ops: expected names from norm, act, rope, got {args.ops!r}")
    variants = [Variant("package"), *map(parse_variant, args.variants)]
    exit_unless_gpu(__file__)  # before anything imports triton, which a CPU-only install lacks
    tables = [builders(v) for v in variants]
    checks = (list(norm_checks()) if "norm" in families else []) + (list(act_checks()) if "act" in families else [])
    checks += list(rope_checks()) if "rope" in families else []
    differ = bit_check(variants, tables, checks)
    roof = copy_roof_gbps()
    rows = (norm_rows(variants, tables) if "norm" in families else []) + (
        act_rows(variants, tables) if "act" in families else []
    )
    rows += rope_rows(variants, tables) if "rope" in families else []
    print(format_rows(rows, roof))
    if differ:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
