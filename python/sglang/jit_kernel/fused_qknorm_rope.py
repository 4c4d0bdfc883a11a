"""fused_qk_norm_rope: per-head RMSNorm of q and k, then RoPE with frequencies computed on the fly
(YaRN optional), in place on a packed qkv buffer, in one launch.

Kernel: ``csrc/elementwise/fused_qknorm_rope.cuh`` (with rope.cuh's rotation math), a module of its
own per dtype; :func:`can_use_fused_qk_norm_rope` says which configurations it takes. Bytes moved (for bandwidth figures): ``2*N*(Hq+Hk)*D*s + 2*D*s + N*p`` (``s`` the
element size, ``p`` the position size); v is neither read nor written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_finite_float32,
    check_no_self_overlap,
    check_scalar,
    check_tensor,
    fail,
    launcher_errors,
    tracing,
    type_name,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.rope import _pdl_flag
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["can_use_fused_qk_norm_rope", "fused_qk_norm_rope", "fused_qk_norm_rope_reference"]


@cache_once
def _jit_fused_qk_norm_rope_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the ``fused_qk_norm_rope`` module for ``dtype``."""
    args = make_cpp_args(dtype)
    return load_jit(
        "fused_qk_norm_rope",
        *args,
        cuda_files=["elementwise/fused_qknorm_rope.cuh"],
        cuda_wrappers=[("fused_qk_norm_rope", f"fused_qk_norm_rope<{args}>")],
    )


@torch.library.custom_op("sglang_jit_kernel::fused_qk_norm_rope", mutates_args=("qkv",), device_types="cuda")
def _fused_qk_norm_rope_op(
    qkv: torch.Tensor,
    num_heads_q: int,
    num_heads_k: int,
    num_heads_v: int,
    head_dim: int,
    eps: float,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    base: float,
    is_neox: bool,
    position_ids: torch.Tensor,
    factor: float,
    low: float,
    high: float,
    attention_factor: float,
    rotary_dim: int,
    enable_pdl: int,
) -> None:
    _jit_fused_qk_norm_rope_module(qkv.dtype).fused_qk_norm_rope(
        qkv,
        num_heads_q,
        num_heads_k,
        num_heads_v,
        head_dim,
        eps,
        q_weight,
        k_weight,
        base,
        is_neox,
        position_ids,
        factor,
        low,
        high,
        attention_factor,
        rotary_dim,
        enable_pdl,
    )


@_fused_qk_norm_rope_op.register_fake
def _(
    qkv: torch.Tensor,
    num_heads_q: int,
    num_heads_k: int,
    num_heads_v: int,
    head_dim: int,
    eps: float,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    base: float,
    is_neox: bool,
    position_ids: torch.Tensor,
    factor: float,
    low: float,
    high: float,
    attention_factor: float,
    rotary_dim: int,
    enable_pdl: int,
) -> None:
    return None


