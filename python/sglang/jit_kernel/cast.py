"""cast: ``downcast_fp8``, the fp8 (e4m3) KV-cache write with a per-tensor scale.

Served by ``csrc/kvcache/downcast_fp8.cuh``, one module per source dtype (fp16, bf16; both prebuilt);
the launcher picks its kernel from the shapes and addresses (lean for 16-element vectors, flat for
narrower ones, legacy past 2^31 vectors).

Bytes moved (for bandwidth figures): ``2 * S * H * D * (element_size + 1) + S * index size`` (read k
and v, write one byte per element of each, read loc).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FAST_PATH_REFUSALS,
    INDEX_DTYPES,
    INT64_MAX,
    INT64_MIN,
    check_dtype_as,
    check_indices_enabled,
    check_no_partial_overlap,
    check_no_self_overlap,
    check_scalar,
    check_shape,
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

__all__ = ["downcast_fp8"]

#: Source dtypes of downcast_fp8.
SOURCE_DTYPES = (torch.float16, torch.bfloat16)
#: Destination dtypes: bytes of fp8 e4m3 (the original's uint8), or the fp8 dtype itself.
OUT_DTYPES = (torch.uint8, torch.float8_e4m3fn)
#: The largest finite e4m3 value; quotients are clamped to [-FP8_MAX, FP8_MAX].
FP8_MAX = 448.0


@cache_once
def _jit_downcast_fp8_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the downcast_fp8 module for sources of ``dtype``."""
    args = make_cpp_args(dtype)
    return load_jit(
        "downcast_fp8",
        *args,
        cuda_files=["kvcache/downcast_fp8.cuh"],
        cuda_wrappers=[("downcast_fp8", f"downcast_fp8<{args}>")],
    )


# The exported function by source dtype, filled when its module is loaded: the eager fast path is a
# dict lookup and the FFI call, whose launcher validates everything it needs (falling back to the
# checked path, which explains a refusal).
_FNS: dict[torch.dtype, Callable[..., None]] = {}


def _load(dtype: torch.dtype) -> Callable[..., None]:
    fn = _jit_downcast_fp8_module(dtype).downcast_fp8
    _FNS[dtype] = fn
    return fn


