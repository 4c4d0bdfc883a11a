"""Probe: the rows the open performance targets need, in one process and about a minute on an H200
(each bench script takes 30-90 s; this is the short list for a device call that must also run the
tests).

Sections (pick with arguments; default all): ``norm`` (rmsnorm / rmsnorm_hf / qknorm across heads at
1, 8, 64 and 16384 tokens), ``act`` (silu_and_mul at 1, 64,
2048, 16384 tokens; gelu / gelu_tanh), ``quant``
(per_token_group_quant_8bit [T, 7168] group 128), ``kv`` (store_cache,
set_mla_kv_buffer, concat_mla_k / concat_mla_absorb_q).

Each row: CUDA-graph median per call, "cold" = inputs rotated past the L2 (benchmark.utils.
bench_rotating), "one" = one input set replayed (the tutorial's run_benchmark); % of the 1 GiB device
copy measured at the start of the same run, for the bytes the op must move.

Run: python -m sglang.jit_kernel.benchmark.probe_targets [norm] [act] [quant] [kv]
"""

import sys
import time

import torch

from sglang.jit_kernel.benchmark.utils import bench_rotating, copy_roof_gbps, exit_unless_gpu, num_rotating_sets

exit_unless_gpu("probe_targets.py")
BF16 = torch.bfloat16
T0 = time.time()
ROOF = copy_roof_gbps()
print(f"copy roof {ROOF:.0f} GB/s", flush=True)


def row(op, case, label, call, make, nbytes, one=True, cold=True):
    out = []
    if cold:
        sets = [make() for _ in range(num_rotating_sets(nbytes))]
        out.append(("cold", bench_rotating(call, sets)[0]))
        del sets
    if one:
        out.append(("one", bench_rotating(call, [make()])[0]))
    s = "  ".join(f"{k} {us:8.2f} us {nbytes / (us * 1e-6) / 1e9 / ROOF * 100:6.1f}%" for k, us in out)
    print(f"{op:22s} {case:24s} {label:22s} {s}", flush=True)
    torch.cuda.empty_cache()


def section(name):
    print(f"## {name} ({time.time() - T0:.0f} s)", flush=True)


which = sys.argv[1:] or ["norm", "act", "quant", "kv"]

if "norm" in which:
    section("norm")
    from sglang.jit_kernel.norm import fused_inplace_qknorm_across_heads, rmsnorm, rmsnorm_hf

    for t in (1, 8, 64, 16384):
        h = 4096
        mk = lambda: (
            torch.randn(t, h, dtype=BF16, device="cuda"),
            torch.randn(h, dtype=BF16, device="cuda"),
            torch.empty(t, h, dtype=BF16, device="cuda"),
        )
        nb = 2 * t * h * 2 + h * 2
        row("rmsnorm", f"[{t}, {h}]", "jit", lambda x, w, o: rmsnorm(x, w, 1e-6, out=o), mk, nb, cold=t == 16384)
        row("rmsnorm_hf", f"[{t}, {h}]", "jit", lambda x, w, o: rmsnorm_hf(x, w, 1e-6, out=o), mk, nb, cold=t == 16384)
        mkq = lambda: (
            torch.randn(t, 4096 + 1024, dtype=BF16, device="cuda"),
            torch.randn(4096, dtype=BF16, device="cuda"),
            torch.randn(1024, dtype=BF16, device="cuda"),
        )
        nbq = 2 * t * 5120 * 2 + 5120 * 2
        mk5 = lambda: (
            torch.randn(t, 5120, dtype=BF16, device="cuda"),
            torch.randn(5120, dtype=BF16, device="cuda"),
            torch.empty(t, 5120, dtype=BF16, device="cuda"),
        )
        row(
            "rmsnorm",
            f"[{t}, 5120]",
            "jit (across_heads' bytes)",
            lambda x, w, o: rmsnorm(x, w, 1e-6, out=o),
            mk5,
            nbq,
            cold=t == 16384,
        )
        aq = lambda qk, wq, wk: fused_inplace_qknorm_across_heads(qk[:, :4096], qk[:, 4096:], wq, wk, 1e-6)
        row("across_heads", f"[{t}, 4096+1024]", "jit", aq, mkq, nbq, cold=t == 16384)

