"""KV-cache writes: ``store_cache`` (k and v rows into their caches by slot), ``store_cache_quant``
(the same rows quantized to fp8 e4m3 with per-tensor scales) and ``set_mla_kv_buffer`` (the MLA
latent and rotary parts into one cache row), with ``can_use_store_cache`` and
``can_use_set_mla_kv_buffer``.

store_cache and set_mla_kv_buffer are bit copies of any dtype, served by the byte-copy engine
(``csrc/kvcache/row_scatter.cuh``, with the launchers ``store_cache.cuh`` and
``set_mla_kv_buffer.cuh``); their modules have no dtype templates, so one build serves every dtype.
store_cache has a module per index dtype and vector widths (16-byte rows, the rest), each compiled on
the first call that needs it; set_mla_kv_buffer one. store_cache_quant
(``csrc/kvcache/store_cache_quant.cuh``) converts as it scatters (row_scatter's flat layout, the
quantizers' e4m3 conversion) and is built per source dtype.

Slot indices outside ``[0, num_slots)`` (``-1`` marks the padding rows of a CUDA-graph batch) copy
nothing for their row: the kernels never write out of bounds or into another slot, and the CUDA
context stays usable. ``SGLANG_JIT_CHECK_INDICES=1`` makes the wrappers raise ``IndexError`` naming
the first index outside the cache other than ``-1`` (a host read: it synchronises the stream, and is
left out while a CUDA graph is being captured). A slot named by several indices gets bytes of those
rows in no defined order (rows are copied in parallel, in parts): a slot map names each slot once.

Bytes moved (for bandwidth figures): store_cache ``2 * n * (k_row_bytes + v_row_bytes) + n * index
size`` for ``n`` indices; store_cache_quant ``n * (k_row + v_row) * (element_size + 1) + n * index
size``; set_mla_kv_buffer ``2 * n * (nope + rope) * element_size + n * index size``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FAST_PATH_REFUSALS,
    INDEX_DTYPES,
    INT64_MAX,
    VIEW_ERRORS,
    check_indices,
    check_indices_enabled,
    check_no_partial_overlap,
    check_no_self_overlap,
    check_scalar,
    check_static_scale,
    check_tensor,
    fail,
    launcher_errors,
    tracing,
    unit_last_stride,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["can_use_set_mla_kv_buffer", "can_use_store_cache", "set_mla_kv_buffer", "store_cache", "store_cache_quant"]


#: store_cache's module widths, in the order a launch tries them: "wide", the 16-byte vectors of
#: aligned rows (loaded on the first call), "narrow", the 8 / 4 / 2 / 1-byte vectors of rows that do
#: not allow 16 bytes (loaded on the first such call). A wide launcher returns False, launching
#: nothing, for such rows.
STORE_CACHE_WIDTHS = ("wide", "narrow")


@cache_once
def _jit_store_cache_module(index_dtype: torch.dtype = torch.int64, widths: str = "wide") -> Module:
    """Compile (first use) and cache ``store_cache``'s module for indices of ``index_dtype`` (int32 /
    int64) and vector ``widths`` (STORE_CACHE_WIDTHS)."""
    if widths not in STORE_CACHE_WIDTHS:
        raise ValueError(f"store_cache module: widths: expected one of {STORE_CACHE_WIDTHS}, got {widths!r}")
    args = make_cpp_args(index_dtype, f"ScatterWidths::k{widths.capitalize()}")
    return load_jit(
        "store_cache",
        *args,
        cuda_files=["kvcache/store_cache.cuh"],
        cuda_wrappers=[("store_cache", f"store_cache<{args}>")],
    )


@cache_once
def _jit_set_mla_kv_buffer_module() -> Module:
    """Compile (first use) and cache ``set_mla_kv_buffer``'s module."""
    return load_jit(
        "set_mla_kv_buffer",
        cuda_files=["kvcache/set_mla_kv_buffer.cuh"],
        cuda_wrappers=[("set_mla_kv_buffer", "set_mla_kv_buffer")],
    )


#: Source dtypes of store_cache_quant (one module each).
QUANT_SOURCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The largest finite e4m3 value; store_cache_quant clamps the scaled values to [-FP8_MAX, FP8_MAX].
FP8_MAX = 448.0
#: The largest size_limit: the launcher takes an int64 (the FFI does not pass a larger int as one).


@cache_once
def _jit_store_cache_quant_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache ``store_cache_quant``'s module for sources of ``dtype``."""
    args = make_cpp_args(dtype)
    return load_jit(
        "store_cache_quant",
        *args,
        cuda_files=["kvcache/store_cache_quant.cuh"],
        cuda_wrappers=[("store_cache_quant", f"store_cache_quant<{args}>")],
    )


_BUILDERS: dict[str, Callable[..., Module]] = {
    "store_cache": _jit_store_cache_module,
    "set_mla_kv_buffer": _jit_set_mla_kv_buffer_module,
    "store_cache_quant": _jit_store_cache_quant_module,
}

