"""Normalisation ops: RMSNorm, fused residual add + RMSNorm, their Gemma forms, per-head QK RMSNorm.

Every op computes in fp32 and rounds once to the tensor dtype (float16, bfloat16 or float32).
Kernels: ``csrc/elementwise/rmsnorm.cuh`` (the shared row kernel), ``fused_add_rmsnorm.cuh`` and
``qknorm.cuh``, compiled together into one module per dtype.

Bytes moved (for bandwidth figures), with ``s = element_size``:
rmsnorm ``2*N*H*s + H*s``; fused_add_rmsnorm ``4*N*H*s + H*s``;
fused_inplace_qknorm ``2*N*(Hq+Hk)*D*s + 2*D*s``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from sglang.jit_kernel.registry import CheckCase, register_module, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = [
    "rmsnorm",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "fused_inplace_qknorm",
]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------
# Module: one per dtype, exporting the three ops (vector widths and vectors-per-thread buckets are
# compiled inside; one translation unit compiles ~3x faster than three, the host side dominates).
# ---------------------------------------------------------------------------------------------
@cache_once
def _jit_norm_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the norm module for ``dtype``: ``rmsnorm`` (also gemma),
    ``fused_add_rmsnorm`` (also gemma) and ``fused_inplace_qknorm``."""
    args = make_cpp_args(dtype)
    return load_jit(
        "norm",
        *args,
        cuda_files=[
            "elementwise/rmsnorm.cuh",
            "elementwise/fused_add_rmsnorm.cuh",
            "elementwise/qknorm.cuh",
        ],
        cuda_wrappers=[
            ("rmsnorm", f"rmsnorm<{args}>"),
            ("fused_add_rmsnorm", f"fused_add_rmsnorm<{args}>"),
            ("fused_inplace_qknorm", f"fused_inplace_qknorm<{args}>"),
            # benchmark sweeps only (bench_norm.py --sweep): force the launch geometry
            ("_set_geometry_override", "set_norm_geometry_override"),
            # tests and benchmarks only: force the L2 hint of in-place launches (-1 auto, 0, 1)
            ("_set_l2_hint_override", "set_norm_l2_hint_override"),
        ],
    )


# The exported functions by dtype, filled when a dtype's module is loaded: the eager fast path is
# one dict lookup (a dtype missing here takes the checked path, which loads the module).
_RMSNORM_FNS: dict[torch.dtype, Callable[..., None]] = {}
_FUSED_ADD_RMSNORM_FNS: dict[torch.dtype, Callable[..., None]] = {}
_QKNORM_FNS: dict[torch.dtype, Callable[..., None]] = {}


def _load(dtype: torch.dtype) -> Module:
    """The norm module of ``dtype`` (compiled on first use), its functions registered above."""
    module = _jit_norm_module(dtype)
    _RMSNORM_FNS[dtype] = module.rmsnorm
    _FUSED_ADD_RMSNORM_FNS[dtype] = module.fused_add_rmsnorm
    _QKNORM_FNS[dtype] = module.fused_inplace_qknorm
    return module