def _loc_range(mult: int, offset: int, num_slots: int) -> tuple[int, int] | None:
    """The ``loc`` values ``[lo, hi]`` whose row ``loc * mult + offset`` lies in ``[0, num_slots)``
    (exact integer arithmetic, as the kernel's 128-bit test), clipped to int64; None if none do."""
    if num_slots == 0:
        return None
    if mult == 0:
        return (INT64_MIN, INT64_MAX) if 0 <= offset < num_slots else None
    a, b = -offset, num_slots - 1 - offset  # mult * loc in [a, b]
    if mult > 0:
        lo, hi = -((-a) // mult), b // mult
    else:
        lo, hi = -((-b) // mult), a // mult
    lo, hi = max(lo, INT64_MIN), min(hi, INT64_MAX)
    return (lo, hi) if lo <= hi else None


def _check_destinations(loc: torch.Tensor, mult: int, offset: int, num_slots: int) -> None:
    """With ``SGLANG_JIT_CHECK_INDICES=1``: IndexError naming the first ``loc`` (other than -1) whose
    row ``loc * mult + offset`` is outside ``[0, num_slots)``. Reads ``loc`` on the host (a stream
    sync); left out while a CUDA graph is being captured."""
    if not check_indices_enabled() or loc.numel() == 0:
        return
    if loc.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    flat = loc.long()
    bounds = _loc_range(mult, offset, num_slots)
    bad = torch.ones_like(flat, dtype=torch.bool) if bounds is None else (flat < bounds[0]) | (flat > bounds[1])
    bad &= flat != -1
    if not bool(bad.any()):
        return
    first = int(bad.nonzero()[0, 0])
    value = int(flat[first])
    fail(
        IndexError,
        "downcast_fp8",
        "loc",
        "value",
        f"entries with loc * mult + offset in [0, {num_slots}) (num_slots; mult={mult}, offset={offset}) "
        "or -1 (skipped)",
        f"{value} (row {value * mult + offset}) at position {first}",
    )


def _run(
    k: torch.Tensor,
    v: torch.Tensor,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    loc: torch.Tensor,
    mult: int,
    offset: int,
) -> None:
    """The checked call: the optional host index check, then the launcher."""
    _check_destinations(loc, mult, offset, k_out.shape[0])
    with launcher_errors("downcast_fp8"):  # the launcher's exact overlap checks, named for the op
        _load(k.dtype)(k, v, k_out, v_out, k_scale, v_scale, loc, mult, offset)


def _check_downcast(
    op: str,
    k: torch.Tensor,
    v: torch.Tensor,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    loc: torch.Tensor,
    mult: int,
    offset: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """downcast_fp8's argument checks (raising as its docstring says, named for ``op``); returns k, v,
    k_out, v_out with a unit last dim's stride normalised."""
    check_tensor(
        op, "k", k, dtypes=SOURCE_DTYPES, dims=[("num_tokens", None), ("num_kv_heads", None), ("head_dim", None)]
    )
    check_tensor(op, "v", v, dtype_as=(k, "k"), shape_as=(k, "k"))
    for arg, out in (("k_out", k_out), ("v_out", v_out)):
        check_tensor(op, arg, out, dtypes=OUT_DTYPES, device_as=(k, "k"))
        check_shape(op, arg, out, [("num_slots", None), ("num_kv_heads", k.shape[1]), ("head_dim", k.shape[2])])
    if v_out.shape != k_out.shape:
        fail(RuntimeError, op, "v_out", "shape", f"{tuple(k_out.shape)} (the shape of k_out)", tuple(v_out.shape))
    check_dtype_as(op, "v_out", v_out, k_out, "k_out")  # one dtype for both (the launcher's)
    for arg, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        check_tensor(op, arg, scale, dtypes=(torch.float32,), device_as=(k, "k"))
        if scale.numel() != 1 or scale.dim() > 1:
            fail(RuntimeError, op, arg, "shape", "[1] (one float32 on the device)", tuple(scale.shape))
    check_tensor(op, "loc", loc, dtypes=INDEX_DTYPES, device_as=(k, "k"), dims=[("num_tokens", k.shape[0])])
    for arg, value in (("mult", mult), ("offset", offset)):
        check_scalar(op, arg, value, int, minimum=INT64_MIN, maximum=INT64_MAX)
    k, v, k_out, v_out = (unit_last_stride(t) for t in (k, v, k_out, v_out))
    for arg, t in (("k", k), ("v", v), ("k_out", k_out), ("v_out", v_out)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            fail(
                RuntimeError,
                op,
                arg,
                "last-dim stride",
                "1 (a contiguous head_dim)",
                f"{t.stride(-1)} (shape {tuple(t.shape)} with strides {t.stride()})",
            )
    for out_arg, out in (("k_out", k_out), ("v_out", v_out)):
        check_no_self_overlap(op, out_arg, out)  # slot rows of their own
        for arg, t in (("k", k), ("v", v), ("loc", loc), ("k_scale", k_scale), ("v_scale", v_scale)):
            check_no_partial_overlap(op, out_arg, out, t, arg, allow_same=False, dense_only=True)
    check_no_partial_overlap(op, "v_out", v_out, k_out, "k_out", allow_same=False, dense_only=True)
    return k, v, k_out, v_out


@torch.library.custom_op("sglang_jit_kernel::downcast_fp8", mutates_args=("k_out", "v_out"), device_types="cuda")
def _downcast_fp8_op(
    k: torch.Tensor,
    v: torch.Tensor,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    loc: torch.Tensor,
    mult: int,
    offset: int,
) -> None:
    _run(
        unit_last_stride(k),
        unit_last_stride(v),
        unit_last_stride(k_out),
        unit_last_stride(v_out),
        k_scale.reshape(1),
        v_scale.reshape(1),
        loc,
        mult,
        offset,
    )


@_downcast_fp8_op.register_fake
def _(
    k: torch.Tensor,
    v: torch.Tensor,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    loc: torch.Tensor,
    mult: int,
    offset: int,
) -> None:
    return None


def downcast_fp8(
    k: torch.Tensor,
    v: torch.Tensor,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    loc: torch.Tensor,
    mult: int = 1,
    offset: int = 0,
) -> None:
    """Write k and v into fp8 caches: ``k_out[loc[i] * mult + offset] = e4m3(clamp(k[i] / k_scale,
    -448, 448))``, and the same for ``v`` with ``v_scale``, for every token ``i``.

    Rounding, in this order: each element is widened to fp32 (exact), divided by the fp32 scale
    (the correctly rounded IEEE quotient: the kernel runs the compiler's own division fast path
    with its reciprocal step done once per thread, where the exponents are ordinary, and the full
    division elsewhere), clamped to ``[-448, 448]`` and rounded once to e4m3 (to nearest, ties to
    even). The result equals, bit for bit,
    ``(k.float() / k_scale).clamp(-448, 448).to(torch.float8_e4m3fn)``, except that NaN always
    gives the byte ``0x7F`` (torch keeps a NaN's sign bit). ``+-inf`` gives ``+-448``; a scale of
    0 gives ``+-448`` for nonzero elements and NaN for zeros; a NaN scale gives NaN everywhere.

    The original package computes ``1 / scale`` and the product in the input dtype (two more
    roundings). The two agree bit for bit when the scale is a power of two (both roundings exact
    then); for other scales they differ by one e4m3 step on the elements whose quotient lies near a
    rounding midpoint: 0.6 % (scale 3) to 4.4 % (scale 1.7) of bf16 sources, about 0.3 % of fp16
    ones (normal inputs of std 100; the original's bf16 inverse is off by up to 2^-9 relative).

    Rows whose destination ``loc[i] * mult + offset`` (exact integer arithmetic) is outside
    ``[0, num_slots)`` are skipped: nothing is written out of bounds and the CUDA context stays
    usable. With ``SGLANG_JIT_CHECK_INDICES=1`` such a ``loc`` other than ``-1`` raises instead.
    Two tokens with the same destination: the row holds pieces (one vector store each, 1 to 16
    bytes) of either token's bytes, in
    no defined mix (as with concurrent plain stores).

    Parameters
    ----------
    k, v : torch.Tensor
        ``[num_tokens, num_kv_heads, head_dim]``, float16 or bfloat16 (one dtype), on a CUDA device;
        token and head strides free, the last stride 1. Not modified.
    k_out, v_out : torch.Tensor
        ``[num_slots, num_kv_heads, head_dim]`` uint8 (the e4m3 bytes) or float8_e4m3fn, one shape
        and one dtype;
        slot and head strides free, the last stride 1. Written in the addressed rows only.
    k_scale, v_scale : torch.Tensor
        ``[1]`` (or 0-d) float32 on the device of ``k``: the dequantisation scales. Not modified.
    loc : torch.Tensor
        ``[num_tokens]`` int64 or int32 on the device of ``k``, any stride. Not modified.
    mult, offset : int, optional
        The destination row of token ``i`` is ``loc[i] * mult + offset`` (defaults 1 and 0); any
        int64 values.

    Returns
    -------
    None
        ``k_out`` and ``v_out`` are written in place (addressed rows only); with 0 tokens nothing is
        launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor; ``mult`` or ``offset`` not an int.
    ValueError
        ``mult`` or ``offset`` outside int64.
    RuntimeError
        A tensor not on ``k``'s CUDA device; ``k`` not float16/bfloat16 or ``v`` of another dtype or
        shape; outputs not uint8/float8_e4m3fn or not ``[num_slots, num_kv_heads, head_dim]``, or of
        two dtypes; a
        scale that is not float32 with one element; ``loc`` not int32/int64 or not one entry per
        token; a last dim that is not contiguous; an output with overlapping slot rows (expanded); an
        output sharing memory with an input or with the other output. Raised before any launch, as ``downcast_fp8: <arg> <what>: expected X, got Y``.
    IndexError
        With ``SGLANG_JIT_CHECK_INDICES=1``: a ``loc`` (other than -1) whose row is outside the cache.
    """
    if not tracing() and not check_indices_enabled():
        fn = _FNS.get(getattr(k, "dtype", None))
        if fn is not None and type(mult) is int and type(offset) is int:  # the FFI would take a bool
            try:
                # the launcher checks everything
                fn(k, v, k_out, v_out, k_scale, v_scale, loc, mult, offset)
                return
            except FAST_PATH_REFUSALS:  # before any launch: explain
                pass
    k, v, k_out, v_out = _check_downcast("downcast_fp8", k, v, k_out, v_out, k_scale, v_scale, loc, mult, offset)
    if k.shape[0] == 0:
        return
    if tracing():
        torch.ops.sglang_jit_kernel.downcast_fp8(k, v, k_out, v_out, k_scale, v_scale, loc, mult, offset)
    else:
        _run(k, v, k_out, v_out, k_scale.reshape(1), v_scale.reshape(1), loc, mult, offset)


# ---------------------------------------------------------------------------------------------
# Registration: one module per source dtype
# ---------------------------------------------------------------------------------------------
def reference_downcast_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The documented formula in torch: ``e4m3(clamp(x.float() / scale, -448, 448))`` as bytes,
    NaN -> 0x7F."""
    y = (x.float() / scale.float().reshape(())).clamp(-FP8_MAX, FP8_MAX)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(y), torch.full_like(q, 0x7F), q)


def _check_cases() -> list[CheckCase]:
    """``check``: k, v ``[16384, 8, 128]`` bf16 into ``[4 * 16384 + 1, 8, 128]`` uint8 caches at random
    distinct rows; both caches are views of one buffer so that one tensor shows both writes."""
    t, h, d, slots = 16384, 8, 128, 4 * 16384 + 1

    def make() -> tuple:
        k = torch.randn(t, h, d, device="cuda").mul_(40).to(torch.bfloat16)
        v = torch.randn(t, h, d, device="cuda").mul_(40).to(torch.bfloat16)
        caches = torch.zeros(2, slots, h, d, dtype=torch.uint8, device="cuda")
        scales = torch.tensor([0.37, 1.7], device="cuda")
        return k, v, caches, scales, torch.randperm(slots, device="cuda")[:t]

    def call(
        k: torch.Tensor, v: torch.Tensor, caches: torch.Tensor, scales: torch.Tensor, loc: torch.Tensor
    ) -> torch.Tensor:
        downcast_fp8(k, v, caches[0], caches[1], scales[0:1], scales[1:2], loc)
        return caches

    def reference(
        k: torch.Tensor, v: torch.Tensor, caches: torch.Tensor, scales: torch.Tensor, loc: torch.Tensor
    ) -> torch.Tensor:
        expected = caches.clone()
        expected[0, loc] = reference_downcast_fp8(k, scales[0])
        expected[1, loc] = reference_downcast_fp8(v, scales[1])
        return expected

    return [
        CheckCase(
            f"[{t}, {h}, {d}] bf16 -> [{slots}, {h}, {d}] e4m3",
            make,
            call,
            reference,
            bytes_moved=2 * t * h * d * (2 + 1) + t * 8,
            dtype=torch.uint8,
        )
    ]


register_op(
    "downcast_fp8", build=_jit_downcast_fp8_module, variants=[(d,) for d in SOURCE_DTYPES], check_cases=_check_cases
)