def fused_qk_norm_rope(
    qkv: torch.Tensor,
    num_heads_q: int,
    num_heads_k: int,
    num_heads_v: int,
    head_dim: int,
    eps: float,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    base: float,
    is_neox: bool,
    position_ids: torch.Tensor,
    factor: float,
    low: float,
    high: float,
    attention_factor: float,
    rotary_dim: int | None = None,
    *,
    enable_pdl: bool | None = None,
) -> None:
    """RMSNorm each q and k head of a packed qkv buffer, then rotate it, in place (v untouched).

    For each head ``x`` of q (weight ``q_weight``) and of k (``k_weight``), in fp32 with one rounding
    at the end: ``y = (x * rsqrt(mean(x**2) + eps)) * w`` (the formula of
    :func:`sglang.jit_kernel.norm.fused_inplace_qknorm`, evaluated in this order and not rounded
    here, so not bit-identical to it), then RoPE of
    ``y[:R]`` (``R = rotary_dim``) with ``f_i = base**(-2i/R)``; when ``factor != 1`` YaRN blends
    ``f_i`` with ``f_i / factor``: ``ramp = clamp((i - low) / (high - low), 0, 1)`` (``high`` nudged
    by 0.001 when equal to ``low``), ``f_i <- (f_i / factor) * ramp + f_i * (1 - ramp)``.
    ``c = cos(pos * f_i) * attention_factor``, ``s = sin(pos * f_i) * attention_factor``
    (``attention_factor`` applies whatever ``factor`` is; pass 1.0 for plain RoPE); pairs rotate as in
    :func:`sglang.jit_kernel.rope.apply_rope_inplace`.

    Parameters
    ----------
    qkv : torch.Tensor
        ``[num_tokens, (num_heads_q + num_heads_k + num_heads_v) * head_dim]`` CUDA tensor, float16 /
        bfloat16 / float32, last dim contiguous, token stride free. Modified in place (q and k
        columns only).
    num_heads_q, num_heads_k, num_heads_v : int
        Head counts (>= 0).
    head_dim : int
        Elements per head (>= 1); up to 1024 (2-byte dtypes) / 512 (fp32) when rows, head_dim and R/2
        allow 16-byte vectors, up to 128 otherwise.
    eps : float
        Added to the mean square (>= 0).
    q_weight, k_weight : torch.Tensor
        ``[head_dim]``, contiguous, the dtype and device of qkv.
    base : float
        RoPE base (> 0).
    is_neox : bool
        NeoX (halves) or GPT-J (interleaved pairs) style.
    position_ids : torch.Tensor
        ``[num_tokens]`` int32 or int64 on qkv's device, any stride (copied if strided); any value:
        nothing is indexed by it. Not modified.
    factor, low, high, attention_factor : float
        YaRN scaling (``factor > 0``; ``factor == 1`` disables the blend; ``low``, ``high`` in units of
        the pair index ``i``, finite in float32) and the cos/sin multiplier (finite in float32).
    rotary_dim : int, optional
        ``R``: even, ``<= head_dim``; None (default) means ``head_dim``.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+. Keyword-only.
    Returns
    -------
    None
        qkv is written in place; with 0 tokens nothing is launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, a count or ``rotary_dim`` not an int, a float
        argument not a number, ``is_neox`` not a bool.
    ValueError
        Negative head counts or eps, ``head_dim < 1``, ``base <= 0`` or ``factor <= 0`` (NaN fails
        these ranges too), ``rotary_dim`` not even in ``[2, head_dim]``, ``base``, ``factor``,
        ``eps``, ``low``, ``high`` or ``attention_factor`` not finite in float32
        (``fused_qk_norm_rope: low value: expected a finite number, got nan``; magnitudes past
        3.4028235e+38 too).
    RuntimeError
        As ``fused_qk_norm_rope: <arg> <what>: expected X, got Y``: not on CUDA or another device,
        unsupported or mismatched dtypes, qkv not ``[num_tokens, row]`` of the heads' row, a weight not
        ``[head_dim]`` or not contiguous, position_ids not ``[num_tokens]``; from the launcher, qkv
        sharing memory with a weight or position_ids, qkv rows that overlap (a token stride below
        the row, e.g. an expanded qkv), a head_dim the kernel does not take.
    """
    op = "fused_qk_norm_rope"
    for name, value in (("num_heads_q", num_heads_q), ("num_heads_k", num_heads_k), ("num_heads_v", num_heads_v)):
        check_scalar(op, name, value, int, minimum=0)
    check_scalar(op, "head_dim", head_dim, int, minimum=1)
    check_scalar(op, "eps", eps, float, minimum=0.0)
    check_scalar(op, "base", base, float, minimum=0.0, exclusive_minimum=True)
    check_scalar(op, "is_neox", is_neox, bool)
    check_scalar(op, "factor", factor, float, minimum=0.0, exclusive_minimum=True)
    for name, value in (("base", base), ("factor", factor), ("eps", eps)):  # the kernel takes float32
        check_finite_float32(op, name, value)
    for name, value in (("low", low), ("high", high), ("attention_factor", attention_factor)):
        check_scalar(op, name, value, float)
        check_finite_float32(op, name, value)
    check_scalar(op, "rotary_dim", rotary_dim, int, optional=True)
    check_scalar(op, "enable_pdl", enable_pdl, bool, optional=True)
    r = head_dim if rotary_dim is None else rotary_dim
    if r <= 0 or r % 2 != 0 or r > head_dim:
        fail(ValueError, op, "rotary_dim", "value", f"an even number in [2, head_dim={head_dim}]", r)
    row = (num_heads_q + num_heads_k + num_heads_v) * head_dim
    check_tensor(
        op, "qkv", qkv, dtypes=FLOAT_DTYPES, dims=[("num_tokens", None), ("row", row)], last_dim_contiguous=True
    )
    if not tracing():  # tokens of their own (written in place by racing CTAs otherwise)
        check_no_self_overlap(op, "qkv", qkv)
    check_tensor(op, "q_weight", q_weight, dtype_as=(qkv, "qkv"), dims=[("head_dim", head_dim)], contiguous=True)
    check_tensor(op, "k_weight", k_weight, dtype_as=(qkv, "qkv"), dims=[("head_dim", head_dim)], contiguous=True)
    check_tensor(
        op,
        "position_ids",
        position_ids,
        dtypes=INDEX_DTYPES,
        device_as=(qkv, "qkv"),
        dims=[("num_tokens", qkv.shape[0])],
    )
    position_ids = position_ids.contiguous()
    if qkv.shape[0] == 0:
        return
    args = (
        qkv,
        num_heads_q,
        num_heads_k,
        num_heads_v,
        head_dim,
        float(eps),
        q_weight,
        k_weight,
        float(base),
        is_neox,
        position_ids,
        float(factor),
        float(low),
        float(high),
        float(attention_factor),
        r,
        _pdl_flag(enable_pdl),
    )
    if tracing():
        torch.ops.sglang_jit_kernel.fused_qk_norm_rope(*args)
    else:
        with launcher_errors(op):  # the launcher's exact overlap checks, named for the op
            _jit_fused_qk_norm_rope_module(qkv.dtype).fused_qk_norm_rope(*args)


