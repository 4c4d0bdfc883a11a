"""Gated activations of MLP blocks: ``silu_and_mul``, ``gelu_and_mul``, ``gelu_tanh_and_mul``.

``input[..., 2H]`` holds the gate (first half) and the up projection (second half); the op writes
``out[..., H] = round(act(gate)) * up``. Kernel: ``csrc/elementwise/activation.cuh``; each op has
its own module per dtype (the activation is a template parameter of the launcher), so an op's first
call compiles only its own kernels.

Bytes moved (for bandwidth figures): ``3 * num_tokens * H * element_size`` (read 2H, write H per
row); a row skipped by the expert filter moves only its 4-byte id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.jit_kernel._validate import (
    FAST_PATH_REFUSALS,
    FLOAT_DTYPES,
    INT64_MAX,
    VIEW_ERRORS,
    check_no_partial_overlap,
    check_scalar,
    check_shape,
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
    "SUPPORTED_ACTIVATIONS",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "run_activation",
    "silu_and_mul",
]

#: The activations ``run_activation`` takes by name.
SUPPORTED_ACTIVATIONS = {"silu", "gelu", "gelu_tanh"}

# activation name -> (op name, C++ enumerator)
_OPS = {
    "silu": ("silu_and_mul", "GatedActivation::kSilu"),
    "gelu": ("gelu_and_mul", "GatedActivation::kGelu"),
    "gelu_tanh": ("gelu_tanh_and_mul", "GatedActivation::kGeluTanh"),
}


# ---------------------------------------------------------------------------------------------
# Modules: one per op and dtype, exporting that op alone (its launcher instantiates the kernels of
# each vector width for its activation; the width is a runtime choice among them).
# ---------------------------------------------------------------------------------------------
def _load_gated_module(op: str, dtype: torch.dtype) -> Module:
    """Compile (first use) or load the module of ``op`` for ``dtype``: one export, ``op``."""
    args = make_cpp_args(dtype)
    return load_jit(
        op,
        *args,
        cuda_files=["elementwise/activation.cuh"],
        cuda_wrappers=[(op, f"gated_act_and_mul<{args}, {_ENUMS[op]}>")],
    )


# op name -> C++ enumerator of its activation
_ENUMS = {op: enum for op, enum in _OPS.values()}


@cache_once
def _jit_silu_and_mul_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the ``silu_and_mul`` module for ``dtype``."""
    return _load_gated_module("silu_and_mul", dtype)


@cache_once
def _jit_gelu_and_mul_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the ``gelu_and_mul`` module for ``dtype``."""
    return _load_gated_module("gelu_and_mul", dtype)


@cache_once
def _jit_gelu_tanh_and_mul_module(dtype: torch.dtype) -> Module:
    """Compile (first use) and cache the ``gelu_tanh_and_mul`` module for ``dtype``."""
    return _load_gated_module("gelu_tanh_and_mul", dtype)


# op name -> its module builder
_BUILDERS: dict[str, Callable[[torch.dtype], Module]] = {
    "silu_and_mul": _jit_silu_and_mul_module,
    "gelu_and_mul": _jit_gelu_and_mul_module,
    "gelu_tanh_and_mul": _jit_gelu_tanh_and_mul_module,
}

# The exported functions by op and dtype, filled when an op's module is loaded: the eager fast path
# is one dict lookup (a dtype missing here takes the checked path, which loads the module).
_FNS: dict[str, dict[torch.dtype, Callable[..., None]]] = {op: {} for op, _ in _OPS.values()}


def _load(op: str, dtype: torch.dtype) -> Callable[..., None]:
    """``op``'s exported function for ``dtype`` (its module compiled on first use), registered above."""
    fn = getattr(_BUILDERS[op](dtype), op)
    _FNS[op][dtype] = fn
    return fn


def _input_rows(input: torch.Tensor) -> torch.Tensor:
    """``[..., 2H]`` -> ``[num_tokens, 2H]``: a view when the leading dims flatten to one row stride,
    else a copy (``reshape``; the input is only read)."""
    return input if input.dim() == 2 else input.reshape(-1, input.shape[-1])


