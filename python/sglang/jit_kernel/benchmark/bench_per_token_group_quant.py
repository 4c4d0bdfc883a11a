"""Benchmark per_token_group_quant with fuse_silu_and_mul (silu and mul + per-token-group fp8 quant,
group 128) against our unfused silu_and_mul + per_token_group_quant_8bit, torch eager and
torch.compile, with the device copy roof measured in the same run.

Cases:
  - Llama-3-8B MLP: input ``[T, 2 x 14336]`` bf16, T in 1, 64, 256, 2048, 16384 (CI: 1, 2048);
  - DeepSeek-V3 masked MoE (DeepEP low-latency layout): ``[32 experts, T_pad 256, 2 x 2048]`` bf16 with
    masked_m drawn around expected_m = 64 rows per expert.
Bytes moved (the op's minimum): ``M * 2H * 2 + M * H + 4 * M * H / 128`` for the ``M`` rows computed
(read gate and up in bf16, write fp8 and one fp32 scale per group); for the masked case ``M`` is
``sum(masked_m)`` (torch computes every padded row; its µs are still held to the valid rows' bytes).
Rows: cold L2 (inputs rotated past the L2 size) and one input (the same buffers each call);
µs is the CUDA-graph median.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.benchmark.utils import exit_unless_gpu

if __name__ == "__main__":
    exit_unless_gpu("bench_per_token_group_quant.py")  # before importing triton

from sglang.jit_kernel.benchmark.bench_per_token_group_quant_8bit import quant_rows  # noqa: E402
from sglang.jit_kernel.benchmark.utils import (  # noqa: E402
    BenchRow,
    bench_rotating,
    copy_roof_gbps,
    format_rows,
    get_benchmark_range,
    num_rotating_sets,
)
from sglang.test.ci.ci_register import register_cuda_ci  # noqa: E402

register_cuda_ci(est_time=120, suite="stage-b-kernel-benchmark-1-gpu-large")

TOKENS = get_benchmark_range(full_range=[1, 64, 256, 2048, 16384], ci_range=[1, 2048])
HIDDEN, GROUP, EPS = 14336, 128, 1e-10
MOE_EXPERTS, MOE_T_PAD, MOE_HIDDEN, MOE_EXPECTED_M = 32, 256, 2048, 64
FP8 = torch.float8_e4m3fn


def nbytes(rows: int, hidden: int) -> int:
    return rows * 2 * hidden * 2 + rows * hidden + 4 * rows * (hidden // GROUP)


def _torch_fused(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    """silu(gate) * up rounded to bf16 (legacy), then the group quant, in torch ops."""
    h = x.shape[-1] // 2
    act = torch.nn.functional.silu(x[..., :h]) * x[..., h:]
    groups = act.float().unflatten(-1, (h // GROUP, GROUP))
    scale = groups.abs().amax(-1).clamp_min(EPS) / 448.0
    q.copy_((groups / scale.unsqueeze(-1)).clamp(-448.0, 448.0).flatten(-2).to(FP8))
    s.copy_(scale)


def main() -> None:
    from sglang.jit_kernel.activation import silu_and_mul  # noqa: PLC0415
    from sglang.jit_kernel.per_token_group_quant import per_token_group_quant  # noqa: PLC0415
    from sglang.jit_kernel.per_token_group_quant_8bit import per_token_group_quant_8bit  # noqa: PLC0415

    roof = copy_roof_gbps()
    compiled = torch.compile(_torch_fused)

    # Dense rows: [T, 2H] -> [T, H] fp8 + [T, H / 128] fp32 (row-major)
    def make(t: int) -> tuple:
        x = torch.randn(t, 2 * HIDDEN, dtype=torch.bfloat16, device="cuda")
        q = torch.empty(t, HIDDEN, dtype=FP8, device="cuda")
        h = torch.empty(t, HIDDEN, dtype=torch.bfloat16, device="cuda")  # the unfused intermediate
        return x, q, torch.empty(t, HIDDEN // GROUP, device="cuda"), h

    def unfused(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, h: torch.Tensor) -> None:
        silu_and_mul(x, h)
        per_token_group_quant_8bit(h, q, s, GROUP, EPS, -448.0, 448.0)

    providers = {
        "jit fused (legacy)": lambda x, q, s, h: per_token_group_quant(x, q, s, GROUP, fuse_silu_and_mul=True),
        "jit fused (dense)": lambda x, q, s, h: per_token_group_quant(
            x, q, s, GROUP, fuse_silu_and_mul=True, silu_and_mul_mode="dense"
        ),
        "jit unfused": unfused,
        "torch": lambda x, q, s, h: _torch_fused(x, q, s),
        "torch.compile": lambda x, q, s, h: compiled(x, q, s),
    }
    rows = quant_rows("silu_and_mul + group quant", TOKENS, make, providers, lambda t: nbytes(t, HIDDEN))

    # Masked MoE rows: [E, T_pad, 2H], masked_m around the expected count
    e, t_pad, hidden = MOE_EXPERTS, MOE_T_PAD, MOE_HIDDEN
    generator = torch.Generator(device="cuda").manual_seed(0)
    masked_m = torch.randint(
        MOE_EXPECTED_M // 2, 3 * MOE_EXPECTED_M // 2, (e,), dtype=torch.int32, device="cuda", generator=generator
    )
    valid_rows = int(masked_m.sum())
    moe_bytes = nbytes(valid_rows, hidden)

    def make_moe() -> tuple:
        x = torch.randn(e, t_pad, 2 * hidden, dtype=torch.bfloat16, device="cuda")
        q = torch.empty(e, t_pad, hidden, dtype=FP8, device="cuda")
        s = torch.empty(e, hidden // GROUP, t_pad, device="cuda").transpose(1, 2)  # per-expert column-major
        h = torch.empty(e * t_pad, hidden, dtype=torch.bfloat16, device="cuda")
        s_rows = torch.empty(e * t_pad, hidden // GROUP, device="cuda")  # the unfused op's (row-major) scales
        return x, q, s, h, s_rows

    def moe_unfused(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, h: torch.Tensor, s_rows: torch.Tensor) -> None:
        # No masked path in the unfused ops: every padded row is computed.
        silu_and_mul(x.view(e * t_pad, 2 * hidden), h)
        per_token_group_quant_8bit(h, q.view(e * t_pad, hidden), s_rows, GROUP, EPS, -448.0, 448.0)

    moe_providers = {
        "jit fused (legacy)": lambda x, q, s, h, s_rows: per_token_group_quant(
            x, q, s, GROUP, False, True, masked_m, MOE_EXPECTED_M
        ),
        "jit unfused (all rows)": moe_unfused,
        "torch (all rows)": lambda x, q, s, h, s_rows: _torch_fused(x, q, s),
        "torch.compile (all rows)": lambda x, q, s, h, s_rows: compiled(x, q, s),
    }
    case = f"[{e}, {t_pad}, 2 x {hidden}] masked, {valid_rows} rows"
    sets = [make_moe() for _ in range(num_rotating_sets(moe_bytes))]
    for label, input_sets in (("cold", sets), ("one input", sets[:1])):
        for name, call in moe_providers.items():
            rows.append(BenchRow("masked MoE", f"{case} {label}", name, bench_rotating(call, input_sets)[0], moe_bytes))

    print(
        f"# per_token_group_quant(fuse_silu_and_mul=True) bf16 -> fp8, group {GROUP}; "
        "bytes = M*2H*2 + M*H + 4*M*H/128 (M: rows computed)"
    )
    print(format_rows(rows, roof))


if __name__ == "__main__":
    main()