# The exported functions by (name, build arguments), filled when a module is loaded: the eager fast
# path is a dict lookup and the FFI call, whose launcher validates everything it needs (falling back
# to the checked path, which explains a refusal).
_FNS: dict[tuple, Callable[..., None]] = {}


def _load(name: str, *args: object) -> Callable[..., None]:
    """The launcher ``name`` (a key of ``_BUILDERS``) built for ``args`` (store_cache: the index dtype and
    widths; store_cache_quant: the source dtype), its module compiled on first use."""
    fn = _FNS[(name, *args)] = getattr(_BUILDERS[name](*args), name)
    return fn


def _fast_fn(name: str, *args: object) -> Callable[..., None] | None:
    """The loaded FFI function of ``name`` (built for ``args``) for the eager fast path, or None (module
    not loaded yet, or ``SGLANG_JIT_CHECK_INDICES=1``, which needs the checked path's host read of the
    indices)."""
    fn = _FNS.get((name, *args))
    if fn is None or check_indices_enabled():
        return None
    return fn


def _rows(op: str, arg: str, tensor: torch.Tensor, dim_name: str) -> torch.Tensor:
    """``[n, ...]`` -> the 2-D view ``[n, row]`` (the trailing dims flattened, which must form one
    contiguous row; the row stride is free). A size-1 row gets stride 1 (torch leaves it free)."""
    if tensor.dim() < 2:
        fail(RuntimeError, op, arg, "shape", f"[{dim_name}, row...] (at least 2 dims)", tuple(tensor.shape))
    if tensor.dim() != 2:
        try:
            tensor = tensor.view(tensor.shape[0], -1)
        except VIEW_ERRORS:
            fail(
                RuntimeError,
                op,
                arg,
                "layout",
                "rows of contiguous elements (the dims after the first flatten into one contiguous row)",
                f"shape {tuple(tensor.shape)} with strides {tensor.stride()}",
            )
    tensor = unit_last_stride(tensor)
    if tensor.stride(1) != 1 and tensor.shape[1] > 1:
        fail(
            RuntimeError,
            op,
            arg,
            "last-dim stride",
            "1 (a contiguous row)",
            f"{tensor.stride(1)} (shape {tuple(tensor.shape)} with strides {tensor.stride()})",
        )
    return tensor


def _row_bytes(t: torch.Tensor) -> int:
    return t.shape[1] * t.element_size()


def _check_row(
    op: str, arg: str, tensor: torch.Tensor, ref: torch.Tensor, ref_arg: str, *, elements: bool = False
) -> None:
    """RuntimeError unless the 2-D row views ``tensor`` and ``ref`` have rows of one size: in bytes, or
    in elements with ``elements`` (a cache of another dtype than its source)."""
    size, unit = (lambda t: t.shape[1], "elements") if elements else (_row_bytes, "bytes")
    if size(tensor) != size(ref):
        fail(
            RuntimeError,
            op,
            arg,
            "row size",
            f"{size(ref)} {unit} (the row of {ref_arg})",
            f"{size(tensor)} {unit} (shape {tuple(tensor.shape)})",
        )