# ---------------------------------------------------------------------------------------------
# Checks: plain attribute tests on the hot path; messages are built only on failure.
# ---------------------------------------------------------------------------------------------
def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _fail_tensor(op: str, name: str, tensor: object, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cuda:
        raise RuntimeError(f"{op}: {name} must be a CUDA tensor, got device {tensor.device}")
    raise RuntimeError(f"{op}: {name} {what}")


def _check_rows(
    op: str, name: str, tensor: torch.Tensor, dtype: torch.dtype | None = None, ref_name: str = "input"
) -> None:
    """``tensor``: a CUDA tensor of a supported dtype (``dtype``, that of ``ref_name``, if given),
    at least 1-D, its last dimension contiguous."""
    if not (isinstance(tensor, torch.Tensor) and tensor.is_cuda):
        _fail_tensor(op, name, tensor, "")
    if dtype is None:
        if tensor.dtype not in _DTYPES:
            raise RuntimeError(
                f"{op}: {name} has unsupported dtype {_name(tensor.dtype)}; expected one of "
                f"{', '.join(_name(d) for d in _DTYPES)}"
            )
    elif tensor.dtype != dtype:
        raise RuntimeError(
            f"{op}: {name} dtype must match {ref_name}: expected {_name(dtype)}, got {_name(tensor.dtype)}"
        )
    if tensor.dim() == 0:
        raise RuntimeError(f"{op}: {name} must have at least 1 dimension, got a 0-d tensor")
    if tensor.stride(-1) != 1 and tensor.shape[-1] > 1:
        raise RuntimeError(
            f"{op}: {name} must be contiguous in its last dimension, got shape {tuple(tensor.shape)} "
            f"with strides {tensor.stride()}"
        )


def _check_weight(
    op: str, name: str, weight: torch.Tensor, size: int, dtype: torch.dtype, dim_name: str, ref_name: str = "input"
) -> None:
    """``weight``: a CUDA tensor of ``dtype`` and shape ``[size]`` (contiguity and the device index
    are checked by the launcher)."""
    if not (isinstance(weight, torch.Tensor) and weight.is_cuda):
        _fail_tensor(op, name, weight, "")
    if weight.dtype != dtype:
        raise RuntimeError(
            f"{op}: {name} dtype must match {ref_name}: expected {_name(dtype)}, got {_name(weight.dtype)}"
        )
    if weight.dim() != 1 or weight.shape[0] != size:
        raise RuntimeError(f"{op}: {name} must have shape [{dim_name}] = ({size},), got {tuple(weight.shape)}")


def _check_scalars(op: str, eps: object, enable_pdl: object, cast_x_before_out_mul: object = False) -> None:
    """TypeError / ValueError naming the scalar argument that is not what the op takes."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    if not eps >= 0.0:  # also rejects NaN
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
    if enable_pdl is not None and not isinstance(enable_pdl, bool):
        raise TypeError(f"{op}: enable_pdl must be None or a bool, got {type(enable_pdl).__name__}")
    if not isinstance(cast_x_before_out_mul, bool):
        raise TypeError(f"{op}: cast_x_before_out_mul must be a bool, got {type(cast_x_before_out_mul).__name__}")


def _check_same_shape(op: str, name: str, tensor: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    _check_rows(op, name, tensor, ref.dtype, ref_name)
    if tensor.shape != ref.shape:
        raise RuntimeError(
            f"{op}: {name} shape must match {ref_name}: expected {tuple(ref.shape)}, got {tuple(tensor.shape)}"
        )


def _as_rows(op: str, name: str, tensor: torch.Tensor, copy_ok: bool = False) -> torch.Tensor:
    """``[..., hidden_size]`` -> ``[num_tokens, hidden_size]``: a view when the leading dims can be
    flattened; otherwise a copy if ``copy_ok`` (read-only inputs), else an error."""
    if tensor.dim() == 2:
        return tensor
    try:
        return tensor.view(-1, tensor.shape[-1])
    except RuntimeError:
        if copy_ok:
            return tensor.reshape(-1, tensor.shape[-1])
        raise RuntimeError(
            f"{op}: {name} with shape {tuple(tensor.shape)} and strides {tensor.stride()} cannot be viewed as "
            "[num_tokens, hidden_size] without a copy; pass a tensor whose leading dims can be flattened"
        ) from None


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
    _load(input.dtype).rmsnorm(
        _as_rows("rmsnorm", "out", out),
        _as_rows("rmsnorm", "input", input, copy_ok=True),
        weight,
        eps,
        weight_offset,
        cast_x_before_out_mul,
        enable_pdl,
    )


@_rmsnorm_out_op.register_fake
def _(out, input, weight, eps, weight_offset, cast_x_before_out_mul, enable_pdl) -> None:
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
    _load(input.dtype).fused_add_rmsnorm(
        _as_rows("fused_add_rmsnorm", "input", input),
        _as_rows("fused_add_rmsnorm", "residual", residual),
        weight,
        eps,
        weight_offset,
        enable_pdl,
    )


@_fused_add_rmsnorm_op.register_fake
def _(input, residual, weight, eps, weight_offset, enable_pdl) -> None:
    return None


@torch.library.custom_op("sglang_jit_kernel::qknorm_inplace", mutates_args=("q", "k"), device_types="cuda")
def _qknorm_op(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    enable_pdl: int,
) -> None:
    _load(q.dtype).fused_inplace_qknorm(q, k, q_weight, k_weight, eps, enable_pdl)


@_qknorm_op.register_fake
def _(q, k, q_weight, k_weight, eps, enable_pdl) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------
# Each op has a fast eager path for the common case (a 2-D CUDA input of an already loaded dtype):
# a dict lookup and the FFI call, with every other check done once, by the launcher's TensorMatcher
# (a RuntimeError naming the argument, expected vs actual, before any launch). Everything else
# (first call of a dtype, other ranks, torch.compile tracing, bad inputs) takes the checked path:
# the same checks in Python, then the module or the torch.library op.
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
    pdl = -1 if enable_pdl is None else int(enable_pdl is True)
    if not torch.compiler.is_compiling():
        try:
            fn = _RMSNORM_FNS.get(input.dtype) if input.is_cuda and input.dim() == 2 else None
        except AttributeError:  # not a tensor: the checked path raises TypeError
            fn = None
        if fn is not None and (enable_pdl is None or enable_pdl is True or enable_pdl is False):
            result = torch.empty_like(input) if out is None else out
            try:
                fn(result, input, weight, eps, weight_offset, cast_x_before_out_mul, pdl)
                return result
            except (TypeError, RuntimeError):  # raised before any launch: the checked path names the argument
                pass
    _check_scalars(op, eps, enable_pdl, cast_x_before_out_mul)
    _check_rows(op, "input", input)
    _check_weight(op, "weight", weight, input.shape[-1], input.dtype, "hidden_size")
    if out is None:
        if input.dim() == 2:
            out = torch.empty_like(input)
        else:
            out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    else:
        _check_same_shape(op, "out", out, input, "input")
    if torch.compiler.is_compiling():
        torch.ops.sglang_jit_kernel.rmsnorm_out(out, input, weight, eps, weight_offset, cast_x_before_out_mul, pdl)
    else:
        _load(input.dtype).rmsnorm(
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

    ``out = x * rsqrt(mean(x**2) + eps) * w``, per row, in fp32 with one rounding to the dtype.
    With ``cast_x_before_out_mul=True`` (Hugging Face's order) ``x * rsqrt(...)`` is rounded to the
    dtype first and then multiplied by ``w`` in fp32 and rounded again:
    ``out = round(float(round(x * rsqrt(mean(x**2) + eps))) * w)``.
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
        Round ``x * rsqrt(...)`` to the dtype before the weight multiply. Default False.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on when the GPU is SM90+. Results do not depend
        on it.

    Returns
    -------
    torch.Tensor
        ``out``.

    Raises
    ------
    TypeError
        If ``input``, ``weight`` or ``out`` is not a tensor, ``eps`` not a number, ``enable_pdl``
        not None/bool or ``cast_x_before_out_mul`` not a bool.
    ValueError
        If ``eps`` is negative or NaN.
    RuntimeError
        Before any launch, naming the argument: not on a CUDA device, unsupported or mismatched
        dtype, ``weight`` not of shape ``[hidden_size]`` or on another device, ``out`` of another
        shape, a last dim that is not contiguous, leading dims that cannot be flattened without a
        copy (``out``), ``out`` partially overlapping ``input``, sharing memory with ``weight``, or
        expanded (stride 0).
    """
    return _rmsnorm("rmsnorm", input, weight, eps, out, 0.0, cast_x_before_out_mul, enable_pdl)


def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    *,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Gemma's RMSNorm: ``out = x * rsqrt(mean(x**2) + eps) * (1 + w)``, the ``1 + w`` in fp32.

    Same arguments, layout rules, bytes moved and errors as :func:`rmsnorm` (fp32 arithmetic, one
    rounding to the dtype).

    Returns
    -------
    torch.Tensor
        ``out``.
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
    pdl = -1 if enable_pdl is None else int(enable_pdl is True)
    if not torch.compiler.is_compiling():
        try:
            fn = _FUSED_ADD_RMSNORM_FNS.get(input.dtype) if input.is_cuda and input.dim() == 2 else None
        except AttributeError:
            fn = None
        if fn is not None and (enable_pdl is None or enable_pdl is True or enable_pdl is False):
            try:
                fn(input, residual, weight, eps, weight_offset, pdl)
                return
            except (TypeError, RuntimeError):  # raised before any launch: the checked path names the argument
                pass
    _check_scalars(op, eps, enable_pdl)
    _check_rows(op, "input", input)
    _check_same_shape(op, "residual", residual, input, "input")
    _check_weight(op, "weight", weight, input.shape[-1], input.dtype, "hidden_size")
    if torch.compiler.is_compiling():
        torch.ops.sglang_jit_kernel.fused_add_rmsnorm_inplace(input, residual, weight, eps, weight_offset, pdl)
    else:
        _load(input.dtype).fused_add_rmsnorm(
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
    ``input <- round(r * rsqrt(mean(r**2) + eps) * w)`` where ``r`` is the ROUNDED sum, i.e. exactly
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
        Programmatic Dependent Launch; None means on when the GPU is SM90+.

    Returns
    -------
    None

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`rmsnorm`, for ``input``, ``residual`` and ``weight``, before any launch; also
        RuntimeError if ``residual`` overlaps ``input`` in memory (including being the same tensor),
        either shares memory with ``weight``, or either is expanded (stride 0).
    """
    _fused_add_rmsnorm("fused_add_rmsnorm", input, residual, weight, eps, 0.0, enable_pdl)


def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    enable_pdl: bool | None = None,
) -> None:
    """Gemma's fused add + RMSNorm: as :func:`fused_add_rmsnorm` with ``(1 + w)`` (in fp32).

    Returns
    -------
    None
    """
    _fused_add_rmsnorm("gemma_fused_add_rmsnorm", input, residual, weight, eps, 1.0, enable_pdl)


def fused_inplace_qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    enable_pdl: bool | None = None,
) -> None:
    """Per-head RMSNorm of q and k, in place, in one launch.

    ``q[t, h] <- round(q[t, h] * rsqrt(mean(q[t, h]**2) + eps) * q_weight)``, likewise k with
    ``k_weight``; fp32 arithmetic, one rounding.
    Moves ``2 * num_tokens * (num_q_heads + num_kv_heads) * head_dim * s + 2 * head_dim * s`` bytes.

    Parameters
    ----------
    q : torch.Tensor
        ``[num_tokens, num_q_heads, head_dim]`` CUDA tensor, float16 / bfloat16 / float32. Token
        and head strides are free (e.g. a view into a fused qkv buffer); the last dim must be
        contiguous.
    k : torch.Tensor
        ``[num_tokens, num_kv_heads, head_dim]``, same dtype and device, its own strides; must not
        overlap ``q``.
    q_weight, k_weight : torch.Tensor
        ``[head_dim]``, contiguous, same dtype and device.
    eps : float
        Added to the mean square (>= 0). Default 1e-6.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on when the GPU is SM90+.

    Returns
    -------
    None

    Raises
    ------
    TypeError
        If an argument is not a tensor, ``eps`` not a number or ``enable_pdl`` not None/bool.
    ValueError
        If ``eps`` is negative or NaN.
    RuntimeError
        Before any launch, naming the argument: not on CUDA, unsupported or mismatched dtype, q or k
        not 3-D, mismatched num_tokens, a weight not of shape ``[head_dim]``, a last dim that is not
        contiguous, ``k`` sharing an element with ``q`` (partially, or the same tensor), q or k
        sharing memory with ``q_weight`` or ``k_weight``, q or k whose own elements may overlap (a
        stride-0 / expanded dim, or heads closer than ``head_dim``). q and k may interleave as
        views of one buffer, token-major (fused qkv) or head-major
        (``buf.view(H, T, D).transpose(0, 1)``): the overlap check is exact when both
        have the same largest stride (the token stride, or the head stride of head-major views);
        views of one buffer in a layout it cannot decide (e.g. different token strides) are refused.
    """
    pdl = -1 if enable_pdl is None else int(enable_pdl is True)
    if not torch.compiler.is_compiling():
        try:
            fn = _QKNORM_FNS.get(q.dtype) if q.is_cuda else None
        except AttributeError:
            fn = None
        if fn is not None and (enable_pdl is None or enable_pdl is True or enable_pdl is False):
            try:
                fn(q, k, q_weight, k_weight, eps, pdl)
                return
            except (TypeError, RuntimeError):  # raised before any launch: the checked path names the argument
                pass
    op = "fused_inplace_qknorm"
    _check_scalars(op, eps, enable_pdl)
    _check_rows(op, "q", q)
    _check_rows(op, "k", k, q.dtype, "q")
    if q.dim() != 3 or k.dim() != 3:
        bad, t = ("q", q) if q.dim() != 3 else ("k", k)
        heads = "num_q_heads" if bad == "q" else "num_kv_heads"
        raise RuntimeError(f"{op}: {bad} must be 3-D [num_tokens, {heads}, head_dim], got shape {tuple(t.shape)}")
    head_dim = q.shape[2]
    if k.shape[0] != q.shape[0] or k.shape[2] != head_dim:
        raise RuntimeError(
            f"{op}: k must have shape [num_tokens, num_kv_heads, head_dim] = ({q.shape[0]}, *, {head_dim}), "
            f"got {tuple(k.shape)}"
        )
    _check_weight(op, "q_weight", q_weight, head_dim, q.dtype, "head_dim", "q")
    _check_weight(op, "k_weight", k_weight, head_dim, q.dtype, "head_dim", "q")
    if torch.compiler.is_compiling():
        torch.ops.sglang_jit_kernel.qknorm_inplace(q, k, q_weight, k_weight, eps, pdl)
    else:
        _load(q.dtype).fused_inplace_qknorm(q, k, q_weight, k_weight, eps, pdl)


# ---------------------------------------------------------------------------------------------
# Registration: one module per dtype serves every norm op; `check` runs each op on its own rows.
# ---------------------------------------------------------------------------------------------
def _rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """fp32 RMSNorm of the same low-precision rows, rounded once to the dtype."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * (w.float() + offset)).to(x.dtype)


_CHECK_SHAPES = [(16384, 4096), (16384, 8192)]


def _plain_cases(fn: Callable[..., torch.Tensor], offset: float) -> Callable[[], list[CheckCase]]:
    def cases() -> list[CheckCase]:
        out = []
        for n, h in _CHECK_SHAPES:

            def make(n: int = n, h: int = h) -> tuple:
                x = torch.randn(n, h, dtype=torch.bfloat16, device="cuda")
                w = torch.randn(h, dtype=torch.bfloat16, device="cuda")
                return x, w, torch.empty_like(x)

            out.append(
                CheckCase(
                    label=f"[{n}, {h}] bf16",
                    make_inputs=make,
                    call=lambda x, w, o: fn(x, w, 1e-6, out=o),
                    reference=lambda x, w, o: _rms_reference(x, w, 1e-6, offset),
                    bytes_moved=2 * n * h * 2 + h * 2,  # read x, write out, read w
                    dtype=torch.bfloat16,
                )
            )
        return out

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


def _qknorm_cases() -> list[CheckCase]:
    n, hq, hk, d = 16384, 32, 8, 128

    def make() -> tuple:
        qkv = torch.randn(n, (hq + 2 * hk) * d, dtype=torch.bfloat16, device="cuda")
        return qkv, torch.randn(d, dtype=torch.bfloat16, device="cuda"), torch.randn(d, dtype=torch.bfloat16, device="cuda")

    def views(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return qkv[:, : hq * d].view(n, hq, d), qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)

    def call(qkv: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor) -> torch.Tensor:
        fused_inplace_qknorm(*views(qkv), qw, kw, 1e-6)
        return qkv

    def reference(qkv: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor) -> torch.Tensor:
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
            dtype=torch.bfloat16,
        )
    ]


_NORM_MODULE = register_module("norm", _jit_norm_module, [(d,) for d in _DTYPES])
register_op("rmsnorm", module=_NORM_MODULE, check_cases=_plain_cases(rmsnorm, 0.0))
register_op("fused_add_rmsnorm", module=_NORM_MODULE, check_cases=_fused_cases(fused_add_rmsnorm, 0.0))
register_op("gemma_rmsnorm", module=_NORM_MODULE, check_cases=_plain_cases(gemma_rmsnorm, 1.0))
register_op("gemma_fused_add_rmsnorm", module=_NORM_MODULE, check_cases=_fused_cases(gemma_fused_add_rmsnorm, 1.0))
register_op("fused_inplace_qknorm", module=_NORM_MODULE, check_cases=_qknorm_cases)
