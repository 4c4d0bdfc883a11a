"""Rotary position embedding (RoPE): in place on q and k, optionally storing k and v into KV caches
in the same launch, and vLLM's ``rotary_embedding``.

With ``R = rope_dim`` and a cos/sin cache row ``cache[pos] = [cos_0 .. cos_{R/2-1}, sin_0 ..
sin_{R/2-1}]``, each pair of a head becomes ``(x*c - y*s, x*s + y*c)``, evaluated in fp32 as
``(fma(x, c, -(y*s)), fma(y, c, x*s))`` and rounded once to the tensor dtype: the NeoX pairs ``(x[i], x[i + R/2])`` or the GPT-J pairs ``(x[2i], x[2i + 1])``.
Elements ``[R, head_dim)`` of each head are untouched. Kernels: ``csrc/elementwise/rope.cuh``; each op
has a module of its own per dtype (the first call compiles only the kernels that op dispatches to).
``apply_rope_inplace_with_kvcache`` into float8_e4m3fn caches (quantized with per-tensor scales as
``store_cache_quant`` does) runs the same kernels with a quantizing store
(``csrc/elementwise/rope_fp8_kvcache.cuh``), in a module of its own per q dtype, chosen by the
caches' dtype, so that caches of the model dtype never compile it.

Bytes moved (the benchmark's count), ``s`` the element size, ``N`` tokens, ``Hq``/``Hk`` heads:
``apply_rope_inplace`` ``2*N*(Hq+Hk)*R*s + N*R*4 + N*p`` (``p`` the position size: read + write of
the rotated elements, the cache rows, the positions); ``apply_rope_inplace_with_kvcache`` adds
``N*Hk*(2*D - R)*s`` read (the rest of k, all of v) and ``2*N*Hk*D*s`` written (both caches;
``2*N*Hk*D`` for float8_e4m3fn caches) and
``N*p`` for ``out_loc``; ``rotary_embedding`` as ``apply_rope_inplace`` with ``N*R*s`` for the cache
rows (the cache is in the tensors' dtype).

A position outside ``[0, max_position)`` never reads out of bounds: that token's heads are rotated by
``cos = 1, sin = 0`` in fp32, which keeps every finite element's value (a ``-0.0`` may come back as
``+0.0``) but makes the partner of an inf or NaN element NaN (``inf * 0``); with the KV store they
are stored so. An
``out_loc`` outside ``[0, cache_size)`` stores nothing for its token. ``SGLANG_JIT_CHECK_INDICES=1``
turns both into an ``IndexError`` naming the first bad entry (a host read: one sync per call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FAST_PATH_REFUSALS,
    FLOAT_DTYPES,
    INDEX_DTYPES,
    VIEW_ERRORS,
    check_indices,
    check_indices_enabled,
    check_no_self_overlap,
    check_scalar,
    check_static_scale,
    check_tensor,
    dtype_name,
    fail,
    launcher_errors,
    tracing,
    type_name,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = [
    "FusedSetKVBufferArg",
    "apply_rope_inplace",
    "apply_rope_inplace_with_kvcache",
    "apply_rope_with_cos_sin_cache_inplace",
    "rotary_embedding",
    "rotary_embedding_with_key",
    "rotary_embedding_without_key",
]


# ---------------------------------------------------------------------------------------------
# Modules: one per op and dtype, each exporting its own launcher of rope.cuh (is_neox and the vector
# width are compiled inside, rope_dim and head counts are runtime).
# ---------------------------------------------------------------------------------------------
def _build(op: str, dtype: torch.dtype) -> Module:
    args = make_cpp_args(dtype)
    return load_jit(op, *args, cuda_files=["elementwise/rope.cuh"], cuda_wrappers=[(op, f"{op}<{args}>")])


@cache_once
def _jit_apply_rope_inplace_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the ``apply_rope_inplace`` module for ``dtype``."""
    return _build("apply_rope_inplace", dtype)


@cache_once
def _jit_apply_rope_inplace_with_kvcache_module(dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> Module:
    """Compile (first use) and cache the ``apply_rope_inplace_with_kvcache`` module for q of ``dtype``
    and caches of ``dtype`` (``cache_dtype`` None or ``dtype``: bit copies; it also holds the
    rotation-only kernels, for a store with no slots or no kv heads) or float8_e4m3fn (the quantizing
    store of ``rope_fp8_kvcache.cuh``, a module of its own so that a first call with caches of the
    model dtype compiles no fp8 kernel)."""
    if cache_dtype is None or cache_dtype == dtype:
        return _build("apply_rope_inplace_with_kvcache", dtype)
    if cache_dtype != FP8_CACHE_DTYPE:
        raise ValueError(
            f"apply_rope_inplace_with_kvcache: cache dtype {cache_dtype}: expected {dtype} or {FP8_CACHE_DTYPE}"
        )
    args = make_cpp_args(dtype)
    return load_jit(
        "apply_rope_inplace_with_kvcache_fp8",
        *args,
        cuda_files=["elementwise/rope_fp8_kvcache.cuh"],
        cuda_wrappers=[("apply_rope_inplace_with_kvcache", f"apply_rope_inplace_with_kvcache_fp8<{args}>")],
    )


@cache_once
def _jit_rotary_embedding_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the ``rotary_embedding`` module for ``dtype`` (cache in the dtype)."""
    return _build("rotary_embedding", dtype)


#: The cache dtype of the quantizing KV store (besides caches of q's dtype).
FP8_CACHE_DTYPE = torch.float8_e4m3fn

# The eager fast paths: dtype (apply_rope_inplace) or (q dtype, cache dtype) -> launcher, filled once a
# module is loaded.
_ROPE_FNS: dict[torch.dtype, Callable[..., None]] = {}
_ROPE_KV_FNS: dict[tuple[torch.dtype, torch.dtype], Callable[..., None]] = {}


def _rope_fn(dtype: torch.dtype) -> Callable[..., None]:
    """``apply_rope_inplace``'s launcher for ``dtype`` (compiled on first use)."""
    fn = _ROPE_FNS.get(dtype)
    if fn is None:
        fn = _ROPE_FNS[dtype] = _jit_apply_rope_inplace_module(dtype).apply_rope_inplace
    return fn


def _rope_kv_fn(dtype: torch.dtype, cache_dtype: torch.dtype) -> Callable[..., None]:
    """``apply_rope_inplace_with_kvcache``'s launcher for q of ``dtype`` and caches of ``cache_dtype``
    (``dtype`` or float8_e4m3fn; compiled on first use). The fp8 launcher takes four more arguments:
    k_scale, v_scale, k_inv_scale, v_inv_scale."""
    fn = _ROPE_KV_FNS.get((dtype, cache_dtype))
    if fn is None:
        # caches of q's dtype: the builder's one-argument form, the key prebuild and check use too
        build_args = (dtype,) if cache_dtype == dtype else (dtype, cache_dtype)
        module = _jit_apply_rope_inplace_with_kvcache_module(*build_args)
        fn = _ROPE_KV_FNS[(dtype, cache_dtype)] = module.apply_rope_inplace_with_kvcache
    return fn


def _rope_kv_launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    is_neox: bool,
    rope_dim: int,
    enable_pdl: int,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    k_inv_scale: float,
    v_inv_scale: float,
) -> None:
    """The launch of the checked path (and the torch.library op's body): caches of q's dtype take the
    bit-copy launcher (the scales are then None and 1.0), fp8 caches the quantizing one. With
    SGLANG_JIT_CHECK_INDICES=1 the host index checks run here, on the real tensors also under
    torch.compile (the wrapper's positions check is left out while tracing)."""
    op = "apply_rope_inplace_with_kvcache"
    check_indices(op, "positions", positions, cos_sin_cache.shape[0], skip_value=None, dim_name="max_position")
    check_indices(op, "out_loc", out_loc, k_cache.shape[0], skip_value=None, dim_name="cache_size")
    args = (q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox, rope_dim, enable_pdl)
    if k_cache.dtype != FP8_CACHE_DTYPE:
        _rope_kv_fn(q.dtype, k_cache.dtype)(*args)
        return
    scales = [None if s is None else s.reshape(1) for s in (k_scale, v_scale)]
    _rope_kv_fn(q.dtype, FP8_CACHE_DTYPE)(*args, *scales, float(k_inv_scale), float(v_inv_scale))