#: Heads the launcher takes at any alignment: 64 units of two one-element vectors (R = head_dim).
_MAX_HEAD_DIM_ANY_LAYOUT = 128


def can_use_fused_qk_norm_rope(head_dim: int, is_neox: bool, dtype: torch.dtype, yarn: bool = False) -> bool:
    """Whether :func:`fused_qk_norm_rope` takes heads of ``head_dim`` elements of ``dtype`` with the
    default ``rotary_dim`` (= ``head_dim``), NeoX or GPT-J style, with or without YaRN.

    The kernel runs 64 units of two vectors per head at most: one-element vectors take any even
    ``head_dim <= 128``; 16-byte vectors (``v = 16 / element_size`` elements: 8 for float16 /
    bfloat16, 4 for float32) take ``head_dim`` a multiple of ``2 * v`` up to ``128 * v`` (1024 / 512)
    when qkv's address and token stride and the weights' addresses are 16-byte aligned too, as
    contiguous tensors from the allocator are (a qkv view at an odd element offset is not; the
    launcher then raises RuntimeError for ``head_dim > 128``). Both styles and YaRN (any ``factor``,
    ``low``, ``high``, ``attention_factor``) run for every such ``head_dim``, so ``is_neox`` and
    ``yarn`` do not change the answer.

    Parameters
    ----------
    head_dim : int
        Elements per head.
    is_neox : bool
        NeoX (halves) or GPT-J (interleaved pairs) style.
    dtype : torch.dtype
        The dtype of qkv and the weights.
    yarn : bool
        YaRN scaling (``factor != 1``). Default False.

    Returns
    -------
    bool
        True for float16 / bfloat16 / float32 and an even ``head_dim`` with ``2 <= head_dim <= 128``,
        or a multiple of ``2 * v`` up to ``128 * v`` (16-byte-aligned qkv rows and weights); False
        for other dtypes, odd, non-positive or larger head dims. Loads nothing.

    Raises
    ------
    TypeError
        ``head_dim`` not an int, ``is_neox`` or ``yarn`` not a bool, ``dtype`` not a ``torch.dtype``
        (``can_use_fused_qk_norm_rope: head_dim type: expected an int, got float``).
    """
    op = "can_use_fused_qk_norm_rope"
    check_scalar(op, "head_dim", head_dim, int)
    check_scalar(op, "is_neox", is_neox, bool)
    if not isinstance(dtype, torch.dtype):
        fail(TypeError, op, "dtype", "type", "a torch.dtype", type_name(dtype))
    check_scalar(op, "yarn", yarn, bool)
    if dtype not in FLOAT_DTYPES or head_dim < 2 or head_dim % 2 != 0:
        return False
    vec = 16 // dtype.itemsize
    return head_dim <= _MAX_HEAD_DIM_ANY_LAYOUT or (head_dim % (2 * vec) == 0 and head_dim <= 128 * vec)