if "act" in which:
    section("activation")
    from sglang.jit_kernel.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul

    H = 14336
    for t in (1, 64, 2048, 16384):
        mk = lambda: (torch.randn(t, 2 * H, dtype=BF16, device="cuda"), torch.empty(t, H, dtype=BF16, device="cuda"))
        nb = 3 * t * H * 2
        row("silu_and_mul", f"[{t}, 2 x {H}]", "jit", lambda x, o: silu_and_mul(x, o), mk, nb, cold=t >= 2048)
        if t in (1, 16384):
            row(
                "gelu_tanh_and_mul",
                f"[{t}, 2 x {H}]",
                "jit",
                lambda x, o: gelu_tanh_and_mul(x, o),
                mk,
                nb,
                cold=t >= 2048,
            )
            row("gelu_and_mul", f"[{t}, 2 x {H}]", "jit", lambda x, o: gelu_and_mul(x, o), mk, nb, cold=t >= 2048)

if "quant" in which:
    section("quant")
    from sglang.jit_kernel.per_token_group_quant_8bit import per_token_group_quant_8bit

    K, G = 7168, 128
    for t in (1, 64, 2048, 16384):
        mk = lambda: (
            torch.randn(t, K, dtype=BF16, device="cuda"),
            torch.empty(t, K, dtype=torch.float8_e4m3fn, device="cuda"),
            torch.empty(t, K // G, dtype=torch.float32, device="cuda"),
        )
        nb = t * K * 3 + 4 * t * K // G
        row(
            "per_token_group_quant",
            f"[{t}, {K}] g{G}",
            "jit",
            lambda x, q, s: per_token_group_quant_8bit(x, q, s, G, 1e-10, -448.0, 448.0),
            mk,
            nb,
            cold=t >= 2048,
        )

if "kv" in which:
    section("kv")
    from sglang.jit_kernel.concat_mla import concat_mla_absorb_q, concat_mla_k
    from sglang.jit_kernel.kvcache import set_mla_kv_buffer, store_cache

    for t in (1, 16384):
        slots = 4 * t + 1
        mk = lambda: (
            torch.randn(t, 1024, dtype=BF16, device="cuda"),
            torch.randn(t, 1024, dtype=BF16, device="cuda"),
            torch.empty(slots, 1024, dtype=BF16, device="cuda"),
            torch.empty(slots, 1024, dtype=BF16, device="cuda"),
            torch.randperm(slots, device="cuda")[:t],
        )
        row(
            "store_cache",
            f"[{t}, 1024]->[{slots}]",
            "jit",
            lambda k, v, kc, vc, i: store_cache(k, v, kc, vc, i),
            mk,
            4 * t * 1024 * 2 + 8 * t,
            cold=t > 1,
        )
        mkm = lambda: (
            torch.empty(slots, 576, dtype=BF16, device="cuda"),
            torch.randperm(slots, device="cuda")[:t],
            torch.randn(t, 512, dtype=BF16, device="cuda"),
            torch.randn(t, 64, dtype=BF16, device="cuda"),
        )
        row(
            "set_mla_kv_buffer",
            f"[{t}, 512+64]->[{slots}]",
            "jit",
            lambda b, l, n, r: set_mla_kv_buffer(b, l, n, r),
            mkm,
            2 * t * 576 * 2 + 8 * t,
            cold=t > 1,
        )
    t = 16384
    mkk = lambda: (
        torch.empty(t, 128, 192, dtype=BF16, device="cuda"),
        torch.randn(t, 128, 128, dtype=BF16, device="cuda"),
        torch.randn(t, 1, 64, dtype=BF16, device="cuda"),
    )
    nbk = t * 128 * 192 * 2 + t * 128 * 128 * 2 + t * 64 * 2
    row("concat_mla_k", f"[{t}, 128, 192]", "jit", lambda k, n, r: concat_mla_k(k, n, r), mkk, nbk, one=False)
    t = 4096
    mka = lambda: (
        torch.randn(t, 128, 512, dtype=BF16, device="cuda"),
        torch.randn(t, 128, 64, dtype=BF16, device="cuda"),
    )
    nba = 2 * t * 128 * 576 * 2
    row(
        "concat_mla_absorb_q", f"[{t}, 128, 512+64]", "jit", lambda a, b: concat_mla_absorb_q(a, b), mka, nba, one=False
    )
section("end")