def _pdl_flag(enable_pdl: bool | None) -> int:
    """enable_pdl as the launchers take it: -1 auto (SM90+), 1 on, 0 off."""
    return -1 if enable_pdl is None else int(enable_pdl)


def _indices_checked() -> bool:
    return check_indices_enabled()


# ---------------------------------------------------------------------------------------------
# torch.library ops (used under torch.compile; eager calls go straight to the module)
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sglang_jit_kernel::apply_rope_inplace", mutates_args=("q", "k"), device_types="cuda")
def _rope_op(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool,
    rope_dim: int,
    enable_pdl: int,
) -> None:
    # the wrapper's host index check is left out while tracing: here it runs on the real tensors
    check_indices(
        "apply_rope_inplace", "positions", positions, cos_sin_cache.shape[0], skip_value=None, dim_name="max_position"
    )
    _rope_fn(q.dtype)(q, k, cos_sin_cache, positions, is_neox, rope_dim, enable_pdl)


@_rope_op.register_fake
def _(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool,
    rope_dim: int,
    enable_pdl: int,
) -> None:
    return None


# The KV op that torch.compile traces (the mutations declared); its fake does nothing (no outputs).
_rope_kv_op = torch.library.custom_op(
    "sglang_jit_kernel::apply_rope_inplace_with_kvcache",
    mutates_args=("q", "k", "k_cache", "v_cache"),
    device_types="cuda",
)(_rope_kv_launch)


@_rope_kv_op.register_fake
def _(*args: object) -> None:
    return None


@torch.library.custom_op("sglang_jit_kernel::rotary_embedding", mutates_args=("query", "key"), device_types="cuda")
def _rotary_embedding_op(
    query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, is_neox: bool
) -> None:
    # the wrapper's host index check is left out while tracing: here it runs on the real tensors
    check_indices(
        "rotary_embedding", "positions", positions, cos_sin_cache.shape[0], skip_value=None, dim_name="max_position"
    )
    _jit_rotary_embedding_module(query.dtype).rotary_embedding(query, key, cos_sin_cache, positions, is_neox, -1)


@_rotary_embedding_op.register_fake
def _(
    query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, is_neox: bool
) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# Checks shared by the ops
# ---------------------------------------------------------------------------------------------
def _check_rope_args(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool,
    rope_dim: int,
) -> int:
    """The checks of q, k, the fp32 cache, positions, is_neox and rope_dim; returns R."""
    check_scalar(op, "is_neox", is_neox, bool)
    check_scalar(op, "rope_dim", rope_dim, int, minimum=0)
    check_tensor(
        op,
        "q",
        q,
        dtypes=FLOAT_DTYPES,
        dims=[("num_tokens", None), ("num_q_heads", None), ("head_dim", None)],
        last_dim_contiguous=True,
    )
    num_tokens, _, head_dim = q.shape
    check_tensor(
        op,
        "k",
        k,
        dtype_as=(q, "q"),
        dims=[("num_tokens", num_tokens), ("num_kv_heads", None), ("head_dim", head_dim)],
        last_dim_contiguous=True,
    )
    check_tensor(
        op,
        "cos_sin_cache",
        cos_sin_cache,
        dtypes=(torch.float32,),
        device_as=(q, "q"),
        dims=[("max_position", None), ("rope_dim", None)],
        last_dim_contiguous=True,
    )
    check_tensor(op, "positions", positions, dtypes=INDEX_DTYPES, device_as=(q, "q"), dims=[("num_tokens", num_tokens)])
    width = cos_sin_cache.shape[1]
    r = width if rope_dim == 0 else rope_dim
    if r % 2 != 0 or r == 0:
        fail(ValueError, op, "rope_dim", "value", "an even number > 0 (0: cos_sin_cache.size(1))", r)
    if r > head_dim:
        fail(ValueError, op, "rope_dim", "value", f"<= head_dim ({head_dim})", r)
    if r > width:
        fail(ValueError, op, "rope_dim", "value", f"<= cos_sin_cache.size(1) ({width})", r)
    check_indices(op, "positions", positions, cos_sin_cache.shape[0], skip_value=None, dim_name="max_position")
    return r


