"""Benchmark the norm ops against torch (eager, F.rms_norm, torch.compile) and FlashInfer.

CUDA-graph median per call with inputs rotated past 4x the L2 size (up to 64 sets: cold L2 from
~1 MB per call; the decode cases stay partly L2-resident, like a decode step's input; calls under
5 us are timed in five graph captures and the middle one is reported, see bench_rotating), GB/s
from the bytes each op must move, and % of a device copy measured in the same process. Bytes moved (bf16, s = 2):
  rmsnorm, rmsnorm_hf   2*N*H*s + H*s            (read x, write out, read w)
  fused_add_rmsnorm     4*N*H*s + H*s            (read x and residual, write both, read w)
  qknorm                2*N*(Hq+Hk)*D*s + 2*D*s  (read and write q and k in place, read both weights)
  qknorm_across_heads   2*N*(HQ+HK)*s + (HQ+HK)*s (the same, whole rows: HQ = Hq*D, HK = Hk*D)
The decode rows (1, 8, 64 tokens) of every op stand next to rmsnorm's at [N, 4096]: one launch each
(qknorm_across_heads normalises q and k in one grid; its "jit 2x rmsnorm" row is the two-launch
alternative).
Then: eager wall time per rmsnorm call at [1, 4096] (10k calls, one sync) vs F.rms_norm, and
whether each op leaves the L2 fair to the next kernel (l2_after_table: the large in-place launches
load with an evict_last L2 hint, see RowAccess in csrc/elementwise/norm_rows.cuh).

``python bench_norm.py --pdl`` instead times rmsnorm and fused_add_rmsnorm at decode sizes with PDL
on and off.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from sglang.jit_kernel.benchmark.utils import (
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    eager_wall_us,
    exit_unless_gpu,
    format_rows,
    num_rotating_sets,
    run_benchmark,
)
from sglang.jit_kernel.norm import (
    fused_add_rmsnorm,
    fused_inplace_qknorm,
    fused_inplace_qknorm_across_heads,
    rmsnorm,
    rmsnorm_hf,
)
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=240, suite="stage-b-kernel-benchmark-1-gpu-large")

DTYPE = torch.bfloat16
EPS = 1e-6
HIDDEN = 4096
RMS_SHAPES = [(1, 4096), (8, 4096), (64, 4096), (16384, 4096), (16384, 8192)]
QK_TOKENS = [1, 8, 64, 16384]
HF_SHAPES = [(1, 4096), (8, 4096), (64, 4096), (16384, 4096)]
NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
EAGER_CALLS = 10_000

try:  # optional baseline
    import flashinfer.norm as flashinfer_norm  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001 - not installed or broken: skip silently
    flashinfer_norm = None


# ---------------------------------------------------------------------------------------------
# torch baselines (fp32 arithmetic like the kernels)
# ---------------------------------------------------------------------------------------------
def torch_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def torch_fused_add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> None:
    r.copy_((x.float() + r.float()).to(r.dtype))
    x.copy_(torch_rmsnorm(r, w))


def torch_qknorm(q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor) -> None:
    q.copy_(torch_rmsnorm(q, qw))
    k.copy_(torch_rmsnorm(k, kw))


def torch_rmsnorm_hf(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm: normalise in fp32, round to the dtype, multiply by w."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


_compiled: dict[str, Callable] = {}


def compiled(name: str, fn: Callable) -> Callable:
    if name not in _compiled:
        _compiled[name] = torch.compile(fn)
    return _compiled[name]


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------
def rms_rows(roof: float) -> list[BenchRow]:
    providers: dict[str, Callable] = {
        "jit": lambda x, w, o: rmsnorm(x, w, EPS, out=o),
        "jit out=x": lambda x, w, o: rmsnorm(x, w, EPS, out=x),
        "torch": lambda x, w, o: torch_rmsnorm(x, w),
        "F.rms_norm": lambda x, w, o: F.rms_norm(x, (x.shape[-1],), w, EPS),
        "torch.compile": lambda x, w, o: compiled("rms", torch_rmsnorm)(x, w),
    }
    if flashinfer_norm is not None:
        providers["flashinfer"] = lambda x, w, o: flashinfer_norm.rmsnorm(x, w, EPS, out=o)
    return row_op_rows("rmsnorm", RMS_SHAPES, providers)


def row_op_rows(op: str, shapes: list[tuple[int, int]], providers: dict[str, Callable]) -> list[BenchRow]:
    """Rows of an op reading x [N, H] and w [H] and writing out [N, H] (providers take x, w, out)."""
    rows = []
    for n, h in shapes:
        nbytes = 2 * n * h * 2 + h * 2
        sets = []
        for _ in range(num_rotating_sets(nbytes)):
            x = torch.randn(n, h, dtype=DTYPE, device="cuda")
            sets.append((x, torch.rand(h, dtype=DTYPE, device="cuda") + 0.5, torch.empty_like(x)))
        rows += run_providers(op, f"[{n}, {h}]", providers, sets, nbytes)
        del sets
        torch.cuda.empty_cache()
    return rows


def fused_rows(roof: float) -> list[BenchRow]:
    providers: dict[str, Callable] = {
        "jit": lambda x, r, w: fused_add_rmsnorm(x, r, w, EPS),
        "torch": torch_fused_add_rmsnorm,
        "torch.compile": lambda x, r, w: compiled("fused", torch_fused_add_rmsnorm)(x, r, w),
    }
    if flashinfer_norm is not None:
        providers["flashinfer"] = lambda x, r, w: flashinfer_norm.fused_add_rmsnorm(x, r, w, EPS)
    rows = []
    for n, h in RMS_SHAPES:
        nbytes = 4 * n * h * 2 + h * 2
        sets = []
        for _ in range(num_rotating_sets(nbytes)):
            x = torch.randn(n, h, dtype=DTYPE, device="cuda")
            sets.append((x, torch.randn_like(x), torch.rand(h, dtype=DTYPE, device="cuda") + 0.5))
        rows += run_providers("fused_add_rmsnorm", f"[{n}, {h}]", providers, sets, nbytes)
        del sets
        torch.cuda.empty_cache()
    return rows


def qk_rows(roof: float) -> list[BenchRow]:
    hq, hk, d = NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM
    providers: dict[str, Callable] = {
        "jit": lambda q, k, qw, kw: fused_inplace_qknorm(q, k, qw, kw, EPS),
        "jit head_dim=": lambda q, k, qw, kw: fused_inplace_qknorm(q, k, qw, kw, EPS, head_dim=d),
        "torch": torch_qknorm,
        "torch.compile": lambda q, k, qw, kw: compiled("qk", torch_qknorm)(q, k, qw, kw),
    }
    rows = []
    for n in QK_TOKENS:
        nbytes = 2 * n * (hq + hk) * d * 2 + 2 * d * 2
        sets = []
        for _ in range(num_rotating_sets(nbytes)):
            qkv = torch.randn(n, (hq + 2 * hk) * d, dtype=DTYPE, device="cuda")
            q = qkv[:, : hq * d].view(n, hq, d)
            k = qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
            weights = [torch.rand(d, dtype=DTYPE, device="cuda") + 0.5 for _ in range(2)]
            sets.append((q, k, *weights))
        rows += run_providers("qknorm", f"[{n}, {hq}+{hk}, {d}]", providers, sets, nbytes)
        del sets
        torch.cuda.empty_cache()
    return rows


def hf_rows(roof: float) -> list[BenchRow]:
    providers: dict[str, Callable] = {
        "jit": lambda x, w, o: rmsnorm_hf(x, w, EPS, out=o),
        "torch": lambda x, w, o: torch_rmsnorm_hf(x, w),
        "torch.compile": lambda x, w, o: compiled("hf", torch_rmsnorm_hf)(x, w),
    }
    return row_op_rows("rmsnorm_hf", HF_SHAPES, providers)


def across_heads_rows(roof: float) -> list[BenchRow]:
    """q [N, Hq*D] and k [N, Hk*D] as views of a fused qkv buffer, whole rows normalised."""
    hidden_q, hidden_k = NUM_Q_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM

    def two_launches(q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor) -> None:
        rmsnorm(q, qw, EPS, out=q)
        rmsnorm(k, kw, EPS, out=k)

    providers: dict[str, Callable] = {
        "jit": lambda q, k, qw, kw: fused_inplace_qknorm_across_heads(q, k, qw, kw, EPS),
        "jit 2x rmsnorm": two_launches,
        "torch": torch_qknorm,
        "torch.compile": lambda q, k, qw, kw: compiled("across", torch_qknorm)(q, k, qw, kw),
    }
    rows = []
    for n in QK_TOKENS:
        nbytes = 2 * n * (hidden_q + hidden_k) * 2 + (hidden_q + hidden_k) * 2
        sets = []
        for _ in range(num_rotating_sets(nbytes)):
            qkv = torch.randn(n, hidden_q + 2 * hidden_k, dtype=DTYPE, device="cuda")
            weights = [torch.rand(size, dtype=DTYPE, device="cuda") + 0.5 for size in (hidden_q, hidden_k)]
            sets.append((qkv[:, :hidden_q], qkv[:, hidden_q : hidden_q + hidden_k], *weights))
        rows += run_providers("qknorm_across_heads", f"[{n}, {hidden_q}+{hidden_k}]", providers, sets, nbytes)
        del sets
        torch.cuda.empty_cache()
    return rows


def run_providers(op: str, case: str, providers: dict, sets: list, nbytes: int) -> list[BenchRow]:
    rows = []
    for name, call in providers.items():
        try:
            median, _, _ = bench_rotating(call, sets)
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run this case
            print(f"# {op} {case} {name}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})")
            continue
        rows.append(BenchRow(op, case, name, median, nbytes))
    return rows


def method_rows() -> list[BenchRow]:
    """jit only, two timing methods side by side: cold L2 (rotated inputs, the main table) and one
    input set replayed (the tutorial's run_benchmark; L2 keeps part of the data between replays),
    plus rmsnorm at 4x the rows (1 GiB moved) to separate launch ramp and tail from the steady state."""
    rows = []
    for n, h in [(16384, 4096), (16384, 8192), (65536, 4096)]:
        nbytes = 2 * n * h * 2 + h * 2
        w = torch.rand(h, dtype=DTYPE, device="cuda") + 0.5
        sets = [(torch.randn(n, h, dtype=DTYPE, device="cuda"),) for _ in range(num_rotating_sets(nbytes))]
        out = torch.empty(n, h, dtype=DTYPE, device="cuda")
        call = lambda x, w=w, out=out: rmsnorm(x, w, EPS, out=out)
        rows.append(BenchRow("rmsnorm", f"[{n}, {h}]", "jit cold L2", bench_rotating(call, sets)[0], nbytes))
        rows.append(
            BenchRow(
                "rmsnorm", f"[{n}, {h}]", "jit one input", run_benchmark(lambda first=sets[0]: call(*first))[0], nbytes
            )
        )
        if n == 16384:
            x, r = sets[0][0], torch.randn(n, h, dtype=DTYPE, device="cuda")
            median = run_benchmark(lambda: fused_add_rmsnorm(x, r, w, EPS))[0]
            rows.append(BenchRow("fused_add_rmsnorm", f"[{n}, {h}]", "jit one input", median, 4 * n * h * 2 + h * 2))
        del sets, out
        torch.cuda.empty_cache()
    n, hq, hk, d = 16384, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM
    qkv = torch.randn(n, (hq + 2 * hk) * d, dtype=DTYPE, device="cuda")
    q, k = qkv[:, : hq * d].view(n, hq, d), qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
    qw = torch.rand(d, dtype=DTYPE, device="cuda") + 0.5
    median = run_benchmark(lambda: fused_inplace_qknorm(q, k, qw, qw, EPS))[0]
    rows.append(
        BenchRow("qknorm", f"[{n}, {hq}+{hk}, {d}]", "jit one input", median, 2 * n * (hq + hk) * d * 2 + 2 * d * 2)
    )
    return rows


# ---------------------------------------------------------------------------------------------
# Eager (host) overhead
# ---------------------------------------------------------------------------------------------


def eager_table() -> str:
    x = torch.randn(1, HIDDEN, dtype=DTYPE, device="cuda")
    w = torch.rand(HIDDEN, dtype=DTYPE, device="cuda") + 0.5
    out = torch.empty_like(x)
    r = torch.randn_like(x)
    results = {
        "jit rmsnorm(x, w)": eager_wall_us(lambda: rmsnorm(x, w)),
        "jit rmsnorm(x, w, out=)": eager_wall_us(lambda: rmsnorm(x, w, out=out)),
        "jit rmsnorm_hf(x, w, out=)": eager_wall_us(lambda: rmsnorm_hf(x, w, out=out)),
        "jit fused_add_rmsnorm": eager_wall_us(lambda: fused_add_rmsnorm(x, r, w)),
        "F.rms_norm(x, (H,), w)": eager_wall_us(lambda: F.rms_norm(x, (HIDDEN,), w, EPS)),
        "torch eager fp32 rmsnorm": eager_wall_us(lambda: torch_rmsnorm(x, w)),
    }
    if flashinfer_norm is not None:
        results["flashinfer rmsnorm"] = eager_wall_us(lambda: flashinfer_norm.rmsnorm(x, w, EPS))
    lines = [f"# eager wall time per call, [1, {HIDDEN}] bf16, {EAGER_CALLS} calls, one sync (target jit <= 5 us)"]
    lines += [f"{name:<28} {us:8.2f} us" for name, us in results.items()]
    return "\n".join(lines)


def l2_after_table(victim_mb: int = 32, reps: int = 20) -> str:
    """Does an op leave the L2 fair to the next kernel? A victim buffer (victim_mb MB, under the L2
    size) is read twice right after the op; the second read is an L2 hit unless lines the op left
    behind (e.g. marked evict_last and never written) push the victim out first. Median µs of the
    second read (events, ``reps`` times) after each op at [16384, 4096] bf16, next to the same after
    a torch copy of 128 MB (fair) and after a 1 GiB copy without the first read (all misses)."""
    x = torch.randn(16384, HIDDEN, dtype=DTYPE, device="cuda")
    r, o = torch.randn_like(x), torch.empty_like(x)
    w = torch.rand(HIDDEN, dtype=DTYPE, device="cuda") + 0.5
    qkv = torch.randn(16384, (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, dtype=DTYPE, device="cuda")
    q = qkv[:, : NUM_Q_HEADS * HEAD_DIM].view(16384, NUM_Q_HEADS, HEAD_DIM)
    k = qkv[:, NUM_Q_HEADS * HEAD_DIM : (NUM_Q_HEADS + NUM_KV_HEADS) * HEAD_DIM].view(16384, NUM_KV_HEADS, HEAD_DIM)
    hw = torch.rand(HEAD_DIM, dtype=DTYPE, device="cuda") + 0.5
    q2 = qkv[:, : NUM_Q_HEADS * HEAD_DIM]
    k2 = qkv[:, NUM_Q_HEADS * HEAD_DIM : (NUM_Q_HEADS + NUM_KV_HEADS) * HEAD_DIM]
    hqw, hkw = torch.rand_like(q2[0]) + 0.5, torch.rand_like(k2[0]) + 0.5
    big, big_out = torch.empty(1 << 29, dtype=DTYPE, device="cuda"), torch.empty(1 << 29, dtype=DTYPE, device="cuda")
    victim = torch.randn(victim_mb << 19, dtype=DTYPE, device="cuda")

    def second_read_us(op: Callable[[], object], warm: bool = True) -> float:
        times = []
        for _ in range(reps):
            op()
            if warm:
                victim.sum()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            victim.sum()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return sorted(times)[len(times) // 2]

    results = {
        "torch copy 128 MB (fair)": second_read_us(lambda: o.copy_(x)),
        "jit rmsnorm out separate": second_read_us(lambda: rmsnorm(x, w, EPS, out=o)),
        "jit rmsnorm out=x": second_read_us(lambda: rmsnorm(x, w, EPS, out=x)),
        "jit fused_add_rmsnorm": second_read_us(lambda: fused_add_rmsnorm(x, r, w, EPS)),
        "jit qknorm 16384 tokens": second_read_us(lambda: fused_inplace_qknorm(q, k, hw, hw, EPS)),
        "jit qknorm across heads": second_read_us(lambda: fused_inplace_qknorm_across_heads(q2, k2, hqw, hkw, EPS)),
        "1 GiB copy, no first read": second_read_us(lambda: big_out.copy_(big), warm=False),
    }
    lines = [f"# next kernel's L2: second read of a {victim_mb} MB buffer right after each op ([16384, {HIDDEN}] bf16)"]
    lines += [f"{name:<28} {us:8.2f} us" for name, us in results.items()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# PDL on / off (--pdl)
# ---------------------------------------------------------------------------------------------
def pdl_rows() -> list[BenchRow]:
    """Decode sizes with PDL on and off (the automatic geometry)."""
    rows = []
    for n in (1, 64):
        x = [torch.randn(n, HIDDEN, dtype=DTYPE, device="cuda") for _ in range(64)]
        r = [torch.randn(n, HIDDEN, dtype=DTYPE, device="cuda") for _ in range(64)]
        w = torch.rand(HIDDEN, dtype=DTYPE, device="cuda") + 0.5
        out = torch.empty(n, HIDDEN, dtype=DTYPE, device="cuda")
        for pdl in (True, False):
            median, _, _ = bench_rotating(
                lambda a, pdl=pdl: rmsnorm(a, w, EPS, out=out, enable_pdl=pdl), [(a,) for a in x]
            )
            rows.append(BenchRow("rmsnorm", f"[{n}, {HIDDEN}]", f"pdl={pdl}", median, 2 * n * HIDDEN * 2 + HIDDEN * 2))
            median, _, _ = bench_rotating(
                lambda a, b, pdl=pdl: fused_add_rmsnorm(a, b, w, EPS, enable_pdl=pdl), list(zip(x, r))
            )
            rows.append(
                BenchRow("fused_add_rmsnorm", f"[{n}, {HIDDEN}]", f"pdl={pdl}", median, 4 * n * HIDDEN * 2 + HIDDEN * 2)
            )
    return rows


def main() -> None:
    import sys

    exit_unless_gpu("bench_norm.py")
    roof = copy_roof_gbps()
    if "--pdl" in sys.argv:
        print(format_rows(pdl_rows(), roof))
        return
    rows = rms_rows(roof) + hf_rows(roof) + fused_rows(roof) + qk_rows(roof) + across_heads_rows(roof)
    eager = eager_table()
    print(eager)
    print(format_rows(rows, roof))
    print("# timing method: cold L2 (rotated inputs) vs one input replayed (the tutorial's run_benchmark)")
    print(format_rows(method_rows(), roof))
    print(l2_after_table())


if __name__ == "__main__":
    main()