def _out_rows(op: str, out: torch.Tensor) -> torch.Tensor:
    """``[..., H]`` -> ``[num_tokens, H]``, always a view of ``out`` (the kernel writes through it)."""
    if out.dim() != 2:
        try:
            return out.view(-1, out.shape[-1])
        except VIEW_ERRORS:
            fail(
                RuntimeError,
                op,
                "out",
                "layout",
                "leading dims that flatten to one row stride (a view as [num_tokens, hidden_size])",
                f"shape {tuple(out.shape)} with strides {out.stride()}",
            )
    return out


def _launch(
    op: str, out: torch.Tensor, input: torch.Tensor, expert_ids: torch.Tensor | None, expert_step: int, enable_pdl: int
) -> None:
    fn = _FNS[op].get(input.dtype) or _load(op, input.dtype)
    with launcher_errors(op):  # the launcher's exact overlap checks, named for the op
        fn(_out_rows(op, out), _input_rows(input), expert_ids, expert_step, enable_pdl)


# ---------------------------------------------------------------------------------------------
# torch.library ops (used under torch.compile; eager calls go straight to the module)
# ---------------------------------------------------------------------------------------------
def _define_library_op(op: str) -> None:
    @torch.library.custom_op(f"sglang_jit_kernel::{op}_out", mutates_args=("out",), device_types="cuda")
    def library_op(
        out: torch.Tensor, input: torch.Tensor, expert_ids: torch.Tensor | None, expert_step: int, enable_pdl: int
    ) -> None:
        _launch(op, out, input, expert_ids, expert_step, enable_pdl)

    @library_op.register_fake
    def _(
        out: torch.Tensor, input: torch.Tensor, expert_ids: torch.Tensor | None, expert_step: int, enable_pdl: int
    ) -> None:
        return None


for _op, _ in _OPS.values():
    _define_library_op(_op)
# op name -> its torch.library op (resolved once: a plain dict lookup while torch.compile traces)
_LIBRARY_OPS = {op: getattr(torch.ops.sglang_jit_kernel, f"{op}_out") for op, _ in _OPS.values()}


