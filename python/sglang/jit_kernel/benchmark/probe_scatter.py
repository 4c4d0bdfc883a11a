"""Probe: the floor of a row scatter. Times store_cache and set_mla_kv_buffer (the same kernels and
bytes) with different slot maps, so that only the destination pattern changes:

  random      distinct random slots of a [4T + 1]-slot cache (bench_kvcache's case)
  sorted      the same slots, sorted ascending
  identity    slot i = i into a [T]-slot cache: a contiguous copy of the same bytes through the kernel
  identity 4T slot i = i into the [4T + 1]-slot cache (the same footprint as random, written in order)

at the bench's sizes and at 4x the tokens (to separate the fixed launch / ramp / tail cost of a
~40 MB call from the rate). Each size also gets a "torch copy" row: one torch copy_ of a contiguous
tensor holding the op's source bytes into a contiguous destination of the same size (reads and
writes what the op does, less the indices, in one launch): the roof for a call of that size, against which the "identity"
(our kernel, contiguous slots) and "random" rows are read. Every row of one op and size has the
same bytes (the op's formula), so the % columns compare directly.
CUDA-graph median, inputs rotated past 4x the L2 (benchmark.utils.bench_rotating); % of the copy roof
(1 GiB device copy) as the benches print it. If "identity" reaches the roof and "random" does not,
the gap is the scatter pattern (the DRAM page / L2 set behaviour of 2 KiB or 1152-byte rows at random
slots), not the kernel.

Run: python -m sglang.jit_kernel.benchmark.probe_scatter
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.benchmark.utils import (
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    exit_unless_gpu,
    format_rows,
    num_rotating_sets,
)
from sglang.jit_kernel.kvcache import _load

DTYPE = torch.bfloat16
ROW = 8 * 128
NOPE, ROPE = 512, 64
PATTERNS = ("random", "sorted", "identity", "identity 4T")


def torch_copy_row(op: str, case: str, src_bytes: int, nbytes: int) -> BenchRow:
    """One contiguous copy_ of ``src_bytes`` bytes (as bf16), rotated like the op's rows; counted with
    the op's ``nbytes`` so that its % column reads against theirs."""
    numel = src_bytes // 2
    sets = [
        (torch.randn(numel, dtype=DTYPE, device="cuda"), torch.empty(numel, dtype=DTYPE, device="cuda"))
        for _ in range(num_rotating_sets(2 * src_bytes))
    ]
    median, _, _ = bench_rotating(lambda src, dst: dst.copy_(src), sets)
    del sets
    torch.cuda.empty_cache()
    return BenchRow(op, case, "torch copy (same bytes)", median, nbytes)


def slot_map(pattern: str, t: int) -> tuple[int, torch.Tensor]:
    """(num_slots, indices [t] int64) of a pattern."""
    if pattern == "identity":
        return t, torch.arange(t, device="cuda")
    if pattern == "identity 4T":
        return 4 * t + 1, torch.arange(t, device="cuda")
    slots = 4 * t + 1
    idx = torch.randperm(slots, device="cuda")[:t]
    return slots, (idx.sort().values if pattern == "sorted" else idx)


def store_rows(t: int) -> list[BenchRow]:
    launch = _load("store_cache", torch.int64, "wide")
    nbytes = 2 * t * (ROW + ROW) * 2 + t * 8
    rows = []
    for pattern in PATTERNS:
        sets = []
        for _ in range(num_rotating_sets(nbytes)):
            slots, idx = slot_map(pattern, t)
            k, v = (torch.randn(t, ROW, dtype=DTYPE, device="cuda") for _ in range(2))
            k_cache, v_cache = (torch.zeros(slots, ROW, dtype=DTYPE, device="cuda") for _ in range(2))
            sets.append((k, v, k_cache, v_cache, idx))
        median, _, _ = bench_rotating(lambda k, v, kc, vc, idx: launch(k, v, kc, vc, idx, 0, 0), sets)
        rows.append(BenchRow("store_cache", f"[{t}, {ROW}]", pattern, median, nbytes))
        del sets
        torch.cuda.empty_cache()
    rows.append(torch_copy_row("store_cache", f"[{t}, {ROW}]", 2 * t * ROW * 2, nbytes))
    return rows


def mla_rows(t: int) -> list[BenchRow]:
    launch = _load("set_mla_kv_buffer")
    nbytes = 2 * t * (NOPE + ROPE) * 2 + t * 8
    rows = []
    for pattern in PATTERNS:
        sets = []
        for _ in range(num_rotating_sets(nbytes)):
            slots, loc = slot_map(pattern, t)
            kv = torch.zeros(slots, 1, NOPE + ROPE, dtype=DTYPE, device="cuda")
            k_nope = torch.randn(t, 1, NOPE, dtype=DTYPE, device="cuda")
            k_rope = torch.randn(t, 1, ROPE, dtype=DTYPE, device="cuda")
            sets.append((kv, loc, k_nope, k_rope))
        median, _, _ = bench_rotating(launch, sets)
        rows.append(BenchRow("set_mla_kv_buffer", f"[{t}, {NOPE}+{ROPE}]", pattern, median, nbytes))
        del sets
        torch.cuda.empty_cache()
    rows.append(torch_copy_row("set_mla_kv_buffer", f"[{t}, {NOPE}+{ROPE}]", t * (NOPE + ROPE) * 2, nbytes))
    return rows


def main() -> None:
    exit_unless_gpu("probe_scatter.py")
    roof = copy_roof_gbps()
    rows = store_rows(16384) + store_rows(65536) + mla_rows(16384) + mla_rows(65536)
    print(format_rows(rows, roof))


if __name__ == "__main__":
    main()