# ---------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------
def apply_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    is_neox: bool,
    rope_dim: int = 0,
    enable_pdl: bool | None = None,
) -> None:
    """Rotate the first ``R`` elements of every head of q and k in place by their token's position.

    ``c = cos_sin_cache[pos, :R/2]``, ``s = cos_sin_cache[pos, R/2:R]`` (``pos = positions[t]``);
    each pair ``(x, y)`` becomes ``(x*c_i - y*s_i, x*s_i + y*c_i)`` in fp32 and is rounded once to
    the dtype. NeoX (``is_neox=True``) pairs ``(x[i], x[i + R/2])``, GPT-J pairs ``(x[2i], x[2i+1])``,
    ``i < R/2``. Elements ``[R, head_dim)`` are not touched.

    Parameters
    ----------
    q : torch.Tensor
        ``[num_tokens, num_q_heads, head_dim]`` CUDA tensor, float16 / bfloat16 / float32, last dim
        contiguous, token and head strides free (a view of a fused qkv buffer, or ``q[..., :R]`` of
        a wider head). Modified in place.
    k : torch.Tensor
        ``[num_tokens, num_kv_heads, head_dim]``, same dtype and device, its own strides (they may
        differ from q's); must not share memory with q. Modified in place.
    cos_sin_cache : torch.Tensor
        ``[max_position, width]`` float32 on q's device, last dim contiguous (row stride free), cos in
        ``[:R/2]`` and sin in ``[R/2:R]`` of each row. Not modified.
    positions : torch.Tensor
        ``[num_tokens]`` int32 or int64 on q's device, any stride (a strided tensor is copied). A
        position outside ``[0, max_position)`` reads nothing and rotates its token's heads by
        ``cos = 1, sin = 0`` (finite values kept, see the module docstring for -0.0, inf and NaN);
        ``SGLANG_JIT_CHECK_INDICES=1`` raises instead.
    is_neox : bool
        NeoX (rotate halves) or GPT-J (rotate interleaved pairs) style. Keyword-only.
    rope_dim : int
        ``R``: 0 (default) means ``cos_sin_cache.size(1)``; otherwise an even ``R`` with
        ``R <= head_dim`` and ``R <= cos_sin_cache.size(1)``.
    enable_pdl : bool, optional
        Keyword-only. Programmatic Dependent Launch; None means on for SM90+. Results do not depend
        on it.

    Returns
    -------
    None
        q and k are rotated in place.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor; ``is_neox`` not a bool; ``rope_dim`` not an int;
        ``enable_pdl`` not None/bool.
    ValueError
        ``rope_dim`` negative, odd, above head_dim or above the cache width; with ``rope_dim = 0``, a
        cache width that is odd or 0 (``<op>: rope_dim value: expected an even number > 0 ...``).
    RuntimeError
        Before any launch, as ``apply_rope_inplace: <arg> <what>: expected X, got Y``: a tensor not
        on CUDA or on another device, q not float16/bfloat16/float32, k of another dtype, a cache not
        float32, positions not int32/int64, q or k not 3-D, mismatched num_tokens or head_dim, a
        last dim that is not contiguous. From the launcher, naming the tensors: q and k sharing
        memory, or either sharing memory with the cache or positions, or heads that overlap.
    IndexError
        With ``SGLANG_JIT_CHECK_INDICES=1``: a position outside ``[0, max_position)``.
    """
    if not tracing():
        try:
            fn = _ROPE_FNS.get(q.dtype)
        except AttributeError:  # not a tensor: the checked path raises TypeError
            fn = None
        if (
            fn is not None
            and (is_neox is True or is_neox is False)
            and type(rope_dim) is int
            and (enable_pdl is None or enable_pdl is True or enable_pdl is False)
            and not _indices_checked()
        ):
            try:
                fn(q, k, cos_sin_cache, positions, is_neox, rope_dim, -1 if enable_pdl is None else enable_pdl)
                return
            except FAST_PATH_REFUSALS:  # refused before any launch: the checked path explains
                pass
    op = "apply_rope_inplace"
    check_scalar(op, "enable_pdl", enable_pdl, bool, optional=True)
    _check_rope_args(op, q, k, cos_sin_cache, positions, is_neox, rope_dim)
    positions = positions.contiguous()  # read only: a strided index tensor is copied
    pdl = _pdl_flag(enable_pdl)
    if tracing():
        torch.ops.sglang_jit_kernel.apply_rope_inplace(q, k, cos_sin_cache, positions, is_neox, rope_dim, pdl)
    else:
        with launcher_errors(op):  # the launcher's exact overlap checks, named for the op
            _rope_fn(q.dtype)(q, k, cos_sin_cache, positions, is_neox, rope_dim, pdl)


def _cache_rows(op: str, arg: str, cache: torch.Tensor, row: int) -> torch.Tensor:
    """``[cache_size, num_kv_heads, head_dim]`` or ``[cache_size, num_kv_heads * head_dim]`` -> the 2-D
    view (rows contiguous, row stride free)."""
    if cache.dim() == 3:
        try:
            cache = cache.view(cache.shape[0], -1)
        except VIEW_ERRORS:
            fail(
                RuntimeError,
                op,
                arg,
                "layout",
                "rows of contiguous elements (dims after the first flatten into one contiguous row)",
                f"shape {tuple(cache.shape)} with strides {cache.stride()}",
            )
    check_tensor(
        op, arg, cache, dims=[("cache_size", None), ("num_kv_heads * head_dim", row)], last_dim_contiguous=True
    )
    if not tracing():  # slot rows of their own
        check_no_self_overlap(op, arg, cache)
    return cache


