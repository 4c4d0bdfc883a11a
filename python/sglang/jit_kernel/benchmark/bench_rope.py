"""Benchmark the RoPE ops against torch (eager and torch.compile) and the device copy roof.

Shapes (issue 16): NeoX, q 32 heads and k 8 heads x 128, bf16, fp32 cos/sin cache of 8192
positions, int64 positions; the KV store with v and two caches; fused_qk_norm_rope on the
Qwen3 shape (32 + 8 + 8 heads x 128); rotary_embedding (bf16 cache).

Bytes moved per call (the formulas of rope.py / fused_qknorm_rope.py), N tokens, s = 2 (bf16):
  apply_rope_inplace               2*N*(Hq+Hk)*R*s + N*R*4 + N*8
  apply_rope_inplace_with_kvcache  the above + N*Hk*(2*D-R)*s (rest of k, v read) + 2*N*Hk*D*s (caches) + N*8
    into float8_e4m3fn caches      the same with 2*N*Hk*D (one byte per cache element)
  fused_qk_norm_rope               2*N*(Hq+Hk)*D*s + 2*D*s + N*8
  rotary_embedding                 2*N*(Hq+Hk)*R*s + N*R*s + N*8
"""

import argparse

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("bench_rope.py")  # before importing triton, which a CPU-only install lacks

from sglang.jit_kernel.benchmark.utils import (  # noqa: E402
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    eager_wall_us,
    format_rows,
    get_benchmark_range,
    num_rotating_sets,
    run_benchmark,
)
from sglang.jit_kernel.fused_qknorm_rope import fused_qk_norm_rope  # noqa: E402
from sglang.jit_kernel.rope import (  # noqa: E402
    apply_rope_inplace,
    apply_rope_inplace_with_kvcache,
    make_cos_sin_cache,
    rotary_embedding,
)
from sglang.test.ci.ci_register import register_cuda_ci  # noqa: E402

register_cuda_ci(est_time=120, suite="stage-b-kernel-benchmark-1-gpu-large")

TOKENS = get_benchmark_range(full_range=[1, 64, 2048, 16384], ci_range=[1, 16384])
HQ, HK, HV, D = 32, 8, 8, 128
MAX_POS = 8192
DTYPE = torch.bfloat16
V_INV_SCALE = 1 / 1.7  # the fp8 KV rows: v quantized with an inverse scale, k with a device scale


# ---- torch baselines (the same math, written with torch ops) ----
def torch_rope(q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> None:
    half = cache.shape[1] // 2
    row = cache[positions]
    cos, sin = row[:, None, :half], row[:, None, half:]
    for x in (q, k):
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        x.copy_(torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype))


def torch_rope_kv(q, k, v, k_cache, v_cache, cache, positions, loc) -> None:
    torch_rope(q, k, cache, positions)
    k_cache[loc] = k.view(k.shape[0], -1)
    v_cache[loc] = v.view(v.shape[0], -1)


