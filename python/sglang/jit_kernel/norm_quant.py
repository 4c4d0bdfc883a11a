"""RMSNorm + 8-bit quantization in one launch: ``rmsnorm_quant`` and ``fused_add_rmsnorm_quant``.

The FP8 serving form of a decoder layer's norms: the normalised row is quantized for the next 8-bit
GEMM without being written and read back. Per token group (DeepSeek-style block FP8, DeepGEMM's
scale layouts), per token, or with a static per-tensor scale; fp8 e4m3 or int8.

The result is bit-identical to the unfused composition of this package's ops:
``rmsnorm`` / ``fused_add_rmsnorm``, then ``per_token_group_quant_8bit`` (group), ``per_token_quant_fp8``
(token) or ``per_tensor_quant_fp8(..., is_static=True)`` (static). Kernel: ``csrc/elementwise/norm_quant.cuh``
(the norm part of ``rmsnorm.cuh`` / ``norm_rows.cuh`` with a quant epilogue); one module per op, input dtype and
output dtype. Rows the kernel does not take (not 16-byte aligned, or longer than 16384 elements) run
that composition itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._quant_8bit import as_rows
from sglang.jit_kernel._validate import (
    check_contiguous,
    check_cuda,
    check_dtype,
    check_dtype_as,
    check_no_partial_overlap,
    check_no_self_overlap,
    check_same_device,
    check_scalar,
    check_shape,
    fail,
    launcher_errors,
    share_bytes,
    tracing,
    type_name,
)
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["rmsnorm_quant", "fused_add_rmsnorm_quant"]

#: Input dtypes (the normalised row is rounded to it before quantization) and output dtypes.
IN_DTYPES = (torch.float16, torch.bfloat16)
OUT_DTYPES = (torch.float8_e4m3fn, torch.int8)
#: Group sizes the ops accept (the kernel would take powers of two up to 32 vectors of 16 bytes).
GROUP_SIZES = (16, 32, 64, 128)
#: Clamp bounds of each output dtype (fp8: its largest finite value; int8: the integer range).
Q_BOUNDS = {torch.float8_e4m3fn: (-448.0, 448.0), torch.int8: (-128.0, 127.0)}
#: The longest row (bytes) the kernel holds in registers (2048 vectors of 16 bytes).
MAX_ROW_BYTES = 32768
#: The norm_rows kind each op's module instantiates.
_KINDS = {"rmsnorm_quant": "kRMSNorm", "fused_add_rmsnorm_quant": "kFusedAddRMSNorm"}
#: Quant modes as the launcher takes them.
_GROUP, _TOKEN, _STATIC = 0, 1, 2


def _load(op: str, in_dtype: torch.dtype, out_dtype: torch.dtype) -> Module:
    """Compile (first use) or load ``op``'s module for ``in_dtype`` -> ``out_dtype`` (its kernels only)."""
    args = make_cpp_args(in_dtype, out_dtype)
    return load_jit(
        op,
        *args,
        cuda_files=["elementwise/norm_quant.cuh"],
        cuda_wrappers=[(op, f"norm_quant<{args}, NormKind::{_KINDS[op]}>")],
    )


@cache_once
def _jit_rmsnorm_quant_module(in_dtype: torch.dtype, out_dtype: torch.dtype) -> Module:
    """rmsnorm_quant's module for ``in_dtype`` -> ``out_dtype``."""
    return _load("rmsnorm_quant", in_dtype, out_dtype)


@cache_once
def _jit_fused_add_rmsnorm_quant_module(in_dtype: torch.dtype, out_dtype: torch.dtype) -> Module:
    """fused_add_rmsnorm_quant's module for ``in_dtype`` -> ``out_dtype``."""
    return _load("fused_add_rmsnorm_quant", in_dtype, out_dtype)


