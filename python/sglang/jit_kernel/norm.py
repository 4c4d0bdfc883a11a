"""Normalisation ops: RMSNorm (both multiply orders), fused residual add + RMSNorm, their Gemma
forms, per-head QK RMSNorm and QK RMSNorm across heads.

Every op computes in fp32 and rounds once to the tensor dtype (float16, bfloat16 or float32);
``rmsnorm_hf`` rounds twice, in Hugging Face's order (also importable from
``sglang.jit_kernel.rmsnorm_hf``). Kernels: ``csrc/elementwise/rmsnorm.cuh`` (its own kernel), and
the row engine ``norm_rows.cuh`` behind the launchers ``fused_add_rmsnorm.cuh``, ``qknorm.cuh`` and
``qknorm_across_heads.cuh``; each op's module (one per dtype) compiles only its own kernels.

Bytes moved (for bandwidth figures), with ``s = element_size``:
rmsnorm / rmsnorm_hf ``2*N*H*s + H*s``; fused_add_rmsnorm ``4*N*H*s + H*s``;
fused_inplace_qknorm ``2*N*(Hq+Hk)*D*s + 2*D*s``;
fused_inplace_qknorm_across_heads ``2*N*(hidden_q+hidden_k)*s + (hidden_q+hidden_k)*s``.

A row of ``2**30`` elements or more is refused by the launcher (``<op>: rmsnorm: hidden_size must be
< 2^30, got N``). Every other error reads ``<op>: <arg> <what>: expected X, got Y``, raised before
any launch: by the Python
checks (``sglang.jit_kernel._validate``), which also refuse overlapping dense tensors, or, for the
aliasing of strided and interleaved views, by the C++ launchers' exact test, in the same words
(``fused_inplace_qknorm: k overlaps q: expected disjoint memory, got a partial overlap (k [...), q
[...))``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FAST_PATH_REFUSALS,
    FLOAT_DTYPES,
    VIEW_ERRORS,
    check_no_partial_overlap,
    check_scalar,
    check_tensor,
    fail,
    launcher_errors,
    rows_are_views,
    tracing,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = [
    "rmsnorm",
    "rmsnorm_hf",
    "is_supported_rmsnorm_hf_hidden_size",
    "fused_add_rmsnorm",
    "is_supported_jit_fused_add_rmsnorm_hidden_size",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "fused_inplace_qknorm",
    "can_use_fused_inplace_qknorm",
    "fused_inplace_qknorm_across_heads",
]

#: Row lengths (hidden_size, head_dim) the launchers take: 1 <= n < 2^30 (NormParams keeps vector
#: counts in 32 bits).
_MAX_ROW = 1 << 30
_ZERO = 0  # fused_inplace_qknorm's default head_dim, for an identity test on its fast path


# ---------------------------------------------------------------------------------------------
# Modules: two per op and dtype, each compiling only the kernels its op dispatches to (the
# vectors-per-thread buckets and L2-hint builds of its NormKind): "wide", the 16-byte vectors of
# aligned rows, loaded on the first call; "narrow", the 8 / 4 / 2-byte vectors of rows that do not
# allow 16 bytes (odd hidden sizes, offset views), loaded on the first such call. A wide launcher
# returns False, launching nothing, for such rows; the launch then goes to the narrow module.
# gemma_rmsnorm and rmsnorm_hf are runtime parameters of rmsnorm's kernels (weight offset, multiply
# order) and share its modules; gemma_fused_add_rmsnorm likewise shares fused_add_rmsnorm's.
# fused_inplace_qknorm and fused_inplace_qknorm_across_heads launch the same kQKNorm builds and
# share one module per width.
# ---------------------------------------------------------------------------------------------
#: The module widths, in the order a launch tries them.
NORM_WIDTHS = ("wide", "narrow")


def _norm_args(dtype: torch.dtype, widths: str):
    if widths not in NORM_WIDTHS:
        raise ValueError(f"norm module: widths: expected one of {NORM_WIDTHS}, got {widths!r}")
    return make_cpp_args(dtype, f"NormWidths::k{widths.capitalize()}")


@cache_once
def _jit_rmsnorm_module(dtype: torch.dtype, widths: str = "wide") -> Module:
    """Compile (first use) and cache rmsnorm's module for ``dtype`` and ``widths`` (also
    gemma_rmsnorm and rmsnorm_hf)."""
    args = _norm_args(dtype, widths)
    return load_jit(
        "rmsnorm",
        *args,
        cuda_files=["elementwise/rmsnorm.cuh"],
        cuda_wrappers=[("rmsnorm", f"rmsnorm<{args}>")],
    )


@cache_once
def _jit_fused_add_rmsnorm_module(dtype: torch.dtype, widths: str = "wide") -> Module:
    """Compile (first use) and cache fused_add_rmsnorm's module for ``dtype`` and ``widths`` (also
    the gemma form)."""
    args = _norm_args(dtype, widths)
    return load_jit(
        "fused_add_rmsnorm",
        *args,
        cuda_files=["elementwise/fused_add_rmsnorm.cuh"],
        cuda_wrappers=[("fused_add_rmsnorm", f"fused_add_rmsnorm<{args}>")],
    )


@cache_once
def _jit_qknorm_module(dtype: torch.dtype, widths: str = "wide") -> Module:
    """Compile (first use) and cache the qk-norm module for ``dtype`` and ``widths``:
    ``fused_inplace_qknorm`` and ``fused_inplace_qknorm_across_heads``, two launchers over the same
    kernel builds."""
    args = _norm_args(dtype, widths)
    return load_jit(
        "fused_inplace_qknorm",
        *args,
        cuda_files=["elementwise/qknorm_across_heads.cuh"],  # includes qknorm.cuh
        cuda_wrappers=[
            ("fused_inplace_qknorm", f"fused_inplace_qknorm<{args}>"),
            ("fused_inplace_qknorm_across_heads", f"fused_inplace_qknorm_across_heads<{args}>"),
        ],
    )


# The wide launchers by dtype, filled when a dtype's wide module is loaded: the eager fast path is
# one dict lookup and the call (a dtype missing here, or rows the wide launcher declines, take the
# checked path, which loads what the launch needs).
_RMSNORM_FNS: dict[torch.dtype, Callable[..., bool]] = {}
_FUSED_ADD_RMSNORM_FNS: dict[torch.dtype, Callable[..., bool]] = {}
_QKNORM_FNS: dict[torch.dtype, Callable[..., bool]] = {}
_QKNORM_ACROSS_HEADS_FNS: dict[torch.dtype, Callable[..., bool]] = {}


@functools.cache
def _any_width(build: Callable[[torch.dtype, str], Module], dtype: torch.dtype, name: str) -> Callable[..., None]:
    """A launch of ``name`` from ``build``'s modules: the wide launcher, then the narrow one (its
    module compiled on first use) for rows the wide one declines. Made once per op and dtype (the
    torch.library ops fetch it on every call)."""
    wide = getattr(build(dtype, "wide"), name)

    def launch(*args: object) -> None:
        if not wide(*args):
            getattr(build(dtype, "narrow"), name)(*args)

    return launch


def _load_rmsnorm(dtype: torch.dtype) -> Callable[..., None]:
    """rmsnorm's launch for ``dtype`` (modules compiled on first use); registers the fast path."""
    _RMSNORM_FNS[dtype] = _jit_rmsnorm_module(dtype).rmsnorm
    return _any_width(_jit_rmsnorm_module, dtype, "rmsnorm")