def fused_qk_norm_rope_reference(
    qkv: torch.Tensor,
    num_heads_q: int,
    num_heads_k: int,
    head_dim: int,
    eps: float,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    base: float,
    is_neox: bool,
    position_ids: torch.Tensor,
    factor: float,
    low: float,
    high: float,
    attention_factor: float,
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """The expected qkv of :func:`fused_qk_norm_rope` (a new tensor), in fp32 from the same inputs.

    Norm, then RoPE with the op's frequencies (computed in fp32 like the kernel), rounded once to the
    dtype of qkv; the v columns (and any after ``num_heads_q + num_heads_k`` heads) are copied unchanged.

    Parameters
    ----------
    qkv, num_heads_q, num_heads_k, head_dim, eps, q_weight, k_weight, base, is_neox, position_ids, ...
        ``factor``, ``low``, ``high``, ``attention_factor`` and ``rotary_dim`` too: as for
        :func:`fused_qk_norm_rope` (no ``num_heads_v``: it is implied by the width of qkv). Not
        checked; ``rotary_dim`` None or 0 means ``head_dim``.

    Returns
    -------
    torch.Tensor
        ``[num_tokens, row]``, the dtype and device of qkv. qkv is not modified.
    """
    n = qkv.shape[0]
    r = rotary_dim or head_dim
    out = qkv.clone()
    i = torch.arange(r // 2, dtype=torch.float32, device=qkv.device)
    freq = torch.pow(torch.tensor(base, dtype=torch.float32, device=qkv.device), -2.0 * i / r)
    if factor != 1.0:
        hi = high + 0.001 if high == low else high
        ramp = ((i - low) / (hi - low)).clamp(0.0, 1.0)
        freq = (freq / factor) * ramp + freq * (1.0 - ramp)
    theta = position_ids.float()[:, None] * freq[None, :]
    cos = (torch.cos(theta) * attention_factor)[:, None, :]
    sin = (torch.sin(theta) * attention_factor)[:, None, :]
    for first, count, weight in ((0, num_heads_q, q_weight), (num_heads_q, num_heads_k, k_weight)):
        if count == 0:
            continue
        cols = slice(first * head_dim, (first + count) * head_dim)
        x = qkv[:, cols].float().view(n, count, head_dim)
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        if is_neox:
            a, b = y[..., : r // 2].clone(), y[..., r // 2 : r].clone()
            y[..., : r // 2], y[..., r // 2 : r] = a * cos - b * sin, a * sin + b * cos
        else:
            a, b = y[..., 0:r:2].clone(), y[..., 1:r:2].clone()
            y[..., 0:r:2], y[..., 1:r:2] = a * cos - b * sin, a * sin + b * cos
        out[:, cols] = y.view(n, count * head_dim).to(qkv.dtype)
    return out


def _check_cases() -> list[CheckCase]:
    """Qwen3 shape: 16384 tokens, 32 + 8 + 8 heads x 128, bf16, NeoX, plain RoPE."""
    n, hq, hk, hv, d = 16384, 32, 8, 8, 128

    def make() -> tuple:
        qkv = torch.randn(n, (hq + hk + hv) * d, dtype=torch.bfloat16, device="cuda")
        qw = torch.randn(d, dtype=torch.bfloat16, device="cuda")
        kw = torch.randn(d, dtype=torch.bfloat16, device="cuda")
        # positions below 2048: the frequencies of kernel and reference (both fp32 powf) may differ by
        # an ulp, an angle error of pos * ulp that check's one-ulp bf16 tolerance absorbs there
        return qkv, qw, kw, torch.randint(0, 2048, (n,), device="cuda")

    def call(qkv: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-6, qw, kw, 1e6, True, pos, 1.0, 0.0, 0.0, 1.0)
        return qkv

    def reference(qkv: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return fused_qk_norm_rope_reference(qkv, hq, hk, d, 1e-6, qw, kw, 1e6, True, pos, 1.0, 0.0, 0.0, 1.0)

    nbytes = 2 * n * (hq + hk) * d * 2 + 2 * d * 2 + n * 8
    return [CheckCase(f"[{n}, {hq}+{hk}+{hv}, {d}] bf16 neox", make, call, reference, nbytes, torch.bfloat16)]


register_op(
    "fused_qk_norm_rope",
    build=_jit_fused_qk_norm_rope_module,
    variants=[(d,) for d in FLOAT_DTYPES],
    check_cases=_check_cases,
)
