"""The catalogue of shipped ops: every compile-time variant (for prebuilds) and one check case per op
(for ``python -m sglang.jit_kernel check``).

An op registers itself by adding a factory of its ``OpEntry`` to ``_ENTRY_FACTORIES`` below: its name, the module builder (the
``@cache_once`` function of its wrapper), the argument tuples of every variant it ships with, and
``check_cases``, which returns cases that run the op on fresh random inputs against an fp32
reference and count the bytes the op must move.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch


@dataclass(frozen=True)
class CheckCase:
    """One correctness-and-speed case of an op.

    ``make_inputs()`` draws fresh random inputs (a tuple); ``call(*inputs)`` runs the op and returns
    its output (for in-place ops, the mutated tensor); ``reference(*inputs)`` returns the expected
    output from an fp32 computation on the same inputs, rounded to the output dtype (it must be
    computed before ``call`` mutates anything, so ``check`` calls it first); ``bytes_moved`` is the
    fewest bytes the op must read plus write.
    """

    label: str
    make_inputs: Callable[[], tuple]
    call: Callable[..., torch.Tensor]
    reference: Callable[..., torch.Tensor]
    bytes_moved: int
    dtype: torch.dtype


@dataclass(frozen=True)
class OpEntry:
    """An op: its module builder, the build arguments of every shipped variant, its check cases."""

    name: str
    build: Callable[..., Any]
    variants: Sequence[tuple]
    check_cases: Callable[[], list[CheckCase]] = field(default=lambda: [])

    def variant_names(self) -> list[str]:
        return [f"{self.name}[{', '.join(_show(a) for a in args)}]" for args in self.variants]


def _show(value: Any) -> str:
    return str(value).replace("torch.", "")


_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


# ---- scale ----
def _scale_entry() -> OpEntry:
    from sglang.jit_kernel.scale import _jit_scale_module, scale  # noqa: PLC0415

    def cases() -> list[CheckCase]:
        n = 1 << 24
        factor = 1.5

        def make() -> tuple:
            src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
            return src, torch.empty_like(src)

        return [
            CheckCase(
                label=f"[{n}] bf16",
                make_inputs=make,
                call=lambda src, out: scale(src, factor, out=out),
                reference=lambda src, out: (src.float() * factor).to(src.dtype),
                bytes_moved=2 * n * 2,
                dtype=torch.bfloat16,
            )
        ]

    return OpEntry("scale", _jit_scale_module, [(d,) for d in _FLOATS], cases)


# ---- add_constant ----
def _add_constant_entry() -> OpEntry:
    from sglang.jit_kernel.add_constant import _jit_add_constant_module, add_constant  # noqa: PLC0415

    def cases() -> list[CheckCase]:
        n = 1 << 24

        def make() -> tuple:
            src = torch.randint(-(2**20), 2**20, (n,), dtype=torch.int32, device="cuda")
            return src, torch.empty_like(src)

        return [
            CheckCase(
                label=f"[{n}] int32 +1",
                make_inputs=make,
                call=lambda src, out: add_constant(src, 1, out=out),
                reference=lambda src, out: (src.long() + 1).to(torch.int32),
                bytes_moved=2 * n * 4,
                dtype=torch.int32,
            )
        ]

    return OpEntry("add_constant", _jit_add_constant_module, [(1,)], cases)


# ---- norm: rmsnorm, fused_add_rmsnorm, their gemma forms, fused_inplace_qknorm ----
def _rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """fp32 RMSNorm of the same low-precision rows, rounded once to the dtype."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * (w.float() + offset)).to(x.dtype)