def apply_rope_inplace_with_kvcache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    *,
    is_neox: bool,
    rope_dim: int = 0,
    enable_pdl: bool | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_inv_scale: float = 1.0,
    v_inv_scale: float = 1.0,
) -> None:
    """:func:`apply_rope_inplace`, then store the rotated k and the untouched v by slot, in one launch.

    After the rotation (same formula and roundings), ``k_cache[out_loc[t]] = k[t]`` (rotated, all
    ``head_dim`` elements of every kv head) and ``v_cache[out_loc[t]] = v[t]``: bit for bit when the
    caches have q's dtype; with float8_e4m3fn caches quantized as
    :func:`~sglang.jit_kernel.kvcache.store_cache_quant` does, from the rotated k as rounded to q's
    dtype: ``e4m3(clamp(float(k[t]) * k_inv, -448, 448))`` (one fp32 product, round to nearest even,
    NaN -> 0x7F), ``k_inv = 1 / k_scale[0]`` (a correctly rounded fp32 reciprocal, read on the device
    by the kernel) when ``k_scale`` is given, else ``k_inv_scale``; the same for v. The result is bit
    for bit that of :func:`apply_rope_inplace` followed by ``store_cache_quant``.

    Parameters
    ----------
    q, k, cos_sin_cache, positions, is_neox, rope_dim, enable_pdl
        As in :func:`apply_rope_inplace`; q and k are rotated in place.
    v : torch.Tensor
        ``[num_tokens, num_kv_heads, head_dim]`` (k's shape), the dtype of q, its own strides, last dim
        contiguous. Not modified.
    k_cache, v_cache : torch.Tensor
        ``[cache_size, num_kv_heads * head_dim]`` (or ``[cache_size, num_kv_heads, head_dim]`` with
        contiguous rows), both of q's dtype or both float8_e4m3fn, row stride free; must not share
        memory with any other argument. Written in the rows ``out_loc`` names only.
    out_loc : torch.Tensor
        ``[num_tokens]`` int32 or int64, any stride (copied if strided): the cache row of each
        token. An entry outside
        ``[0, cache_size)`` stores nothing for its token (q and k are still rotated); with
        ``SGLANG_JIT_CHECK_INDICES=1`` it raises instead. Two tokens with one row: the row holds
        pieces (one vector store each, up to 16 bytes) of either token's k and v, in no defined mix
        (as with concurrent plain stores).
    k_scale, v_scale : torch.Tensor, optional
        fp8 caches only: ``[1]`` (or 0-d) float32 dequantisation scales on q's device (``k ~=
        k_cache.float() * k_scale``). Not modified. Given with the matching ``*_inv_scale`` at 1.0.
    k_inv_scale, v_inv_scale : float, optional
        fp8 caches only: the multipliers used when the scale tensors are not given, rounded to fp32.
        Default 1.0.

    Returns
    -------
    None
        q and k rotated in place; ``k_cache`` and ``v_cache`` written in the rows ``out_loc`` names.

    Raises
    ------
    TypeError, ValueError, IndexError
        As :func:`apply_rope_inplace` (IndexError also for ``out_loc``); a scale neither None nor a
        tensor or an inverse scale not a real number (TypeError); an inverse scale other than 1.0
        with its scale tensor given, an inverse scale that is an int outside the float range, or any
        scale argument with caches of q's dtype (ValueError).
    RuntimeError
        As :func:`apply_rope_inplace`, and: v not of k's shape or dtype, a cache of neither q's dtype
        nor float8_e4m3fn (or the two caches of different dtypes), of another row size or slot
        count, a scale tensor not float32 with one element on q's device, out_loc not int32/int64 or
        not ``[num_tokens]``, a cache with overlapping slot rows (expanded); from the launcher, a
        cache sharing memory with another argument.
    """
    if not tracing():
        try:
            fn = _ROPE_KV_FNS.get((q.dtype, k_cache.dtype)) if k_cache.dim() == 2 and v_cache.dim() == 2 else None
        except AttributeError:
            fn = None
        if (
            fn is not None
            and (is_neox is True or is_neox is False)
            and type(rope_dim) is int
            and (enable_pdl is None or enable_pdl is True or enable_pdl is False)
            and not _indices_checked()
        ):
            pdl = -1 if enable_pdl is None else enable_pdl
            try:
                if k_cache.dtype != FP8_CACHE_DTYPE:
                    # exact floats: True == 1.0 too, which the checked path refuses (TypeError)
                    if (
                        k_scale is None
                        and v_scale is None
                        and type(k_inv_scale) is float
                        and type(v_inv_scale) is float
                        and k_inv_scale == 1.0
                        and v_inv_scale == 1.0
                    ):
                        fn(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox, rope_dim, pdl)
                        return
                elif type(k_inv_scale) is float and type(v_inv_scale) is float:
                    fn(
                        q,
                        k,
                        v,
                        k_cache,
                        v_cache,
                        cos_sin_cache,
                        positions,
                        out_loc,
                        is_neox,
                        rope_dim,
                        pdl,
                        k_scale,
                        v_scale,
                        k_inv_scale,
                        v_inv_scale,
                    )
                    return
            except FAST_PATH_REFUSALS:
                pass
    op = "apply_rope_inplace_with_kvcache"
    check_scalar(op, "enable_pdl", enable_pdl, bool, optional=True)
    _check_rope_args(op, q, k, cos_sin_cache, positions, is_neox, rope_dim)
    num_tokens, num_kv_heads, head_dim = k.shape
    check_tensor(
        op,
        "v",
        v,
        dtype_as=(q, "q"),
        dims=[("num_tokens", num_tokens), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)],
        last_dim_contiguous=True,
    )
    check_tensor(op, "k_cache", k_cache, dtypes=(q.dtype, FP8_CACHE_DTYPE), device_as=(q, "q"))
    check_tensor(op, "v_cache", v_cache, dtype_as=(k_cache, "k_cache"), device_as=(q, "q"))
    for arg, scale, inv_arg, inv in (
        ("k_scale", k_scale, "k_inv_scale", k_inv_scale),
        ("v_scale", v_scale, "v_inv_scale", v_inv_scale),
    ):
        check_static_scale(op, arg, scale, inv_arg, inv, (q, "q"))
        if k_cache.dtype != FP8_CACHE_DTYPE and (scale is not None or inv != 1.0):
            fail(
                ValueError,
                op,
                arg if scale is not None else inv_arg,
                "value",
                f"{'None' if scale is not None else '1.0'} for caches of {dtype_name(k_cache.dtype)} (scales apply to "
                f"{dtype_name(FP8_CACHE_DTYPE)} caches)",
                "a tensor" if scale is not None else inv,
            )
    k_cache = _cache_rows(op, "k_cache", k_cache, num_kv_heads * head_dim)
    v_cache = _cache_rows(op, "v_cache", v_cache, num_kv_heads * head_dim)
    if v_cache.shape[0] != k_cache.shape[0]:
        fail(
            RuntimeError,
            op,
            "v_cache",
            "shape",
            f"[cache_size={k_cache.shape[0]}, "
            f"num_kv_heads * head_dim={num_kv_heads * head_dim}] (the slots of k_cache)",
            tuple(v_cache.shape),
        )
    check_tensor(op, "out_loc", out_loc, dtypes=INDEX_DTYPES, device_as=(q, "q"), dims=[("num_tokens", num_tokens)])
    positions, out_loc = positions.contiguous(), out_loc.contiguous()  # read only: strided indices are copied
    args = (q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox, rope_dim, _pdl_flag(enable_pdl))
    scales = (k_scale, v_scale, float(k_inv_scale), float(v_inv_scale))
    if tracing():
        torch.ops.sglang_jit_kernel.apply_rope_inplace_with_kvcache(*args, *scales)
    else:
        with launcher_errors(op):  # the launcher's exact overlap checks, named for the op
            _rope_kv_launch(*args, *scales)


