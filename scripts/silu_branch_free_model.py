"""CPU model of the branch-free silu of 16-bit 16-byte launches (csrc/elementwise/activation.cuh,
activate_silu_branch_free) on every finite 16-bit gate, against the acceptance of the tests
(test_activation.py).

The kernel: silu(g) = g / (1 + exp(-g)) = (g * S) / (S + S * 2^t * 2^(-g * lo)), t = g * (-A), with
log2(e) = A + lo split so that g * A is exact in fp32 for every gate of the dtype (A has 15 significant
bits for bf16, whose gates have 8, and 13 for fp16, whose gates have 11; the 15-bit A lies within 2^-17.1
of log2(e)), 2^(-g * lo) taken to first order, S a power of two (g * S exact):
    x  = g (bf16), max(g, -88.5) (fp16)    FMNMX (fp16 only)
    t  = x * -A                            FMUL (exact)
    c  = sat(fma(x, -lo * ln2 * S, S))     FFMA.SAT: S * 2^(-g lo) to first order, in [0, 1]; g = +inf
                                           gives 0, not -inf (no 0 * inf below)
    e  = ex2.approx.ftz(t)                 MUFU.EX2
    d  = fma(e, c, S)                      FFMA: S * (1 + exp(-g))
    r  = rcp.approx.ftz(d)                 MUFU.RCP
    r  = fma(r, fma(-d, r, 1), r)          FFMA x2, fp16 only (one Newton step)
    act = (g * S) * r                      FMUL, FMUL
bf16, S = 2^-4: d < 2^124 wherever exp(-g) is finite, so the ftz reciprocal stays normal for the gates
-87.5 .. -88.5 (1 + exp(-g) >= 2^126), where the formula's results are tiny normal values. fp16, S = 1/2:
the Newton step keeps the gate -3.25390625 (11 fp32 ulps from a midpoint) on its side at twice the MUFU
bounds; the clamp keeps e finite (no inf * 0 in the step) and makes d >= 2^126 below about -88, where
rcp flushes to 0 and act = -0 (fp16's rounding of the formula) or NaN (g = -inf).

Modelled here in numpy float32 (FMA through float64), ex2.approx.ftz and rcp.approx.ftz as the exact value
times (1 + k * 2^-23) for k at both ends and the middle of their PTX bounds (2 and 1 ulps; --scale
multiplies them), against: assert_matches_reference at up = 1.5 ("fp32 formula": 1 ulp of the output,
either rounding within MIDPOINT_ULPS["silu"] = 8 fp32 ulps of a midpoint, no cancellation slack), the
rounded activation itself at up = 1 ("rounding (up = 1)": exactly the formula's rounding, or its
neighbour within 8 ulps of a midpoint), and the same with the formula's expf off by one ulp either way
("expf +-1 ulp": the GPU's expf is not the CPU's). Also the special values: +inf -> +inf, -inf -> NaN,
NaN -> NaN, gates beyond the formula's exp overflow -> -0.

    python scripts/silu_branch_free_model.py [--scale 2]      (CPU only; numpy, torch)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gelu_logistic_fit import accepted, ex2, fma, rcp, roundings  # the helpers of the gelu model

f32 = np.float32
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: S by dtype (kernel: kSiluScale)
SCALE = {torch.bfloat16: 2.0**-4, torch.float16: 0.5}
#: fp16's clamp of the gate's exponent path (kernel: kSiluHalfFloor): exp(-g) stays finite (no inf * 0 in
#: the Newton step) and S * (1 + exp(-g)) > 2^126, so the reciprocal flushes to 0 and g * 0 is -0 (or NaN
#: for g = -inf), as the formula's fp16 rounding there
FP16_FLOOR = -88.5
#: log2(e)'s high part by dtype (kernel: kSiluLog2eHi): 23637 / 2^14 (15 bits), 5909 / 2^12 (13 bits)
LOG2E_HI = {torch.bfloat16: 23637 / 16384, torch.float16: 5909 / 4096}


def constants(dtype: torch.dtype) -> tuple[np.float32, np.float32, np.float32]:
    """(-A, -lo * ln2 * S, S) in fp32, as the kernel's constexprs compute them (double, then float)."""
    hi, scale = LOG2E_HI[dtype], SCALE[dtype]
    return f32(-hi), f32(-(LOG2E - hi) * LN2 * scale), f32(scale)


def saturate(x: np.ndarray) -> np.ndarray:
    """fma.rn.sat's clamp: to [0, 1], NaN to +0."""
    return np.where(np.isnan(x), f32(0), np.clip(x, f32(0), f32(1))).astype(f32)


