"""Benchmark the MoE routing ops against torch (eager and torch.compile), and sgl_kernel when it is
importable (the sglang comparator).

Rows: CUDA-graph median µs; "1 input" replays one input set (the issue's method), "cold" rotates
input sets past the L2 size (timed at the largest token count of each op only, to keep the run
short). Each row prints as soon as it is measured; the whole run stays under a minute on an H200
(short graphs: ``BENCH_MOE_REP_MS`` ms per capture, 3 captures, the middle one reported; rows past
``BENCH_MOE_BUDGET_S`` seconds are skipped with a note). ``BENCH_MOE_PARTS`` (comma-separated, default
``routing,align,sum_reduce``) picks the groups of rows, e.g. ``align`` alone;
``BENCH_MOE_TOKENS`` (e.g. ``1,64,256,1024,4096``) the token counts and ``BENCH_MOE_PROVIDERS`` (e.g.
``jit,sgl_kernel``) the providers.

"jit" is this package's op. Bytes moved per call: num_tokens * (num_experts * gating element size
+ topk * (4 + 4)) (read the logits, write fp32 weights and int32 ids); moe_sum_reduce
(topk + 1) * num_tokens * hidden_size * element size (read every expert output, write the sum),
against the device copy roof (% copy).
"""

import os
import time

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("bench_moe.py")  # before importing triton, which a CPU-only install lacks

from sglang.jit_kernel.benchmark.utils import (  # noqa: E402
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    format_rows,
    get_benchmark_range,
    num_rotating_sets,
)
from sglang.jit_kernel.grouped_topk import grouped_topk  # noqa: E402
from sglang.jit_kernel.moe_align import moe_align_block_size  # noqa: E402
from sglang.jit_kernel.moe_sum_reduce import moe_sum_reduce  # noqa: E402
from sglang.jit_kernel.moe_topk_sigmoid import topk_sigmoid  # noqa: E402
from sglang.jit_kernel.moe_topk_softmax import topk_softmax  # noqa: E402
from sglang.test.ci.ci_register import register_cuda_ci  # noqa: E402

register_cuda_ci(est_time=120, suite="stage-b-kernel-benchmark-1-gpu-large")

TOKENS = (
    [int(t) for t in os.environ["BENCH_MOE_TOKENS"].split(",")]  # e.g. 1,64,256,1024,4096
    if os.environ.get("BENCH_MOE_TOKENS")
    else get_benchmark_range(full_range=[1, 64, 4096], ci_range=[1, 4096])
)
#: Only these providers (comma-separated names, e.g. "jit,jit sorted"), when set.
PROVIDERS = [name for name in os.environ.get("BENCH_MOE_PROVIDERS", "").split(",") if name]
EXPERTS = get_benchmark_range(full_range=[128, 256], ci_range=[256])
TOPK = 8
REP_MS = int(os.environ.get("BENCH_MOE_REP_MS", "4"))
CAPTURES = 3
BUDGET_S = float(os.environ.get("BENCH_MOE_BUDGET_S", "55"))
PARTS = os.environ.get("BENCH_MOE_PARTS", "routing,align,sum_reduce").split(",")
_START = time.monotonic()
_ROOF: list[float] = []


def emit(row: BenchRow) -> BenchRow:
    """Print one row now (flushed), in the table's format."""
    print(format_rows([row], _ROOF[0]).splitlines()[-1], flush=True)
    return row


try:  # the sglang comparator, when installed
    import sgl_kernel  # noqa: PLC0415
except Exception:  # noqa: BLE001
    sgl_kernel = None


def torch_softmax_topk(w, i, g):
    values, indices = torch.softmax(g.float(), dim=-1).topk(TOPK, dim=-1)
    w.copy_(values)
    i.copy_(indices)


def torch_sigmoid_topk(w, i, g):
    p = torch.sigmoid(g.float())
    indices = p.topk(TOPK, dim=-1).indices
    w.copy_(p.gather(1, indices))
    i.copy_(indices)