@dataclass
class FusedSetKVBufferArg:
    """Where :func:`apply_rope_with_cos_sin_cache_inplace` stores k and v after the rotation.

    Attributes
    ----------
    value : torch.Tensor
        v, ``[num_tokens, num_kv_heads, head_dim]`` (or ``[num_tokens, num_kv_heads * head_dim]``).
    k_buffer, v_buffer : torch.Tensor
        The caches, ``[cache_size, num_kv_heads * head_dim]`` (or 3-D with contiguous rows).
    cache_loc : torch.Tensor
        ``[num_tokens]`` int32 / int64 cache rows.
    k_scale, v_scale : torch.Tensor, optional
        float8_e4m3fn buffers only: ``[1]`` float32 dequantisation scales on the device (default None).
    k_inv_scale, v_inv_scale : float, optional
        float8_e4m3fn buffers only: the multipliers used without scale tensors (default 1.0). See
        :func:`apply_rope_inplace_with_kvcache`.
    """

    value: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    cache_loc: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    k_inv_scale: float = 1.0
    v_inv_scale: float = 1.0


def apply_rope_with_cos_sin_cache_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    is_neox: bool,
    rope_dim: int = 0,
    fused_args: FusedSetKVBufferArg | None = None,
    enable_pdl: bool | None = None,
) -> None:
    """RoPE in place, and with ``fused_args`` the KV store in the same launch.

    :func:`apply_rope_inplace` when ``fused_args`` is None, else :func:`apply_rope_inplace_with_kvcache`
    with ``v = value``, ``k_cache = k_buffer``, ``v_cache = v_buffer``, ``out_loc = cache_loc`` and the
    scale fields as its keyword arguments (float8_e4m3fn buffers: the quantizing store) (a 2-D
    value ``[num_tokens, num_kv_heads * head_dim]`` is viewed as k's shape). Same formula and
    roundings: each pair ``(x, y)`` becomes ``(fma(x, c, -(y*s)), fma(y, c, x*s))`` in fp32, rounded
    once.

    Parameters
    ----------
    q, k, cos_sin_cache, positions, is_neox, rope_dim, enable_pdl
        As in :func:`apply_rope_inplace` (``is_neox``, ``rope_dim``, ``fused_args`` and ``enable_pdl``
        keyword-only); q and k are rotated in place.
    fused_args : FusedSetKVBufferArg, optional
        The KV store (see :class:`FusedSetKVBufferArg`); None (default): rotation only.

    Returns
    -------
    None

    Raises
    ------
    TypeError
        ``fused_args`` neither None nor a ``FusedSetKVBufferArg``
        (``apply_rope_with_cos_sin_cache_inplace: fused_args type: expected a FusedSetKVBufferArg or None,
        got dict``); otherwise as the op called.
    ValueError, RuntimeError, IndexError
        As :func:`apply_rope_inplace` / :func:`apply_rope_inplace_with_kvcache`, the message naming
        that op (``apply_rope_inplace_with_kvcache: v shape: ...``).
    """
    if fused_args is None:
        return apply_rope_inplace(
            q, k, cos_sin_cache, positions, is_neox=is_neox, rope_dim=rope_dim, enable_pdl=enable_pdl
        )
    if not isinstance(fused_args, FusedSetKVBufferArg):
        fail(
            TypeError,
            "apply_rope_with_cos_sin_cache_inplace",
            "fused_args",
            "type",
            "a FusedSetKVBufferArg or None",
            type_name(fused_args),
        )
    value = fused_args.value
    if isinstance(value, torch.Tensor) and isinstance(k, torch.Tensor) and value.dim() == 2 and k.dim() == 3:
        value = (
            value.view(value.shape[0], k.shape[1], k.shape[2]) if value.shape[1] == k.shape[1] * k.shape[2] else value
        )
    return apply_rope_inplace_with_kvcache(
        q,
        k,
        value,
        fused_args.k_buffer,
        fused_args.v_buffer,
        cos_sin_cache,
        positions,
        fused_args.cache_loc,
        is_neox=is_neox,
        rope_dim=rope_dim,
        enable_pdl=enable_pdl,
        k_scale=fused_args.k_scale,
        v_scale=fused_args.v_scale,
        k_inv_scale=fused_args.k_inv_scale,
        v_inv_scale=fused_args.v_inv_scale,
    )