def _kv_rows(
    op: str, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 2-D row views of k, v and their caches (store_cache, store_cache_quant), with the counts
    checked: as many tokens in v as in k, at most that many indices, as many slots in both caches."""
    k2, v2 = _rows(op, "k", k, "num_tokens"), _rows(op, "v", v, "num_tokens")
    k_cache2, v_cache2 = _rows(op, "k_cache", k_cache, "num_slots"), _rows(op, "v_cache", v_cache, "num_slots")
    if v2.shape[0] != k2.shape[0]:
        fail(RuntimeError, op, "v", "shape", f"{k2.shape[0]} tokens (the rows of k)", f"{v2.shape[0]}")
    if indices.shape[0] > k2.shape[0]:
        fail(RuntimeError, op, "indices", "shape", f"at most {k2.shape[0]} entries (the rows of k)", indices.shape[0])
    if v_cache2.shape[0] != k_cache2.shape[0]:
        fail(
            RuntimeError,
            op,
            "v_cache",
            "shape",
            f"{k_cache2.shape[0]} slots (the slots of k_cache)",
            f"{v_cache2.shape[0]}",
        )
    return k2, v2, k_cache2, v_cache2


def _check_disjoint(op: str, cache_args: dict[str, torch.Tensor], source_args: dict[str, torch.Tensor]) -> None:
    if tracing():  # fake tensors have no data pointer; the launcher checks it
        return
    caches = list(cache_args.items())
    # dense_only: interleaved views of one buffer (k and v halves of each slot of a fused kv cache)
    # share no element; the launcher's element test decides those, as on the fast path.
    for i, (cache_arg, cache) in enumerate(caches):
        check_no_self_overlap(op, cache_arg, cache)  # slot rows of their own
        for other_arg, other in caches[:i]:  # and caches that share no memory
            check_no_partial_overlap(op, cache_arg, cache, other, other_arg, allow_same=False, dense_only=True)
        for source_arg, source in source_args.items():
            check_no_partial_overlap(op, cache_arg, cache, source, source_arg, allow_same=False, dense_only=True)


# ---------------------------------------------------------------------------------------------
# store_cache
# ---------------------------------------------------------------------------------------------
def _run_store_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    num_split: int,
) -> None:
    """The checked call on 2-D views: the optional host index check, then the wide launcher, and the
    narrow one for rows the wide one declines."""
    check_indices("store_cache", "indices", indices, k_cache.shape[0], dim_name="num_slots")
    with launcher_errors("store_cache"):  # the launcher's exact overlap checks, named for the op
        if not _load("store_cache", indices.dtype, "wide")(k, v, k_cache, v_cache, indices, 0, num_split):
            _load("store_cache", indices.dtype, "narrow")(k, v, k_cache, v_cache, indices, 0, num_split)


@torch.library.custom_op("sglang_jit_kernel::store_cache", mutates_args=("k_cache", "v_cache"), device_types="cuda")
def _store_cache_op(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    num_split: int,
) -> None:
    op = "store_cache"
    _run_store_cache(
        _rows(op, "k", k, "num_tokens"),
        _rows(op, "v", v, "num_tokens"),
        _rows(op, "k_cache", k_cache, "num_slots"),
        _rows(op, "v_cache", v_cache, "num_slots"),
        indices,
        num_split,
    )


@_store_cache_op.register_fake
def _(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    num_split: int,
) -> None:
    return None


def store_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    row_bytes: int = 0,
    num_split: int = 0,
) -> None:
    """Write k and v rows into their caches by slot: ``k_cache[indices[i]] = k[i]``,
    ``v_cache[indices[i]] = v[i]`` for ``i < num_indices``.

    Bit copies (no rounding; any dtype, including fp8 and integer caches). An index outside
    ``[0, num_slots)`` copies nothing for its row: ``-1`` marks a padding row of a CUDA-graph batch,
    and any other stray value is skipped the same way (never a write out of bounds or into another
    slot); with ``SGLANG_JIT_CHECK_INDICES=1`` such a value other than ``-1`` raises instead.

    Parameters
    ----------
    k : torch.Tensor
        ``[num_tokens, k_row]`` (or ``[num_tokens, ...]`` whose trailing dims form one contiguous
        row, e.g. ``[num_tokens, num_kv_heads, head_dim]``), any dtype, on a CUDA device; the token
        stride is free. Not modified.
    v : torch.Tensor
        ``[num_tokens, v_row]`` the same way; its dtype and row width may differ from ``k``'s
        (``v_head_dim != head_dim``). Not modified.
    k_cache : torch.Tensor
        ``[num_slots, k_row]`` (or ``[num_slots, ...]``), the dtype and row bytes of ``k``; the slot
        stride is free. Written in the addressed slots only.
    v_cache : torch.Tensor
        ``[num_slots, v_row]``, the dtype and row bytes of ``v``, as many slots as ``k_cache``.
    indices : torch.Tensor
        ``[num_indices]`` int32 or int64, any stride, ``num_indices <= num_tokens``: rows of ``k`` and
        ``v`` after ``num_indices`` are not read (a slot map shorter than a padded batch).
    row_bytes : int, optional
        ``k``'s row size in bytes; 0 (default) infers it. When given it must equal
        ``k_row * k.element_size()``.
    num_split : int, optional
        Tuning knob: warps per row part (each copies a ``1/num_split`` chunk of a row); 0 (default)
        chooses from the sizes. Values above the vectors per row act as that many.

    Returns
    -------
    None
        ``k_cache`` and ``v_cache`` are written in place; with 0 indices nothing is launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor; ``row_bytes`` or ``num_split`` not an int.
    ValueError
        ``row_bytes`` or ``num_split`` negative or past int64, or ``row_bytes`` not the row of ``k``.
    RuntimeError
        A tensor not on ``k``'s CUDA device; a cache of another dtype or row size than its source;
        ``indices`` not int32/int64 or not 1-D, or longer than ``k``; ``k`` and ``v`` with different
        token counts, or the caches with different slot counts; a tensor of fewer than 2 dims; rows
        that are not contiguous; a cache sharing memory with ``k``, ``v``, ``indices`` or the other
        cache; a cache whose slot rows overlap (an expanded or row-stride-0 cache). Raised before any launch, as
        ``store_cache: <arg> <what>: expected X, got Y``.
    IndexError
        With ``SGLANG_JIT_CHECK_INDICES=1``: an index outside ``[0, num_slots)`` other than ``-1``.
    """
    if not tracing():
        fn = _fast_fn("store_cache", getattr(indices, "dtype", None), "wide")
        # exact ints only: the FFI would pass a bool as 0 / 1 (the checked path raises TypeError)
        if fn is not None and type(row_bytes) is int and type(num_split) is int:
            try:
                # the launcher checks everything; False: rows for the narrow module (the checked path)
                if fn(k, v, k_cache, v_cache, indices, row_bytes, num_split):
                    return
            except FAST_PATH_REFUSALS:  # raised before any launch: the checked path explains
                pass
    op = "store_cache"
    check_tensor(op, "k", k)
    check_tensor(op, "v", v, device_as=(k, "k"))
    check_tensor(op, "k_cache", k_cache, dtype_as=(k, "k"))
    check_tensor(op, "v_cache", v_cache, dtype_as=(v, "v"), device_as=(k, "k"))
    check_tensor(op, "indices", indices, dtypes=INDEX_DTYPES, device_as=(k, "k"), dims=[("num_indices", None)])
    check_scalar(op, "row_bytes", row_bytes, int, minimum=0, maximum=INT64_MAX)
    check_scalar(op, "num_split", num_split, int, minimum=0, maximum=INT64_MAX)
    k2, v2, k_cache2, v_cache2 = _kv_rows(op, k, v, k_cache, v_cache, indices)
    _check_row(op, "k_cache", k_cache2, k2, "k")
    _check_row(op, "v_cache", v_cache2, v2, "v")
    if row_bytes not in (0, _row_bytes(k2)):
        fail(ValueError, op, "row_bytes", "value", f"0 or {_row_bytes(k2)} (the row of k in bytes)", row_bytes)
    _check_disjoint(op, {"k_cache": k_cache, "v_cache": v_cache}, {"k": k, "v": v, "indices": indices})
    if indices.shape[0] == 0:
        return
    if tracing():
        torch.ops.sglang_jit_kernel.store_cache(k, v, k_cache, v_cache, indices, num_split)
    else:
        _run_store_cache(k2, v2, k_cache2, v_cache2, indices, num_split)


def can_use_store_cache(size: int) -> bool:
    """Whether :func:`store_cache` takes rows of ``size`` bytes: True for every ``size >= 1`` (any row
    size, not only multiples of 4 bytes; unaligned sizes use narrower vectors), False otherwise.
    For a True answer it compiles (first use) or loads the module, so the kernel is then ready.

    Parameters
    ----------
    size : int
        Row size in bytes (``k_row * k.element_size()``).

    Returns
    -------
    bool
        ``size >= 1``.

    Raises
    ------
    TypeError
        ``size`` is not an int.
    """
    check_scalar("can_use_store_cache", "size", size, int)
    if size < 1:
        return False
    _load("store_cache", torch.int64, "wide")
    return True


# ---------------------------------------------------------------------------------------------
# store_cache_quant
# ---------------------------------------------------------------------------------------------
def _launch_store_cache_quant(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    k_inv_scale: float,
    v_inv_scale: float,
    size_limit: int,
) -> None:
    """The checked call (and the torch.library op's body): 2-D views and ``[1]`` scales, the optional
    host index check, then the launcher."""
    op = "store_cache_quant"
    k_cache2 = _rows(op, "k_cache", k_cache, "num_slots")
    check_indices(op, "indices", indices, k_cache2.shape[0], dim_name="num_slots")
    scales = [None if s is None else s.reshape(1) for s in (k_scale, v_scale)]
    rows = (_rows(op, "k", k, "num_tokens"), _rows(op, "v", v, "num_tokens"), k_cache2)
    with launcher_errors(op):  # the launcher's exact overlap checks, named for the op
        _load(op, k.dtype)(
            *rows,
            _rows(op, "v_cache", v_cache, "num_slots"),
            indices,
            *scales,
            float(k_inv_scale),
            float(v_inv_scale),
            size_limit,
        )


# The op that torch.compile traces (the mutations declared); its fake does nothing (no outputs).
_store_cache_quant_op = torch.library.custom_op(
    "sglang_jit_kernel::store_cache_quant", mutates_args=("k_cache", "v_cache"), device_types="cuda"
)(_launch_store_cache_quant)


@_store_cache_quant_op.register_fake
def _(*args: object) -> None:
    return None


def store_cache_quant(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    k_inv_scale: float = 1.0,
    v_inv_scale: float = 1.0,
    size_limit: int = 0,
) -> None:
    """Quantize k and v rows to fp8 e4m3 and write them into their caches by slot:
    ``k_cache[indices[i]] = e4m3(clamp(k[i] * k_inv, -448, 448))``, the same for ``v`` with
    ``v_inv``, for ``i < num_indices``.

    ``k_inv`` is ``1 / k_scale[0]`` when ``k_scale`` is given (read on the device by the kernel, so a
    captured CUDA graph uses the scale's value at each replay), and ``k_inv_scale`` otherwise; the
    same for v. ``k_scale`` is the dequantisation scale: ``k ~= k_cache.float() * k_scale``.

    Rounding, in this order: each element is widened to fp32 (exact); ``k_inv`` is the correctly
    rounded fp32 reciprocal of the scale (or ``k_inv_scale`` rounded to fp32); the product is rounded
    once to fp32, clamped to ``[-448, 448]`` and rounded once to e4m3, to nearest with ties to even.
    The bytes equal ``(k.float() * k_inv).clamp(-448, 448).to(torch.float8_e4m3fn)`` with ``k_inv =
    1.0 / k_scale`` (fp32 tensors) or ``torch.tensor(k_inv_scale, dtype=torch.float32)``, except
    that NaN always gives the byte ``0x7F`` (torch keeps a NaN's sign bit). ``+-inf`` gives
    ``+-448``; a scale of 0 (``k_inv = inf``) gives ``+-448`` for nonzero elements and NaN for zeros.

    Slots: an index outside ``[0, num_slots)`` writes nothing for its row (``-1``: a padding row of a
    CUDA-graph batch), as in :func:`store_cache`. ``size_limit > 0`` narrows the valid slots to
    ``[0, min(num_slots, size_limit))``: rows whose index is ``>= size_limit`` are skipped the same
    way (slots from ``size_limit`` on are never written). With ``SGLANG_JIT_CHECK_INDICES=1`` an
    index outside the cache other than ``-1`` raises instead; one in ``[size_limit, num_slots)`` is
    skipped without an error.

    Parameters
    ----------
    k : torch.Tensor
        ``[num_tokens, k_row]`` (or ``[num_tokens, ...]`` whose trailing dims form one contiguous row,
        e.g. ``[num_tokens, num_kv_heads, head_dim]``), float16, bfloat16 or float32, on a CUDA
        device; the token stride is free. Not modified.
    v : torch.Tensor
        ``[num_tokens, v_row]`` the same way, the dtype of ``k``; its row may differ in width
        (``v_head_dim != head_dim``). Not modified.
    k_cache : torch.Tensor
        ``[num_slots, k_row]`` (or ``[num_slots, ...]``) float8_e4m3fn, as many elements per row as
        ``k``; the slot stride is free. Written in the addressed slots only.
    v_cache : torch.Tensor
        ``[num_slots, v_row]`` float8_e4m3fn, as many elements per row as ``v``, as many slots as
        ``k_cache``.
    indices : torch.Tensor
        ``[num_indices]`` int32 or int64, any stride, ``num_indices <= num_tokens``: rows of ``k``
        and ``v`` after ``num_indices`` are not read.
    k_scale, v_scale : torch.Tensor, optional
        ``[1]`` (or 0-d) float32 on the device of ``k``, any stride: the dequantisation scales. Not
        modified. When given, the matching ``*_inv_scale`` must stay 1.0.
    k_inv_scale, v_inv_scale : float, optional
        The multipliers (``1 / scale``) used when the scale tensor is not given; rounded to fp32.
        Default 1.0.
    size_limit : int, optional
        0 (default): every slot of the caches is valid; ``> 0``: only slots below ``size_limit``.

    Returns
    -------
    None
        ``k_cache`` and ``v_cache`` are written in place; with 0 indices nothing is launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor; a scale that is neither a tensor nor None;
        ``k_inv_scale`` / ``v_inv_scale`` not a real number; ``size_limit`` not an int.
    ValueError
        ``size_limit`` negative or past int64; ``k_inv_scale`` (``v_inv_scale``) other than 1.0 with ``k_scale``
        (``v_scale``) given, or an int outside the float range.
    RuntimeError
        A tensor not on ``k``'s CUDA device; ``k`` not float16/bfloat16/float32 or ``v`` of another
        dtype; a cache not float8_e4m3fn, or with another row size (in elements) than its source;
        a scale not float32 or not one element; ``indices`` not int32/int64 or not 1-D, or longer
        than ``k``; ``k`` and ``v`` with different token counts, or the caches with different slot
        counts; a tensor of fewer than 2 dims; rows that are not contiguous; a cache sharing memory
        with an input or the other cache; a cache whose slot rows overlap. Raised before any launch, as
        ``store_cache_quant: <arg> <what>: expected X, got Y``.
    IndexError
        With ``SGLANG_JIT_CHECK_INDICES=1``: an index outside ``[0, num_slots)`` other than ``-1``.
    """
    if not tracing():
        fn = _fast_fn("store_cache_quant", getattr(k, "dtype", None))
        # exact types only: the FFI would pass a bool as a number (the checked path raises TypeError)
        if fn is not None and type(k_inv_scale) is float and type(v_inv_scale) is float and type(size_limit) is int:
            try:
                # the launcher checks everything
                fn(k, v, k_cache, v_cache, indices, k_scale, v_scale, k_inv_scale, v_inv_scale, size_limit)
                return
            except FAST_PATH_REFUSALS:  # raised before any launch: the checked path explains
                pass
    op = "store_cache_quant"
    check_scalar(op, "size_limit", size_limit, int, minimum=0, maximum=INT64_MAX)  # before the devices
    check_tensor(op, "k", k, dtypes=QUANT_SOURCE_DTYPES)
    check_tensor(op, "v", v, dtype_as=(k, "k"))
    check_tensor(op, "k_cache", k_cache, dtypes=(torch.float8_e4m3fn,), device_as=(k, "k"))
    check_tensor(op, "v_cache", v_cache, dtypes=(torch.float8_e4m3fn,), device_as=(k, "k"))
    check_tensor(op, "indices", indices, dtypes=INDEX_DTYPES, device_as=(k, "k"), dims=[("num_indices", None)])
    check_static_scale(op, "k_scale", k_scale, "k_inv_scale", k_inv_scale, (k, "k"))
    check_static_scale(op, "v_scale", v_scale, "v_inv_scale", v_inv_scale, (k, "k"))
    k2, v2, k_cache2, v_cache2 = _kv_rows(op, k, v, k_cache, v_cache, indices)
    _check_row(op, "k_cache", k_cache2, k2, "k", elements=True)
    _check_row(op, "v_cache", v_cache2, v2, "v", elements=True)
    sources = {"k": k, "v": v, "indices": indices}
    sources.update({arg: s for arg, s in (("k_scale", k_scale), ("v_scale", v_scale)) if s is not None})
    _check_disjoint(op, {"k_cache": k_cache, "v_cache": v_cache}, sources)
    if indices.shape[0] == 0:
        return
    args = (k, v, k_cache, v_cache, indices, k_scale, v_scale, float(k_inv_scale), float(v_inv_scale), size_limit)
    if tracing():
        torch.ops.sglang_jit_kernel.store_cache_quant(*args)
    else:
        _launch_store_cache_quant(*args)


def reference_store_cache_quant(x: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """The documented formula in torch, as e4m3 bytes (uint8): ``e4m3(clamp(x.float() * inv, -448,
    448))`` with ``inv`` an fp32 tensor (``1.0 / scale`` or the inverse scale); NaN -> 0x7F."""
    y = (x.float() * inv.float().reshape(())).clamp(-FP8_MAX, FP8_MAX)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(y), torch.full_like(q, 0x7F), q)


# ---------------------------------------------------------------------------------------------
# set_mla_kv_buffer
# ---------------------------------------------------------------------------------------------
def _head_rows(op: str, arg: str, tensor: torch.Tensor, dim_name: str, row_name: str) -> torch.Tensor:
    """``[n, row]`` or ``[n, 1, row]`` -> the 2-D view ``[n, row]``."""
    if tensor.dim() == 3 and tensor.shape[1] == 1:
        tensor = tensor.select(1, 0)
    if tensor.dim() != 2:
        fail(
            RuntimeError,
            op,
            arg,
            "shape",
            f"[{dim_name}, {row_name}] or [{dim_name}, 1, {row_name}]",
            tuple(tensor.shape),
        )
    return _rows(op, arg, tensor, dim_name)


def _run_set_mla_kv_buffer(kv: torch.Tensor, loc: torch.Tensor, nope: torch.Tensor, rope: torch.Tensor) -> None:
    check_indices("set_mla_kv_buffer", "loc", loc, kv.shape[0], dim_name="num_slots")
    with launcher_errors("set_mla_kv_buffer"):  # the launcher's exact overlap checks, named for the op
        _load("set_mla_kv_buffer")(kv, loc, nope, rope)


def _mla_views(
    kv_buffer: torch.Tensor, cache_k_nope: torch.Tensor, cache_k_rope: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "set_mla_kv_buffer"
    return (
        _head_rows(op, "kv_buffer", kv_buffer, "num_slots", "nope + rope"),
        _head_rows(op, "cache_k_nope", cache_k_nope, "num_tokens", "nope"),
        _head_rows(op, "cache_k_rope", cache_k_rope, "num_tokens", "rope"),
    )


@torch.library.custom_op("sglang_jit_kernel::set_mla_kv_buffer", mutates_args=("kv_buffer",), device_types="cuda")
def _set_mla_kv_buffer_op(
    kv_buffer: torch.Tensor, loc: torch.Tensor, cache_k_nope: torch.Tensor, cache_k_rope: torch.Tensor
) -> None:
    kv, nope, rope = _mla_views(kv_buffer, cache_k_nope, cache_k_rope)
    _run_set_mla_kv_buffer(kv, loc, nope, rope)


@_set_mla_kv_buffer_op.register_fake
def _(kv_buffer: torch.Tensor, loc: torch.Tensor, cache_k_nope: torch.Tensor, cache_k_rope: torch.Tensor) -> None:
    return None


def set_mla_kv_buffer(
    kv_buffer: torch.Tensor, loc: torch.Tensor, cache_k_nope: torch.Tensor, cache_k_rope: torch.Tensor
) -> None:
    """Write MLA keys into the cache: ``kv_buffer[loc[i]] = cat(cache_k_nope[i], cache_k_rope[i])``.

    Bit copies (no rounding, any dtype). A ``loc`` outside ``[0, num_slots)`` copies nothing for its
    row (``-1``: a CUDA-graph padding row), as in :func:`store_cache`.

    Parameters
    ----------
    kv_buffer : torch.Tensor
        ``[num_slots, nope + rope]`` or ``[num_slots, 1, nope + rope]`` on a CUDA device, rows
        contiguous, slot stride free (DeepSeek: nope 512, rope 64). Written in the addressed slots.
    loc : torch.Tensor
        ``[num_tokens]`` int64 or int32, any stride.
    cache_k_nope : torch.Tensor
        ``[num_tokens, nope]`` or ``[num_tokens, 1, nope]``, the dtype of ``kv_buffer``, rows
        contiguous, token stride free. Not modified.
    cache_k_rope : torch.Tensor
        ``[num_tokens, rope]`` or ``[num_tokens, 1, rope]``, likewise. Not modified.

    Returns
    -------
    None
        ``kv_buffer`` is written in place; with 0 tokens nothing is launched.

    Raises
    ------
    TypeError
        An argument that is not a tensor.
    RuntimeError
        A tensor not on ``kv_buffer``'s CUDA device or of another dtype; ``loc`` not int32/int64, not
        1-D or not one entry per token; shapes other than the above, ``nope + rope`` not the row of
        ``kv_buffer``; rows that are not contiguous; ``kv_buffer`` with overlapping slot rows (expanded), or sharing memory with a source or
        ``loc``. Raised before any launch, as ``set_mla_kv_buffer: <arg> <what>: expected X, got Y``.
    IndexError
        With ``SGLANG_JIT_CHECK_INDICES=1``: a ``loc`` outside ``[0, num_slots)`` other than ``-1``.
    """
    if not tracing():
        fn = _fast_fn("set_mla_kv_buffer")
        if fn is not None:
            try:
                fn(kv_buffer, loc, cache_k_nope, cache_k_rope)  # the launcher checks everything
                return
            except FAST_PATH_REFUSALS:  # raised before any launch: the checked path explains
                pass
    op = "set_mla_kv_buffer"
    check_tensor(op, "kv_buffer", kv_buffer)
    check_tensor(op, "loc", loc, dtypes=INDEX_DTYPES, device_as=(kv_buffer, "kv_buffer"), dims=[("num_tokens", None)])
    check_tensor(op, "cache_k_nope", cache_k_nope, dtype_as=(kv_buffer, "kv_buffer"))
    check_tensor(op, "cache_k_rope", cache_k_rope, dtype_as=(kv_buffer, "kv_buffer"))
    kv, nope, rope = _mla_views(kv_buffer, cache_k_nope, cache_k_rope)
    for arg, t in (("cache_k_nope", nope), ("cache_k_rope", rope)):
        if t.shape[0] != loc.shape[0]:
            fail(RuntimeError, op, arg, "shape", f"{loc.shape[0]} tokens (the entries of loc)", f"{t.shape[0]}")
    if nope.shape[1] + rope.shape[1] != kv.shape[1]:
        fail(
            RuntimeError,
            op,
            "kv_buffer",
            "row size",
            f"nope + rope = {nope.shape[1]} + {rope.shape[1]} = {nope.shape[1] + rope.shape[1]} elements",
            f"{kv.shape[1]}",
        )
    _check_disjoint(
        op, {"kv_buffer": kv_buffer}, {"cache_k_nope": cache_k_nope, "cache_k_rope": cache_k_rope, "loc": loc}
    )
    if loc.shape[0] == 0:
        return
    if tracing():
        torch.ops.sglang_jit_kernel.set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope)
    else:
        _run_set_mla_kv_buffer(kv, loc, nope, rope)


def can_use_set_mla_kv_buffer(nope_bytes: int, rope_bytes: int) -> bool:
    """Whether :func:`set_mla_kv_buffer` takes rows of ``cache_k_nope`` of ``nope_bytes`` bytes and of
    ``cache_k_rope`` of ``rope_bytes`` bytes: True when both are ``>= 1``, of any size (not only
    multiples of 16 or 4 bytes: each launch copies with the widest vector, 16 bytes down to 1, that
    the sizes, addresses and strides allow), False otherwise. A part of 0 bytes is answered False:
    the op's checks let one through (that part copies nothing), but no MLA layout has one and no
    test covers it. Pure arithmetic: it loads nothing (the module compiles on the op's first call).

    Parameters
    ----------
    nope_bytes : int
        Bytes of a ``cache_k_nope`` row (``nope * element_size``; DeepSeek bfloat16: 1024).
    rope_bytes : int
        Bytes of a ``cache_k_rope`` row (``rope * element_size``; DeepSeek bfloat16: 128).

    Returns
    -------
    bool
        ``nope_bytes >= 1 and rope_bytes >= 1``.

    Raises
    ------
    TypeError
        An argument that is not an int (bools included).
    """
    op = "can_use_set_mla_kv_buffer"
    check_scalar(op, "nope_bytes", nope_bytes, int)
    check_scalar(op, "rope_bytes", rope_bytes, int)
    return nope_bytes >= 1 and rope_bytes >= 1


# ---------------------------------------------------------------------------------------------
# Registration of store_cache and store_cache_quant (set_mla_kv_buffer registers in its own module)
# ---------------------------------------------------------------------------------------------
def _store_cache_cases() -> list[CheckCase]:
    """``check``: k, v ``[16384, 8 x 128]`` bf16 into caches of ``4 * 16384 + 1`` slots, random
    distinct slots; both caches are views of one buffer so that one tensor shows both writes."""
    t, row, slots = 16384, 1024, 4 * 16384 + 1

    def make() -> tuple:
        k = torch.randn(t, row, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(t, row, dtype=torch.bfloat16, device="cuda")
        caches = torch.zeros(2, slots, row, dtype=torch.bfloat16, device="cuda")
        indices = torch.randperm(slots, device="cuda")[:t]
        return k, v, caches, indices

    def call(k: torch.Tensor, v: torch.Tensor, caches: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        store_cache(k, v, caches[0], caches[1], indices)
        return caches

    def reference(k: torch.Tensor, v: torch.Tensor, caches: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        expected = caches.clone()
        expected[0, indices] = k
        expected[1, indices] = v
        return expected

    return [
        CheckCase(
            f"[{t}, {row}] bf16 -> [{slots}, {row}]",
            make,
            call,
            reference,
            bytes_moved=2 * 2 * t * row * 2 + t * 8,
            dtype=torch.bfloat16,
        )
    ]


def _set_mla_kv_buffer_cases() -> list[CheckCase]:
    """``check``: DeepSeek rows (nope 512, rope 64) bf16, 16384 tokens into 4 * 16384 + 1 slots."""
    t, nope, rope, slots = 16384, 512, 64, 4 * 16384 + 1

    def make() -> tuple:
        kv = torch.zeros(slots, 1, nope + rope, dtype=torch.bfloat16, device="cuda")
        loc = torch.randperm(slots, device="cuda")[:t]
        k_nope = torch.randn(t, 1, nope, dtype=torch.bfloat16, device="cuda")
        k_rope = torch.randn(t, 1, rope, dtype=torch.bfloat16, device="cuda")
        return kv, loc, k_nope, k_rope

    def call(kv: torch.Tensor, loc: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
        set_mla_kv_buffer(kv, loc, k_nope, k_rope)
        return kv

    def reference(kv: torch.Tensor, loc: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
        expected = kv.clone()
        expected[loc] = torch.cat([k_nope, k_rope], dim=-1)
        return expected

    return [
        CheckCase(
            f"[{t}, {nope}+{rope}] bf16 -> [{slots}, {nope + rope}]",
            make,
            call,
            reference,
            bytes_moved=2 * t * (nope + rope) * 2 + t * 8,
            dtype=torch.bfloat16,
        )
    ]


register_op(
    "store_cache",
    build=_jit_store_cache_module,
    variants=[(i, w) for i in INDEX_DTYPES for w in STORE_CACHE_WIDTHS],
    check_cases=_store_cache_cases,
)
# set_mla_kv_buffer registers in its own module, sglang.jit_kernel.set_mla_kv_buffer (the original
# package's path for it), which re-exports it from here.


def _store_cache_quant_cases() -> list[CheckCase]:
    """``check``: k, v ``[16384, 8 x 128]`` bf16 into fp8 caches of ``4 * 16384 + 1`` slots at random
    distinct slots, k with a device scale, v with an inverse scale; both caches are views of one
    buffer so that one tensor shows both writes."""
    t, row, slots = 16384, 1024, 4 * 16384 + 1
    v_inv = 1 / 1.7

    def make() -> tuple:
        k = torch.randn(t, row, device="cuda").mul_(40).to(torch.bfloat16)
        v = torch.randn(t, row, device="cuda").mul_(40).to(torch.bfloat16)
        caches = torch.zeros(2, slots, row, dtype=torch.float8_e4m3fn, device="cuda")
        k_scale = torch.tensor([0.37], device="cuda")
        return k, v, caches, k_scale, torch.randperm(slots, device="cuda")[:t]

    def call(
        k: torch.Tensor, v: torch.Tensor, caches: torch.Tensor, k_scale: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        store_cache_quant(k, v, caches[0], caches[1], indices, k_scale, v_inv_scale=v_inv)
        return caches.view(torch.uint8)

    def reference(
        k: torch.Tensor, v: torch.Tensor, caches: torch.Tensor, k_scale: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        expected = caches.view(torch.uint8).clone()
        expected[0, indices] = reference_store_cache_quant(k, 1.0 / k_scale)
        expected[1, indices] = reference_store_cache_quant(v, torch.tensor(v_inv, device="cuda"))
        return expected

    return [
        CheckCase(
            f"[{t}, {row}] bf16 -> [{slots}, {row}] e4m3",
            make,
            call,
            reference,
            bytes_moved=2 * t * row * (2 + 1) + t * 8,
            dtype=torch.uint8,
        )
    ]


register_op(
    "store_cache_quant",
    build=_jit_store_cache_quant_module,
    variants=[(d,) for d in QUANT_SOURCE_DTYPES],
    check_cases=_store_cache_quant_cases,
)
