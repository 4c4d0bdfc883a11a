"""Probe: the floor of concat_mla_k's byte mix at large sizes (issue 17: >= 97 % of copy at 16384
tokens; the op reached 94.3 % and sglang 0.5.23 93.7 % in one H200 run).

k [T, 128, 192] <- k_nope [T, 128, 128], k_rope [T, 1, 64] bf16 moves 2 bytes read for 3 written
(T * (128 * 192 * 2 + 128 * 128 * 2 + 64 * 2) bytes, the op's count). Each row counts its own bytes. Rows, cold (inputs
rotated past 4x the L2), CUDA-graph median, % of the 1 GiB bf16 device copy (1:1 read / write):
  concat_mla_k       the op (default kernel)
  floor 3:2          probe_concat_floor.cuh: each warp reads 64 contiguous 16-byte vectors and writes
                     96 contiguous ones (512-byte warp accesses): the same mix, no layout, no rope rows
  torch zero_ k      a memset of k alone (write only: the write side's rate)
  torch copy k_nope  a same-dtype copy of k_nope into a [T, 128, 128] buffer (1:1, the copy roof's mix
                     at this size)
  torch copy+fill k  the same bytes as "floor 3:2" on the op's own buffers by torch's kernels: a
                     contiguous copy of k_nope into k's first bytes, then a fill of the rest of k
If "floor 3:2" is below 97 % of the copy, the target is above what this mix of bytes reaches here.
Not a CI benchmark (no bench_ prefix); on a GPU machine:

Run: python -m sglang.jit_kernel.benchmark.probe_concat_floor
"""

from __future__ import annotations

import os

import torch

import sglang.jit_kernel.benchmark.utils as bench
from sglang.jit_kernel.utils import load_jit

TOKENS = (4096, 16384)
HEADS, NOPE, ROPE = 128, 128, 64
PROBE_CUH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_concat_floor.cuh")


def op_bytes(t: int) -> int:
    return t * (HEADS * (NOPE + ROPE) * 2 + HEADS * NOPE * 2 + ROPE * 2)


def make_set(t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    bf16 = torch.bfloat16
    return (
        torch.empty(t, HEADS, NOPE + ROPE, dtype=bf16, device="cuda"),
        torch.randn(t, HEADS, NOPE, device="cuda").to(bf16),
        torch.randn(t, 1, ROPE, device="cuda").to(bf16),
    )


def check(probe) -> None:
    """Warp w of the floor kernel writes src vectors [64w, 64w + 64) and then [64w, 64w + 32) to dst
    vectors [96w, 96w + 96) (two warps here)."""
    src = torch.randn(8, 128, device="cuda").to(torch.bfloat16)  # 128 vectors of 8 bf16: 64 pairs
    dst = torch.full((8, 192), float("nan"), dtype=torch.bfloat16, device="cuda")
    probe.concat_floor(src, dst)
    s, d = src.view(-1, 8), dst.view(-1, 8)
    for w in range(2):
        assert torch.equal(d[96 * w : 96 * w + 64], s[64 * w : 64 * w + 64])
        assert torch.equal(d[96 * w + 64 : 96 * w + 96], s[64 * w : 64 * w + 32])


def copy_fill(k: torch.Tensor, k_nope: torch.Tensor) -> None:
    """k's storage: its first k_nope.numel() elements <- k_nope (a contiguous 1:1 copy), the rest
    zero-filled: the reads and writes of concat_mla_k without its layout."""
    flat = k.view(-1)
    flat[: k_nope.numel()].copy_(k_nope.view(-1))
    flat[k_nope.numel() :].zero_()


def main() -> None:
    bench.exit_unless_gpu("probe_concat_floor.py")
    from sglang.jit_kernel.concat_mla import concat_mla_k  # noqa: PLC0415

    probe = load_jit("probe_concat_floor", cuda_files=[PROBE_CUH], cuda_wrappers=[("concat_floor", "concat_floor")])
    check(probe)
    roof = bench.copy_roof_gbps()
    rows = []
    for t in TOKENS:
        nbytes = op_bytes(t)
        case = f"[{t}, {HEADS}, {NOPE}+{ROPE}] cold"
        sets = [make_set(t) for _ in range(bench.num_rotating_sets(nbytes))]
        k_bytes = t * HEADS * (NOPE + ROPE) * 2
        calls = {  # label: (call, bytes counted)
            "concat_mla_k": (lambda k, n, r: concat_mla_k(k, n, r), nbytes),
            "floor 3:2": (lambda k, n, r: probe.concat_floor(n, k), nbytes - t * ROPE * 2),
            "torch zero_ k": (lambda k, n, r: k.zero_(), k_bytes),
            # the op's bytes (less the rope rows) by torch's own kernels on the same buffers: k_nope
            # copied contiguously into the first nope bytes of k's storage, the rest of k filled
            "torch copy+fill k": (lambda k, n, r: copy_fill(k, n), nbytes - t * ROPE * 2),
        }
        for label, (call, counted) in calls.items():
            rows.append(bench.BenchRow(label, case, "", bench.bench_rotating(call, sets)[0], counted))
        copies = [(torch.empty_like(n), n) for _, n, _ in sets]
        median = bench.bench_rotating(lambda dst, src: dst.copy_(src), copies)[0]
        rows.append(bench.BenchRow("torch copy k_nope", case, "1:1", median, 2 * t * HEADS * NOPE * 2))
        del sets, copies
        torch.cuda.empty_cache()
    print(
        "# bytes: each row its own (the op's count; the floor's without the rope rows; zero_ k's writes; the copy's read + write)"
    )
    print(bench.format_rows(rows, roof))


if __name__ == "__main__":
    main()
