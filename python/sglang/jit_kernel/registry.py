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


# Every op's entry factory, in display order. A new op adds its factory here.
_ENTRY_FACTORIES: list[Callable[[], OpEntry]] = [_scale_entry, _add_constant_entry]


def all_ops() -> dict[str, OpEntry]:
    """Every shipped op by name (imports the wrappers)."""
    entries = [factory() for factory in _ENTRY_FACTORIES]
    return {e.name: e for e in entries}