def _rmsnorm_entries() -> list[OpEntry]:
    from sglang.jit_kernel.norm import (  # noqa: PLC0415
        _jit_norm_module,
        fused_add_rmsnorm,
        gemma_fused_add_rmsnorm,
        gemma_rmsnorm,
        rmsnorm,
    )

    shapes = [(16384, 4096), (16384, 8192)]
    dtype = torch.bfloat16

    def plain_cases(fn, offset: float) -> Callable[[], list[CheckCase]]:
        def cases() -> list[CheckCase]:
            out = []
            for n, h in shapes:
                def make(n=n, h=h) -> tuple:
                    x = torch.randn(n, h, dtype=dtype, device="cuda")
                    w = torch.randn(h, dtype=dtype, device="cuda")
                    return x, w, torch.empty_like(x)

                out.append(
                    CheckCase(
                        label=f"[{n}, {h}] bf16",
                        make_inputs=make,
                        call=lambda x, w, o: fn(x, w, 1e-6, out=o),
                        reference=lambda x, w, o: _rms_reference(x, w, 1e-6, offset),
                        bytes_moved=2 * n * h * 2 + h * 2,  # read x, write out, read w
                        dtype=dtype,
                    )
                )
            return out

        return cases

    def fused_cases(fn, offset: float) -> Callable[[], list[CheckCase]]:
        def cases() -> list[CheckCase]:
            out = []
            for n, h in shapes:
                def make(n=n, h=h) -> tuple:
                    x = torch.randn(n, h, dtype=dtype, device="cuda")
                    r = torch.randn(n, h, dtype=dtype, device="cuda")
                    return x, r, torch.randn(h, dtype=dtype, device="cuda")

                def call(x, r, w):
                    fn(x, r, w, 1e-6)
                    return x

                out.append(
                    CheckCase(
                        label=f"[{n}, {h}] bf16",
                        make_inputs=make,
                        call=call,
                        reference=lambda x, r, w: _rms_reference(
                            (x.float() + r.float()).to(dtype), w, 1e-6, offset
                        ),
                        bytes_moved=4 * n * h * 2 + h * 2,  # read x and r, write both, read w
                        dtype=dtype,
                    )
                )
            return out

        return cases

    # One norm module per dtype serves all five norm ops (gemma = a runtime weight offset of 1):
    # its variants are listed once, under rmsnorm; building it for any other norm op is a cache hit.
    variants = [(d,) for d in _FLOATS]
    return [
        OpEntry("rmsnorm", _jit_norm_module, variants, plain_cases(rmsnorm, 0.0)),
        OpEntry("fused_add_rmsnorm", _jit_norm_module, [], fused_cases(fused_add_rmsnorm, 0.0)),
        OpEntry("gemma_rmsnorm", _jit_norm_module, [], plain_cases(gemma_rmsnorm, 1.0)),
        OpEntry("gemma_fused_add_rmsnorm", _jit_norm_module, [], fused_cases(gemma_fused_add_rmsnorm, 1.0)),
    ]


def _rmsnorm_entry() -> OpEntry:
    return _rmsnorm_entries()[0]


def _fused_add_rmsnorm_entry() -> OpEntry:
    return _rmsnorm_entries()[1]


def _gemma_rmsnorm_entry() -> OpEntry:
    return _rmsnorm_entries()[2]


def _gemma_fused_add_rmsnorm_entry() -> OpEntry:
    return _rmsnorm_entries()[3]


def _qknorm_entry() -> OpEntry:
    from sglang.jit_kernel.norm import _jit_norm_module, fused_inplace_qknorm  # noqa: PLC0415

    def cases() -> list[CheckCase]:
        n, hq, hk, d = 16384, 32, 8, 128
        dtype = torch.bfloat16

        def make() -> tuple:
            qkv = torch.randn(n, (hq + 2 * hk) * d, dtype=dtype, device="cuda")
            return qkv, torch.randn(d, dtype=dtype, device="cuda"), torch.randn(d, dtype=dtype, device="cuda")

        def views(qkv):
            q = qkv[:, : hq * d].view(n, hq, d)
            k = qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
            return q, k

        def call(qkv, qw, kw):
            q, k = views(qkv)
            fused_inplace_qknorm(q, k, qw, kw, 1e-6)
            return qkv

        def reference(qkv, qw, kw):
            q, k = views(qkv)
            expected = qkv.clone()
            expected[:, : hq * d] = _rms_reference(q, qw, 1e-6, 0.0).view(n, hq * d)
            expected[:, hq * d : (hq + hk) * d] = _rms_reference(k, kw, 1e-6, 0.0).view(n, hk * d)
            return expected

        return [
            CheckCase(
                label=f"[{n}, {hq}+{hk}, {d}] bf16",
                make_inputs=make,
                call=call,
                reference=reference,
                bytes_moved=2 * n * (hq + hk) * d * 2 + 2 * d * 2,  # read + write q and k, weights
                dtype=dtype,
            )
        ]

    # Same module as rmsnorm (see _rmsnorm_entries): no variants of its own.
    return OpEntry("fused_inplace_qknorm", _jit_norm_module, [], cases)


# Every op's entry factory, in display order. A new op adds its factory here.
_ENTRY_FACTORIES: list[Callable[[], OpEntry]] = [
    _scale_entry,
    _add_constant_entry,
    _rmsnorm_entry,
    _fused_add_rmsnorm_entry,
    _gemma_rmsnorm_entry,
    _gemma_fused_add_rmsnorm_entry,
    _qknorm_entry,
]


def all_ops() -> dict[str, OpEntry]:
    """Every shipped op by name (imports the wrappers)."""
    entries = [factory() for factory in _ENTRY_FACTORIES]
    return {e.name: e for e in entries}