def _heads_view(op: str, arg: str, tensor: torch.Tensor, lead_shape: tuple, head_size: int) -> torch.Tensor:
    """vLLM's ``[*lead, H * head_size]`` or ``[*lead, H, head_size]`` (``lead`` the shape of positions:
    ``[num_tokens]`` or ``[batch, seq]``) -> a ``[num_tokens, H, head_size]`` view (no copy: the op
    writes in place)."""
    check_tensor(op, arg, tensor, dtypes=FLOAT_DTYPES, last_dim_contiguous=True)
    lead = len(lead_shape)

    def expected() -> str:  # built only on failure: str() of a symbolic size would break tracing
        dims = ", ".join(str(n) for n in lead_shape)
        return (
            f"[{dims}, num_heads * head_size] or [{dims}, num_heads, head_size] (the leading dims of "
            f"positions, head_size={head_size})"
        )

    shape = tuple(tensor.shape)
    if tensor.dim() not in (lead + 1, lead + 2) or shape[:lead] != tuple(lead_shape):
        fail(RuntimeError, op, arg, "shape", expected(), shape)
    if tensor.dim() == lead + 2 and shape[-1] != head_size or shape[-1] % head_size != 0:
        fail(RuntimeError, op, arg, "shape", expected(), shape)
    num_tokens = 1
    for n in lead_shape:
        num_tokens *= n
    inner = 1
    for n in shape[lead:]:
        inner *= n
    try:
        return tensor.view(num_tokens, inner // head_size, head_size)
    except VIEW_ERRORS:
        fail(
            RuntimeError,
            op,
            arg,
            "layout",
            "tokens and heads that flatten to [num_tokens, num_heads, head_size] without a copy",
            f"shape {shape} with strides {tensor.stride()}",
        )


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """vLLM's rotary embedding, in place: the first ``rot_dim = cos_sin_cache.size(-1)`` elements of
    each head of query and key rotated as in :func:`apply_rope_inplace` with ``R = rot_dim``.

    The cache is in the query's dtype; each pair ``(x, y)`` becomes ``(fma(x, c, -(y*s)), fma(y, c,
    x*s))`` in fp32 from the dtype values of x, y, c, s and is rounded once to the dtype; NeoX or
    GPT-J style.

    Parameters
    ----------
    positions : torch.Tensor
        ``[num_tokens]`` or ``[batch, seq]``, int32 or int64, on query's device, any stride (copied
        if strided). Out-of-range entries rotate their token by ``cos = 1, sin = 0`` (finite values kept, see
        apply_rope_inplace; ``SGLANG_JIT_CHECK_INDICES=1``:
        IndexError).
    query : torch.Tensor
        ``[num_tokens, num_heads * head_size]``, ``[num_tokens, num_heads, head_size]`` or with
        ``[batch, seq]`` leading dims; float16 / bfloat16 / float32; token and head layout must
        flatten to ``[num_tokens, num_heads, head_size]`` without a copy (token stride free).
        Rotated in place.
    key : torch.Tensor or None
        Like ``query`` (its own head count and strides), the same dtype; or None.
    head_size : int
        Elements per head (``>= rot_dim``).
    cos_sin_cache : torch.Tensor
        ``[max_position, rot_dim]``, the dtype of query, rows contiguous; cos then sin halves.
    is_neox : bool
        NeoX (default) or GPT-J style.

    Returns
    -------
    (torch.Tensor, torch.Tensor or None)
        ``(query, key)``, the same tensor objects, rotated in place (``key`` None when given None).
        With 0 tokens nothing is launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor (key may be None), ``head_size`` not an int,
        ``is_neox`` not a bool.
    ValueError
        ``head_size`` < 1; ``rot_dim`` 0, odd or above head_size (``rotary_embedding: cos_sin_cache
        rot_dim: expected <= head_size (64), got 128``).
    RuntimeError
        As ``rotary_embedding: <arg> <what>: expected X, got Y``: not on CUDA or another device,
        unsupported or mismatched dtypes (the cache in another dtype than query), shapes that do
        not split into ``num_tokens`` tokens of whole heads, layouts that do not flatten without a
        copy; from the launcher, query and key sharing memory.
    IndexError
        With ``SGLANG_JIT_CHECK_INDICES=1``: a position outside ``[0, max_position)``.
    """
    _rotary_embedding("rotary_embedding", positions, query, key, head_size, cos_sin_cache, is_neox)
    return query, key


def rotary_embedding_with_key(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """:func:`rotary_embedding` of query and key, in place, returning None: the same kernel, the same
    values bit for bit, the same checks (messages start ``rotary_embedding_with_key:``).

    Parameters
    ----------
    positions, query, head_size, cos_sin_cache, is_neox
        As in :func:`rotary_embedding`: ``positions`` ``[num_tokens]`` or ``[batch, seq]`` int32 /
        int64; ``query`` ``[..., num_heads * head_size]`` or ``[..., num_heads, head_size]`` float16 /
        bfloat16 / float32, rotated in place; ``cos_sin_cache`` ``[max_position, rot_dim]`` in query's
        dtype, ``rot_dim`` even and ``<= head_size``.
    key : torch.Tensor
        Like ``query`` (its own head count and strides), the same dtype; rotated in place. Required:
        None is a TypeError (:func:`rotary_embedding_without_key` rotates query alone).

    Returns
    -------
    None
        query and key are rotated in place; with 0 tokens nothing is launched.

    Raises
    ------
    TypeError, ValueError, RuntimeError, IndexError
        As :func:`rotary_embedding`; also TypeError for a ``key`` of None
        (``rotary_embedding_with_key: key type: expected a torch.Tensor, got NoneType``).
    """
    _rotary_embedding("rotary_embedding_with_key", positions, query, key, head_size, cos_sin_cache, is_neox, True)


def rotary_embedding_without_key(
    positions: torch.Tensor,
    query: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """:func:`rotary_embedding` of query alone (``key=None``), in place, returning None.

    The launch is rotary_embedding's with a key of 0 heads (eagerly a zero-head view of query, so
    nothing is allocated), so query's values are those of ``rotary_embedding(positions, query, None,
    ...)`` and of :func:`rotary_embedding_with_key`'s query, bit for bit. Same checks as
    :func:`rotary_embedding` (messages start ``rotary_embedding_without_key:``).

    Parameters
    ----------
    positions, query, head_size, cos_sin_cache, is_neox
        As in :func:`rotary_embedding_with_key`.

    Returns
    -------
    None
        query is rotated in place; with 0 tokens nothing is launched.

    Raises
    ------
    TypeError, ValueError, RuntimeError, IndexError
        As :func:`rotary_embedding` (without the errors about key).
    """
    _rotary_embedding("rotary_embedding_without_key", positions, query, None, head_size, cos_sin_cache, is_neox)


def _rotary_embedding(
    op: str,
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    key_required: bool = False,
) -> None:
    """rotary_embedding and its two forms: the checks (messages start ``<op>:``), then the launch.
    ``key_required``: a key of None is a TypeError (else it means query alone)."""
    check_scalar(op, "head_size", head_size, int, minimum=1)
    check_scalar(op, "is_neox", is_neox, bool)
    check_tensor(op, "positions", positions, dtypes=INDEX_DTYPES)
    if positions.dim() not in (1, 2):
        fail(RuntimeError, op, "positions", "shape", "[num_tokens] or [batch, seq]", tuple(positions.shape))
    num_tokens = positions.numel()
    q = _heads_view(op, "query", query, tuple(positions.shape), head_size)
    check_tensor(op, "positions", positions, device_as=(query, "query"))
    if key is None and not key_required:
        # no key: k with 0 heads. Eager: a view of q (no allocation); traced: a tensor of its own, so
        # that the op's two mutated arguments never alias
        k = q.new_empty((num_tokens, 0, head_size)) if tracing() else q[:, :0]
    else:
        check_tensor(op, "key", key, dtype_as=(query, "query"))
        k = _heads_view(op, "key", key, tuple(positions.shape), head_size)
    check_tensor(
        op,
        "cos_sin_cache",
        cos_sin_cache,
        dtype_as=(query, "query"),
        dims=[("max_position", None), ("rot_dim", None)],
        last_dim_contiguous=True,
    )
    rot_dim = cos_sin_cache.shape[1]
    if rot_dim % 2 != 0 or rot_dim == 0:
        fail(ValueError, op, "cos_sin_cache", "rot_dim", "an even number > 0 (cos_sin_cache.size(-1))", rot_dim)
    if rot_dim > head_size:
        fail(ValueError, op, "cos_sin_cache", "rot_dim", f"<= head_size ({head_size})", rot_dim)
    pos = positions.reshape(-1).contiguous()
    check_indices(op, "positions", pos, cos_sin_cache.shape[0], skip_value=None, dim_name="max_position")
    if num_tokens > 0:
        if tracing():
            torch.ops.sglang_jit_kernel.rotary_embedding(q, k, cos_sin_cache, pos, is_neox)
        else:
            with launcher_errors(op):  # the launcher's exact overlap checks, named for the op
                _jit_rotary_embedding_module(query.dtype).rotary_embedding(q, k, cos_sin_cache, pos, is_neox, -1)


# ---------------------------------------------------------------------------------------------
# References (fp32, from the same low-precision inputs) and registration
# ---------------------------------------------------------------------------------------------
def rope_reference(
    x: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, is_neox: bool, rope_dim: int = 0
) -> torch.Tensor:
    """The rotated ``x [num_tokens, num_heads, head_dim]`` in fp32, rounded once to x's dtype (a
    position outside the cache leaves its token's finite values unchanged). NeoX and GPT-J written apart."""
    r = rope_dim or cos_sin_cache.shape[1]
    half = r // 2
    out = x.float().clone()
    pos = positions.long()
    valid = (pos >= 0) & (pos < cos_sin_cache.shape[0])
    row = cos_sin_cache.float()[pos.clamp(0, cos_sin_cache.shape[0] - 1)]
    cos = torch.where(valid[:, None], row[:, :half], 1.0)[:, None, :]
    sin = torch.where(valid[:, None], row[:, half:r], 0.0)[:, None, :]
    if is_neox:
        a, b = out[..., :half].clone(), out[..., half:r].clone()
        out[..., :half] = a * cos - b * sin
        out[..., half:r] = a * sin + b * cos
    else:
        a, b = out[..., 0:r:2].clone(), out[..., 1:r:2].clone()
        out[..., 0:r:2] = a * cos - b * sin
        out[..., 1:r:2] = a * sin + b * cos
    return out.to(x.dtype)


def make_cos_sin_cache(
    max_position: int, rope_dim: int, base: float = 10000.0, device: str = "cuda", dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``[max_position, rope_dim]``: cos then sin of ``pos * base^(-2i/rope_dim)``, computed in fp64."""
    inv_freq = base ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64, device=device) / rope_dim)
    freqs = torch.arange(max_position, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


_CHECK_N, _CHECK_HQ, _CHECK_HK, _CHECK_D = 16384, 32, 8, 128


def _rope_bytes(n: int, hq: int, hk: int, r: int, kv_d: int = 0, cache_element: int = 4) -> int:
    """Bytes an op must move (the module docstring's formula: bf16 q/k, cos/sin rows of
    ``cache_element`` bytes, int64 indices); kv_d > 0 adds the KV store of kv_d-element heads."""
    total = 2 * n * (hq + hk) * r * 2 + n * r * cache_element + n * 8
    if kv_d:
        total += n * hk * (2 * kv_d - r) * 2 + 2 * n * hk * kv_d * 2 + n * 8
    return total


def _qk_inputs(n: int, hq: int, hk: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [n, hq, d] and k [n, hk, d], bf16 (separate tensors, as bench_rope times them)."""
    return (
        torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda"),
        torch.randn(n, hk, d, dtype=torch.bfloat16, device="cuda"),
    )


def _rope_cases() -> list[CheckCase]:
    n, hq, hk, d = _CHECK_N, _CHECK_HQ, _CHECK_HK, _CHECK_D

    def make() -> tuple:
        return (*_qk_inputs(n, hq, hk, d), make_cos_sin_cache(8192, d), torch.randint(0, 8192, (n,), device="cuda"))

    def call(q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> None:
        apply_rope_inplace(q, k, cache, positions, is_neox=True)

    def output(_: None, q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.cat([q.view(-1), k.view(-1)])

    def reference(q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.cat([rope_reference(x, cache, positions, True).view(-1) for x in (q, k)])

    label = f"[{n}, {hq}+{hk}, {d}] bf16 neox"
    return [CheckCase(label, make, call, reference, _rope_bytes(n, hq, hk, d), torch.bfloat16, output=output)]


def _rope_kv_cases() -> list[CheckCase]:
    """bench_rope's KV shape: caches of 2 * n slots, out_loc a random permutation's first n."""
    n, hq, hk, d = _CHECK_N, _CHECK_HQ, _CHECK_HK, _CHECK_D
    slots = 2 * n

    def make() -> tuple:
        q, k = _qk_inputs(n, hq, hk, d)
        v = torch.randn(n, hk, d, dtype=torch.bfloat16, device="cuda")
        cache = make_cos_sin_cache(8192, d)
        positions = torch.randint(0, 8192, (n,), device="cuda")
        loc = torch.randperm(slots, device="cuda")[:n]
        kv = torch.zeros(2, slots, hk * d, dtype=torch.bfloat16, device="cuda")
        return q, k, v, kv, cache, positions, loc

    def call(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: torch.Tensor,
        cache: torch.Tensor,
        positions: torch.Tensor,
        loc: torch.Tensor,
    ) -> None:
        apply_rope_inplace_with_kvcache(q, k, v, kv[0], kv[1], cache, positions, loc, is_neox=True)

    def output(
        _: None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, *rest: torch.Tensor
    ) -> torch.Tensor:
        return torch.cat([q.view(-1), k.view(-1), kv.view(-1)])

    def reference(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: torch.Tensor,
        cache: torch.Tensor,
        positions: torch.Tensor,
        loc: torch.Tensor,
    ) -> torch.Tensor:
        q_rot, k_rot = (rope_reference(x, cache, positions, True) for x in (q, k))
        expected = kv.clone()
        expected[0, loc] = k_rot.view(n, -1)
        expected[1, loc] = v.view(n, -1)
        return torch.cat([q_rot.view(-1), k_rot.view(-1), expected.view(-1)])

    label = f"[{n}, {hq}+{hk}, {d}] bf16 neox"
    nbytes = _rope_bytes(n, hq, hk, d, kv_d=d)
    return [CheckCase(label, make, call, reference, nbytes, torch.bfloat16, output=output), _rope_fp8_kv_case()]


def _rope_fp8_kv_case() -> CheckCase:
    """The same shape into float8_e4m3fn caches, k with a device scale, v with an inverse scale; the
    caches are compared dequantized, within one e4m3 step of the fp32 reference (the rotated k of the
    reference may sit one bf16 ulp from the kernel's, across an e4m3 rounding boundary)."""
    n, hq, hk, d = _CHECK_N, _CHECK_HQ, _CHECK_HK, _CHECK_D
    slots, k_scale, v_inv = 2 * n, 0.05, 10.0

    def make() -> tuple:
        q, k = _qk_inputs(n, hq, hk, d)
        v = torch.randn(n, hk, d, dtype=torch.bfloat16, device="cuda")
        cache = make_cos_sin_cache(8192, d)
        positions = torch.randint(0, 8192, (n,), device="cuda")
        loc = torch.randperm(slots, device="cuda")[:n]
        kv = torch.zeros(2, slots, hk * d, dtype=FP8_CACHE_DTYPE, device="cuda")
        return q, k, v, kv, cache, positions, loc, torch.tensor([k_scale], device="cuda")

    def call(*inputs: torch.Tensor) -> None:
        q, k, v, kv, cache, positions, loc, ks = inputs
        apply_rope_inplace_with_kvcache(
            q, k, v, kv[0], kv[1], cache, positions, loc, is_neox=True, k_scale=ks, v_inv_scale=v_inv
        )

    def output(_: None, *inputs: torch.Tensor) -> torch.Tensor:
        kv = inputs[3].float()
        return torch.cat([(kv[0] * k_scale).view(-1), (kv[1] / v_inv).view(-1)])

    def reference(*inputs: torch.Tensor) -> torch.Tensor:
        _, k, v, kv, cache, positions, loc, _ = inputs
        expected = kv.float().clone()
        k_rot = rope_reference(k, cache, positions, True).float().view(n, -1)
        expected[0, loc] = (k_rot / k_scale).clamp(-448, 448).to(FP8_CACHE_DTYPE).float()
        expected[1, loc] = (v.float().view(n, -1) * v_inv).clamp(-448, 448).to(FP8_CACHE_DTYPE).float()
        return torch.cat([(expected[0] * k_scale).view(-1), (expected[1] / v_inv).view(-1)])

    label = f"[{n}, {hq}+{hk}, {d}] bf16 neox -> e4m3"
    nbytes = _rope_bytes(n, hq, hk, d, kv_d=d) - 2 * n * hk * d  # one byte per cache element, not two
    # one e4m3 step: 2^-3 relative for normal values, 2^-9 (times the scale) absolute for subnormal ones
    return CheckCase(label, make, call, reference, nbytes, torch.float32, tolerance=(0.13, 2**-9), output=output)


def _rotary_embedding_cases() -> list[CheckCase]:
    n, hq, hk, d = _CHECK_N, _CHECK_HQ, _CHECK_HK, _CHECK_D

    def make() -> tuple:
        query = torch.randn(n, hq * d, dtype=torch.bfloat16, device="cuda")
        key = torch.randn(n, hk * d, dtype=torch.bfloat16, device="cuda")
        return (
            query,
            key,
            make_cos_sin_cache(8192, d, dtype=torch.bfloat16),
            torch.randint(0, 8192, (n,), device="cuda"),
        )

    def call(query: torch.Tensor, key: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> tuple:
        return rotary_embedding(positions, query, key, d, cache, True)

    def output(result: tuple, *inputs: torch.Tensor) -> torch.Tensor:
        query, key = result
        return torch.cat([query.view(-1), key.view(-1)])

    def reference(query: torch.Tensor, key: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q = rope_reference(query.view(n, hq, d), cache, positions, True)
        k = rope_reference(key.view(n, hk, d), cache, positions, True)
        return torch.cat([q.view(-1), k.view(-1)])

    label = f"[{n}, {hq}+{hk}, {d}] bf16 neox"
    nbytes = _rope_bytes(n, hq, hk, d, cache_element=2)
    return [CheckCase(label, make, call, reference, nbytes, torch.bfloat16, output=output)]


_DTYPES = [(d,) for d in FLOAT_DTYPES]
register_op("apply_rope_inplace", build=_jit_apply_rope_inplace_module, variants=_DTYPES, check_cases=_rope_cases)
register_op(
    "apply_rope_inplace_with_kvcache",
    build=_jit_apply_rope_inplace_with_kvcache_module,
    variants=_DTYPES + [(d, FP8_CACHE_DTYPE) for d in FLOAT_DTYPES],
    check_cases=_rope_kv_cases,
)
register_op(
    "rotary_embedding", build=_jit_rotary_embedding_module, variants=_DTYPES, check_cases=_rotary_embedding_cases
)