def _load_fused_add_rmsnorm(dtype: torch.dtype) -> Callable[..., None]:
    """fused_add_rmsnorm's launch for ``dtype`` (modules compiled on first use); registers the fast path."""
    _FUSED_ADD_RMSNORM_FNS[dtype] = _jit_fused_add_rmsnorm_module(dtype).fused_add_rmsnorm
    return _any_width(_jit_fused_add_rmsnorm_module, dtype, "fused_add_rmsnorm")


def _load_qknorm(dtype: torch.dtype, across_heads: bool) -> Callable[..., None]:
    """The qk-norm launch for ``dtype`` (per head, or with ``across_heads`` per row; modules compiled
    on first use); registers both fast paths."""
    module = _jit_qknorm_module(dtype)
    _QKNORM_FNS[dtype] = module.fused_inplace_qknorm
    _QKNORM_ACROSS_HEADS_FNS[dtype] = module.fused_inplace_qknorm_across_heads
    name = "fused_inplace_qknorm_across_heads" if across_heads else "fused_inplace_qknorm"
    return _any_width(_jit_qknorm_module, dtype, name)


def _pdl_flag(enable_pdl: bool | None) -> int:
    """enable_pdl as the launchers take it: -1 auto (SM90+), 1 on, 0 off."""
    return -1 if enable_pdl is None else int(enable_pdl)


def _as_rows(op: str, name: str, tensor: torch.Tensor, copy_ok: bool = False) -> torch.Tensor:
    """``[..., hidden_size]`` -> ``[num_tokens, hidden_size]``: a view when the leading dims can be
    flattened; otherwise a copy if ``copy_ok`` (read-only inputs), else an error."""
    if tensor.dim() == 2:
        return tensor
    try:
        return tensor.view(-1, tensor.shape[-1])
    except VIEW_ERRORS:
        if copy_ok:
            return tensor.reshape(-1, tensor.shape[-1])
        fail(
            RuntimeError,
            op,
            name,
            "layout",
            "leading dims that flatten to [num_tokens, hidden_size] without a copy",
            f"shape {tuple(tensor.shape)} with strides {tensor.stride()}",
        )


def _check_qk_overlaps(
    op: str, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor
) -> None:
    """The in-place q / k launchers' aliasing rules, where a byte-span test decides them (dense
    views); q and k interleaved in one buffer, and other strided views, are left to the launcher's
    exact element test (verify_qk_in_place), which words its refusals the same way."""
    check_no_partial_overlap(op, "k", k, q, "q", allow_same=False, dense_only=True)
    for arg, t in (("q", q), ("k", k)):
        check_no_partial_overlap(op, arg, t, q_weight, "q_weight", allow_same=False, dense_only=True)
        check_no_partial_overlap(op, arg, t, k_weight, "k_weight", allow_same=False, dense_only=True)


# ---------------------------------------------------------------------------------------------
# torch.library ops (used under torch.compile; eager calls go straight to the module)
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sglang_jit_kernel::rmsnorm_out", mutates_args=("out",), device_types="cuda")
def _rmsnorm_out_op(
    out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float,
    cast_x_before_out_mul: bool,
    enable_pdl: int,
) -> None:
    _load_rmsnorm(input.dtype)(
        _as_rows("rmsnorm", "out", out),
        _as_rows("rmsnorm", "input", input, copy_ok=True),
        weight,
        eps,
        weight_offset,
        cast_x_before_out_mul,
        enable_pdl,
    )


@_rmsnorm_out_op.register_fake
def _(
    out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float,
    cast_x_before_out_mul: bool,
    enable_pdl: int,
) -> None:
    return None


@torch.library.custom_op(
    "sglang_jit_kernel::fused_add_rmsnorm_inplace", mutates_args=("input", "residual"), device_types="cuda"
)
def _fused_add_rmsnorm_op(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float,
    enable_pdl: int,
) -> None:
    _load_fused_add_rmsnorm(input.dtype)(
        _as_rows("fused_add_rmsnorm", "input", input),
        _as_rows("fused_add_rmsnorm", "residual", residual),
        weight,
        eps,
        weight_offset,
        enable_pdl,
    )


