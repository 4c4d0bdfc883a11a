"""per_token_group_quant: per-token-group 8-bit quantization, optionally fused with the gated activation
before it (silu / gelu / gelu_tanh and mul), in sglang 0.5.23's signature.

Kernel of the fused path: ``csrc/quantization/per_token_group_quant.cuh`` (one module per input dtype,
output dtype and activation, so a first call compiles only its own kernels). Without
``fuse_silu_and_mul`` the op is :func:`per_token_group_quant_8bit`'s kernels.

Bytes moved (fused): ``M * 2H * s_in + M * H + 4 * M * H / group_size`` (read gate and up, write
the 8-bit values and one 4-byte scale per group; ue8m0 scales one byte per group), ``M`` the rows
computed (with ``masked_m``: its sum).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._quant_8bit import (
    TYPE_MAX,
    as_rows,
    emulate_amax,
    emulate_quant,
    emulate_scale,
    last_dim_contiguous,
)
from sglang.jit_kernel._validate import (
    FLOAT_DTYPES,
    check_contiguous,
    check_cuda,
    check_dtype,
    check_last_dim_contiguous,
    check_no_partial_overlap,
    check_no_self_overlap,
    check_same_device,
    check_scalar,
    check_shape,
    dtype_name,
    fail,
    launcher_errors,
    tracing,
    type_name,
)
from sglang.jit_kernel.per_token_group_quant_8bit import max_group_size, per_token_group_quant_8bit
from sglang.jit_kernel.registry import CheckCase, register_op
from sglang.jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = ["ACTIVATIONS", "MODES", "max_fused_group_size", "per_token_group_quant"]

_OP = "per_token_group_quant"
FP8 = torch.float8_e4m3fn
_OUT_DTYPES = (FP8, torch.int8)
#: The 8-bit bounds of each output dtype (the clamp of the quantization).
_BOUNDS = {FP8: (-448.0, 448.0), torch.int8: (-128.0, 127.0)}
#: ``activation=`` values and their C++ enumerators (activation.cuh).
ACTIVATIONS = {
    "silu": "GatedActivation::kSilu",
    "gelu": "GatedActivation::kGelu",
    "gelu_tanh": "GatedActivation::kGeluTanh",
}
#: ``silu_and_mul_mode=`` values.
MODES = ("legacy", "dense")


@cache_once
def _jit_module(in_dtype: torch.dtype, out_dtype: torch.dtype, activation: str) -> Module:
    """Compile (first use) and cache the fused module for ``in_dtype`` -> ``out_dtype`` with
    ``activation`` (its kernels only)."""
    args = make_cpp_args(in_dtype, out_dtype)
    return load_jit(
        _OP,
        *args,
        activation,
        cuda_files=["quantization/per_token_group_quant.cuh"],
        cuda_wrappers=[(_OP, f"per_token_group_quant<{args}, {ACTIVATIONS[activation]}>")],
    )


def max_fused_group_size(dtype: torch.dtype) -> int:
    """Largest group_size of the fused path for input ``dtype``: a warp's largest tile, two steps of 32
    chunks of 16 bytes (512 for 16-bit inputs, 256 for float32)."""
    return 64 * (16 // torch.empty((), dtype=dtype).element_size())


def _launch_fused(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    masked_m: torch.Tensor | None,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
    dense: bool,
    launch_rows: int,
    activation: str,
) -> None:
    """The fused kernel on 3-D views ``[E, T_pad, 2H]`` / ``[E, T_pad, H]`` / ``[E, T_pad, S]``."""
    _jit_module(input.dtype, output_q.dtype, activation).per_token_group_quant(
        input, output_q, output_s, masked_m, group_size, eps, scale_ue8m0, dense, launch_rows
    )


@torch.library.custom_op(
    "sglang_jit_kernel::per_token_group_quant_fused", mutates_args=("output_q", "output_s"), device_types="cuda"
)
def _fused_op(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    masked_m: torch.Tensor | None,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
    dense: bool,
    launch_rows: int,
    activation: str,
) -> None:
    _launch_fused(input, output_q, output_s, masked_m, group_size, eps, scale_ue8m0, dense, launch_rows, activation)


@_fused_op.register_fake
def _(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    masked_m: torch.Tensor | None,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
    dense: bool,
    launch_rows: int,
    activation: str,
) -> None:
    return None


def _check_choice(arg: str, value: object, choices: tuple[str, ...] | dict) -> None:
    """ValueError unless ``value`` is one of ``choices`` (TypeError unless a str)."""
    if not isinstance(value, str):
        fail(TypeError, _OP, arg, "type", "a str", type_name(value))
    if value not in choices:
        fail(ValueError, _OP, arg, "value", f"one of {', '.join(repr(c) for c in choices)}", repr(value))


def _allocate_scales(
    leading: tuple[int, ...],
    cols: int,
    dtype: torch.dtype,
    device: torch.device,
    column_major: bool,
    masked: bool,
) -> torch.Tensor:
    """output_s when not given: row-major ``[*leading, cols]``, or column-major (TMA-aligned, see
    :func:`per_token_group_quant`)."""
    if not column_major:
        return torch.empty(*leading, cols, dtype=dtype, device=device)
    if masked:  # [E, T_pad, cols]: each expert's [T_pad, cols] column-major
        experts, rows = leading
        padded = (rows + 3) // 4 * 4
        return torch.empty(experts, cols, padded, dtype=dtype, device=device).transpose(1, 2)[:, :rows]
    rows = 1
    for n in leading:
        rows *= n
    padded = (rows + 3) // 4 * 4
    return torch.empty(cols, padded, dtype=dtype, device=device).T[:rows].view(*leading, cols)


def per_token_group_quant(
    input: torch.Tensor,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    group_size: int = 128,
    scale_ue8m0: bool = False,
    fuse_silu_and_mul: bool = False,
    masked_m: torch.Tensor | None = None,
    expected_m: int | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    column_major_scales: bool = False,
    eps: float = 1e-10,
    activation: str = "silu",
    silu_and_mul_mode: str = "legacy",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize groups of ``group_size`` consecutive values of each row to 8 bits, one scale per group;
    with ``fuse_silu_and_mul``, of the gated activation ``act(gate) * up`` of each row, in one pass.

    The quantized value ``h`` (``H = input.shape[-1] // 2`` with fusion, ``g = input[..., i]``,
    ``u = input[..., H + i]``; without fusion ``h = input``)::

        legacy:  h = round_T(float(round_T(act(float(g)))) * float(u))
        dense:   h = round_T(act(float(g)) * float(u))

    ``round_T`` rounds to the input dtype (nearest even; nothing for float32, where the two modes
    agree). Legacy is bit for bit what :func:`~sglang.jit_kernel.activation.silu_and_mul` (``gelu_and_mul``,
    ``gelu_tanh_and_mul``) writes, so the result equals that op followed by
    :func:`~sglang.jit_kernel.per_token_group_quant_8bit.per_token_group_quant_8bit`, including the
    hardware approximations of the activation that op takes at its sizes. Dense computes the
    activation by the formulas of those ops' docstrings (fp32, each operation rounded as written,
    libm ``expf`` / ``erff`` / ``tanhf``) and rounds once; it is bit for bit an fp32 torch reference
    written the same way::

        silu       g / (1 + exp(-g))
        gelu       (g * 0.5) * (1 + erf(g * 0.70710678))
        gelu_tanh  (0.5 * g) * (1 + tanh(0.7978845608 * (g + 0.044715 * (g * g * g))))

    Then per group of ``h`` (fp32, IEEE roundings, in this order; per_token_group_quant_8bit's
    arithmetic with the bounds of the output dtype)::

        s = clamp(max(max|h|, eps) / q_type_max, FLT_MIN, FLT_MAX)   # q_type_max 448 (fp8), 127 (int8)
        s = 2 ** ceil(log2(s)), at most 2**127                        # scale_ue8m0 only
        q = round(clamp(h * (1 / s), q_min, q_max))                   # fp8 +-448, int8 -128..127

    No scale is NaN: all-zero groups get ``eps / q_type_max`` (FLT_MIN at least), a group holding inf
    FLT_MAX (2^127 with ``scale_ue8m0``; inf quantizes to the bound). NaN values are ignored by the maximum and quantize to NaN
    (fp8) or 0 (int8). An infinite ``h`` comes from infinite inputs or an overflow of the product in
    ``T``.

    Parameters
    ----------
    input : torch.Tensor
        CUDA tensor, float16 / bfloat16 / float32, not modified. Without fusion ``[..., hidden_size]``;
        with fusion ``[..., 2 * hidden_size]`` (gate, then up). With ``masked_m``: ``[num_experts,
        T_pad, 2 * hidden_size]``. Leading dims flatten to ``num_tokens`` rows; any row stride
        (column slices of a wider buffer, storage offsets) is read in place; leading dims that do not
        flatten, or a non-contiguous last dim, are copied first.
    output_q : torch.Tensor, optional
        Written: ``[..., hidden_size]`` (the shape of ``input``, last dim halved with fusion),
        ``float8_e4m3fn`` or ``int8``, last dim contiguous, any row stride, leading dims flattening to
        one row stride; must not overlap the other tensors. Allocated (contiguous, of ``out_dtype``)
        when None.
    output_s : torch.Tensor, optional
        Written: float32 ``[..., num_groups]`` (``num_groups = hidden_size / group_size``; also
        ``[num_tokens, num_groups]`` for an input of other than 2 dims without ``masked_m``), any strides giving each
        element its own address: row-major, or column-major (the transposed TMA-aligned layout
        ``torch.empty(num_groups, M_pad).T[:M]`` DeepGEMM reads). With ``scale_ue8m0``: int32
        ``[..., ceil(num_groups / 4)]``, four exponent bytes per word (group ``g`` in byte ``g % 4``,
        little-endian; bytes past the last group 0). Allocated when None: row-major, or with
        ``column_major_scales`` column-major with ``M_pad`` rounded up to a multiple of 4 (per expert
        with ``masked_m``: ``torch.empty(E, cols, T_pad_pad).transpose(1, 2)[:, :T_pad]``).
    group_size : int
        A power of two dividing ``hidden_size``: 16 to 1024 (float32: 512) without fusion, to
        :func:`max_fused_group_size` (512; float32 256) with. Default 128.
    scale_ue8m0 : bool
        Power-of-two scales stored as exponent bytes (fp8 output only). Default False.
    fuse_silu_and_mul : bool
        Apply the gated activation (``activation``, silu by default) before quantizing. Default False.
    masked_m : torch.Tensor, optional
        With fusion only: int32 ``[num_experts]``, contiguous, on the device of ``input``: the valid
        rows of each expert of a masked MoE layout. Rows ``t >= masked_m[e]`` of expert ``e`` are not
        read and their ``output_q`` / ``output_s`` entries are left untouched. Entries are clamped to
        ``[0, T_pad]`` on the device (never checked on the host: no synchronisation, graph-safe).
    expected_m : int, optional
        With ``masked_m``: the expected rows per expert (``>= 0``), a hint sizing the grid (``min(max(
        expected_m, 1), T_pad)`` rows per expert get their own CTAs; rows past it are looped over).
        Results do not depend on it. Ignored without ``masked_m``.
    out_dtype : torch.dtype, optional
        Keyword-only. ``float8_e4m3fn`` (default) or ``int8``: the dtype of an allocated ``output_q``;
        must match a given one.
    column_major_scales : bool
        Keyword-only. Allocate ``output_s`` column-major (ignored when ``output_s`` is given: its
        strides decide). Default False.
    eps : float
        Keyword-only. Floor of each group's maximum (``>= 0``). Default 1e-10.
    activation : str
        Keyword-only. ``"silu"`` (default), ``"gelu"`` (erf form) or ``"gelu_tanh"``; with fusion only.
    silu_and_mul_mode : str
        Keyword-only. ``"legacy"`` (default) or ``"dense"``, see above; used with fusion only.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``(output_q, output_s)`` (the given objects, or the allocated ones). With 0 rows nothing is
        launched.

    Raises
    ------
    TypeError
        A tensor argument that is not a tensor, a scalar of the wrong type, or an ``out_dtype`` that
        is not a ``torch.dtype``.
    ValueError
        ``group_size`` not a power of two in range; ``eps`` negative or NaN; ``expected_m`` negative;
        ``out_dtype`` not fp8 e4m3 / int8 (int8 with ``scale_ue8m0``); ``activation`` / ``silu_and_mul_mode`` not one of the names;
        a non-silu ``activation`` or ``masked_m`` without ``fuse_silu_and_mul``.
    RuntimeError
        Before any launch and before any output is written, naming the argument
        (``per_token_group_quant: <arg> <what>: expected X, got Y``): a dtype that is not allowed
        (``input`` not float16 / bfloat16 / float32, ``output_q`` not fp8 / int8 or not
        ``out_dtype``, ``output_s`` not float32 / int32 for ue8m0, ``output_q`` not fp8 with
        ``scale_ue8m0``, ``masked_m`` not int32); an odd last dim with fusion; a 0-d ``input``;
        ``hidden_size % group_size != 0``; a shape mismatch (``output_q``, ``output_s`` too small or
        large, ``masked_m`` not ``[num_experts]``, a masked ``input`` not
        3-D); a layout that is not allowed (``output_q`` with a strided last dim or leading dims that
        do not flatten, ``output_s`` with a stride 0 or overlapping elements, ``masked_m`` not
        contiguous); a tensor not on CUDA or on another device than ``input``; outputs overlapping
        the inputs or each other. Metadata is checked before devices.
    """
    op = _OP
    # Scalars and names
    if not isinstance(input, torch.Tensor):
        fail(TypeError, op, "input", "type", "a torch.Tensor", type_name(input))
    check_scalar(op, "group_size", group_size, int)
    check_scalar(op, "scale_ue8m0", scale_ue8m0, bool)
    check_scalar(op, "fuse_silu_and_mul", fuse_silu_and_mul, bool)
    check_scalar(op, "expected_m", expected_m, int, minimum=0, optional=True)
    check_scalar(op, "column_major_scales", column_major_scales, bool)
    check_scalar(op, "eps", eps, float, minimum=0.0)
    _check_choice("activation", activation, ACTIVATIONS)
    _check_choice("silu_and_mul_mode", silu_and_mul_mode, MODES)
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        fail(TypeError, op, "out_dtype", "type", "a torch.dtype or None", type_name(out_dtype))
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        fail(ValueError, op, "out_dtype", "value", "float8_e4m3fn or int8", out_dtype)
    if not fuse_silu_and_mul and activation != "silu":
        fail(ValueError, op, "activation", "value", "'silu' without fuse_silu_and_mul=True", repr(activation))
    if masked_m is not None and not fuse_silu_and_mul:
        fail(ValueError, op, "masked_m", "value", "None without fuse_silu_and_mul=True", type_name(masked_m))

    # The input and the sizes
    check_dtype(op, "input", input, FLOAT_DTYPES)
    if input.dim() == 0:
        fail(RuntimeError, op, "input", "dims", "at least 1 ([..., hidden_size])", "a 0-d tensor")
    width = input.shape[-1]
    if fuse_silu_and_mul and width % 2:
        fail(RuntimeError, op, "input", "last dim", "even (2 * hidden_size)", width)
    hidden_size = width // 2 if fuse_silu_and_mul else width
    largest = max_fused_group_size(input.dtype) if fuse_silu_and_mul else max_group_size(input.dtype)
    check_scalar(op, "group_size", group_size, int, minimum=16, maximum=largest)
    if group_size & (group_size - 1):
        fail(ValueError, op, "group_size", "value", "a power of two", group_size)
    if hidden_size % group_size:
        fail(
            RuntimeError,
            op,
            "input",
            "shape",
            f"hidden_size ({'half the ' if fuse_silu_and_mul else ''}last dim) a multiple of group_size={group_size}",
            tuple(input.shape),
        )
    masked = masked_m is not None
    q_rows = s_rows = None  # the outputs' row views, once checked
    if masked:
        if not isinstance(masked_m, torch.Tensor):
            fail(TypeError, op, "masked_m", "type", "a torch.Tensor", type_name(masked_m))
        if input.dim() != 3:
            fail(
                RuntimeError,
                op,
                "input",
                "dims",
                "3 with masked_m ([num_experts, T_pad, 2 * hidden_size])",
                input.dim(),
            )
        check_dtype(op, "masked_m", masked_m, (torch.int32,))
        check_shape(op, "masked_m", masked_m, [("num_experts", input.shape[0])])
        check_contiguous(op, "masked_m", masked_m)
    leading = tuple(input.shape[:-1])
    q_shape = (*leading, hidden_size)
    num_tokens = input.numel() // width if width else 0
    num_groups = hidden_size // group_size

    # output_q
    if output_q is None:
        q_dtype = out_dtype if out_dtype is not None else FP8
    else:
        if not isinstance(output_q, torch.Tensor):
            fail(TypeError, op, "output_q", "type", "a torch.Tensor", type_name(output_q))
        if out_dtype is not None:
            check_dtype(op, "output_q", output_q, (out_dtype,))
        check_dtype(op, "output_q", output_q, _OUT_DTYPES)
        if tuple(output_q.shape) != q_shape:
            what = "the shape of input with the last dim halved" if fuse_silu_and_mul else "the shape of input"
            fail(RuntimeError, op, "output_q", "shape", f"{q_shape} ({what})", tuple(output_q.shape))
        check_last_dim_contiguous(op, "output_q", output_q)
        check_no_self_overlap(op, "output_q", output_q)
        if not masked:  # leading dims that flatten to rows, before the device checks
            q_rows = as_rows(op, "output_q", output_q, num_tokens, copy_ok=False)
        q_dtype = output_q.dtype
    if scale_ue8m0 and q_dtype != FP8 and output_q is None:
        fail(ValueError, op, "out_dtype", "value", "float8_e4m3fn with scale_ue8m0 (ue8m0 is for fp8)", "int8")
    if scale_ue8m0 and q_dtype != FP8:
        fail(RuntimeError, op, "output_q", "dtype", "float8_e4m3fn (scale_ue8m0 is for fp8)", dtype_name(q_dtype))

    # output_s
    s_dtype = torch.int32 if scale_ue8m0 else torch.float32
    scale_cols = (num_groups + 3) // 4 if scale_ue8m0 else num_groups
    if output_s is not None:
        if not isinstance(output_s, torch.Tensor):
            fail(TypeError, op, "output_s", "type", "a torch.Tensor", type_name(output_s))
        check_dtype(op, "output_s", output_s, (s_dtype,))
        col = ("num_groups / 4 rounded up" if scale_ue8m0 else "num_groups", scale_cols)
        if not masked and output_s.dim() == 2 and input.dim() != 2 and output_s.shape[0] == num_tokens:
            check_shape(op, "output_s", output_s, [("num_tokens", num_tokens), col])
        else:
            dims = ["num_experts", "T_pad"] if masked else [f"dim{i}" for i in range(len(leading))]
            check_shape(op, "output_s", output_s, [*zip(dims, leading), col])
        check_no_self_overlap(op, "output_s", output_s)
        if not masked:
            s_rows = as_rows(op, "output_s", output_s, num_tokens, copy_ok=False)

    # Devices
    check_cuda(op, "input", input)
    if output_q is not None:
        check_same_device(op, "output_q", output_q, input, "input")
    if output_s is not None:
        check_same_device(op, "output_s", output_s, input, "input")
    if masked:
        check_same_device(op, "masked_m", masked_m, input, "input")

    # Overlaps (data pointers do not exist while tracing: the launcher checks them again)
    if output_q is None:
        output_q = torch.empty(q_shape, dtype=q_dtype, device=input.device)
    else:
        check_no_partial_overlap(op, "output_q", output_q, input, "input", allow_same=False)
    if output_s is None:
        output_s = _allocate_scales(leading, scale_cols, s_dtype, input.device, column_major_scales, masked)
    else:
        check_no_partial_overlap(op, "output_s", output_s, input, "input", allow_same=False)
        # Dense pairs here; interleaved ones (packed into one buffer's rows) by the launcher's exact test.
        check_no_partial_overlap(op, "output_s", output_s, output_q, "output_q", allow_same=False, dense_only=True)
    if masked:
        check_no_partial_overlap(op, "output_q", output_q, masked_m, "masked_m", allow_same=False)
        check_no_partial_overlap(op, "output_s", output_s, masked_m, "masked_m", allow_same=False)

    if num_tokens == 0 or num_groups == 0:
        return output_q, output_s
    if not fuse_silu_and_mul:
        lo, hi = _BOUNDS[q_dtype]
        per_token_group_quant_8bit(input, output_q, output_s, group_size, float(eps), lo, hi, scale_ue8m0)
        return output_q, output_s

    # The fused kernel on 3-D views: [E, T_pad, .] with masked_m, else one expert of num_tokens rows
    if masked:
        x, q, s = last_dim_contiguous(input), output_q, output_s
        launch_rows = 0 if expected_m is None else min(max(expected_m, 1), input.shape[1])
    else:
        x = as_rows(op, "input", last_dim_contiguous(input), num_tokens, copy_ok=True).unsqueeze(0)
        if q_rows is None:  # allocated here
            q_rows = as_rows(op, "output_q", output_q, num_tokens, copy_ok=False)
        if s_rows is None:
            s_rows = as_rows(op, "output_s", output_s, num_tokens, copy_ok=False)
        q, s = q_rows.unsqueeze(0), s_rows.unsqueeze(0)
        launch_rows = 0
    args = (x, q, s, masked_m, group_size, float(eps), scale_ue8m0, silu_and_mul_mode == "dense", launch_rows)
    if tracing():
        torch.ops.sglang_jit_kernel.per_token_group_quant_fused(*args, activation)
    else:
        with launcher_errors(op):  # the launcher's exact overlap checks, named for the op
            _launch_fused(*args, activation)
    return output_q, output_s


