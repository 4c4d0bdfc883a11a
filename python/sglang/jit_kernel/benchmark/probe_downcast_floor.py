"""Probe: the floor of downcast_fp8's access pattern. k, v [T, H, 128] bf16 into [S, H, 128] e4m3 caches;
every row of one size is counted with the op's bytes, 2*T*H*D*(2 + 1) + T*8 (read bf16, write one byte
per element, read loc), so the % columns compare directly:

  random        downcast_fp8 (default: the lean kernel), distinct random slots of a [4T + 1]-slot cache (the bench's case)
  sorted        the same slots, sorted ascending
  identity      slot i = i into a [T]-slot cache: the kernel's compute with contiguous writes
  identity 4T   slot i = i into the [4T + 1]-slot cache (random's footprint, written in order)
  floor <mode> <pattern>
                probe_downcast_floor.cuh: the same reads and writes (one byte per element, the high byte
                of each bf16: no scale, no division), on random or identity slots, in three lane layouts:
                "flat layout" (the lean kernel's: two 16-byte loads 16 bytes apart, each warp
                instruction using half of every sector it touches, one 16-byte store), "coalesced x1"
                (one 16-byte load, one 8-byte store), "coalesced x2" (two 16-byte loads,
                two 8-byte stores, every sector fully used)
  torch cast (same bytes)
                one torch copy_ of a contiguous [2T, H, 128] bf16 tensor into a float8_e4m3fn tensor of
                the same shape: one elementwise launch that reads 2 bytes and writes 1 byte per element
                (dtype conversion inside the copy kernel, no division), contiguous, no indices. A graph
                keeps it a kernel (only same-dtype copies become memcpy nodes). The bf16 -> e4m3 cast
                is torch's, not ours; what it measures is the bytes moved in one launch.

What the rows tell: "floor flat layout random" against "floor coalesced x2 random" is the cost of the
default's load layout alone; "floor ... random" against "floor ... identity" the cost of 1 KiB rows at
random slots; "random" against "floor flat layout random" the cost of the kernel's compute (division,
rounding, index checks); "torch cast" the rate a one-launch contiguous pass of these bytes reaches.
Sizes: [16384, 8, 128] (the bench's), [65536, 8, 128] (4x: the fixed launch / ramp / tail cost of a
~100 MB call against the rate) and [64, 32, 128] (decode). CUDA-graph median of one 20 ms capture per
row (decode rows are therefore noisier than the benches' middle of five), inputs rotated past 4x the L2
(benchmark.utils.bench_rotating); % of the copy roof (1 GiB device copy). The first run compiles
the probe module (~25 s of nvcc; cached afterwards); the timing itself takes ~15 s on an H200.

Run: python -m sglang.jit_kernel.benchmark.probe_downcast_floor
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
from sglang.jit_kernel.cast import downcast_fp8
from sglang.jit_kernel.utils import load_jit

DTYPE = torch.bfloat16
HEAD_DIM = 128
#: (tokens, kv heads)
SIZES = ((16384, 8), (4 * 16384, 8), (64, 32))
PATTERNS = ("random", "sorted", "identity", "identity 4T")
#: probe_downcast_floor.cuh mode -> label
FLOOR_MODES = {0: "flat layout", 1: "coalesced x1", 2: "coalesced x2"}
#: Graph replay per capture (ms) and captures per row: a short probe (bench_rotating's defaults, 50 ms
#: and five captures below 5 us, would take over a minute for these ~40 rows).
REP_MS = 20
CAPTURES = 1
PROBE_CUH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_downcast_floor.cuh")


def bytes_moved(t: int, h: int) -> int:
    """downcast_fp8's bytes: read k and v in bf16, write one byte per element of each, read loc."""
    return 2 * t * h * HEAD_DIM * (2 + 1) + t * 8


def slot_map(pattern: str, t: int) -> tuple[int, torch.Tensor]:
    """(num_slots, loc [t] int64) of a pattern."""
    if pattern == "identity":
        return t, torch.arange(t, device="cuda")
    if pattern == "identity 4T":
        return 4 * t + 1, torch.arange(t, device="cuda")
    slots = 4 * t + 1
    loc = torch.randperm(slots, device="cuda")[:t]
    return slots, (loc.sort().values if pattern == "sorted" else loc)


def make_sets(pattern: str, t: int, h: int) -> list[tuple]:
    """Rotating sets (k, v, k_out, v_out, k_scale, v_scale, loc) as bench_downcast_fp8 makes them."""
    sets = []
    for _ in range(num_rotating_sets(bytes_moved(t, h))):
        slots, loc = slot_map(pattern, t)
        k, v = ((torch.randn(t, h, HEAD_DIM, device="cuda") * 50).to(DTYPE) for _ in range(2))
        k_out, v_out = (torch.zeros(slots, h, HEAD_DIM, dtype=torch.uint8, device="cuda") for _ in range(2))
        scales = torch.tensor([0.37, 1.7], device="cuda")
        sets.append((k, v, k_out, v_out, scales[0:1], scales[1:2], loc))
    return sets


def check_floor(probe, s: tuple) -> None:
    """Each floor mode writes the high byte of every bf16 into its row (the probe's contract)."""
    k, v, k_out, v_out, _, _, loc = s
    for mode in FLOOR_MODES:
        k_out.zero_()
        v_out.zero_()
        probe.downcast_floor(k, v, k_out, v_out, loc, mode)
        for x, out in ((k, k_out), (v, v_out)):
            expected = (x.view(torch.int16) >> 8).to(torch.uint8)
            assert torch.equal(out[loc], expected), f"floor mode {mode}: wrong bytes"


def size_rows(probe, t: int, h: int) -> list[BenchRow]:
    case = f"[{t}, {h}, {HEAD_DIM}]"
    nbytes = bytes_moved(t, h)
    rows = []
    for pattern in PATTERNS:
        sets = make_sets(pattern, t, h)
        median, _, _ = bench_rotating(downcast_fp8, sets, REP_MS, CAPTURES)
        rows.append(BenchRow("downcast_fp8", case, pattern, median, nbytes))
        if pattern in ("random", "identity"):
            check_floor(probe, sets[0])
            for mode, label in FLOOR_MODES.items():

                def call(k, v, k_out, v_out, ks, vs, loc, mode=mode) -> None:
                    probe.downcast_floor(k, v, k_out, v_out, loc, mode)

                median, _, _ = bench_rotating(call, sets, REP_MS, CAPTURES)
                rows.append(BenchRow("downcast floor", case, f"{label} {pattern}", median, nbytes))
        del sets
        torch.cuda.empty_cache()
    numel = 2 * t * h * HEAD_DIM
    casts = [
        (torch.randn(numel, device="cuda").to(DTYPE), torch.empty(numel, dtype=torch.float8_e4m3fn, device="cuda"))
        for _ in range(num_rotating_sets(nbytes))
    ]
    median, _, _ = bench_rotating(lambda src, dst: dst.copy_(src), casts, REP_MS, CAPTURES)
    rows.append(BenchRow("torch", case, "cast (same bytes)", median, nbytes))
    del casts
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    exit_unless_gpu("probe_downcast_floor.py")
    probe = load_jit(
        "probe_downcast_floor", cuda_files=[PROBE_CUH], cuda_wrappers=[("downcast_floor", "downcast_floor")]
    )
    roof = copy_roof_gbps()
    rows = []
    for t, h in SIZES:
        rows += size_rows(probe, t, h)
    print(format_rows(rows, roof))


if __name__ == "__main__":
    main()