@_fused_add_rmsnorm_op.register_fake
def _(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float, enable_pdl: int
) -> None:
    return None


@torch.library.custom_op("sglang_jit_kernel::qknorm_inplace", mutates_args=("q", "k"), device_types="cuda")
def _qknorm_op(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    enable_pdl: int,
    across_heads: bool,
) -> None:
    """fused_inplace_qknorm, or with across_heads fused_inplace_qknorm_across_heads."""
    _load_qknorm(q.dtype, across_heads)(q, k, q_weight, k_weight, eps, enable_pdl)


@_qknorm_op.register_fake
def _(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    enable_pdl: int,
    across_heads: bool,
) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------
# Each op has a fast eager path for the common case (an input of an already loaded dtype, 2-D for
# the row ops): a dict lookup and the FFI call, whose launcher checks every tensor once
# (TensorMatcher) and refuses before any launch. On a refusal, and for everything else (first call
# of a dtype, other ranks, torch.compile tracing, bad inputs), the checked path runs: the
# _validate checks, which explain a refusal as `<op>: <arg> <what>: expected X, got Y`, then the
# module or the torch.library op. The fast paths are written out in each op rather than shared
# through a helper: a Python call frame is a measurable part of a decode step's host time
# (benchmark/probe_eager_cost.py).
def _rmsnorm_checked(
    op: str,
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None,
    weight_offset: float,
    cast_x_before_out_mul: bool,
    enable_pdl: bool | None,
) -> torch.Tensor:
    check_scalar(op, "eps", eps, float, minimum=0.0)
    check_scalar(op, "enable_pdl", enable_pdl, bool, optional=True)
    check_scalar(op, "cast_x_before_out_mul", cast_x_before_out_mul, bool)
    check_tensor(op, "input", input, dtypes=FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor(
        op, "weight", weight, dtype_as=(input, "input"), dims=[("hidden_size", input.shape[-1])], contiguous=True
    )
    if out is None:
        out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    else:
        check_tensor(op, "out", out, dtype_as=(input, "input"), shape_as=(input, "input"), last_dim_contiguous=True)
        # Dense views decided here; strided ones (rows of a wider buffer) by the launcher's exact test,
        # unless input reaches it as a flattening copy (then only this byte-range test sees input).
        check_no_partial_overlap(op, "out", out, input, "input", allow_same=True, dense_only=rows_are_views(input))
        check_no_partial_overlap(op, "out", out, weight, "weight", allow_same=False, dense_only=True)
    pdl = _pdl_flag(enable_pdl)
    if tracing():
        torch.ops.sglang_jit_kernel.rmsnorm_out(out, input, weight, eps, weight_offset, cast_x_before_out_mul, pdl)
    else:
        with launcher_errors(op):  # the exact overlap and aliasing checks are the launcher's
            _load_rmsnorm(input.dtype)(
                _as_rows(op, "out", out),
                _as_rows(op, "input", input, copy_ok=True),
                weight,
                eps,
                weight_offset,
                cast_x_before_out_mul,
                pdl,
            )
    return out


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    *,
    cast_x_before_out_mul: bool = False,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Root-mean-square normalisation over the last dimension.

    ``out = x * rsqrt(mean(x**2) + eps) * w``, per row, in fp32 with one rounding to the dtype:
    ``rstd = rsqrt(sum(x**2) * (1 / hidden_size) + eps)`` (an fp32 reduction), then
    ``out = round(x * (w * rstd))`` (the product ``w * rstd`` formed first; the kernel's
    ``x * fma(w, rstd, 0)``). With ``cast_x_before_out_mul=True`` (Hugging Face's order, also :func:`rmsnorm_hf`)
    ``x * rsqrt(...)`` is rounded to the dtype first and then multiplied by ``w`` in fp32 and rounded
    again: ``out = round(float(round(x * rsqrt(mean(x**2) + eps))) * w)``.
    Moves ``2 * num_tokens * hidden_size * s + hidden_size * s`` bytes (``s`` the element size).

    Parameters
    ----------
    input : torch.Tensor
        ``[..., hidden_size]`` CUDA tensor, float16 / bfloat16 / float32; leading dims are
        flattened to ``num_tokens`` (rows may be strided: ``input[:, :hidden_size]`` of a wider
        buffer is read in place; leading dims that do not flatten to one stride are copied first;
        the last dim must be contiguous). Not modified unless it is ``out``.
    weight : torch.Tensor
        ``[hidden_size]``, contiguous, same dtype and device as ``input``.
    eps : float
        Added to the mean square (>= 0; with 0, an all-zero row gives NaN). Default 1e-6.
    out : torch.Tensor, optional
        Where to write: the shape, dtype and device of ``input``, last dim contiguous, any row
        strides; may be ``input`` itself (in place), must not partially overlap it nor share
        memory with ``weight``. Allocated when omitted (contiguous).
    cast_x_before_out_mul : bool
        Keyword-only. Round ``x * rsqrt(...)`` to the dtype before the weight multiply. Default False.
    enable_pdl : bool, optional
        Keyword-only. Programmatic Dependent Launch; None means on when the GPU is SM90+. Results do
        not depend on it.

    Returns
    -------
    torch.Tensor
        ``out`` (the same object when given), the shape and dtype of ``input``.

    Raises
    ------
    TypeError
        If ``input``, ``weight`` or ``out`` is not a tensor, ``eps`` not a number, ``enable_pdl``
        not None/bool or ``cast_x_before_out_mul`` not a bool.
    ValueError
        If ``eps`` is negative or NaN.
    RuntimeError
        Before any launch, as ``rmsnorm: <arg> <what>: expected X, got Y``: a tensor not on a CUDA
        device, an unsupported or mismatched dtype or device, ``weight`` not of shape
        ``[hidden_size]`` or not contiguous, ``out`` of another shape, a last dim that is not
        contiguous, leading dims of ``out`` that cannot be flattened without a copy. From the
        launcher, naming both tensors: ``out`` partially overlapping ``input``, sharing memory with
        ``weight``, or with overlapping rows (stride 0, or a row stride below the row).
    """
    if not tracing():
        try:
            fn = _RMSNORM_FNS.get(input.dtype) if input.dim() == 2 else None
        except AttributeError:  # not a tensor: the checked path raises TypeError
            fn = None
        # exact types only: the FFI would take 1 for a bool (the checked path raises TypeError)
        if (
            fn is not None
            and isinstance(eps, float)
            and type(cast_x_before_out_mul) is bool
            and (enable_pdl is None or enable_pdl is True or enable_pdl is False)
        ):
            result = torch.empty_like(input) if out is None else out
            try:
                if fn(result, input, weight, eps, 0.0, cast_x_before_out_mul, -1 if enable_pdl is None else enable_pdl):
                    return result
            except FAST_PATH_REFUSALS:  # refused before any launch: the checked path explains
                pass
    return _rmsnorm_checked("rmsnorm", input, weight, eps, out, 0.0, cast_x_before_out_mul, enable_pdl)


def _rmsnorm(
    op: str,
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None,
    weight_offset: float,
    cast_x_before_out_mul: bool,
    enable_pdl: bool | None,
) -> torch.Tensor:
    """rmsnorm with a weight offset and a fixed multiply order: gemma_rmsnorm and rmsnorm_hf."""
    if not tracing():
        try:
            fn = _RMSNORM_FNS.get(input.dtype) if input.dim() == 2 else None
        except AttributeError:
            fn = None
        if (
            fn is not None
            and isinstance(eps, float)
            and (enable_pdl is None or enable_pdl is True or enable_pdl is False)
        ):
            result = torch.empty_like(input) if out is None else out
            try:
                if fn(
                    result,
                    input,
                    weight,
                    eps,
                    weight_offset,
                    cast_x_before_out_mul,
                    -1 if enable_pdl is None else enable_pdl,
                ):
                    return result
            except FAST_PATH_REFUSALS:
                pass
    return _rmsnorm_checked(op, input, weight, eps, out, weight_offset, cast_x_before_out_mul, enable_pdl)


def rmsnorm_hf(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    *,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """RMSNorm in Hugging Face's order: normalise, round to the dtype, then multiply by the weight.

    ``out = round(float(round(x * rsqrt(mean(x**2) + eps))) * w)`` per row: the mean square and
    ``x * rsqrt(...)`` in fp32, rounded to the dtype (what ``LlamaRMSNorm`` does with
    ``hidden_states.to(input_dtype)``), then multiplied by ``w`` in fp32 and rounded again. The
    same as ``rmsnorm(input, weight, eps, out, cast_x_before_out_mul=True)``. For float32 the
    roundings to the dtype change nothing; it then differs from :func:`rmsnorm` only in the order
    of the two fp32 multiplies (``(x * rstd) * w`` against ``x * (w * rstd)``).
    Moves ``2 * num_tokens * hidden_size * s + hidden_size * s`` bytes.

    Parameters
    ----------
    input : torch.Tensor
        ``[..., hidden_size]`` CUDA tensor, float16 / bfloat16 / float32, any ``hidden_size >= 1``
        (:func:`is_supported_rmsnorm_hf_hidden_size`); leading dims flattened to ``num_tokens``
        as in :func:`rmsnorm` (strided rows read in place, last dim contiguous). Not modified
        unless it is ``out``.
    weight : torch.Tensor
        ``[hidden_size]``, contiguous, same dtype and device as ``input``.
    eps : float
        Added to the mean square (>= 0). Default 1e-6.
    out : torch.Tensor, optional
        As in :func:`rmsnorm`: the shape, dtype and device of ``input``, last dim contiguous, may be
        ``input`` (in place). Allocated (contiguous) when omitted.
    enable_pdl : bool, optional
        Keyword-only. Programmatic Dependent Launch; None means on when the GPU is SM90+.

    Returns
    -------
    torch.Tensor
        ``out`` (the same object when given), the shape and dtype of ``input``.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`rmsnorm` (messages start ``rmsnorm_hf:``).
    """
    return _rmsnorm("rmsnorm_hf", input, weight, eps, out, 0.0, True, enable_pdl)


def is_supported_rmsnorm_hf_hidden_size(hidden_size: int) -> bool:
    """Whether :func:`rmsnorm_hf` takes rows of ``hidden_size`` elements.

    Parameters
    ----------
    hidden_size : int
        Elements per row.

    Returns
    -------
    bool
        True for every ``1 <= hidden_size < 2**30`` (any size, vectorised when the rows allow it, for
        every dtype); False for anything else (including non-integers and bools). Never raises.
    """
    return type(hidden_size) is int and 1 <= hidden_size < _MAX_ROW


def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    *,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Gemma's RMSNorm: ``out = x * rsqrt(mean(x**2) + eps) * (1 + w)``, in fp32.

    fp32 arithmetic, one rounding to the dtype: ``rstd`` as in :func:`rmsnorm`, then
    ``out = round(x * fma(w, rstd, rstd))`` (``(1 + w) * rstd`` formed with one rounding, then the
    product with ``x``). Same layout rules and bytes moved as :func:`rmsnorm`.

    Parameters
    ----------
    input, weight, eps, out, enable_pdl
        As in :func:`rmsnorm` (``enable_pdl`` keyword-only; no ``cast_x_before_out_mul``): ``input``
        ``[..., hidden_size]`` float16 / bfloat16 / float32, last dim contiguous; ``weight``
        ``[hidden_size]`` contiguous (the Gemma weight ``w``, without the ``+ 1``); ``eps >= 0``
        (default 1e-6); ``out`` optional, may be ``input``.

    Returns
    -------
    torch.Tensor
        ``out`` (the same object when given), the shape and dtype of ``input``.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`rmsnorm` (messages start ``gemma_rmsnorm:``).
    """
    return _rmsnorm("gemma_rmsnorm", input, weight, eps, out, 1.0, False, enable_pdl)


def _fused_add_rmsnorm(
    op: str,
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float,
    enable_pdl: bool | None,
) -> None:
    if not tracing():
        try:
            fn = _FUSED_ADD_RMSNORM_FNS.get(input.dtype) if input.dim() == 2 else None
        except AttributeError:
            fn = None
        if (
            fn is not None
            and isinstance(eps, float)
            and (enable_pdl is None or enable_pdl is True or enable_pdl is False)
        ):
            try:
                if fn(input, residual, weight, eps, weight_offset, -1 if enable_pdl is None else enable_pdl):
                    return
            except FAST_PATH_REFUSALS:  # refused before any launch: the checked path explains
                pass
    check_scalar(op, "eps", eps, float, minimum=0.0)
    check_scalar(op, "enable_pdl", enable_pdl, bool, optional=True)
    check_tensor(op, "input", input, dtypes=FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor(
        op, "residual", residual, dtype_as=(input, "input"), shape_as=(input, "input"), last_dim_contiguous=True
    )
    check_tensor(
        op, "weight", weight, dtype_as=(input, "input"), dims=[("hidden_size", input.shape[-1])], contiguous=True
    )
    check_no_partial_overlap(op, "residual", residual, input, "input", allow_same=False, dense_only=True)
    check_no_partial_overlap(op, "input", input, weight, "weight", allow_same=False, dense_only=True)
    check_no_partial_overlap(op, "residual", residual, weight, "weight", allow_same=False, dense_only=True)
    pdl = _pdl_flag(enable_pdl)
    if tracing():
        torch.ops.sglang_jit_kernel.fused_add_rmsnorm_inplace(input, residual, weight, eps, weight_offset, pdl)
    else:
        with launcher_errors(op):
            _load_fused_add_rmsnorm(input.dtype)(
                _as_rows(op, "input", input), _as_rows(op, "residual", residual), weight, eps, weight_offset, pdl
            )


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    enable_pdl: bool | None = None,
) -> None:
    """Residual add then RMSNorm, both in place.

    ``residual <- round(input + residual)`` (fp32 add, one rounding to the dtype), then
    ``input <- round(r * rsqrt(mean(r**2) + eps) * w)`` (evaluated as in :func:`rmsnorm`,
    ``r * (w * rstd)``, one rounding) where ``r`` is the ROUNDED sum, i.e. exactly
    the values now stored in ``residual``: the variance and the normalised output are those of the
    residual stream as the next layer sees it.
    Moves ``4 * num_tokens * hidden_size * s + hidden_size * s`` bytes.

    Parameters
    ----------
    input : torch.Tensor
        ``[..., hidden_size]`` CUDA tensor, float16 / bfloat16 / float32, last dim contiguous, any
        row strides; overwritten with the normalised rows. Leading dims must be flattenable
        without a copy.
    residual : torch.Tensor
        Same shape, dtype and device as ``input`` (its own strides); overwritten with the sum.
        Must not overlap ``input``.
    weight : torch.Tensor
        ``[hidden_size]``, contiguous, same dtype and device.
    eps : float
        Added to the mean square (>= 0). Default 1e-6.
    enable_pdl : bool, optional
        Keyword-only. Programmatic Dependent Launch; None means on when the GPU is SM90+.

    Returns
    -------
    None
        ``input`` and ``residual`` are written in place.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`rmsnorm`, for ``input``, ``residual`` and ``weight``, before any launch (``residual``
        of another shape: ``fused_add_rmsnorm: residual shape: expected ... (the shape of input)``); also
        RuntimeError if ``residual`` overlaps ``input`` in memory (including being the same tensor),
        either shares memory with ``weight``, or either has overlapping rows (stride 0, or a row
        stride below the row): from the Python checks for dense tensors, from the launcher for
        interleaved views.
    """
    _fused_add_rmsnorm("fused_add_rmsnorm", input, residual, weight, eps, 0.0, enable_pdl)


def is_supported_jit_fused_add_rmsnorm_hidden_size(hidden_size: int) -> bool:
    """Whether :func:`fused_add_rmsnorm` (and :func:`gemma_fused_add_rmsnorm`) takes rows of
    ``hidden_size`` elements (``input.shape[-1]``, an int): True for every ``1 <= hidden_size < 2**30``
    (norm_rows.cuh's bound, shared with rmsnorm: any size, vectorised when the rows allow it, every
    dtype), False for anything else, non-integers and bools included. Never raises; the answer of
    :func:`is_supported_rmsnorm_hf_hidden_size`.
    """
    return is_supported_rmsnorm_hf_hidden_size(hidden_size)


def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    enable_pdl: bool | None = None,
) -> None:
    """Gemma's fused add + RMSNorm: as :func:`fused_add_rmsnorm` with ``(1 + w)`` (in fp32).

    ``residual <- round(input + residual)``, then ``input <- round(r * fma(w, rstd, rstd))`` with ``r``
    the rounded sum and ``rstd = rsqrt(mean(r**2) + eps)`` (fp32; as :func:`gemma_rmsnorm`).

    Parameters
    ----------
    input, residual, weight, eps, enable_pdl
        As in :func:`fused_add_rmsnorm` (``weight`` the Gemma ``w``, without the ``+ 1``); ``input``
        and ``residual`` are overwritten.

    Returns
    -------
    None
        ``input`` and ``residual`` are written in place.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`fused_add_rmsnorm` (messages start ``gemma_fused_add_rmsnorm:``).
    """
    _fused_add_rmsnorm("gemma_fused_add_rmsnorm", input, residual, weight, eps, 1.0, enable_pdl)


def fused_inplace_qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    head_dim: int = 0,
    enable_pdl: bool | None = None,
) -> None:
    """Per-head RMSNorm of q and k, in place, in one launch.

    ``q[t, h] <- round(q[t, h] * rsqrt(mean(q[t, h]**2) + eps) * q_weight)``, likewise k with
    ``k_weight``; fp32 arithmetic, one rounding.
    Moves ``2 * num_tokens * (num_q_heads + num_kv_heads) * head_dim * s + 2 * head_dim * s`` bytes.

    Parameters
    ----------
    q : torch.Tensor
        ``[num_tokens, num_q_heads, head_dim]`` CUDA tensor, float16 / bfloat16 / float32, any
        ``head_dim >= 1`` (:func:`can_use_fused_inplace_qknorm`). Token and head strides are free
        (e.g. a view into a fused qkv buffer); the last dim must be contiguous.
    k : torch.Tensor
        ``[num_tokens, num_kv_heads, head_dim]``, same dtype and device, its own strides; must not
        overlap ``q``.
    q_weight, k_weight : torch.Tensor
        ``[head_dim]``, contiguous, same dtype and device.
    eps : float
        Added to the mean square (>= 0). Default 1e-6.
    head_dim : int
        Keyword-only. 0 (the default: ``q.shape[-1]``) or ``q.shape[-1]`` itself (every head_dim
        runs the same modules).
    enable_pdl : bool, optional
        Keyword-only. Programmatic Dependent Launch; None means on when the GPU is SM90+.

    Returns
    -------
    None
        ``q`` and ``k`` are written in place.

    Raises
    ------
    TypeError
        If a tensor argument is not a tensor, ``eps`` not a number, ``head_dim`` not an int or
        ``enable_pdl`` not None/bool.
    ValueError
        If ``eps`` is negative or NaN, or ``head_dim`` is neither 0 nor ``q.shape[-1]``.
    RuntimeError
        Before any launch, as ``fused_inplace_qknorm: <arg> <what>: expected X, got Y``: not on CUDA,
        unsupported or mismatched dtype or device, q or k not 3-D, mismatched num_tokens or
        head_dim, a weight not of shape ``[head_dim]`` or not contiguous, a last dim that is not
        contiguous. From the launcher, naming the tensors: ``k`` sharing an element with ``q``
        (partially, or the same tensor), q or k sharing memory with ``q_weight`` or ``k_weight``, q
        or k whose own elements may overlap (a stride-0 / expanded dim, or heads closer than
        ``head_dim``). q and k may interleave as views of one buffer, token-major (fused qkv) or
        head-major (``buf.view(H, T, D).transpose(0, 1)``): the overlap check is exact when both
        have the same largest stride (the token stride, or the head stride of head-major views);
        views of one buffer in a layout it cannot decide (e.g. different token strides) are refused.
    """
    if not tracing():
        try:
            # head_dim: `is` the cached int 0 (the default) costs one comparison; other values a
            # type test and q's last size (a bool or float head_dim takes the checked path).
            ok = head_dim is _ZERO or (type(head_dim) is int and head_dim == q.size(-1))
            fn = _QKNORM_FNS.get(q.dtype) if ok else None
        except (AttributeError, IndexError):  # not a tensor, or 0-d: the checked path explains
            fn = None
        if (
            fn is not None
            and isinstance(eps, float)
            and (enable_pdl is None or enable_pdl is True or enable_pdl is False)
        ):
            try:
                if fn(q, k, q_weight, k_weight, eps, -1 if enable_pdl is None else enable_pdl):
                    return
            except FAST_PATH_REFUSALS:  # refused before any launch: the checked path explains
                pass
    op = "fused_inplace_qknorm"
    check_scalar(op, "eps", eps, float, minimum=0.0)
    check_scalar(op, "head_dim", head_dim, int)
    check_scalar(op, "enable_pdl", enable_pdl, bool, optional=True)
    check_tensor(
        op,
        "q",
        q,
        dtypes=FLOAT_DTYPES,
        dims=[("num_tokens", None), ("num_q_heads", None), ("head_dim", None)],
        last_dim_contiguous=True,
    )
    num_tokens, _, dim = q.shape
    if head_dim != 0 and head_dim != dim:
        fail(ValueError, op, "head_dim", "value", f"0 or q.shape[-1] ({dim})", head_dim)
    check_tensor(
        op,
        "k",
        k,
        dtype_as=(q, "q"),
        dims=[("num_tokens", num_tokens), ("num_kv_heads", None), ("head_dim", dim)],
        last_dim_contiguous=True,
    )
    check_tensor(op, "q_weight", q_weight, dtype_as=(q, "q"), dims=[("head_dim", dim)], contiguous=True)
    check_tensor(op, "k_weight", k_weight, dtype_as=(q, "q"), dims=[("head_dim", dim)], contiguous=True)
    _check_qk_overlaps(op, q, k, q_weight, k_weight)
    pdl = _pdl_flag(enable_pdl)
    if tracing():
        torch.ops.sglang_jit_kernel.qknorm_inplace(q, k, q_weight, k_weight, eps, pdl, False)
    else:
        with launcher_errors(op):
            _load_qknorm(q.dtype, False)(q, k, q_weight, k_weight, eps, pdl)