# ---------------------------------------------------------------------------------------------
# References (the tests and `check`) and registration
# ---------------------------------------------------------------------------------------------
def dense_reference(activation: str, input: torch.Tensor) -> torch.Tensor:
    """Dense ``h`` from the same inputs with torch fp32 operations, each rounded as the kernel
    rounds it: ``round_T(act(float(g)) * float(u))`` as float32 (values of the input dtype)."""
    h = input.shape[-1] // 2
    g = input[..., :h].float()
    if activation == "silu":
        act = g / (1 + torch.exp(-g))
    elif activation == "gelu":
        act = (g * 0.5) * (1 + torch.erf(g * 0.7071067811865476))
    else:
        act = (0.5 * g) * (1 + torch.tanh(0.7978845608 * (g + 0.044715 * (g * g * g))))
    return (act * input[..., h:].float()).to(input.dtype).float()


def quant_reference(
    h: torch.Tensor, group_size: int, dtype: torch.dtype, eps: float = 1e-10, ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` of the kernel's quantization of ``h [..., K]`` (fp32 emulation, bit for bit):
    ``q [..., K]`` of ``dtype``, ``s`` fp32 ``[..., K / group_size]`` (power-of-two with ``ue8m0``,
    not packed)."""
    groups = h.float().reshape(*h.shape[:-1], h.shape[-1] // group_size, group_size)
    s = emulate_scale(emulate_amax(groups, dim=-1), eps, TYPE_MAX[dtype], ue8m0)
    q = emulate_quant(groups, s.unsqueeze(-1), *_BOUNDS[dtype], dtype).reshape(h.shape)
    return q, s


_CHECK_T, _CHECK_H, _CHECK_G = 2048, 14336, 128


def _check_cases() -> list[CheckCase]:
    """``check``: [2048, 2 x 14336] bf16 -> fp8, group 128, row-major scales, silu: legacy against the
    unfused silu_and_mul + per_token_group_quant_8bit, dense against the fp32 torch reference."""
    from sglang.jit_kernel.activation import silu_and_mul  # noqa: PLC0415

    t, h, g = _CHECK_T, _CHECK_H, _CHECK_G

    def make() -> tuple:
        x = torch.randn(t, 2 * h, dtype=torch.bfloat16, device="cuda")
        q = torch.empty(t, h, dtype=FP8, device="cuda")
        return x, q, torch.empty(t, h // g, dtype=torch.float32, device="cuda")

    def packed(result: tuple[torch.Tensor, torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        q, s = result
        return torch.cat([q.view(torch.uint8).flatten(), s.view(torch.uint8).flatten()])

    def legacy_expected(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        rq, rs = torch.empty_like(q), torch.empty_like(s)
        per_token_group_quant_8bit(silu_and_mul(x), rq, rs, g, 1e-10, -448.0, 448.0)
        return packed((rq, rs))

    def dense_expected(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return packed(quant_reference(dense_reference("silu", x), g, FP8))

    nbytes = t * 2 * h * 2 + t * h + 4 * t * (h // g)  # read gate and up (bf16), write fp8 + fp32 scales
    return [
        CheckCase(
            label=f"[{t}, 2 x {h}] bf16 silu g{g} fp8 {mode}",
            make_inputs=make,
            call=lambda x, q, s, mode=mode: per_token_group_quant(
                x, q, s, g, fuse_silu_and_mul=True, silu_and_mul_mode=mode
            ),
            reference=legacy_expected if mode == "legacy" else dense_expected,
            bytes_moved=nbytes,
            dtype=torch.uint8,  # bit-exact
            output=packed,
        )
        for mode in MODES
    ]


register_op(
    _OP,
    build=_jit_module,
    variants=[(d, o, a) for d in FLOAT_DTYPES for o in _OUT_DTYPES for a in ACTIVATIONS],
    check_cases=_check_cases,
)
