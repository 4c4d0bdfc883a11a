"""Probe: the floor of silu_and_mul's access pattern at decode and mid sizes (issue 15's T = 64 target,
<= 1.5 us; the figures are in docs/perf_notes.md).

input [T, 2 x 14336] bf16 -> out [T, 14336] bf16, the op's bytes (3 * T * H * 2). Rows:
  silu_and_mul         the op (its kernel and launch geometry)
  floor v<N> t<K> pdl  probe_activation_floor.cuh: the same 16-byte loads and stores with one bf16
                       add per element as the whole compute; N vectors per thread (all loads before
                       any store), K threads per CTA, a one-shot grid; PDL on as the op launches it
  floor v1 t256        the same without PDL
  sfu v<N> t<K> pdl    the same loads and stores with silu's least arithmetic per element (ex2.approx,
                       rcp.approx: the two special-function operations every silu needs, 3 fp32
                       instructions around them); T <= 2048 only. The smallest of these rows bounds the
                       op by its bytes plus its special-function work (the op: 5 fp32 + the same 2)
"one input" rows replay one input set in a CUDA graph (the tutorial's method, the issue's numbers;
L2-resident up to T = 2048), "cold" rows rotate sets past 4x the L2. The smallest floor row at a T
is the fastest this access pattern was seen to go; the op's distance to it is what its arithmetic
and geometry cost, and a target below it is below the floor of moving these bytes this way.
Not a CI benchmark (no bench_ prefix); on a GPU machine:

Run: python -m sglang.jit_kernel.benchmark.probe_activation_floor
"""

from __future__ import annotations

import os

import torch

from sglang.jit_kernel.benchmark.utils import (
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    exit_unless_gpu,
    format_rows,
    num_rotating_sets,
)
from sglang.jit_kernel.utils import load_jit

HIDDEN = 14336
TOKENS = (1, 64, 2048, 16384)
#: (vectors per thread, threads per CTA, PDL, silu arithmetic)
FLOOR_CONFIGS = [(1, 256, False, False)] + [(v, t, True, False) for v in (1, 2, 4) for t in (128, 256, 512)]
SFU_CONFIGS = [(1, t, True, True) for t in (64, 128, 256, 512)] + [
    (v, t, True, True) for v in (2, 4) for t in (128, 256, 1024)
]
PROBE_CUH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_activation_floor.cuh")


def make_set(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(t, 2 * HIDDEN, device="cuda").to(torch.bfloat16), torch.empty(
        t, HIDDEN, dtype=torch.bfloat16, device="cuda"
    )


def mode_of(vecs: int, pdl: bool, sfu: bool) -> int:
    return vecs | (16 if pdl else 0) | (32 if sfu else 0)


def label_of(vecs: int, threads: int, pdl: bool, sfu: bool) -> str:
    return f"{'sfu' if sfu else 'floor'} v{vecs} t{threads}" + (" pdl" if pdl else "")


def check(probe) -> None:
    """Every floor configuration writes gate + up (bf16 add) to every element; every sfu one
    silu(gate) * up within 2 bf16 ulps (its approximate exp and reciprocal)."""
    x, out = make_set(64)
    gate, up = x[:, :HIDDEN].float(), x[:, HIDDEN:].float()
    want_add = x[:, :HIDDEN] + x[:, HIDDEN:]
    want_silu = ((gate * torch.sigmoid(gate)).to(torch.bfloat16).float() * up).to(torch.bfloat16)
    for vecs, threads, pdl, sfu in FLOOR_CONFIGS + SFU_CONFIGS:
        out.fill_(float("nan"))
        probe.act_floor(x, out, mode_of(vecs, pdl, sfu), threads)
        label = label_of(vecs, threads, pdl, sfu)
        if sfu:
            torch.testing.assert_close(out, want_silu, rtol=2**-7, atol=1e-30, msg=lambda m: f"{label}: {m}")
        else:
            assert torch.equal(out, want_add), f"{label}: wrong output"


def main() -> None:
    exit_unless_gpu("probe_activation_floor.py")
    from sglang.jit_kernel.activation import silu_and_mul  # noqa: PLC0415

    probe = load_jit("probe_activation_floor", cuda_files=[PROBE_CUH], cuda_wrappers=[("act_floor", "act_floor")])
    check(probe)
    roof = copy_roof_gbps()
    rows = []
    for t in TOKENS:
        nbytes = 3 * t * HIDDEN * 2
        for kind, sets in (
            ("one input", [make_set(t)]),
            ("cold", [make_set(t) for _ in range(num_rotating_sets(nbytes))]),
        ):
            if kind == "cold" and t < 2048:
                continue  # decode rows: the one-input rows are the issue's
            case = f"[{t}, 2 x {HIDDEN}] {kind}"
            median, _, _ = bench_rotating(lambda x, o: silu_and_mul(x, o), sets)
            rows.append(BenchRow("silu_and_mul", case, "op", median, nbytes))
            for vecs, threads, pdl, sfu in FLOOR_CONFIGS + (SFU_CONFIGS if t <= 2048 else []):
                mode = mode_of(vecs, pdl, sfu)

                def call(x, o, mode=mode, threads=threads) -> None:
                    probe.act_floor(x, o, mode, threads)

                median, _, _ = bench_rotating(call, sets)
                rows.append(
                    BenchRow("sfu" if sfu else "floor", case, label_of(vecs, threads, pdl, sfu), median, nbytes)
                )
            del sets
            torch.cuda.empty_cache()
    print(format_rows(rows, roof))


if __name__ == "__main__":
    main()