def _kernel_takes(rows: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether the fused kernel takes these rows: 16-byte aligned data pointers and row strides
    (the vectors rmsnorm uses for them, so that its reduction order is the same) and at most
    MAX_ROW_BYTES per row. Mirrors the launcher's own refusal."""
    size = rows.element_size()
    values = [rows.data_ptr(), weight.data_ptr(), rows.shape[1] * size]
    if rows.shape[0] > 1:
        values.append(rows.stride(0) * size)
    if residual is not None:
        values.append(residual.data_ptr())
        if rows.shape[0] > 1:
            values.append(residual.stride(0) * size)
    return rows.shape[1] * size <= MAX_ROW_BYTES and all(v % 16 == 0 for v in values)


def _compose(
    rows: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor | None,
    scale: torch.Tensor | None,
    normed: torch.Tensor | None,
    eps: float,
    quant_eps: float,
    group_size: int,
    scale_ue8m0: bool,
) -> None:
    """The unfused composition (the definition of the result) for rows the kernel does not take."""
    from sglang.jit_kernel.norm import fused_add_rmsnorm, rmsnorm  # noqa: PLC0415

    y = normed if normed is not None else torch.empty_like(rows, memory_format=torch.contiguous_format)
    if residual is None:
        rmsnorm(rows, weight, eps, out=y)
    else:
        if y.data_ptr() != rows.data_ptr():
            y.copy_(rows)  # fused_add_rmsnorm normalises in place; input itself stays unchanged
        fused_add_rmsnorm(y, residual, weight, eps)
    if scale is not None:
        from sglang.jit_kernel.per_tensor_quant_fp8 import per_tensor_quant_fp8  # noqa: PLC0415

        per_tensor_quant_fp8(y, output_q, scale.view(1), is_static=True)
    elif group_size > 0:
        from sglang.jit_kernel.per_token_group_quant_8bit import per_token_group_quant_8bit  # noqa: PLC0415

        lo, hi = Q_BOUNDS[output_q.dtype]
        per_token_group_quant_8bit(y, output_q, output_s, group_size, quant_eps, lo, hi, scale_ue8m0)
    else:
        from sglang.jit_kernel.per_token_quant_fp8 import per_token_quant_fp8  # noqa: PLC0415

        per_token_quant_fp8(y, output_q, output_s, eps=quant_eps)


def _launch(
    op: str,
    input: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor | None,
    scale: torch.Tensor | None,
    output_normed: torch.Tensor | None,
    eps: float,
    quant_eps: float,
    group_size: int,
    scale_ue8m0: bool,
    enable_pdl: int,
) -> None:
    """Flatten to rows and run the kernel, or the composition where the kernel does not take the rows."""
    hidden_size = input.shape[-1]
    num_tokens = input.numel() // hidden_size
    rows = as_rows(op, "input", input, num_tokens, copy_ok=residual is None and output_normed is None)
    res = None if residual is None else as_rows(op, "residual", residual, num_tokens, copy_ok=False)
    q = as_rows(op, "output_q", output_q, num_tokens, copy_ok=False)
    y = None if output_normed is None else as_rows(op, "output_normed", output_normed, num_tokens, copy_ok=False)
    if scale is not None:
        s, mode = scale.view(1), _STATIC
    elif group_size > 0:
        s, mode = as_rows(op, "output_s", output_s, num_tokens, copy_ok=False), _GROUP
    else:
        s, mode = _token_scales(op, output_s, num_tokens), _TOKEN
    if not _kernel_takes(rows, weight, res):
        _check_composition_aliasing(op, input, residual, weight, output_q, output_s, output_normed)
        _compose(
            rows, res, weight, q, s if mode != _STATIC else None, scale, y, eps, quant_eps, group_size, scale_ue8m0
        )
        return
    build = _jit_rmsnorm_quant_module if residual is None else _jit_fused_add_rmsnorm_quant_module
    fn = getattr(build(input.dtype, output_q.dtype), op)
    fn(rows, res, weight, q, s, y, eps, quant_eps, mode, group_size, scale_ue8m0, enable_pdl)


def _token_scales(op: str, output_s: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Per-token scales ``[num_tokens]`` or ``[num_tokens, 1]`` (checked) as a ``[num_tokens]`` view."""
    return output_s.select(1, 0) if output_s.dim() == 2 else output_s


# ---------------------------------------------------------------------------------------------
# torch.library ops (torch.compile); eager calls launch directly
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op(
    "sglang_jit_kernel::norm_quant",
    mutates_args=("residual", "output_q", "output_s", "output_normed"),
    device_types="cuda",
)
def _norm_quant_op(
    input: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor | None,
    scale: torch.Tensor | None,
    output_normed: torch.Tensor | None,
    eps: float,
    quant_eps: float,
    group_size: int,
    scale_ue8m0: bool,
    enable_pdl: int,
) -> None:
    """Both ops: fused_add_rmsnorm_quant when ``residual`` is given."""
    op = "rmsnorm_quant" if residual is None else "fused_add_rmsnorm_quant"
    _launch(op, input, residual, weight, output_q, output_s, scale, output_normed, eps, quant_eps, group_size,
            scale_ue8m0, enable_pdl)  # fmt: skip


@_norm_quant_op.register_fake
def _(
    input: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor | None,
    scale: torch.Tensor | None,
    output_normed: torch.Tensor | None,
    eps: float,
    quant_eps: float,
    group_size: int,
    scale_ue8m0: bool,
    enable_pdl: int,
) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# Checks (every one before any launch; shapes, dtypes and layouts first, so that they run on any
# device, then aliasing, then devices)
# ---------------------------------------------------------------------------------------------
def _check_tensor_type(op: str, arg: str, tensor: object) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        fail(TypeError, op, arg, "type", "a torch.Tensor", type_name(tensor))
    return tensor


def _check_rows_layout(op: str, arg: str, tensor: torch.Tensor) -> None:
    if tensor.dim() >= 1 and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        fail(RuntimeError, op, arg, "last-dim stride", "1 (a contiguous last dim)", tensor.stride(-1))
    if any(stride == 0 and size > 1 for size, stride in zip(tensor.shape, tensor.stride())):
        fail(RuntimeError, op, arg, "strides", "no dim of size > 1 with stride 0 (an expanded tensor)", tensor.stride())


def _group_scale_shape(num_tokens: int, cols: int) -> list[tuple[str, int]]:
    return [("num_tokens", num_tokens), ("scale_cols", cols)]


def _check_aliasing(
    op: str,
    input: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    output_q: torch.Tensor | None,
    output_s: torch.Tensor | None,
    scale: torch.Tensor | None,
    output_normed: torch.Tensor | None,
) -> None:
    """RuntimeError naming the pair if ``residual`` overlaps ``input`` or ``weight``, or an output
    overlaps an input or another output (``output_normed`` may be exactly ``input``), where the
    byte-range test is exact (dense views, or the same view: check_no_partial_overlap's
    ``dense_only``); interleaved views are left to the launcher's element test."""
    if residual is not None:
        check_no_partial_overlap(op, "residual", residual, input, "input", allow_same=False, dense_only=True)
        check_no_partial_overlap(op, "residual", residual, weight, "weight", allow_same=False, dense_only=True)
    for arg, t in (("output_q", output_q), ("output_s", output_s)):
        if t is None:
            continue
        for ref_arg, ref in (("input", input), ("weight", weight), ("residual", residual), ("scale", scale)):
            if ref is not None:
                check_no_partial_overlap(op, arg, t, ref, ref_arg, allow_same=False, dense_only=True)
    if output_q is not None and output_s is not None:
        check_no_partial_overlap(op, "output_s", output_s, output_q, "output_q", allow_same=False, dense_only=True)
    if scale is not None:  # one element: the byte test is exact
        for arg, t in (("residual", residual), ("output_normed", output_normed)):
            if t is not None and share_bytes(scale.reshape(1, 1), t):
                fail(RuntimeError, op, "scale", f"overlaps {arg}", "disjoint memory (scale is read after the norm)",
                     "shared bytes")  # fmt: skip
    if output_normed is not None:
        check_no_partial_overlap(op, "output_normed", output_normed, input, "input", dense_only=True)
        for ref_arg, ref in (
            ("weight", weight),
            ("residual", residual),
            ("output_q", output_q),
            ("output_s", output_s),
        ):
            if ref is not None:
                check_no_partial_overlap(
                    op, "output_normed", output_normed, ref, ref_arg, allow_same=False, dense_only=True
                )


def _check_composition_aliasing(
    op: str,
    input: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor | None,
    output_normed: torch.Tensor | None,
) -> None:
    """Every aliasing check of the unfused composition, before its first op writes: its ops run one
    after another (residual and output_normed are written before the quant op's launcher would test
    its outputs), and they see the normalised rows through a fresh intermediate or a torch copy of
    the input. RuntimeError naming the pair if a written tensor has no address of its own per element,
    or shares a byte with another tensor (exact for 2-D row views, by byte spans otherwise);
    output_normed may be exactly input."""
    written = [("output_q", output_q), ("output_s", output_s), ("output_normed", output_normed)]
    if residual is not None:
        written.append(("residual", residual))
    for arg, t in written:
        if t is not None:
            check_no_self_overlap(op, arg, t)

    def view(t: torch.Tensor) -> tuple:
        return t.data_ptr(), t.shape, t.stride()

    in_place = output_normed is not None and view(output_normed) == view(input)
    others = written + [("input", input), ("weight", weight)]
    for i, (arg, t) in enumerate(written):
        for ref_arg, ref in others[i + 1 :]:
            if t is None or ref is None or (in_place and {arg, ref_arg} == {"output_normed", "input"}):
                continue
            if share_bytes(t, ref):
                fail(RuntimeError, op, arg, f"overlaps {ref_arg}", "disjoint memory", "shared bytes")


def _prepare(
    op: str,
    input: object,
    residual: object | None,
    weight: object,
    eps: object,
    group_size: object,
    scale: object | None,
    out_dtype: object | None,
    column_major_scales: object,
    scale_ue8m0: object,
    output_q: object | None,
    output_s: object | None,
    output_normed: object | None,
    return_normed: object,
    quant_eps: object,
    enable_pdl: object,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
    """Every check of both ops (the scalars first, then the tensors in argument order), then the
    allocation of the outputs not given.
    Returns ``(output_q, output_s, output_normed, group_size)``; group_size 0 means not per group."""
    check_scalar(op, "eps", eps, float, minimum=0.0)
    check_scalar(op, "quant_eps", quant_eps, float, minimum=0.0)
    check_scalar(op, "column_major_scales", column_major_scales, bool)
    check_scalar(op, "scale_ue8m0", scale_ue8m0, bool)
    check_scalar(op, "return_normed", return_normed, bool)
    check_scalar(op, "enable_pdl", enable_pdl, bool, optional=True)
    check_scalar(op, "group_size", group_size, int, optional=True)  # its type even where it is ignored
    if scale is not None:
        mode = _STATIC
    elif group_size is None or group_size == -1:
        mode = _TOKEN
    else:
        mode = _GROUP
        if group_size not in GROUP_SIZES:
            fail(ValueError, op, "group_size", "value", f"one of {GROUP_SIZES}, None or -1 (per token)", group_size)
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        fail(TypeError, op, "out_dtype", "type", "a torch.dtype or None", type_name(out_dtype))
    if out_dtype is None and isinstance(output_q, torch.Tensor):
        check_dtype(op, "output_q", output_q, OUT_DTYPES)
        if mode != _GROUP and output_q.dtype == torch.int8:
            fail(RuntimeError, op, "output_q", "dtype", "float8_e4m3fn (per token or with a static scale)", "int8")
        out_dtype = output_q.dtype
    elif out_dtype is None:
        out_dtype = torch.float8_e4m3fn
    if out_dtype not in OUT_DTYPES:
        fail(ValueError, op, "out_dtype", "value", "torch.float8_e4m3fn or torch.int8", out_dtype)
    if mode != _GROUP and (column_major_scales or scale_ue8m0):
        arg = "column_major_scales" if column_major_scales else "scale_ue8m0"
        fail(ValueError, op, arg, "value", "False unless quantizing per group (group_size given)", True)
    if scale_ue8m0 and out_dtype != torch.float8_e4m3fn:
        fail(ValueError, op, "scale_ue8m0", "value", "False with int8 output (ue8m0 scales are for fp8)", True)
    if mode != _GROUP and out_dtype == torch.int8:
        fail(ValueError, op, "out_dtype", "value", "torch.float8_e4m3fn per token or with a static scale", out_dtype)

    input = _check_tensor_type(op, "input", input)
    check_dtype(op, "input", input, IN_DTYPES)
    if input.dim() == 0:
        fail(RuntimeError, op, "input", "dims", "at least 1 ([..., hidden_size])", "a 0-d tensor")
    _check_rows_layout(op, "input", input)
    hidden_size = input.shape[-1]
    num_tokens = math.prod(input.shape[:-1])
    weight = _check_tensor_type(op, "weight", weight)
    check_dtype_as(op, "weight", weight, input, "input")
    check_shape(op, "weight", weight, [("hidden_size", hidden_size)])
    check_contiguous(op, "weight", weight)
    if residual is not None:
        residual = _check_tensor_type(op, "residual", residual)
        check_dtype_as(op, "residual", residual, input, "input")
        if residual.shape != input.shape:
            fail(
                RuntimeError,
                op,
                "residual",
                "shape",
                f"{tuple(input.shape)} (the shape of input)",
                tuple(residual.shape),
            )
        _check_rows_layout(op, "residual", residual)
    if mode == _GROUP and hidden_size % group_size:
        fail(
            RuntimeError,
            op,
            "input",
            "shape",
            f"hidden_size (last dim) a multiple of group_size={group_size}",
            tuple(input.shape),
        )

    if output_q is not None:
        output_q = _check_tensor_type(op, "output_q", output_q)
        check_dtype(op, "output_q", output_q, (out_dtype,))
        if output_q.shape != input.shape:
            fail(
                RuntimeError,
                op,
                "output_q",
                "shape",
                f"{tuple(input.shape)} (the shape of input)",
                tuple(output_q.shape),
            )
        _check_rows_layout(op, "output_q", output_q)
    if mode == _STATIC:
        scale = _check_tensor_type(op, "scale", scale)
        check_dtype(op, "scale", scale, (torch.float32,))
        if scale.numel() != 1 or scale.dim() > 1:
            fail(RuntimeError, op, "scale", "shape", "one element ([1] or [])", tuple(scale.shape))
        if output_s is not None:
            fail(
                ValueError, op, "output_s", "value", "None with a static scale (the scale is read)", type_name(output_s)
            )
    elif output_s is not None:
        output_s = _check_tensor_type(op, "output_s", output_s)
        if mode == _GROUP:
            num_groups = hidden_size // group_size
            cols = (num_groups + 3) // 4 if scale_ue8m0 else num_groups
            check_dtype(op, "output_s", output_s, (torch.int32 if scale_ue8m0 else torch.float32,))
            check_shape(op, "output_s", output_s, _group_scale_shape(num_tokens, cols))
            if column_major_scales and num_tokens > 1 and output_s.stride(0) != 1:
                fail(
                    RuntimeError,
                    op,
                    "output_s",
                    "layout",
                    "column-major (stride 1 along num_tokens, e.g. torch.empty(cols, M_pad).T[:M])",
                    f"strides {output_s.stride()}",
                )
            if not column_major_scales and cols > 1 and output_s.stride(1) != 1:
                fail(
                    RuntimeError,
                    op,
                    "output_s",
                    "layout",
                    "row-major (stride 1 along the groups; pass column_major_scales=True for the transposed layout)",
                    f"strides {output_s.stride()}",
                )
        else:
            check_dtype(op, "output_s", output_s, (torch.float32,))
            if (
                output_s.numel() != num_tokens
                or output_s.dim() not in (1, 2)
                or (output_s.dim() == 2 and output_s.shape[1] != 1)
            ):
                fail(
                    RuntimeError,
                    op,
                    "output_s",
                    "shape",
                    f"[num_tokens={num_tokens}] or [num_tokens={num_tokens}, 1] (one scale per token)",
                    tuple(output_s.shape),
                )
        check_no_self_overlap(op, "output_s", output_s)
    if output_normed is not None:
        output_normed = _check_tensor_type(op, "output_normed", output_normed)
        check_dtype_as(op, "output_normed", output_normed, input, "input")
        if output_normed.shape != input.shape:
            fail(
                RuntimeError,
                op,
                "output_normed",
                "shape",
                f"{tuple(input.shape)} (the shape of input)",
                tuple(output_normed.shape),
            )
        _check_rows_layout(op, "output_normed", output_normed)

    # Aliasing (dense views here; strided ones by the launcher's exact test, or, before the
    # composition, by _check_composition_aliasing). Meta tensors have no storage to alias: they reach
    # the device check below.
    if not tracing() and input.device.type != "meta":
        _check_aliasing(op, input, residual, weight, output_q, output_s, scale, output_normed)

    # Devices
    check_cuda(op, "input", input)
    for arg, t in (
        ("weight", weight),
        ("residual", residual),
        ("output_q", output_q),
        ("output_s", output_s),
        ("scale", scale),
        ("output_normed", output_normed),
    ):
        if t is not None:
            check_cuda(op, arg, t)
            check_same_device(op, arg, t, input, "input")

    # Outputs not given
    device = input.device
    if output_q is None:
        output_q = torch.empty(input.shape, dtype=out_dtype, device=device)
    if mode == _GROUP and output_s is None:
        num_groups = hidden_size // group_size
        cols = (num_groups + 3) // 4 if scale_ue8m0 else num_groups
        dtype = torch.int32 if scale_ue8m0 else torch.float32
        if column_major_scales:
            padded_tokens = (num_tokens + 3) // 4 * 4  # TMA: 16-byte aligned columns
            output_s = torch.empty(cols, padded_tokens, dtype=dtype, device=device).T[:num_tokens]
        else:
            output_s = torch.empty(num_tokens, cols, dtype=dtype, device=device)
    elif mode == _TOKEN and output_s is None:
        output_s = torch.empty(num_tokens, 1, dtype=torch.float32, device=device)
    if output_normed is None and return_normed:
        output_normed = torch.empty(input.shape, dtype=input.dtype, device=device)
    return output_q, output_s, output_normed, group_size if mode == _GROUP else 0


def _run(
    op: str,
    input: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    group_size: int | None,
    scale: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    column_major_scales: bool,
    scale_ue8m0: bool,
    output_q: torch.Tensor | None,
    output_s: torch.Tensor | None,
    output_normed: torch.Tensor | None,
    return_normed: bool,
    quant_eps: float,
    enable_pdl: bool | None,
) -> tuple[torch.Tensor, ...]:
    q, s, y, group = _prepare(
        op, input, residual, weight, eps, group_size, scale, out_dtype, column_major_scales, scale_ue8m0,
        output_q, output_s, output_normed, return_normed, quant_eps, enable_pdl,
    )  # fmt: skip
    result = (q, scale if scale is not None else s) + ((y,) if y is not None else ())
    if input.numel() == 0:
        return result
    pdl = -1 if enable_pdl is None else int(enable_pdl)
    if tracing():
        torch.ops.sglang_jit_kernel.norm_quant(
            input, residual, weight, q, s, scale, y, eps, quant_eps, group, scale_ue8m0, pdl
        )
    else:
        with launcher_errors(op):
            _launch(op, input, residual, weight, q, s, scale, y, eps, quant_eps, group, scale_ue8m0, pdl)
    return result


# The keyword-only parameters, returns and errors both ops share, appended to their docstrings.
_DOC_COMMON = """group_size : int or None
        Values per scale along the row: 16, 32, 64 or 128 (default 128; ``hidden_size`` must be a
        multiple). ``None`` or ``-1``: one scale per token. Ignored when ``scale`` is given (its type
        is still checked).
    scale : torch.Tensor, optional
        A static per-tensor scale, ``float32`` ``[1]`` or 0-d, read (not written): ``q =
        round(clamp(y * (1 / clamp(scale, FLT_MIN, FLT_MAX)), -448, 448))``. fp8 only.
    out_dtype : torch.dtype, optional
        ``torch.float8_e4m3fn`` (default) or ``torch.int8`` (per group only); default ``output_q``'s
        dtype when given.
    column_major_scales : bool
        Per group: allocate ``output_s`` in DeepGEMM's TMA-aligned transposed layout
        (``torch.empty(cols, M_pad).T[:M]``, ``M_pad`` = num_tokens rounded up to 4), and require it
        of a given ``output_s``. Default False (row-major).
    scale_ue8m0 : bool
        Per group, fp8: power-of-two scales stored as exponent bytes, four per ``int32`` word (group
        ``g`` in byte ``g % 4``; bytes past the last group 0). Default False.
    output_q : torch.Tensor, optional
        Written: the shape of ``input``, ``out_dtype``, last dim contiguous, any row stride.
    output_s : torch.Tensor, optional
        Written. Per group: ``float32 [num_tokens, num_groups]`` (ue8m0: ``int32 [num_tokens,
        ceil(num_groups / 4)]``), row-major or column-major as ``column_major_scales`` says, any
        strides otherwise. Per token: ``float32 [num_tokens]`` or ``[num_tokens, 1]``. Must be None
        with ``scale``. Allocated when omitted (per token as ``[num_tokens, 1]``).
    output_normed : torch.Tensor, optional
        Written with ``y`` (the normalised rows in ``input``'s dtype, as rmsnorm writes them): the
        shape and dtype of ``input``, last dim contiguous; may be ``input`` itself.
    return_normed : bool
        Allocate ``output_normed`` when not given and return it. Default False.
    quant_eps : float
        Floor of each block's maximum (>= 0). Default 1e-10.
    enable_pdl : bool, optional
        Programmatic Dependent Launch; None means on for SM90+. Results do not depend on it.

    Returns
    -------
    tuple of torch.Tensor
        ``(output_q, output_s)``, or ``(output_q, output_s, output_normed)`` when ``output_normed`` is
        given or ``return_normed``; the given tensors are returned as the same objects; with
        ``scale`` the second item is ``scale``. With 0 elements nothing is launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, a scalar of the wrong type (``group_size`` not an int
        or None even with ``scale``), an ``out_dtype`` that is not a ``torch.dtype``.
    ValueError
        ``eps`` or ``quant_eps`` negative or NaN, ``group_size`` not one of 16 / 32 / 64 / 128 / None /
        -1, ``out_dtype`` not fp8 e4m3 / int8 (or int8 without groups), ``column_major_scales`` or
        ``scale_ue8m0`` without groups, ``scale_ue8m0`` with int8, ``output_s`` given with ``scale``.
    RuntimeError
        Before any launch, naming the argument (``<op>: <arg> <what>: expected X, got Y``): a dtype
        (``input`` not float16 / bfloat16, ``output_q`` not ``out_dtype`` (not fp8 without groups),
        ``output_s`` not float32 / int32 for ue8m0, ``scale`` not float32, a mismatched weight /
        residual / output_normed), a shape (a 0-d ``input``, ``hidden_size`` not a multiple of
        ``group_size``, a scale buffer of the wrong size), a layout (a strided last dim, a
        non-contiguous ``weight``, a stride 0, ``output_s`` not in the layout ``column_major_scales``
        names, leading dims that do not flatten), a tensor not on CUDA or on another device than ``input``, and aliasing:
        ``residual`` overlapping ``input`` (the same tensor included), an output overlapping an input
        or another output (``output_normed`` may be exactly ``input``). Interleaved strided views of one
        buffer that share no byte are accepted (tested element by element, or, on rows the fused
        kernel does not take, row by row for 2-D views with one row stride and by byte ranges for
        other layouts).
"""


def rmsnorm_quant(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    group_size: int | None = 128,
    scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    output_normed: torch.Tensor | None = None,
    return_normed: bool = False,
    quant_eps: float = 1e-10,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, ...]:
    """RMSNorm of each row, then 8-bit quantization of the normalised row, in one launch.

    Per row ``x`` (fp32 arithmetic, IEEE roundings, in this order)::

        y = round_T(x * (w * rsqrt(sum(x**2) * (1 / hidden_size) + eps)))    # exactly rmsnorm's output
        s = clamp(max(max|y_block|, quant_eps) / q_type_max, FLT_MIN, FLT_MAX)  # block: group or row
        s = 2 ** ceil(log2(s)), at most 2**127                               # scale_ue8m0 only
        q = round(clamp(y * (1 / s), q_min, q_max))                          # to out_dtype

    ``round_T`` rounds to ``input``'s dtype; ``q_type_max`` and the bounds are 448 / [-448, 448] for
    fp8 e4m3 (round-to-nearest-even, saturating) and 127 / [-128, 127] for int8. The result is
    bit-identical to ``rmsnorm(input, weight, eps)`` followed by ``per_token_group_quant_8bit``
    (per group), ``per_token_quant_fp8`` (per token) or ``per_tensor_quant_fp8(..., is_static=True)``
    (static ``scale``), each with these bounds and ``quant_eps``. NaN and inf follow those ops' rules:
    no NaN scale from finite input; a block holding inf gets ``s = FLT_MAX`` (2^127 with
    ``scale_ue8m0``); NaN is ignored by the
    maximum and quantizes to NaN (fp8) or 0 (int8). Moves ``N*H*s_in + H*s_in + N*H`` bytes plus the
    scales (``+ N*H*s_in`` with ``output_normed``).

    Parameters
    ----------
    input : torch.Tensor
        ``[..., hidden_size]`` CUDA tensor, float16 / bfloat16; leading dims flatten to ``num_tokens``;
        last dim contiguous, any row stride (rows of a wider buffer, storage offsets). Not modified
        (unless it is ``output_normed``).
    weight : torch.Tensor
        ``[hidden_size]``, contiguous, the dtype and device of ``input``.
    eps : float
        Added to the mean square (>= 0). Default 1e-6.
    """
    return _run(
        "rmsnorm_quant", input, None, weight, eps, group_size, scale, out_dtype, column_major_scales, scale_ue8m0,
        output_q, output_s, output_normed, return_normed, quant_eps, enable_pdl,
    )  # fmt: skip


def fused_add_rmsnorm_quant(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    group_size: int | None = 128,
    scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    output_normed: torch.Tensor | None = None,
    return_normed: bool = False,
    quant_eps: float = 1e-10,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, ...]:
    """Residual add (in place), RMSNorm, then 8-bit quantization of the normalised row, in one launch.

    Per row (fp32 arithmetic, IEEE roundings, in this order)::

        residual <- r = round_T(input + residual)                           # written in place
        y = round_T(r * (w * rsqrt(sum(r**2) * (1 / hidden_size) + eps)))    # exactly fused_add_rmsnorm's
        s, q as in rmsnorm_quant, from y

    Bit-identical to ``fused_add_rmsnorm(y, residual, weight, eps)`` on ``y`` = a copy of ``input``
    (``output_normed``, else a new contiguous tensor) followed by the quant op of the mode (see
    :func:`rmsnorm_quant`): ``input`` is NOT overwritten with ``y``, it is read only; pass
    ``output_normed=input`` to get fused_add_rmsnorm's in-place output as well.
    Moves ``3*N*H*s_in + H*s_in + N*H`` bytes plus the scales.

    Parameters
    ----------
    input : torch.Tensor
        ``[..., hidden_size]`` CUDA tensor, float16 / bfloat16, last dim contiguous, any row stride;
        leading dims flatten without a copy. Read only (unless it is ``output_normed``).
    residual : torch.Tensor
        The shape, dtype and device of ``input``, its own row stride; overwritten with the rounded sum.
        Must not overlap ``input`` (nor be the same tensor).
    weight : torch.Tensor
        ``[hidden_size]``, contiguous, the dtype and device of ``input``.
    eps : float
        Added to the mean square (>= 0). Default 1e-6.
    """
    _check_tensor_type("fused_add_rmsnorm_quant", "residual", residual)  # required: None is no rmsnorm_quant
    return _run(
        "fused_add_rmsnorm_quant", input, residual, weight, eps, group_size, scale, out_dtype, column_major_scales,
        scale_ue8m0, output_q, output_s, output_normed, return_normed, quant_eps, enable_pdl,
    )  # fmt: skip


if rmsnorm_quant.__doc__ and fused_add_rmsnorm_quant.__doc__:  # None under python -OO
    rmsnorm_quant.__doc__ += _DOC_COMMON
    fused_add_rmsnorm_quant.__doc__ += _DOC_COMMON


# ---------------------------------------------------------------------------------------------
# Registration: `check` compares the bytes of q and s with the unfused composition of our ops
# ---------------------------------------------------------------------------------------------
def _copy_with_layout(rows: torch.Tensor) -> torch.Tensor:
    """A copy of ``rows`` ([num_rows, n], last dim contiguous) with its strides and its address
    modulo 16 bytes."""
    shift = (rows.data_ptr() % 16) // rows.element_size()
    span = (rows.shape[0] - 1) * rows.stride(0) + rows.shape[1] if rows.numel() else 0
    buffer = torch.empty(shift + span, dtype=rows.dtype, device=rows.device)
    copy = buffer.as_strided(rows.shape, rows.stride(), shift)
    copy.copy_(rows)
    return copy


def unfused(
    input: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    group_size: int | None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    scale: torch.Tensor | None = None,
    scale_ue8m0: bool = False,
    quant_eps: float = 1e-10,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, s, y)`` of the unfused composition (``input`` and ``residual`` are not modified): rmsnorm
    of ``input``, or fused_add_rmsnorm of a contiguous copy of ``input`` with a copy of ``residual``
    laid out as ``residual`` is, then per_token_group_quant_8bit (row-major scales),
    per_token_quant_fp8 (``s`` ``[num_tokens]``) or per_tensor_quant_fp8 static (``s`` is ``scale``).
    The ops' own composition runs the norm on the same layouts (the norms' vector width, hence the
    order of their sums, follows the tensors' alignment). The reference of the tests and of ``check``."""
    from sglang.jit_kernel.norm import fused_add_rmsnorm, rmsnorm  # noqa: PLC0415
    from sglang.jit_kernel.per_tensor_quant_fp8 import per_tensor_quant_fp8  # noqa: PLC0415
    from sglang.jit_kernel.per_token_group_quant_8bit import per_token_group_quant_8bit  # noqa: PLC0415
    from sglang.jit_kernel.per_token_quant_fp8 import per_token_quant_fp8  # noqa: PLC0415

    hidden_size = input.shape[-1]
    x = input.reshape(-1, hidden_size)
    if residual is None:
        y = rmsnorm(x, weight, eps)
    else:
        y = x.contiguous().clone()
        fused_add_rmsnorm(y, _copy_with_layout(residual.reshape(-1, hidden_size)), weight, eps)
    q = torch.empty(y.shape, dtype=out_dtype, device=y.device)
    if scale is not None:
        per_tensor_quant_fp8(y, q, scale.reshape(1), is_static=True)
        s = scale
    elif group_size not in (None, -1):
        groups = hidden_size // group_size
        cols = (groups + 3) // 4 if scale_ue8m0 else groups
        s = torch.empty(y.shape[0], cols, dtype=torch.int32 if scale_ue8m0 else torch.float32, device=y.device)
        lo, hi = Q_BOUNDS[out_dtype]
        per_token_group_quant_8bit(y, q, s, group_size, quant_eps, lo, hi, scale_ue8m0)
    else:
        s = torch.empty(y.shape[0], dtype=torch.float32, device=y.device)
        per_token_quant_fp8(y, q, s, eps=quant_eps)
    return q, s, y


def _bytes_of(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.contiguous().view(torch.uint8).flatten() for t in tensors])


def _check_cases(fused: bool) -> Callable[[], list[CheckCase]]:
    """``check``: [16384, 4096] and [16384, 7168] bf16, group 128, fp8, row-major scales."""

    def cases() -> list[CheckCase]:
        out = []
        for m, k in ((16384, 4096), (16384, 7168)):

            def make(m: int = m, k: int = k) -> tuple:
                x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
                r = torch.randn(m, k, dtype=torch.bfloat16, device="cuda") if fused else None
                return x, r, torch.randn(k, dtype=torch.bfloat16, device="cuda")

            def call(x: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
                if fused:
                    return fused_add_rmsnorm_quant(x, r, w, 1e-6)
                return rmsnorm_quant(x, w, 1e-6)

            def expected(x: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor) -> torch.Tensor:
                q, s, _ = unfused(x, r, w, 1e-6, 128)
                return _bytes_of(q, s)

            out.append(
                CheckCase(
                    label=f"[{m}, {k}] bf16 g128 fp8",
                    make_inputs=make,
                    call=call,
                    reference=expected,
                    # read x (and r), write r (fused), read w, write q and the scales
                    bytes_moved=(3 if fused else 1) * m * k * 2 + k * 2 + m * k + 4 * m * (k // 128),
                    dtype=torch.uint8,  # bit-exact: the reference is the unfused composition
                    output=lambda result, *inputs: _bytes_of(result[0], result[1]),
                )
            )
        return out

    return cases


_VARIANTS = [(d, o) for d in IN_DTYPES for o in OUT_DTYPES]
register_op("rmsnorm_quant", build=_jit_rmsnorm_quant_module, variants=_VARIANTS, check_cases=_check_cases(fused=False))
register_op(
    "fused_add_rmsnorm_quant",
    build=_jit_fused_add_rmsnorm_quant_module,
    variants=_VARIANTS,
    check_cases=_check_cases(fused=True),
)
