"""MLA concatenations: ``concat_mla_k`` (the key from its latent and broadcast rotary parts, in place)
and ``concat_mla_absorb_q`` (the absorbed query, allocated).

Both are bit copies (no rounding, any dtype of whole bytes) served by ``csrc/elementwise/concat_mla.cuh``,
compiled per pair of row sizes in bytes (a compile-time knob; DeepSeek's pairs are prebuilt: k 128 + 64
and q 512 + 64 bf16 elements). Other head counts, dims and dtypes build their own pair on first use.

Bytes moved: concat_mla_k ``N*H*(nope + rope)*s`` written + ``N*H*nope*s + N*rope*s`` read;
concat_mla_absorb_q ``2 * d0*d1*(A + B)*s``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FAST_PATH_REFUSALS,
    check_no_partial_overlap,
    check_no_self_overlap,
    check_tensor,
    fail,
    launcher_errors,
    tracing,
    unit_last_stride,
)
from sglang.jit_kernel.registry import CheckCase, register_module, register_op
from sglang.jit_kernel.utils import cache_once, load_jit

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["concat_mla_absorb_q", "concat_mla_k"]

#: (a bytes, b bytes) of the prebuilt variants: DeepSeek k (128 + 64 bf16) and absorbed q (512 + 64 bf16).
_PREBUILT = ((256, 128), (1024, 128))


@cache_once
def _jit_concat_mla_module(a_bytes: int, b_bytes: int) -> Module:
    """Compile (first use) and cache the concat module for rows of ``a_bytes + b_bytes``."""
    return load_jit(
        "concat_mla",
        a_bytes,
        b_bytes,
        cuda_files=["elementwise/concat_mla.cuh"],
        cuda_wrappers=[("concat_mla", f"concat_mla<{a_bytes}, {b_bytes}>")],
    )


# The exported function by (a bytes, b bytes), filled when a module is loaded (the eager fast path).
_FNS: dict[tuple[int, int], Callable[..., None]] = {}


def _load(a_bytes: int, b_bytes: int) -> Callable[..., None]:
    fn = _jit_concat_mla_module(a_bytes, b_bytes).concat_mla
    _FNS[(a_bytes, b_bytes)] = fn
    return fn


def _row_bytes(t: torch.Tensor) -> int:
    return t.shape[-1] * t.element_size()


def _check_3d(op: str, arg: str, t: torch.Tensor, dims: str) -> None:
    if t.dim() != 3:
        fail(RuntimeError, op, arg, "shape", f"[{dims}]", tuple(t.shape))
    if t.shape[-1] == 0:
        fail(RuntimeError, op, arg, "shape", f"[{dims}] with a row of at least one element", tuple(t.shape))


def _check_parts(
    op: str,
    out: tuple[str, torch.Tensor],
    a: tuple[str, torch.Tensor],
    b: tuple[str, torch.Tensor],
    b_heads_one_ok: bool,
) -> None:
    """Shapes of out [N, H, A + B], a [N, H, A], b [N, H (or 1), B]; out disjoint from both."""
    (out_arg, o), (a_arg, x), (b_arg, y) = out, a, b
    if x.shape[:2] != o.shape[:2]:
        fail(
            RuntimeError, op, a_arg, "shape", f"{tuple(o.shape[:2])} leading dims (those of {out_arg})", tuple(x.shape)
        )
    heads_ok = y.shape[1] == o.shape[1] or (b_heads_one_ok and y.shape[1] == 1)
    if y.shape[0] != o.shape[0] or not heads_ok:
        heads = f"{o.shape[1]} or 1" if b_heads_one_ok else f"{o.shape[1]}"
        fail(RuntimeError, op, b_arg, "shape", f"[{o.shape[0]}, {heads}, rope]", tuple(y.shape))
    if x.shape[2] + y.shape[2] != o.shape[2]:
        fail(
            RuntimeError,
            op,
            out_arg,
            "shape",
            f"a last dim of {x.shape[2]} + {y.shape[2]} = {x.shape[2] + y.shape[2]} ({a_arg} + {b_arg})",
            tuple(o.shape),
        )
    if not tracing():  # fake tensors have no data pointer; the launcher checks it
        check_no_self_overlap(op, out_arg, o)
        check_no_partial_overlap(op, out_arg, o, x, a_arg, allow_same=False, dense_only=True)
        check_no_partial_overlap(op, out_arg, o, y, b_arg, allow_same=False, dense_only=True)


def _call(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: str, names: tuple[str, str, str]) -> None:
    """The launcher on ``out``, ``a``, ``b``; its errors name the op and its arguments ``names``."""
    key = (_row_bytes(a), _row_bytes(b))
    fn = _FNS.get(key) or _load(*key)
    with launcher_errors(op, dict(zip(("out", "a", "b"), names))):  # the exact overlap checks, named for the op
        fn(*(unit_last_stride(t) for t in (out, a, b)))  # a 1-element part's free stride: 1 for the launcher


# ---------------------------------------------------------------------------------------------
# concat_mla_k
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sglang_jit_kernel::concat_mla_k", mutates_args=("k",), device_types="cuda")
def _concat_mla_k_op(k: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> None:
    _call(k, k_nope, k_rope, "concat_mla_k", ("k", "k_nope", "k_rope"))


@_concat_mla_k_op.register_fake
def _(k: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> None:
    return None


def concat_mla_k(k: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> None:
    """Assemble MLA keys in place: ``k[:, :, :nope] = k_nope`` and ``k[:, :, nope:] = k_rope``
    broadcast over the heads.

    Bit copies (no rounding). DeepSeek: ``k [N, 128, 192]``, ``k_nope [N, 128, 128]``,
    ``k_rope [N, 1, 64]``, bf16; other head counts, dims and dtypes work too (each pair of row
    sizes compiles once).

    Parameters
    ----------
    k : torch.Tensor
        ``[num_tokens, num_heads, nope + rope]`` on a CUDA device, any dtype; token and head strides
        free, last dim contiguous; may not be 16-byte aligned (narrower vectors); must share no memory
        with ``k_nope`` or ``k_rope``. Written in place (every element).
    k_nope : torch.Tensor
        ``[num_tokens, num_heads, nope]``, the dtype of ``k``, strides likewise. Not modified.
    k_rope : torch.Tensor
        ``[num_tokens, 1, rope]`` (broadcast over the heads) or ``[num_tokens, num_heads, rope]``,
        likewise. Not modified.

    Returns
    -------
    None
        ``k`` is written in place; with 0 elements nothing is launched.

    Raises
    ------
    TypeError
        An argument that is not a tensor.
    RuntimeError
        A tensor not on ``k``'s CUDA device or of another dtype; shapes other than the above
        (including ``nope + rope`` not the last dim of ``k``, or an empty row); a last dim that is not
        contiguous; ``k`` sharing memory with a source, or with overlapping elements (expanded).
        Raised before any launch, as
        ``concat_mla_k: <arg> <what>: expected X, got Y``.
    """
    if not tracing():
        try:
            fn = _FNS.get((k_nope.shape[-1] * k_nope.element_size(), k_rope.shape[-1] * k_rope.element_size()))
        except (AttributeError, IndexError):  # not a tensor / 0-d: the checked path raises
            fn = None
        if fn is not None:
            try:
                fn(k, k_nope, k_rope)  # the launcher checks
                return
            except (AttributeError, IndexError, *FAST_PATH_REFUSALS):  # before any launch: the checked path explains
                pass
    op = "concat_mla_k"
    check_tensor(op, "k", k, last_dim_contiguous=True)
    check_tensor(op, "k_nope", k_nope, dtype_as=(k, "k"), last_dim_contiguous=True)
    check_tensor(op, "k_rope", k_rope, dtype_as=(k, "k"), last_dim_contiguous=True)
    _check_3d(op, "k", k, "num_tokens, num_heads, nope + rope")
    _check_3d(op, "k_nope", k_nope, "num_tokens, num_heads, nope")
    _check_3d(op, "k_rope", k_rope, "num_tokens, 1, rope")
    _check_parts(op, ("k", k), ("k_nope", k_nope), ("k_rope", k_rope), b_heads_one_ok=True)
    if k.numel() == 0:
        return
    if tracing():
        torch.ops.sglang_jit_kernel.concat_mla_k(k, k_nope, k_rope)
    else:
        _call(k, k_nope, k_rope, "concat_mla_k", ("k", "k_nope", "k_rope"))


# ---------------------------------------------------------------------------------------------
# concat_mla_absorb_q
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sglang_jit_kernel::concat_mla_absorb_q_out", mutates_args=("out",), device_types="cuda")
def _concat_mla_absorb_q_op(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    _call(out, a, b, "concat_mla_absorb_q", ("out", "a", "b"))


@_concat_mla_absorb_q_op.register_fake
def _(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    return None


def concat_mla_absorb_q(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Concatenate the absorbed MLA query parts: ``out = cat([a, b], dim=-1)``.

    Bit copies (no rounding). DeepSeek: ``a [d0, d1, 512]`` (the latent part), ``b [d0, d1, 64]``
    (the rotary part), bf16; other dims and dtypes work too (each pair of row sizes compiles once).

    Parameters
    ----------
    a : torch.Tensor
        ``[d0, d1, A]`` on a CUDA device, any dtype; the two leading strides free, last dim
        contiguous. Not modified.
    b : torch.Tensor
        ``[d0, d1, B]``, the dtype and device of ``a``, strides likewise. Not modified.

    Returns
    -------
    torch.Tensor
        ``[d0, d1, A + B]``, the dtype and device of ``a``, contiguous, newly allocated (no launch when
        it is empty).

    Raises
    ------
    TypeError
        An argument that is not a tensor.
    RuntimeError
        ``b`` not on ``a``'s CUDA device or of another dtype; shapes other than the above (or an empty
        last dim); a last dim that is not contiguous. Raised before any launch, as
        ``concat_mla_absorb_q: <arg> <what>: expected X, got Y``.
    """
    if not tracing():
        try:
            fn = _FNS.get((a.shape[-1] * a.element_size(), b.shape[-1] * b.element_size()))
        except (AttributeError, IndexError):  # not a tensor / 0-d: the checked path raises
            fn = None
        if fn is not None and a.dim() == 3:
            out = a.new_empty(a.shape[0], a.shape[1], a.shape[2] + b.shape[-1])
            try:
                fn(out, a, b)  # the launcher checks
                return out
            except FAST_PATH_REFUSALS:  # raised before any launch: the checked path explains
                pass
    op = "concat_mla_absorb_q"
    check_tensor(op, "a", a, last_dim_contiguous=True)
    check_tensor(op, "b", b, dtype_as=(a, "a"), last_dim_contiguous=True)
    _check_3d(op, "a", a, "d0, d1, A")
    _check_3d(op, "b", b, "d0, d1, B")
    if b.shape[:2] != a.shape[:2]:
        fail(RuntimeError, op, "b", "shape", f"[{a.shape[0]}, {a.shape[1]}, B] (the leading dims of a)", tuple(b.shape))
    out = a.new_empty(a.shape[0], a.shape[1], a.shape[2] + b.shape[2])
    if out.numel() == 0:
        return out
    if tracing():
        torch.ops.sglang_jit_kernel.concat_mla_absorb_q_out(out, a, b)
    else:
        _call(out, a, b, "concat_mla_absorb_q", ("out", "a", "b"))
    return out