def torch_rope_kv_fp8(q, k, v, k_cache, v_cache, cache, positions, loc, k_scale) -> None:
    """torch_rope_kv into float8_e4m3fn caches: k with a device scale, v with the inverse scale V_INV_SCALE."""
    torch_rope(q, k, cache, positions)
    for x, out, inv in ((k, k_cache, 1.0 / k_scale), (v, v_cache, V_INV_SCALE)):
        q8 = (x.view(x.shape[0], -1).float() * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        out.view(torch.uint8).index_copy_(0, loc, q8.view(torch.uint8))


def torch_qk_norm_rope(qkv, qw, kw, positions, inv_freq) -> None:
    n = qkv.shape[0]
    theta = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = theta.cos()[:, None], theta.sin()[:, None]
    for first, count, w in ((0, HQ, qw), (HQ, HK, kw)):
        view = qkv[:, first * D : (first + count) * D].view(n, count, D)
        x = view.float()
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        y1, y2 = y[..., : D // 2], y[..., D // 2 :]
        view.copy_(torch.cat([y1 * cos - y2 * sin, y1 * sin + y2 * cos], dim=-1).to(qkv.dtype))


def rope_bytes(n: int) -> int:
    return 2 * n * (HQ + HK) * D * 2 + n * D * 4 + n * 8


def rope_kv_bytes(n: int, cache_element: int = 2) -> int:
    return rope_bytes(n) + n * HK * D * 2 + 2 * n * HK * D * cache_element + n * 8


def qknorm_rope_bytes(n: int) -> int:
    return 2 * n * (HQ + HK) * D * 2 + 2 * D * 2 + n * 8


def rotary_bytes(n: int) -> int:
    return 2 * n * (HQ + HK) * D * 2 + n * D * 2 + n * 8


def rope_rows(cache: torch.Tensor) -> list[BenchRow]:
    compiled = torch.compile(torch_rope)
    providers = {
        "jit": lambda q, k, pos: apply_rope_inplace(q, k, cache, pos, is_neox=True),
        "torch": lambda q, k, pos: torch_rope(q, k, cache, pos),
        "torch.compile": lambda q, k, pos: compiled(q, k, cache, pos),
    }
    rows = []
    for n in TOKENS:
        nbytes = rope_bytes(n)
        sets = [
            (
                torch.randn(n, HQ, D, dtype=DTYPE, device="cuda"),
                torch.randn(n, HK, D, dtype=DTYPE, device="cuda"),
                torch.randint(0, MAX_POS, (n,), device="cuda"),
            )
            for _ in range(num_rotating_sets(nbytes))
        ]
        case = f"[{n}, {HQ}+{HK}, {D}]"
        for name, call in providers.items():
            rows.append(BenchRow("apply_rope_inplace", case, name, bench_rotating(call, sets)[0], nbytes))
        rows.append(
            BenchRow(
                "apply_rope_inplace",
                case,
                "jit one input",
                run_benchmark(lambda first=sets[0]: providers["jit"](*first))[0],
                nbytes,
            )
        )
        del sets
        torch.cuda.empty_cache()
    return rows


def rope_kv_rows(cache: torch.Tensor, fp8: bool = False) -> list[BenchRow]:
    """The KV store into caches of the model dtype, or with ``fp8`` into float8_e4m3fn caches (k with a
    device scale, v with an inverse scale; one byte per cache element)."""
    op = "rope_with_kvcache_fp8" if fp8 else "rope_with_kvcache"
    slots = 2 * max(TOKENS)
    k_cache = torch.zeros(slots, HK * D, dtype=torch.float8_e4m3fn if fp8 else DTYPE, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    scales = {"k_scale": torch.tensor([0.37], device="cuda"), "v_inv_scale": V_INV_SCALE} if fp8 else {}
    reference = (lambda *a: torch_rope_kv_fp8(*a, scales["k_scale"])) if fp8 else torch_rope_kv
    compiled = torch.compile(reference)
    providers = {
        "jit": lambda q, k, v, pos, loc: apply_rope_inplace_with_kvcache(
            q, k, v, k_cache, v_cache, cache, pos, loc, is_neox=True, **scales
        ),
        "torch": lambda q, k, v, pos, loc: reference(q, k, v, k_cache, v_cache, cache, pos, loc),
        "torch.compile": lambda q, k, v, pos, loc: compiled(q, k, v, k_cache, v_cache, cache, pos, loc),
    }
    rows = []
    for n in TOKENS:
        nbytes = rope_kv_bytes(n, 1 if fp8 else 2)
        sets = [
            (
                torch.randn(n, HQ, D, dtype=DTYPE, device="cuda"),
                torch.randn(n, HK, D, dtype=DTYPE, device="cuda"),
                torch.randn(n, HK, D, dtype=DTYPE, device="cuda"),
                torch.randint(0, MAX_POS, (n,), device="cuda"),
                torch.randperm(slots, device="cuda")[:n],
            )
            for _ in range(num_rotating_sets(nbytes))
        ]
        case = f"[{n}, {HQ}+{HK}, {D}] +kv{' e4m3' if fp8 else ''}"
        for name, call in providers.items():
            rows.append(BenchRow(op, case, name, bench_rotating(call, sets)[0], nbytes))
        rows.append(
            BenchRow(
                op,
                case,
                "jit one input",
                run_benchmark(lambda first=sets[0]: providers["jit"](*first))[0],
                nbytes,
            )
        )
        # the same bytes with the cache rows written in order (slot i for token i): what the random
        # slot map costs (the scatter pattern's share of the gap to the copy roof)
        ordered = [(*s[:4], torch.arange(n, device="cuda")) for s in sets]
        rows.append(BenchRow(op, case, "jit ordered slots", bench_rotating(providers["jit"], ordered)[0], nbytes))
        del ordered
        del sets
        torch.cuda.empty_cache()
    return rows


def qknorm_rope_rows() -> list[BenchRow]:
    qw = torch.randn(D, dtype=DTYPE, device="cuda")
    kw = torch.randn(D, dtype=DTYPE, device="cuda")
    base = 1e6
    inv_freq = base ** (-torch.arange(0, D, 2, dtype=torch.float32, device="cuda") / D)
    compiled = torch.compile(torch_qk_norm_rope)
    providers = {
        "jit": lambda qkv, pos: fused_qk_norm_rope(
            qkv, HQ, HK, HV, D, 1e-6, qw, kw, base, True, pos, 1.0, 0.0, 0.0, 1.0
        ),
        "torch": lambda qkv, pos: torch_qk_norm_rope(qkv, qw, kw, pos, inv_freq),
        "torch.compile": lambda qkv, pos: compiled(qkv, qw, kw, pos, inv_freq),
    }
    rows = []
    for n in TOKENS:
        nbytes = qknorm_rope_bytes(n)
        sets = [
            (
                torch.randn(n, (HQ + HK + HV) * D, dtype=DTYPE, device="cuda"),
                torch.randint(0, MAX_POS, (n,), device="cuda"),
            )
            for _ in range(num_rotating_sets(nbytes))
        ]
        case = f"[{n}, {HQ}+{HK}+{HV}, {D}]"
        for name, call in providers.items():
            rows.append(BenchRow("fused_qk_norm_rope", case, name, bench_rotating(call, sets)[0], nbytes))
        rows.append(
            BenchRow(
                "fused_qk_norm_rope",
                case,
                "jit one input",
                run_benchmark(lambda first=sets[0]: providers["jit"](*first))[0],
                nbytes,
            )
        )
        del sets
        torch.cuda.empty_cache()
    return rows


def rotary_rows(cache: torch.Tensor) -> list[BenchRow]:
    cache_t = cache.to(DTYPE)
    rows = []
    for n in TOKENS:
        nbytes = rotary_bytes(n)
        sets = [
            (
                torch.randint(0, MAX_POS, (n,), device="cuda"),
                torch.randn(n, HQ * D, dtype=DTYPE, device="cuda"),
                torch.randn(n, HK * D, dtype=DTYPE, device="cuda"),
            )
            for _ in range(num_rotating_sets(nbytes))
        ]
        call = lambda pos, query, key: rotary_embedding(pos, query, key, D, cache_t, True)  # noqa: E731
        case = f"[{n}, {HQ}+{HK}, {D}]"
        rows.append(BenchRow("rotary_embedding", case, "jit", bench_rotating(call, sets)[0], nbytes))
        rows.append(
            BenchRow(
                "rotary_embedding", case, "jit one input", run_benchmark(lambda first=sets[0]: call(*first))[0], nbytes
            )
        )
        del sets
        torch.cuda.empty_cache()
    return rows


def eager_rows(cache: torch.Tensor) -> str:
    q = torch.randn(1, HQ, D, dtype=DTYPE, device="cuda")
    k = torch.randn(1, HK, D, dtype=DTYPE, device="cuda")
    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    results = {
        "jit apply_rope_inplace": eager_wall_us(lambda: apply_rope_inplace(q, k, cache, pos, is_neox=True)),
        "torch eager rope": eager_wall_us(lambda: torch_rope(q, k, cache, pos), calls=2000),
    }
    lines = ["# eager wall time per call, 1 token (host launch cost), one sync at the end"]
    lines += [f"{name:<28} {us:8.2f} us" for name, us in results.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--ops", default="rope,kv,kv8,qknorm,rotary", help="comma list of: rope, kv, kv8 (fp8 caches), qknorm, rotary"
    )
    ops = set(parser.parse_args().ops.split(","))
    exit_unless_gpu("bench_rope.py")
    cos_sin_cache = make_cos_sin_cache(MAX_POS, D)
    roof = copy_roof_gbps()
    all_rows: list[BenchRow] = []
    if "rope" in ops:
        all_rows += rope_rows(cos_sin_cache)
    if "kv" in ops:
        all_rows += rope_kv_rows(cos_sin_cache)
    if "kv8" in ops:
        all_rows += rope_kv_rows(cos_sin_cache, fp8=True)
    if "qknorm" in ops:
        all_rows += qknorm_rope_rows()
    if "rotary" in ops:
        all_rows += rotary_rows(cos_sin_cache)
    print(
        "# timing: cold L2 (inputs rotated past the L2) for jit / torch / torch.compile; 'jit one input' replays one"
        " input set (the tutorial's run_benchmark; partly L2-resident)"
    )
    print(format_rows(all_rows, roof))
    print(eager_rows(cos_sin_cache))