def can_use_fused_inplace_qknorm(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether :func:`fused_inplace_qknorm` takes heads of ``head_dim`` elements of ``dtype``.

    Parameters
    ----------
    head_dim : int
        Elements per head.
    dtype : torch.dtype
        The dtype of q and k.

    Returns
    -------
    bool
        True for every ``1 <= head_dim < 2**30`` with float16, bfloat16 or float32 (heads that allow
        16-byte vectors run the wide module of the dtype, others the narrow one); False for other
        dtypes and for anything else as ``head_dim`` (including non-integers and bools). Never
        raises.
    """
    return type(head_dim) is int and 1 <= head_dim < _MAX_ROW and dtype in FLOAT_DTYPES


def fused_inplace_qknorm_across_heads(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    enable_pdl: bool | None = None,
) -> None:
    """RMSNorm of each whole row of q and of k (all heads of a token together), in place, in one
    launch.

    ``q[t] <- round(q[t] * rsqrt(mean(q[t]**2) + eps) * q_weight)`` over the ``hidden_q`` elements
    of token ``t``, likewise ``k[t]`` over ``hidden_k`` with ``k_weight``; fp32 arithmetic, one
    rounding. Moves ``2 * num_tokens * (hidden_q + hidden_k) * s + (hidden_q + hidden_k) * s`` bytes.

    Parameters
    ----------
    q : torch.Tensor
        ``[num_tokens, hidden_q]`` CUDA tensor (``hidden_q = num_q_heads * head_dim``), float16 /
        bfloat16 / float32, any ``hidden_q < 2**30``; the token stride is free (e.g. a view into a
        fused qkv buffer), the last dim must be contiguous.
    k : torch.Tensor
        ``[num_tokens, hidden_k]``, any ``hidden_k < 2**30`` (``hidden_q`` or not), same dtype and
        device, its own token stride; must not overlap ``q`` (interleaved views of one buffer are
        fine).
    q_weight : torch.Tensor
        ``[hidden_q]``, contiguous, same dtype and device.
    k_weight : torch.Tensor
        ``[hidden_k]``, contiguous, same dtype and device.
    eps : float
        Added to the mean square (>= 0). Default 1e-6.
    enable_pdl : bool, optional
        Keyword-only. Programmatic Dependent Launch; None means on when the GPU is SM90+.

    Returns
    -------
    None
        ``q`` and ``k`` are written in place.

    Raises
    ------
    TypeError
        If a tensor argument is not a tensor, ``eps`` not a number or ``enable_pdl`` not None/bool.
    ValueError
        If ``eps`` is negative or NaN.
    RuntimeError
        Before any launch, as ``fused_inplace_qknorm_across_heads: <arg> <what>: expected X, got Y``:
        not on CUDA, unsupported or mismatched dtype or device, q or k not 2-D, mismatched
        num_tokens, a weight not of its tensor's hidden size or not contiguous, a last dim that is
        not contiguous. From the launcher, naming the tensors: ``k`` sharing an element with ``q``,
        q or k sharing memory with a weight, or q or k with overlapping rows (stride 0, or a row
        stride below the row).
    """
    if not tracing():
        try:
            fn = _QKNORM_ACROSS_HEADS_FNS.get(q.dtype)
        except AttributeError:  # not a tensor: the checked path raises TypeError
            fn = None
        if (
            fn is not None
            and isinstance(eps, float)
            and (enable_pdl is None or enable_pdl is True or enable_pdl is False)
        ):
            try:
                if fn(q, k, q_weight, k_weight, eps, -1 if enable_pdl is None else enable_pdl):
                    return
            except FAST_PATH_REFUSALS:  # refused before any launch: the checked path explains
                pass
    op = "fused_inplace_qknorm_across_heads"
    check_scalar(op, "eps", eps, float, minimum=0.0)
    check_scalar(op, "enable_pdl", enable_pdl, bool, optional=True)
    check_tensor(
        op, "q", q, dtypes=FLOAT_DTYPES, dims=[("num_tokens", None), ("hidden_q", None)], last_dim_contiguous=True
    )
    num_tokens, hidden_q = q.shape
    check_tensor(
        op, "k", k, dtype_as=(q, "q"), dims=[("num_tokens", num_tokens), ("hidden_k", None)], last_dim_contiguous=True
    )
    check_tensor(op, "q_weight", q_weight, dtype_as=(q, "q"), dims=[("hidden_q", hidden_q)], contiguous=True)
    check_tensor(op, "k_weight", k_weight, dtype_as=(q, "q"), dims=[("hidden_k", k.shape[1])], contiguous=True)
    _check_qk_overlaps(op, q, k, q_weight, k_weight)
    pdl = _pdl_flag(enable_pdl)
    if tracing():
        torch.ops.sglang_jit_kernel.qknorm_inplace(q, k, q_weight, k_weight, eps, pdl, True)
    else:
        with launcher_errors(op):
            _load_qknorm(q.dtype, True)(q, k, q_weight, k_weight, eps, pdl)


# ---------------------------------------------------------------------------------------------
# Registration: each op with its module; `check` runs each op on its own rows.
# ---------------------------------------------------------------------------------------------
def _rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """fp32 RMSNorm of the same low-precision rows, rounded once to the dtype."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * (w.float() + offset)).to(x.dtype)


_CHECK_SHAPES = [(16384, 4096), (16384, 8192)]


def _rows_case(n: int, h: int, call: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor]) -> CheckCase:
    """A [n, h] bf16 case of an op reading x and w and writing out (inputs: x, w, out)."""

    def make() -> tuple:
        x = torch.randn(n, h, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(h, dtype=torch.bfloat16, device="cuda")
        return x, w, torch.empty_like(x)

    return CheckCase(
        label=f"[{n}, {h}] bf16",
        make_inputs=make,
        call=call,
        reference=reference,
        bytes_moved=2 * n * h * 2 + h * 2,  # read x, write out, read w
        dtype=torch.bfloat16,
    )


def _plain_cases(fn: Callable[..., torch.Tensor], offset: float) -> Callable[[], list[CheckCase]]:
    def cases() -> list[CheckCase]:
        return [
            _rows_case(n, h, lambda x, w, o: fn(x, w, 1e-6, out=o), lambda x, w, o: _rms_reference(x, w, 1e-6, offset))
            for n, h in _CHECK_SHAPES
        ]

    return cases


def _fused_cases(fn: Callable[..., None], offset: float) -> Callable[[], list[CheckCase]]:
    def cases() -> list[CheckCase]:
        out = []
        for n, h in _CHECK_SHAPES:

            def make(n: int = n, h: int = h) -> tuple:
                x = torch.randn(n, h, dtype=torch.bfloat16, device="cuda")
                r = torch.randn(n, h, dtype=torch.bfloat16, device="cuda")
                return x, r, torch.randn(h, dtype=torch.bfloat16, device="cuda")

            def call(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
                fn(x, r, w, 1e-6)
                return x

            out.append(
                CheckCase(
                    label=f"[{n}, {h}] bf16",
                    make_inputs=make,
                    call=call,
                    reference=lambda x, r, w: _rms_reference((x.float() + r.float()).to(x.dtype), w, 1e-6, offset),
                    bytes_moved=4 * n * h * 2 + h * 2,  # read x and r, write both, read w
                    dtype=torch.bfloat16,
                )
            )
        return out

    return cases


def _qkv_case(
    label: str,
    n: int,
    q_cols: int,
    k_cols: int,
    weights: tuple[int, int],
    normalise: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None],
    view_q: Callable[[torch.Tensor], torch.Tensor],
    view_k: Callable[[torch.Tensor], torch.Tensor],
) -> CheckCase:
    """q and k normalised in place as views of a bf16 [n, q_cols + 2 * k_cols] qkv buffer (inputs:
    qkv, q_weight, k_weight of `weights` elements); the reference normalises the views' last dim."""

    def make() -> tuple:
        qkv = torch.randn(n, q_cols + 2 * k_cols, dtype=torch.bfloat16, device="cuda")
        return (qkv, *(torch.randn(size, dtype=torch.bfloat16, device="cuda") for size in weights))

    def views(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return view_q(qkv[:, :q_cols]), view_k(qkv[:, q_cols : q_cols + k_cols])

    def call(qkv: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor) -> torch.Tensor:
        normalise(*views(qkv), qw, kw)
        return qkv

    def reference(qkv: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor) -> torch.Tensor:
        q, k = views(qkv)
        expected = qkv.clone()
        expected[:, :q_cols] = _rms_reference(q, qw, 1e-6, 0.0).view(n, q_cols)
        expected[:, q_cols : q_cols + k_cols] = _rms_reference(k, kw, 1e-6, 0.0).view(n, k_cols)
        return expected

    return CheckCase(
        label=label,
        make_inputs=make,
        call=call,
        reference=reference,
        bytes_moved=2 * n * (q_cols + k_cols) * 2 + sum(weights) * 2,  # read + write q and k, weights
        dtype=torch.bfloat16,
    )


def _qknorm_cases() -> list[CheckCase]:
    n, hq, hk, d = 16384, 32, 8, 128
    return [
        _qkv_case(
            f"[{n}, {hq}+{hk}, {d}] bf16",
            n,
            hq * d,
            hk * d,
            (d, d),
            lambda q, k, qw, kw: fused_inplace_qknorm(q, k, qw, kw, 1e-6),
            lambda t: t.view(n, hq, d),
            lambda t: t.view(n, hk, d),
        )
    ]


def _across_heads_cases() -> list[CheckCase]:
    n, hidden_q, hidden_k = 16384, 4096, 1024
    return [
        _qkv_case(
            f"[{n}, {hidden_q}+{hidden_k}] bf16",
            n,
            hidden_q,
            hidden_k,
            (hidden_q, hidden_k),
            lambda q, k, qw, kw: fused_inplace_qknorm_across_heads(q, k, qw, kw, 1e-6),
            lambda t: t,
            lambda t: t,
        )
    ]


_RMSNORM = register_op(
    "rmsnorm",
    build=_jit_rmsnorm_module,
    variants=[(d, w) for d in FLOAT_DTYPES for w in NORM_WIDTHS],
    check_cases=_plain_cases(rmsnorm, 0.0),
)
#: rmsnorm's module, which also serves rmsnorm_hf (registered by sglang.jit_kernel.rmsnorm_hf).
RMSNORM_MODULE = _RMSNORM.module
register_op("gemma_rmsnorm", module=RMSNORM_MODULE, check_cases=_plain_cases(gemma_rmsnorm, 1.0))
_FUSED_ADD = register_op(
    "fused_add_rmsnorm",
    build=_jit_fused_add_rmsnorm_module,
    variants=[(d, w) for d in FLOAT_DTYPES for w in NORM_WIDTHS],
    check_cases=_fused_cases(fused_add_rmsnorm, 0.0),
)
register_op("gemma_fused_add_rmsnorm", module=_FUSED_ADD.module, check_cases=_fused_cases(gemma_fused_add_rmsnorm, 1.0))
_QKNORM = register_op(
    "fused_inplace_qknorm",
    build=_jit_qknorm_module,
    variants=[(d, w) for d in FLOAT_DTYPES for w in NORM_WIDTHS],
    check_cases=_qknorm_cases,
)
register_op("fused_inplace_qknorm_across_heads", module=_QKNORM.module, check_cases=_across_heads_cases)