# ---------------------------------------------------------------------------------------------
# Registration: one module per row-size pair; the DeepSeek pairs are prebuilt
# ---------------------------------------------------------------------------------------------
def _k_cases() -> list[CheckCase]:
    """``check``: DeepSeek k [16384, 128, 192] from k_nope [., 128, 128] and k_rope [., 1, 64], bf16."""
    n, h, nope, rope = 16384, 128, 128, 64

    def make() -> tuple:
        k = torch.empty(n, h, nope + rope, dtype=torch.bfloat16, device="cuda")
        return (
            k,
            torch.randn(n, h, nope, dtype=torch.bfloat16, device="cuda"),
            torch.randn(n, 1, rope, dtype=torch.bfloat16, device="cuda"),
        )

    def call(k: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
        concat_mla_k(k, k_nope, k_rope)
        return k

    def reference(k: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
        return torch.cat([k_nope, k_rope.expand(-1, h, -1)], dim=-1)

    return [
        CheckCase(
            f"[{n}, {h}, {nope}+{rope}] bf16",
            make,
            call,
            reference,
            bytes_moved=n * h * (nope + rope) * 2 + n * h * nope * 2 + n * rope * 2,
            dtype=torch.bfloat16,
        )
    ]


def _q_cases() -> list[CheckCase]:
    """``check``: DeepSeek absorbed q [4096, 128, 512 + 64] bf16."""
    d0, d1, a_dim, b_dim = 4096, 128, 512, 64

    def make() -> tuple:
        return (
            torch.randn(d0, d1, a_dim, dtype=torch.bfloat16, device="cuda"),
            torch.randn(d0, d1, b_dim, dtype=torch.bfloat16, device="cuda"),
        )

    return [
        CheckCase(
            f"[{d0}, {d1}, {a_dim}+{b_dim}] bf16",
            make,
            concat_mla_absorb_q,
            lambda a, b: torch.cat([a, b], dim=-1),
            bytes_moved=2 * d0 * d1 * (a_dim + b_dim) * 2,
            dtype=torch.bfloat16,
        )
    ]


_CONCAT_MLA_MODULE = register_module("concat_mla", _jit_concat_mla_module, list(_PREBUILT))
register_op("concat_mla_k", module=_CONCAT_MLA_MODULE, check_cases=_k_cases)
register_op("concat_mla_absorb_q", module=_CONCAT_MLA_MODULE, check_cases=_q_cases)
