"""Top-k routing floor: the bare probe kernels (probe_topk_floor.cuh) next to topk_softmax on the same
buffers, timed as bench_moe.py times its "1 input" rows (CUDA graph, one input set replayed,
``BENCH_MOE_REP_MS`` ms per capture, 3 captures, the middle one).

Per [num_tokens, E] fp32 top-8 (num_tokens 1 / 64 / 4096, E 128 / 256), µs per call of:
  store     launch + the 8 fp32 + 8 int32 stores of a row, no load
  load      + the row load (one warp per row, 16-byte loads)
  max       + one warp max-reduction (__reduce_max_sync)
  steps     + k = 8 dependent __reduce_max_sync + __ballot_sync steps (the winner drops its key)
  rescan    + the winner's clear and rescan of its run (the real step; the ids are the top-8)
  softmax   + the softmax statistics and weights: the lookahead kernel without options, k fixed
            at compile time (the same bits as topk_softmax)
and topk_softmax itself: the default, the lookahead kernel specialised for k = 8 and no options
("jit": the same structure as "softmax" with the param struct, strides, tails and grid-stride loop of
the real op; from 2048 tokens the sorted kernel), plus rmsnorm [1, 4096] bf16, the memory-bound
reference the issue's ~1 µs floor comes from. "steps" - "max" is what 8 dependent warp steps cost, "softmax" is
what the lookahead structure can reach without its options and runtime k; their distance to "jit" is
what the param struct and the launcher cost. What a run of it told:
docs/perf_notes.md ("Top-k routing floor"). Not a CI benchmark (no bench_ prefix); on a GPU machine:

    python python/sglang/jit_kernel/benchmark/probe_topk_floor.py
"""

from __future__ import annotations

import os

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("probe_topk_floor.py")  # before importing triton, which a CPU-only install lacks

from sglang.jit_kernel.benchmark.utils import bench_rotating  # noqa: E402
from sglang.jit_kernel.moe_topk_softmax import topk_softmax  # noqa: E402
from sglang.jit_kernel.norm import rmsnorm  # noqa: E402
from sglang.jit_kernel.utils import load_jit  # noqa: E402

PROBE_CUH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_topk_floor.cuh")
MODES = ("store", "load", "max", "steps", "rescan", "softmax")  # ProbeMode 0..5
TOKENS = (1, 64, 4096)
EXPERTS = (128, 256)
TOPK = 8
REP_MS = int(os.environ.get("BENCH_MOE_REP_MS", "4"))
CAPTURES = 3


def time_us(call, inputs) -> float:
    """Median µs of ``call(*inputs)`` as bench_moe times a "1 input" row."""
    return bench_rotating(call, [inputs], rep_ms=REP_MS, captures=CAPTURES)[0]


def check(probe, num_tokens: int, num_experts: int) -> list[str]:
    """What the probe kernels must agree on with topk_softmax: the row max (max), the top-8 ids
    (rescan) and every bit (softmax); no NaN in the logits. Returns the failures (printed, not
    raised: the timings are still worth having)."""
    gating = torch.randn(num_tokens, num_experts, device="cuda")
    weights = torch.empty(num_tokens, TOPK, device="cuda")
    ids = torch.empty(num_tokens, TOPK, dtype=torch.int32, device="cuda")
    topk_softmax(weights, ids, gating)
    w = torch.empty_like(weights)
    i = torch.empty_like(ids)
    failures = []
    probe.topk_floor(w, i, gating, MODES.index("max"))
    if not torch.equal(w, gating.max(dim=-1, keepdim=True).values.expand(-1, TOPK)):
        failures.append("max: not the row max")
    probe.topk_floor(w, i, gating, MODES.index("rescan"))
    if not torch.equal(i, ids):
        failures.append("rescan: not topk_softmax's ids")
    probe.topk_floor(w, i, gating, MODES.index("softmax"))
    if not (torch.equal(i, ids) and torch.equal(w.view(torch.int32), weights.view(torch.int32))):
        failures.append("softmax: not topk_softmax's bits")
    return failures


def main() -> None:
    probe = load_jit("probe_topk_floor", cuda_files=[PROBE_CUH], cuda_wrappers=[("topk_floor", "topk_floor")])
    print(
        f"# {torch.cuda.get_device_name()}; µs per call, CUDA graph, one input replayed, "
        f"{REP_MS} ms x {CAPTURES} captures (the middle one)",
        flush=True,
    )
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.rand(4096, dtype=torch.bfloat16, device="cuda") + 0.5
    print(f"rmsnorm [1, 4096] bf16: {time_us(lambda x, w, o: rmsnorm(x, w, out=o), (x, w, torch.empty_like(x))):.2f}")
    ops = {"jit": topk_softmax}
    print(f"{'case':<22}" + "".join(f"{name:>9}" for name in MODES) + "".join(f"{name:>17}" for name in ops))
    for num_experts in EXPERTS:
        for num_tokens in TOKENS:
            for failure in check(probe, num_tokens, num_experts):
                print(f"# [{num_tokens}, {num_experts}] CHECK FAILED: {failure}", flush=True)
            inputs = (
                torch.empty(num_tokens, TOPK, device="cuda"),
                torch.empty(num_tokens, TOPK, dtype=torch.int32, device="cuda"),
                torch.randn(num_tokens, num_experts, device="cuda"),
            )
            line = f"{f'[{num_tokens}, {num_experts}] top{TOPK}':<22}"
            for mode in range(len(MODES)):
                line += f"{time_us(lambda w, i, g, m=mode: probe.topk_floor(w, i, g, m), inputs):>9.2f}"
            for call in ops.values():
                line += f"{time_us(call, inputs):>17.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
