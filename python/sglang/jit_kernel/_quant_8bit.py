"""Helpers shared by the 8-bit activation quantizers' wrappers (``per_token_group_quant_8bit``,
``per_token_quant_fp8``, ``per_tensor_quant_fp8``).

Each op builds its own module (kernels in ``csrc/quantization/<op>.cuh``, arithmetic in
``quantize_8bit.cuh``). ``emulate_quant`` is the kernels' arithmetic written with torch fp32
operations (IEEE division and multiplication, the same roundings), so ``check`` and the tests can
compare bit for bit.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel._validate import VIEW_ERRORS, check_no_partial_overlap, fail, rows_are_views, tracing

#: Output dtypes and the largest finite value of each (q_type_max of the scale).
TYPE_MAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}
FLT_MIN = 2.0**-126
FLT_MAX = float(torch.finfo(torch.float32).max)


def as_rows(op: str, arg: str, tensor: torch.Tensor, num_rows: int, copy_ok: bool) -> torch.Tensor:
    """``[..., n]`` -> ``[num_rows, n]``: a view when the leading dims flatten to one stride; otherwise
    a copy when ``copy_ok`` (read-only inputs), else RuntimeError naming ``arg``."""
    if tensor.dim() == 2 and tensor.shape[0] == num_rows:
        return tensor
    try:
        return tensor.view(num_rows, tensor.shape[-1] if tensor.dim() else 1)
    except VIEW_ERRORS:
        if copy_ok:
            return tensor.reshape(num_rows, tensor.shape[-1])
        fail(
            RuntimeError,
            op,
            arg,
            "layout",
            "leading dims that flatten to one stride (a view of [num_tokens, n])",
            f"shape {tuple(tensor.shape)} with strides {tensor.stride()}",
        )


def check_outputs_disjoint(op: str, input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor) -> None:
    """RuntimeError if ``output_q`` or ``output_s`` shares memory with ``input`` or with each other,
    where that is exact without an element test (dense views, or the same view); interleaved views
    (q and its scales packed in the rows of one buffer) are left to the launcher's element test,
    except against an input the wrapper copies first (the launcher would only see the copy).
    Skipped while tracing (``tracing()``: fake tensors have no addresses; the launcher checks again)."""
    if tracing():
        return
    exact = rows_are_views(input)  # else the byte-range test: the launcher gets a copy of input
    check_no_partial_overlap(op, "output_q", output_q, input, "input", allow_same=False, dense_only=exact)
    check_no_partial_overlap(op, "output_s", output_s, input, "input", allow_same=False, dense_only=exact)
    check_no_partial_overlap(op, "output_s", output_s, output_q, "output_q", allow_same=False, dense_only=True)


def last_dim_contiguous(input: torch.Tensor) -> torch.Tensor:
    """``input`` if its last dim has stride 1, else a contiguous copy (a transposed input is read as
    ``input.contiguous()`` lays it out; ``clone`` because ``contiguous()`` keeps a size-1 last dim's
    stride)."""
    if input.stride(-1) == 1:
        return input
    return input.clone(memory_format=torch.contiguous_format)


def emulate_amax(x: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Largest |x| in fp32 over ``dim`` (all dims if None), ignoring NaN like the kernels' fmaxf; an
    inf stays inf (the kernels' maximum is inf, so the scale is FLT_MAX as documented)."""
    # posinf explicitly: nan_to_num's default maps inf to FLT_MAX, which gave the emulation a scale
    # of FLT_MAX / 448 for groups holding inf where every kernel writes FLT_MAX.
    magnitude = torch.nan_to_num(x.float().abs(), nan=0.0, posinf=float("inf"))
    return magnitude.amax() if dim is None else magnitude.amax(dim=dim)


def emulate_scale(amax: torch.Tensor, eps: float, type_max: float, ue8m0: bool = False) -> torch.Tensor:
    """The kernels' scale from fp32 maxima: clamp(max(amax, eps) / type_max, FLT_MIN, FLT_MAX),
    rounded up to a power of two (at most 2^127) with ``ue8m0``."""
    floored = torch.clamp_min(amax.float(), eps)
    # A tensor divisor: torch divides by a Python scalar as a multiplication by its reciprocal,
    # which is not the kernels' IEEE division.
    s = (floored / torch.full_like(floored, type_max)).clamp(FLT_MIN, FLT_MAX)
    if ue8m0:
        bits = s.view(torch.int32)
        exponent = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
        s = (exponent.clamp_max(254) << 23).view(torch.float32)
    return s


def emulate_quant(x: torch.Tensor, scale: torch.Tensor, q_min: float, q_max: float, dtype: torch.dtype) -> torch.Tensor:
    """The kernels' quantization: clamp(x * (1 / scale), q_min, q_max) rounded to ``dtype`` (fp32
    arithmetic, IEEE roundings; ``scale`` broadcasts against ``x``); NaN stays NaN (fp8) or becomes
    0 (int8)."""
    s = scale.float().clamp(FLT_MIN, FLT_MAX)
    inv = torch.ones_like(s) / s
    y = (x.float() * inv).clamp(q_min, q_max)  # torch.clamp keeps NaN
    if dtype == torch.int8:
        return torch.nan_to_num(y, nan=0.0).round().to(torch.int8)
    return y.to(dtype)