def silu_branch_free(g: np.ndarray, dtype: torch.dtype, ex2_ulps: float, rcp_ulps: float) -> np.ndarray:
    """activate_silu_branch_free<T>(g), instruction by instruction."""
    neg_hi, slope, s = constants(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        x = g if dtype == torch.bfloat16 else np.fmax(g, f32(FP16_FLOOR))  # fmaxf: NaN -> the floor
        t = x * neg_hi
        c = saturate(fma(x, slope, s))
        e = ex2(t, ex2_ulps)
        d = fma(e, c, s)
        r = rcp(d, rcp_ulps)
        if dtype == torch.float16:  # one Newton step
            r = fma(r, fma(-d, r, f32(1)), r)
        return (g * s) * r


def exact_products(dtype: torch.dtype, g: np.ndarray) -> bool:
    """Whether g * -A and g * S are exact for every finite gate (the split's premise; g * -A may overflow
    to inf, where exp(-g) does too)."""
    neg_hi, _, s = constants(dtype)
    g64 = g.astype(np.float64)
    with np.errstate(over="ignore"):
        t = g * neg_hi
    exact_t = (t.astype(np.float64) == g64 * float(neg_hi)) | (np.isinf(t) & (np.abs(g64 * float(neg_hi)) > 3.4e38))
    return bool(exact_t.all() and ((g * s) == g64 * float(s)).all())


def formula(g: torch.Tensor, expf_ulps: int) -> torch.Tensor:
    """The documented fp32 formula g / (1 + exp(-g)): torch's expf (expf_ulps None), or the correctly
    rounded expf moved by expf_ulps fp32 ulps."""
    g = g.float()
    if expf_ulps is None:
        return g / (1 + torch.exp(-g))
    e = torch.exp(-g.double()).float()
    for _ in range(abs(expf_ulps)):  # finite values only (an overflowing expf stays inf)
        e = torch.where(torch.isinf(e), e, torch.nextafter(e, torch.tensor(math.copysign(math.inf, expf_ulps))))
    return g / (1 + e)


def check(scale: float) -> int:
    failures = 0
    for dtype in (torch.bfloat16, torch.float16):
        every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
        gate = every[torch.isfinite(every)]
        g = gate.float().numpy()
        print(f"{str(dtype)[6:]}: g * A and g * S exact for every finite gate: {exact_products(dtype, g)}")
        refs = {ulps: formula(gate, ulps) for ulps in (None, -1, 1)}
        worst = {"fp32 formula": 0, "rounding (up = 1)": 0, "expf +-1 ulp": 0, "specials": 0}
        for e_ulps in (-2 * scale, 0, 2 * scale):
            for r_ulps in (-scale, 0, scale):
                act = torch.from_numpy(silu_branch_free(g, dtype, e_ulps, r_ulps))
                out = (act.to(dtype).float() * 1.5).to(dtype)
                rounded = act.to(dtype)
                ok = {}
                for ulps, ref in refs.items():
                    near, other, ambiguous = roundings("silu", ref, dtype)
                    strict = (rounded == near) | (ambiguous & (rounded == other))
                    both = accepted("silu", out, gate, 1.5, ref) & strict
                    if ulps is None:
                        ok["fp32 formula"] = accepted("silu", out, gate, 1.5, ref)
                        ok["rounding (up = 1)"] = strict
                    else:
                        ok["expf +-1 ulp"] = ok.get("expf +-1 ulp", both) & both
                special = torch.tensor([math.inf, -math.inf, math.nan], dtype=dtype)
                got = torch.from_numpy(silu_branch_free(special.float().numpy(), dtype, e_ulps, r_ulps))
                ok["specials"] = torch.tensor([bool(got[0] == math.inf), bool(got[1].isnan()), bool(got[2].isnan())])
                for key, value in ok.items():
                    worst[key] = max(worst[key], int((~value).sum()))
                if e_ulps == 2 * scale and r_ulps == scale:
                    bad = ~ok["rounding (up = 1)"]
                    if bad.any():
                        print("   failing gates (one corner):", gate[bad][:8].tolist())
        tiny = gate.float() <= -87.0
        act = torch.from_numpy(silu_branch_free(g, dtype, 0, 0))
        print(
            f"model silu {str(dtype)[6:]:8s} MUFU errors x{scale}: gates failing (worst corner) against "
            + ", ".join(f"{k} {v}" for k, v in worst.items())
            + f"; gates <= -87: {int(tiny.sum())}, of which nonzero: {int((act[tiny] != 0).sum())}"
            f" (formula: {int((refs[None][tiny] != 0).sum())})"
        )
        failures += sum(worst.values())
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the MUFU error bounds")
    args = parser.parse_args()
    for dtype, hi in LOG2E_HI.items():
        print(f"{str(dtype)[6:]}: log2(e) - A = 2^{math.log2(LOG2E - hi):.2f}")
    sys.exit(1 if check(args.scale) else 0)


if __name__ == "__main__":
    main()