def torch_grouped(g, bias):
    p = torch.sigmoid(g.float())
    s = p + bias
    t, e = s.shape
    group_scores = s.view(t, 8, -1).topk(2, dim=-1).values.sum(dim=-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(4, dim=-1).indices, 1.0)
    masked = s.masked_fill(keep.repeat_interleave(e // 8, dim=1) == 0, float("-inf"))
    w = p.gather(1, masked.topk(TOPK, dim=-1).indices)
    return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * 2.5


def routing_sets(num_tokens, num_experts, dtype, n_sets):
    return [
        (
            torch.empty(num_tokens, TOPK, device="cuda"),
            torch.empty(num_tokens, TOPK, dtype=torch.int32, device="cuda"),
            torch.randn(num_tokens, num_experts, dtype=dtype, device="cuda"),
        )
        for _ in range(n_sets)
    ]


def time_providers(op, case, providers, make_sets, nbytes, rows, cold=True, one_input_only=()):
    """Rows of every provider, "1 input" and (``cold``) "cold"; providers named in ``one_input_only``
    get the "1 input" row only."""
    modes = [("1 input", 1)] + ([("cold", num_rotating_sets(nbytes))] if cold else [])
    for mode, n_sets in modes:
        sets = make_sets(n_sets)
        for name, call in providers.items():
            if PROVIDERS and name not in PROVIDERS:
                continue
            if mode != "1 input" and name in one_input_only:
                continue
            if time.monotonic() - _START > BUDGET_S:
                print(f"# {op} {case} {mode} {name}: skipped (past the {BUDGET_S:g} s budget)", flush=True)
                continue
            try:
                median, _, _ = bench_rotating(call, sets, rep_ms=REP_MS, captures=CAPTURES)
            except Exception as error:  # noqa: BLE001  (a comparator that rejects the case)
                print(f"# {op} {case} {name}: skipped ({type(error).__name__}: {error})", flush=True)
                continue
            rows.append(emit(BenchRow(op, f"{case} {mode}", name, median, nbytes)))
        del sets


def routing_rows() -> list[BenchRow]:
    rows = []
    dtype = torch.float32
    for op, jit, eager in (
        ("topk_softmax", topk_softmax, torch_softmax_topk),
        ("topk_sigmoid", topk_sigmoid, torch_sigmoid_topk),
    ):
        compiled = torch.compile(eager)
        for num_experts in EXPERTS:
            for num_tokens in TOKENS:
                providers = {
                    "jit": lambda w, i, g, f=jit: f(w, i, g),
                    "torch": eager,
                    "torch.compile": compiled,
                }
                if sgl_kernel is not None and hasattr(sgl_kernel, op):
                    providers["sgl_kernel"] = lambda w, i, g, f=getattr(sgl_kernel, op): f(w, i, g)  # noqa: B008 (binds this op)
                nbytes = num_tokens * (num_experts * 4 + TOPK * 8)
                time_providers(
                    op,
                    f"[{num_tokens}, {num_experts}] fp32 top{TOPK}",
                    providers,
                    lambda n: routing_sets(num_tokens, num_experts, dtype, n),
                    nbytes,
                    rows,
                    cold=num_tokens == TOKENS[-1],
                )
    compiled = torch.compile(torch_grouped)
    for num_tokens in TOKENS:
        providers = {
            "jit": lambda g, b: grouped_topk(g, b, 8, 4, TOPK, True, 2.5),
            "torch": torch_grouped,
            "torch.compile": compiled,
        }
        nbytes = num_tokens * (256 * 4 + TOPK * 8)

        def make(n, t=num_tokens):
            return [(torch.randn(t, 256, device="cuda"), torch.randn(256, device="cuda") * 0.1) for _ in range(n)]

        time_providers(
            "grouped_topk",
            f"[{num_tokens}, 256] g8 tg4 top8",
            providers,
            make,
            nbytes,
            rows,
            cold=num_tokens == TOKENS[-1],
        )
    return rows


SUM_REDUCE_SHAPES = get_benchmark_range(
    full_range=[(1, 8, 4096), (64, 8, 4096), (4096, 8, 4096), (16384, 8, 4096), (16384, 2, 7168)],
    ci_range=[(64, 8, 4096), (16384, 8, 4096)],
)


def sum_reduce_rows() -> list[BenchRow]:
    rows = []
    factor = 2.5
    eager = lambda x, out: torch.mul(x.sum(dim=1), factor, out=out)  # noqa: E731
    compiled = torch.compile(eager)
    providers = {"jit": lambda x, out: moe_sum_reduce(x, out, factor), "torch": eager, "torch.compile": compiled}
    if sgl_kernel is not None and hasattr(sgl_kernel, "moe_sum_reduce"):
        providers["sgl_kernel"] = lambda x, out: sgl_kernel.moe_sum_reduce(x, out, factor)
    for t, k, h in SUM_REDUCE_SHAPES:
        nbytes = (k + 1) * t * h * 2

        def make(n, t=t, k=k, h=h):
            return [
                (
                    torch.randn(t, k, h, dtype=torch.bfloat16, device="cuda"),
                    torch.empty(t, h, dtype=torch.bfloat16, device="cuda"),
                )
                for _ in range(n)
            ]

        time_providers("moe_sum_reduce", f"[{t}, {k}, {h}] bf16", providers, make, nbytes, rows, cold=t >= 4096)
        torch.cuda.empty_cache()
    return rows


#: 384 tokens = 3072 ids, below moe_align.SPLIT_MIN_NUMEL (4096), where the default switches from "small" to "split".
ALIGN_TOKENS = get_benchmark_range(full_range=[1, 64, 384, 4096], ci_range=[1, 4096])


def torch_align(ids, sorted_ids, expert_ids, total, cumsum, num_experts, block_size):
    """moe_align_block_size in static-shape torch (capturable: no bincount / repeat_interleave sync)."""
    flat = ids.view(-1).long()
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    order = torch.sort(flat, stable=True).indices
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    experts = flat[order]
    slot = (
        (ends - padded)[experts] + torch.arange(flat.numel(), device=ids.device) - (counts.cumsum(0) - counts)[experts]
    )
    sorted_ids.fill_(flat.numel()).scatter_(0, slot, order.int())
    blocks = torch.arange(expert_ids.numel(), device=ids.device) * block_size
    expert_ids.copy_(torch.searchsorted(ends, blocks, right=True).clamp_max(num_experts - 1))
    total.copy_(ends[-1:])
    cumsum[:1].zero_()  # not `cumsum[0] = 0`: a host-to-device copy, which graph capture refuses
    cumsum[1 : num_experts + 1] = ends


def align_rows() -> list[BenchRow]:
    """moe_align_block_size as sglang calls it: 256 experts passed as 257, block 64, padded. Bytes:
    read the ids, write every sorted slot and every block expert."""
    rows = []
    num_experts, block_size = 257, 64
    compiled = torch.compile(torch_align)
    providers = {
        "jit": lambda *a: moe_align_block_size(*a[:1], num_experts, block_size, *a[1:], True),
        "torch": lambda *a: torch_align(*a, num_experts, block_size),
        "torch.compile": lambda *a: compiled(*a, num_experts, block_size),
    }
    if sgl_kernel is not None and hasattr(sgl_kernel, "moe_align_block_size"):
        providers["sgl_kernel"] = lambda *a: sgl_kernel.moe_align_block_size(
            *a[:1], num_experts, block_size, *a[1:], True
        )
    for t in ALIGN_TOKENS:
        numel = t * TOPK
        sorted_len = numel + num_experts * (block_size - 1)
        blocks = -(-sorted_len // block_size)

        def make(n, t=t, sorted_len=sorted_len, blocks=blocks):
            return [
                (
                    torch.rand(t, 256, device="cuda").topk(TOPK, dim=-1).indices.int(),
                    torch.empty(sorted_len, dtype=torch.int32, device="cuda"),
                    torch.empty(blocks, dtype=torch.int32, device="cuda"),
                    torch.empty(1, dtype=torch.int32, device="cuda"),
                    torch.empty(num_experts + 1, dtype=torch.int32, device="cuda"),
                )
                for _ in range(n)
            ]

        time_providers(
            "moe_align_block_size",
            f"[{t}, {TOPK}] E256(+1) block{block_size}",
            providers,
            make,
            4 * (numel + sorted_len + blocks),
            rows,
            cold=t == ALIGN_TOKENS[-1],
        )
    return rows


if __name__ == "__main__":
    exit_unless_gpu("bench_moe.py")
    _ROOF.append(copy_roof_gbps())
    print(format_rows([], _ROOF[0]), flush=True)  # the header; rows follow as they are measured
    parts = {"routing": routing_rows, "align": align_rows, "sum_reduce": sum_reduce_rows}
    unknown = [p for p in PARTS if p not in parts]
    if unknown:
        raise SystemExit(f"BENCH_MOE_PARTS: unknown part(s) {unknown}; expected some of {list(parts)}")
    all_rows = [row for name, rows in parts.items() if name in PARTS for row in rows()]
    print(f"# {len(all_rows)} rows in {time.monotonic() - _START:.1f} s", flush=True)
