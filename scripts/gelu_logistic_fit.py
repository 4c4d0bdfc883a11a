"""The fit behind the logistic gelu of 16-bit 16-byte launches (csrc/elementwise/activation.cuh,
activate_logistic) and a CPU model of both logistic activations on every finite 16-bit gate.

Fit: gelu(g) = g * Phi(g) = g * sigmoid(z), z = logit(Phi(g)) = g * P(g^2). P is a degree-6 weighted
minimax polynomial (Lawson's iteratively reweighted least squares, float64, Phi from mpmath) on
|g| <= 6, with the weight that makes one number bound both signs: Phi(-|g|) * |dz| <= 2^-POS (the
relative error of g * sigmoid(z) for g > 0) and |dz| <= 2^-NEG for |g| <= XNEG (the relative error for
g < 0). The kernel holds Q = -log2(e) * P rounded to fp32.

Model: the kernel's instruction sequence in numpy float32 (FMA through float64), ex2.approx.ftz and
rcp.approx.ftz as the exact value times (1 + k * 2^-23) for k at both ends and the middle of their
PTX bounds (2 and 1 ulps; --scale multiplies them), and the tests' acceptance against the fp32 formula
and against the float64 value: assert_matches_reference (1 ulp of the output at up = 1.5, either
rounding within MIDPOINT_ULPS fp32 ulps of a midpoint: 16 for gelu, 8 for gelu_tanh; the cancellation
slack) and the rounded activation itself (up = 1, exactly either rounding; gates above -3.6, as
test_logistic_every_16_bit_gate). Reads the coefficients from activation.cuh.

    python scripts/gelu_logistic_fit.py [--scale 2]      (CPU only; numpy, mpmath, torch)
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
import torch
from mpmath import erfc, log, mp, mpf, sqrt

KERNEL = Path(__file__).resolve().parents[1] / "python/sglang/jit_kernel/csrc/elementwise/activation.cuh"
LOG2E = 1.4426950408889634
DEGREE, X_MAX, POS, NEG, XNEG = 6, 6.0, 24.5, 21.0, 3.6
f32 = np.float32


def fit() -> np.ndarray:
    mp.dps = 40
    xs = np.linspace(1e-4, X_MAX, 8000)
    tail = np.array([float(erfc(mpf(x) / sqrt(2)) / 2) for x in xs])  # Phi(-x)
    logit = np.array([float(log((1 - mpf(t)) / mpf(t))) for t in tail])
    basis = np.vander(xs**2, DEGREE + 1, increasing=True)  # P(x^2) against logit / x
    weight = np.maximum(tail * 2**POS, (xs <= XNEG) * (1 - tail) * 2**NEG) * xs  # |dz| = x |P - logit / x|
    lawson = np.ones_like(xs)
    for _ in range(300):
        w = np.sqrt(lawson) * weight
        coef, *_ = np.linalg.lstsq(basis * w[:, None], logit / xs * w, rcond=None)
        err = np.abs(basis @ coef - logit / xs) * weight
        lawson *= err / err.max() + 1e-30
        lawson /= lawson.sum()
    q = (-LOG2E * coef).astype(f32)
    dz = np.abs(basis @ (-q.astype(np.float64) / LOG2E) - logit / xs) * xs
    print(
        f"fit: degree {DEGREE} on |g| <= {X_MAX}: Phi(-|g|) |dz| <= 2^{math.log2((dz * tail).max()):.2f}, "
        f"|dz| <= 2^{math.log2(dz[xs <= XNEG].max()):.2f} for |g| <= {XNEG}"
    )
    print("  Q (fp32):", ", ".join(f"{v!s}f" for v in q))
    return q


def kernel_coefficients() -> np.ndarray:
    found = dict(re.findall(r"\bc(\d) = (-?[0-9.]+(?:e[-+]?\d+)?)f", KERNEL.read_text()))
    return np.array([f32(found[str(i)]) for i in range(len(found))], dtype=f32)


def fma(a: np.ndarray, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    return (a.astype(np.float64) * np.float64(b) + np.asarray(c, dtype=np.float64)).astype(f32)


def ex2(t: np.ndarray, ulps: float) -> np.ndarray:
    t = np.where(np.abs(t) < 2.0**-126, 0, t).astype(np.float64)
    with np.errstate(over="ignore"):
        v = (np.exp2(t) * (1 + ulps * 2.0**-23)).astype(f32)
    return np.where(np.abs(v) < 2.0**-126, f32(0), v)


def rcp(d: np.ndarray, ulps: float) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        v = ((1.0 / d.astype(np.float64)) * (1 + ulps * 2.0**-23)).astype(f32)
    return np.where(np.abs(v) < 2.0**-126, f32(0), v)


def logistic(name: str, g: np.ndarray, q: np.ndarray, ex2_ulps: float, rcp_ulps: float) -> np.ndarray:
    """activate_logistic<kAct>(g), instruction by instruction (fma: one rounding, through float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = g * g
        if name == "gelu_tanh":
            beta, kappa = float(f32(0.7978845608)), float(f32(0.044715))
            h = fma(s, f32(-2 * beta * kappa * LOG2E), f32(-2 * beta * LOG2E))
        else:
            h = np.full_like(s, q[-1])
            for c in q[-2::-1]:
                h = fma(s, h, c)
        e = ex2(g * h, ex2_ulps)
        return g * rcp(f32(1) + e, rcp_ulps)


def reference(name: str, g: torch.Tensor, precise: bool) -> torch.Tensor:
    """The documented fp32 formula (activation_reference), or the float64 value."""
    if not precise:
        g = g.float()
        if name == "gelu":
            return (g * 0.5) * (1 + torch.erf(g * 0.7071067811865476))
        return (0.5 * g) * (1 + torch.tanh(0.7978845608 * (g + 0.044715 * (g * g * g))))
    g = g.double()
    if name == "gelu":
        return g * 0.5 * torch.special.erfc(-g * 0.7071067811865476)
    return g * torch.sigmoid(2 * 0.7978845608 * (g + 0.044715 * g**3))


def spacing(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    bits = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[dtype]
    tiny = torch.finfo(dtype).tiny
    return torch.exp2(torch.floor(torch.log2(v.double().abs().clamp_min(tiny))) - bits)


MIDPOINT_ULPS = {"silu": 8, "gelu": 16, "gelu_tanh": 8}  # test_activation.MIDPOINT_ULPS
CANCEL_ULPS = {"silu": 0, "gelu": 4, "gelu_tanh": 4}  # test_activation.CANCEL_ULPS


def roundings(name: str, act: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(near, other, ambiguous): act rounded to dtype, the neighbour across the midpoint, and whether act lies
    within MIDPOINT_ULPS[name] fp32 ulps of that midpoint (reference_pair)."""
    near = act.to(dtype)
    other = (2 * act.double() - near.double()).to(dtype)
    window = MIDPOINT_ULPS[name] * spacing(act, torch.float32)
    ambiguous = ((act.double() - (near.double() + other.double()) / 2).abs() <= window) & (other != near)
    return near, other, ambiguous


def accepted(name: str, out: torch.Tensor, gate: torch.Tensor, up: float, act: torch.Tensor) -> torch.Tensor:
    """assert_matches_reference's test, element-wise, with act as the reference activation."""
    dtype = out.dtype
    near, other, ambiguous = roundings(name, act, dtype)
    expected, alternative = (near.float() * up).to(dtype), (other.float() * up).to(dtype)
    slack = CANCEL_ULPS[name] * 2.0**-24 * (gate.double() * up).abs()
    got = out.double()
    ok = (got - expected.double()).abs() <= spacing(expected, dtype) + slack
    ok |= ambiguous & ((got - alternative.double()).abs() <= spacing(alternative, dtype) + slack)
    ok |= got == expected.double()
    return ok & ~torch.isnan(got)


def check(q: np.ndarray, scale: float) -> None:
    for dtype in (torch.bfloat16, torch.float16):
        every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
        gate = every[torch.isfinite(every)]
        for name in ("gelu_tanh", "gelu"):
            refs = {precise: reference(name, gate, precise) for precise in (False, True)}
            worst = {"fp32 formula": 0, "float64": 0, "either": 0, "rounding (up = 1)": 0}
            for e_ulps in (-2 * scale, 0, 2 * scale):
                for r_ulps in (-scale, 0, scale):
                    act = torch.from_numpy(logistic(name, gate.float().numpy(), q, e_ulps, r_ulps))
                    out = (act.to(dtype).float() * 1.5).to(dtype)
                    ok32, ok64 = (accepted(name, out, gate, 1.5, refs[p]) for p in (False, True))
                    rounded, exact = act.to(dtype), gate.float() <= -3.6
                    for p in (False, True):
                        near, other, ambiguous = roundings(name, refs[p], dtype)
                        exact |= (rounded == near) | (ambiguous & (rounded == other))
                    for key, ok in (
                        ("fp32 formula", ok32),
                        ("float64", ok64),
                        ("either", ok32 | ok64),
                        ("rounding (up = 1)", exact),
                    ):
                        worst[key] = max(worst[key], int((~ok).sum()))
            print(
                f"model {name:9s} {str(dtype)[6:]:8s} MUFU errors x{scale}: gates failing (worst corner) against "
                + ", ".join(f"{k} {v}" for k, v in worst.items())
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the MUFU error bounds")
    args = parser.parse_args()
    fitted, used = fit(), kernel_coefficients()
    print("  activation.cuh holds the same coefficients:", bool(np.array_equal(fitted, used)))
    roots = np.polyval(
        used[::-1].astype(np.float64), np.concatenate([np.linspace(0, 100, 4001), np.logspace(2, 38, 4000)])
    )
    print("  Q < 0 for every u >= 0 (sampled):", bool((roots < 0).all()))
    check(used, args.scale)


if __name__ == "__main__":
    main()