# ---------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------
# The fast eager path covers the common case (a 2-D CUDA input of an already loaded dtype): a dict
# lookup and the FFI call, every check done once by the launcher's TensorMatcher (a RuntimeError
# before any launch). Anything else (first call of a dtype, other ranks, torch.compile tracing, bad
# input) takes the checked path: the same checks in Python, naming the argument, then the module or
# the torch.library op.
def _gated(
    op: str,
    input: torch.Tensor,
    out: torch.Tensor | None,
    expert_ids: torch.Tensor | None,
    expert_step: int,
    enable_pdl: bool | None,
) -> torch.Tensor:
    pdl = -1 if enable_pdl is None else int(enable_pdl is True)
    if not tracing():
        try:
            fn = _FNS[op].get(input.dtype) if input.is_cuda and input.dim() == 2 else None
        except AttributeError:  # not a tensor: the checked path raises TypeError
            fn = None
        if (
            fn is not None
            and type(expert_step) is int
            and (enable_pdl is None or enable_pdl is True or enable_pdl is False)
        ):
            result = input.new_empty((input.shape[0], input.shape[1] // 2)) if out is None else out
            try:
                fn(result, input, expert_ids, expert_step, pdl)
                return result
            except FAST_PATH_REFUSALS:  # raised before any launch: the checked path names the argument
                pass
    return _gated_checked(op, input, out, expert_ids, expert_step, enable_pdl, pdl)


def _gated_checked(
    op: str,
    input: torch.Tensor,
    out: torch.Tensor | None,
    expert_ids: torch.Tensor | None,
    expert_step: int,
    enable_pdl: bool | None,
    pdl: int,
) -> torch.Tensor:
    compiling = tracing()
    check_tensor(op, "input", input, dtypes=FLOAT_DTYPES, last_dim_contiguous=True)
    width = input.shape[-1]
    if width % 2 != 0:
        fail(RuntimeError, op, "input", "last dim", "even (2 * hidden_size)", width)
    hidden_size = width // 2
    out_shape = (*input.shape[:-1], hidden_size)
    check_scalar(op, "expert_step", expert_step, int, minimum=1, maximum=INT64_MAX)
    check_scalar(op, "enable_pdl", enable_pdl, bool, optional=True)
    if out is None:
        out = torch.empty(out_shape, dtype=input.dtype, device=input.device)
    else:
        check_tensor(op, "out", out, dtype_as=(input, "input"), last_dim_contiguous=True)
        if tuple(out.shape) != out_shape:
            fail(
                RuntimeError,
                op,
                "out",
                "shape",
                f"{out_shape} (the shape of input with the last dim halved)",
                tuple(out.shape),
            )
        if not compiling:  # data pointers do not exist while tracing; the launcher checks again
            # dense_only where the launcher sees input itself (not a flattening copy of it)
            check_no_partial_overlap(op, "out", out, input, "input", allow_same=False, dense_only=rows_are_views(input))
    num_tokens = out.numel() // hidden_size if hidden_size else 0
    if expert_ids is not None:
        check_tensor(op, "expert_ids", expert_ids, dtypes=(torch.int32,), device_as=(input, "input"), contiguous=True)
        check_shape(op, "expert_ids", expert_ids, [("num_expert_ids", None)])
        needed = -(-num_tokens // expert_step)
        if expert_ids.shape[0] < needed:
            fail(
                RuntimeError,
                op,
                "expert_ids",
                "length",
                f">= {needed} (ceil(num_tokens / expert_step) = ceil({num_tokens} / {expert_step}))",
                expert_ids.shape[0],
            )
        if not compiling:
            check_no_partial_overlap(op, "out", out, expert_ids, "expert_ids", allow_same=False, dense_only=True)
    if num_tokens == 0:
        return out
    if compiling:  # the op checks the layout of out when it runs (the launcher's TensorMatcher)
        _LIBRARY_OPS[op](out, input, expert_ids, expert_step, pdl)
        return out
    rows = _out_rows(op, out)
    if num_tokens > 1 and abs(rows.stride(0)) < hidden_size:
        fail(
            RuntimeError,
            op,
            "out",
            "row stride",
            f">= hidden_size = {hidden_size} (rows that do not overlap)",
            rows.stride(0),
        )
    _launch(op, out, input, expert_ids, expert_step, pdl)
    return out


_DOC_COMMON = """
    The activation is computed in fp32 from ``g = input[..., i]`` and rounded to the dtype; that value
    is multiplied by ``u = input[..., H + i]`` in fp32 and rounded again::

        out[..., i] = round(float(round(act(float(g)))) * float(u)),   H = input.shape[-1] // 2

    (torch's ``act(x[..., :H]) * x[..., H:]`` on tensors of the dtype). The fp32 arithmetic is done
    operation by operation as written in the summary line above, without fused multiply-adds, with
    libm's ``expf`` / ``erff`` / ``tanhf``. Exception, for speed: float16 / bfloat16 launches on 16-byte
    vectors (aligned rows, beyond decode sizes, where the kernel narrows its vectors) take ``exp``
    and the reciprocal from the hardware approximations (ex2.approx, rcp.approx): ``silu`` as written
    (no branch), ``gelu_tanh`` and ``gelu`` as
    ``g * sigmoid(z)`` (``0.5 * (1 + tanh(y)) = sigmoid(2y)``; gelu's ``z = logit(Phi(g))`` by a
    polynomial fit). The activation rounded to the dtype is then the same except next to a rounding
    midpoint, where it may be its neighbour (one ulp of the dtype), or, for gelu / gelu_tanh gates
    near -3 where the fp32 formula's ``1 + erf`` / ``1 + tanh`` cancels, the rounding of the exact
    (float64) activation; the tests check every 16-bit gate. Moves
    ``3 * num_tokens * H * element_size`` bytes; a row skipped by the expert filter only its id.

    Parameters
    ----------
    input : torch.Tensor
        ``[..., 2 * H]`` CUDA tensor, float16 / bfloat16 / float32, on any device index; ``H >= 1``
        (any size: vectorised when the pointers and row strides allow, narrower accesses otherwise).
        The leading dims are flattened to ``num_tokens`` rows: they may be strided (e.g. a column
        slice of a wider buffer is read in place); leading dims that do not flatten to one row stride
        are copied first. The last dim must be contiguous. Not modified.
    out : torch.Tensor, optional
        ``[..., H]`` (the shape of ``input`` with the last dim halved), same dtype and device, last
        dim contiguous, leading dims flattening to one row stride; must share no memory with
        ``input`` nor ``expert_ids``. Allocated (contiguous) when omitted.
    expert_ids : torch.Tensor, optional
        MoE filter: int32 ``[num_expert_ids]``, contiguous, on the device of ``input``, with
        ``num_expert_ids >= ceil(num_tokens / expert_step)`` (``num_tokens // expert_step`` when
        ``expert_step`` divides ``num_tokens``). Row ``t`` is computed only when
        ``expert_ids[t // expert_step] != -1``; otherwise ``out[t]`` is left untouched.
    expert_step : int
        Rows per expert id, ``>= 1``. Default 1. Only used with ``expert_ids`` (still type- and
        range-checked without it).
    enable_pdl : bool, optional
        Keyword-only. Programmatic Dependent Launch; None means on when the GPU is SM90+. Results do
        not depend on it.

    Returns
    -------
    torch.Tensor
        ``out`` (the same object when given), shape ``[..., H]``, the dtype of ``input``. With 0 rows
        nothing is launched.

    Raises
    ------
    TypeError
        If ``input``, ``out`` or ``expert_ids`` is not a tensor, ``expert_step`` not an int or
        ``enable_pdl`` not None / a bool.
    ValueError
        If ``expert_step < 1`` or past int64.
    RuntimeError
        Before any launch, naming the argument (``<op>: <arg> <what>: expected X, got Y``): not on a
        CUDA device, an unsupported or mismatched dtype, an odd last dim of ``input``, ``out`` of
        another shape or device, a last dim that is not contiguous, ``out`` leading dims that do not
        flatten, overlapping ``out`` rows, ``out`` sharing memory with ``input`` or ``expert_ids``,
        ``expert_ids`` not int32, not 1-D and contiguous, too short or on another device.
"""


def silu_and_mul(
    input: torch.Tensor,
    out: torch.Tensor | None = None,
    expert_ids: torch.Tensor | None = None,
    expert_step: int = 1,
    *,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    return _gated("silu_and_mul", input, out, expert_ids, expert_step, enable_pdl)


def gelu_and_mul(
    input: torch.Tensor,
    out: torch.Tensor | None = None,
    expert_ids: torch.Tensor | None = None,
    expert_step: int = 1,
    *,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    return _gated("gelu_and_mul", input, out, expert_ids, expert_step, enable_pdl)


def gelu_tanh_and_mul(
    input: torch.Tensor,
    out: torch.Tensor | None = None,
    expert_ids: torch.Tensor | None = None,
    expert_step: int = 1,
    *,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    return _gated("gelu_tanh_and_mul", input, out, expert_ids, expert_step, enable_pdl)


silu_and_mul.__doc__ = (
    "SiLU-gated product: ``out = round(silu(gate)) * up``, ``silu(g) = g / (1 + exp(-g))``.\n" + _DOC_COMMON
)
gelu_and_mul.__doc__ = (
    "GELU-gated product (exact erf form): ``out = round(gelu(gate)) * up``,\n"
    "    ``gelu(g) = (g * 0.5) * (1 + erf(g * 0.70710678))``.\n" + _DOC_COMMON
)
gelu_tanh_and_mul.__doc__ = (
    "GELU-gated product (tanh approximation): ``out = round(gelu_tanh(gate)) * up``,\n"
    "    ``gelu_tanh(g) = (0.5 * g) * (1 + tanh(0.7978845608 * (g + 0.044715 * (g * g * g))))``.\n" + _DOC_COMMON
)

_BY_NAME = {"silu": silu_and_mul, "gelu": gelu_and_mul, "gelu_tanh": gelu_tanh_and_mul}


def run_activation(
    op_name: str,
    input: torch.Tensor,
    out: torch.Tensor | None,
    expert_ids: torch.Tensor | None = None,
    expert_step: int = 1,
    *,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """The gated activation named ``op_name`` (one of ``SUPPORTED_ACTIVATIONS``): ``silu`` ->
    :func:`silu_and_mul`, ``gelu`` -> :func:`gelu_and_mul`, ``gelu_tanh`` -> :func:`gelu_tanh_and_mul`.

    Parameters
    ----------
    op_name : str
        ``"silu"``, ``"gelu"`` or ``"gelu_tanh"``.
    input, out, expert_ids, expert_step, enable_pdl
        As for :func:`silu_and_mul` (``out`` may be None: allocated).

    Returns
    -------
    torch.Tensor
        ``out``.

    Raises
    ------
    ValueError
        If ``op_name`` is not one of ``SUPPORTED_ACTIVATIONS`` (``run_activation: op_name value:
        expected one of gelu, gelu_tanh, silu, got 'relu'``); otherwise as the op.
    """
    fn = _BY_NAME.get(op_name) if isinstance(op_name, str) else None
    if fn is None:
        fail(
            ValueError,
            "run_activation",
            "op_name",
            "value",
            f"one of {', '.join(sorted(SUPPORTED_ACTIVATIONS))}",
            repr(op_name),
        )
    return fn(input, out, expert_ids, expert_step, enable_pdl=enable_pdl)


# ---------------------------------------------------------------------------------------------
# Reference and registration: each op its own module per dtype; `check` runs one case each.
# ---------------------------------------------------------------------------------------------
def activation_reference(name: str, gate: torch.Tensor) -> torch.Tensor:
    """``act(float(gate))`` in fp32 with torch ops, each rounded as the kernel rounds it (fp32)."""
    g = gate.float()
    if name == "silu":
        return g / (1 + torch.exp(-g))
    if name == "gelu":
        return (g * 0.5) * (1 + torch.erf(g * 0.7071067811865476))
    return (0.5 * g) * (1 + torch.tanh(0.7978845608 * (g + 0.044715 * (g * g * g))))


def gated_reference(name: str, input: torch.Tensor) -> torch.Tensor:
    """The op's fp32 reference from the same inputs: ``round(float(round(act(g))) * float(u))``."""
    h = input.shape[-1] // 2
    act = activation_reference(name, input[..., :h]).to(input.dtype)
    return (act.float() * input[..., h:].float()).to(input.dtype)


_CHECK_TOKENS, _CHECK_HIDDEN = 2048, 14336


def _check_cases(name: str) -> Callable[[], list[CheckCase]]:
    fn = _BY_NAME[name]

    def cases() -> list[CheckCase]:
        t, h = _CHECK_TOKENS, _CHECK_HIDDEN

        def make() -> tuple:
            x = torch.randn(t, 2 * h, dtype=torch.bfloat16, device="cuda")
            return x, torch.empty(t, h, dtype=torch.bfloat16, device="cuda")

        return [
            CheckCase(
                label=f"[{t}, 2 x {h}] bf16",
                make_inputs=make,
                call=lambda x, o: fn(x, o),
                reference=lambda x, o: gated_reference(name, x),
                bytes_moved=3 * t * h * 2,  # read gate and up, write out
                dtype=torch.bfloat16,
                # two ulps (twice testing.TOLERANCE[bfloat16]): the rounded activation may be its
                # neighbour next to a rounding midpoint (the 16-byte fast kernels), and the product
                # with up carries that to 2 ulps of out
                tolerance=(1.6e-2, 1e-5),
            )
        ]

    return cases


for _name, (_op, _) in _OPS.items():
    register_op(_op, build=_BUILDERS[_op], variants=[(d,) for d in FLOAT_DTYPES], check_cases=_check_cases(_name))
