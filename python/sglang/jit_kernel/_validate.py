"""The argument checks of every op wrapper: one vocabulary, one message format.

Every failure reads ``<op>: <arg> <what>: expected X, got Y`` and is raised before any launch:

* ``TypeError``: not a tensor, or a scalar of the wrong type (``scale: factor type: expected a real
  number (int or float), got str``);
* ``ValueError``: a scalar out of range (``rmsnorm: eps value: expected >= 0, got -1.0``);
* ``IndexError``: with ``SGLANG_JIT_CHECK_INDICES=1``, an index outside its tensor
  (:func:`check_indices`);
* ``RuntimeError``: a tensor on the wrong device, of the wrong dtype, shape or layout, or overlapping
  another (``rmsnorm: weight dtype: expected bfloat16 (the dtype of input), got float16``).

The checks are plain attribute tests and build their message only on failure, so a wrapper's checked
path stays cheap; the eager fast paths of the ops skip them and rely on the C++ launcher's
``TensorMatcher``, falling back to these checks to explain a refusal.

Usage in a wrapper::

    check_tensor("rmsnorm", "input", input, dtypes=FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("rmsnorm", "weight", weight, dtype_as=(input, "input"), dims=[("hidden_size", h)])
    check_scalar("rmsnorm", "eps", eps, float, minimum=0.0)
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

import torch

from sglang.jit_kernel._build import env_flag

__all__ = [
    "FAST_PATH_REFUSALS",
    "FLOAT_DTYPES",
    "INDEX_DTYPES",
    "INT64_MAX",
    "INT64_MIN",
    "VIEW_ERRORS",
    "check_contiguous",
    "check_cuda",
    "check_dtype",
    "check_dtype_as",
    "check_finite_float32",
    "check_indices",
    "check_last_dim_contiguous",
    "check_no_partial_overlap",
    "check_same_device",
    "check_scalar",
    "check_shape",
    "check_shape_as",
    "check_tensor",
    "dtype_name",
    "fail",
    "launcher_errors",
    "prepare_elementwise_out",
    "rows_are_views",
    "share_bytes",
    "type_name",
    "unit_last_stride",
]

#: The floating dtypes most ops take.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The dtypes of index tensors (positions, slot mappings, expert ids).
INDEX_DTYPES = (torch.int32, torch.int64)
#: The range of an int scalar the launchers take (int64_t).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: What ``Tensor.view`` raises for a shape its strides cannot give without a copy: RuntimeError on
#: real tensors, ValueError on the fake tensors of tracing (torch.compile, FakeTensorMode).
VIEW_ERRORS = (RuntimeError, ValueError)
_FAKE_MODE_KEY = torch._C._TorchDispatchModeKey.FAKE
_active_dispatch_mode = torch._C._get_dispatch_mode


def tracing() -> bool:
    """True while torch.compile / torch.export trace, or while a ``FakeTensorMode`` is active (shape
    propagation outside dynamo): the tensors are fake, with no data pointers. The ops then take their
    ``torch.library`` path, whose fake implementation runs instead of a launch, and skip the checks
    that read data pointers or values (the launcher makes them when the op really runs). A tracer
    over real tensors (``make_fx`` in its "real" mode) is not seen: the op runs, unrecorded."""
    return torch.compiler.is_compiling() or _active_dispatch_mode(_FAKE_MODE_KEY) is not None


#: What an eager fast path (a loaded launcher called directly) may raise before any launch: the
#: launcher's checks and the FFI's argument conversion (OverflowError included, which converting a
#: Python int may raise). The wrapper catches these and runs its checked path, whose error names
#: the argument.
FAST_PATH_REFUSALS = (TypeError, ValueError, RuntimeError, OverflowError)

# A dim spec: (name, size) pins the size, (name, None) accepts any size and only names the dim.
DimSpec = tuple[str, "int | None"]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).replace("torch.", "")


def _names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


def type_name(value: object) -> str:
    """The type of ``value`` for a message: ``float``, ``NoneType`` for built-ins; module-qualified
    otherwise (``numpy.bool``, ``torch.Tensor``), so a foreign type is not mistaken for a built-in
    one of the same name."""
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def fail(error: type[Exception], op: str, arg: str, what: str, expected: object, got: object) -> NoReturn:
    """Raise ``error("<op>: <arg> <what>: expected <expected>, got <got>")``; the one formatter."""
    raise error(f"{op}: {arg} {what}: expected {expected}, got {got}")


def _layout(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)} with strides {tensor.stride()}"


def check_cuda(op: str, arg: str, tensor: object) -> None:
    """TypeError unless ``tensor`` is a ``torch.Tensor``; RuntimeError unless it is on a CUDA device."""
    if not isinstance(tensor, torch.Tensor):
        fail(TypeError, op, arg, "type", "a torch.Tensor", type_name(tensor))
    if not tensor.is_cuda:
        fail(RuntimeError, op, arg, "device", "a CUDA device", tensor.device)


def check_dtype(op: str, arg: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    """RuntimeError unless ``tensor.dtype`` is one of ``allowed``."""
    if tensor.dtype not in allowed:
        expected = dtype_name(allowed[0]) if len(allowed) == 1 else f"one of {_names(allowed)}"
        fail(RuntimeError, op, arg, "dtype", expected, dtype_name(tensor.dtype))


def check_dtype_as(op: str, arg: str, tensor: torch.Tensor, ref: torch.Tensor, ref_arg: str) -> None:
    """RuntimeError unless ``tensor`` has the dtype of ``ref`` (the argument ``ref_arg``)."""
    if tensor.dtype != ref.dtype:
        fail(
            RuntimeError,
            op,
            arg,
            "dtype",
            f"{dtype_name(ref.dtype)} (the dtype of {ref_arg})",
            dtype_name(tensor.dtype),
        )


def check_same_device(op: str, arg: str, tensor: torch.Tensor, ref: torch.Tensor, ref_arg: str) -> None:
    """RuntimeError unless ``tensor`` is on the device of ``ref`` (device type and index)."""
    if tensor.device != ref.device:
        fail(RuntimeError, op, arg, "device", f"{ref.device} (the device of {ref_arg})", tensor.device)


def check_shape(op: str, arg: str, tensor: torch.Tensor, dims: Sequence[DimSpec]) -> None:
    """RuntimeError unless ``tensor`` has ``len(dims)`` dims with the pinned sizes.

    ``dims`` names each dim: ``[("num_tokens", None), ("hidden_size", 4096)]`` reads in a message as
    ``[num_tokens, hidden_size=4096]``.
    """
    shape = tensor.shape
    if len(shape) == len(dims) and all(size is None or shape[i] == size for i, (_, size) in enumerate(dims)):
        return
    spec = ", ".join(name if size is None else f"{name}={size}" for name, size in dims)
    fail(RuntimeError, op, arg, "shape", f"[{spec}]", tuple(shape))


def check_shape_as(op: str, arg: str, tensor: torch.Tensor, ref: torch.Tensor, ref_arg: str) -> None:
    """RuntimeError unless ``tensor`` has the shape of ``ref`` (the argument ``ref_arg``), e.g.
    ``rmsnorm: out shape: expected (4, 64) (the shape of input), got (4, 32)``."""
    if tensor.shape != ref.shape:
        fail(RuntimeError, op, arg, "shape", f"{tuple(ref.shape)} (the shape of {ref_arg})", tuple(tensor.shape))


def check_last_dim_contiguous(op: str, arg: str, tensor: torch.Tensor) -> None:
    """RuntimeError unless ``tensor`` is at least 1-D and its last dim has stride 1 (a size-1 last dim
    has no stride to respect); the other strides are free."""
    if tensor.dim() == 0:
        fail(RuntimeError, op, arg, "dims", "at least 1", "a 0-d tensor")
    if tensor.stride(-1) != 1 and tensor.shape[-1] > 1:
        fail(
            RuntimeError,
            op,
            arg,
            "last-dim stride",
            "1 (a contiguous last dim)",
            f"{tensor.stride(-1)} ({_layout(tensor)})",
        )


def check_contiguous(op: str, arg: str, tensor: torch.Tensor) -> None:
    """RuntimeError unless ``tensor`` is contiguous."""
    if not tensor.is_contiguous():
        fail(RuntimeError, op, arg, "layout", "contiguous", _layout(tensor))


def _byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """``[first, last)`` bytes that ``tensor``'s elements can touch (empty tensors span nothing)."""
    if tensor.numel() == 0:
        return 0, 0
    start = tensor.data_ptr()
    extent = sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
    return start, start + (extent + 1) * tensor.element_size()


def _is_dense(tensor: torch.Tensor, span: tuple[int, int]) -> bool:
    """Whether ``tensor``'s elements fill its byte span (contiguous, or a permutation of a contiguous
    layout): then two such views share a byte exactly when their spans intersect."""
    return tensor.numel() * tensor.element_size() == span[1] - span[0]


def check_no_partial_overlap(
    op: str,
    arg: str,
    out: torch.Tensor,
    ref: torch.Tensor,
    ref_arg: str,
    allow_same: bool = True,
    *,
    dense_only: bool = False,
) -> None:
    """RuntimeError if the bytes spanned by ``out`` and ``ref`` intersect, unless (with ``allow_same``)
    ``out`` is exactly the view ``ref`` (same pointer, shape, element size and strides of the dims
    longer than 1: an in-place call).

    The message names both byte spans, in the words of the C++ launchers' exact check
    (``verify_no_partial_overlap``):
    ``rmsnorm: out overlaps input: expected disjoint memory or the same tensor, got a partial overlap
    (out [0x7f0000000010, 0x7f0000008010), input [0x7f0000000000, 0x7f0000008000))``;
    ``... expected disjoint memory, got the same tensor (...)`` when ``allow_same`` is False.

    The test is on byte spans, exact for dense tensors and conservative for interleaved strided views
    (two disjoint column slices of one buffer are refused: ``got overlapping byte ranges (...)``).
    ``dense_only=True`` raises only where it is exact (both views dense, or the same view) and leaves
    every other intersecting pair to the launcher's exact element test: for ops whose launchers accept
    interleaved views (q and k of a fused qkv buffer, strided rows). Skipped while tracing
    (``tracing()``: no data pointers then): the launcher's own overlap test runs at call time.
    """
    if tracing():
        return  # data pointers do not exist while tracing; the launcher checks overlap when the op runs
    a0, a1 = _byte_span(out)
    b0, b1 = _byte_span(ref)
    if a0 >= b1 or b0 >= a1:
        return
    same = (
        out.data_ptr() == ref.data_ptr()
        and out.shape == ref.shape
        # size-1 dims address nothing: their strides may differ (as in the launchers' test)
        and all(a == b for a, b, n in zip(out.stride(), ref.stride(), out.shape) if n != 1)
        and out.element_size() == ref.element_size()  # views of one buffer as types of other widths differ
    )
    if same and allow_same:
        return
    dense = _is_dense(out, (a0, a1)) and _is_dense(ref, (b0, b1))
    if dense_only and not same and not dense:
        return  # interleaved or strided views: the launcher decides element by element
    expected = "disjoint memory or the same tensor" if allow_same else "disjoint memory"
    # Strided views whose byte ranges intersect may still interleave without sharing an element.
    what = "the same tensor" if same else "a partial overlap" if dense else "overlapping byte ranges"
    fail(
        RuntimeError,
        op,
        arg,
        f"overlaps {ref_arg}",
        expected,
        f"{what} ({arg} [{a0:#x}, {a1:#x}), {ref_arg} [{b0:#x}, {b1:#x}))",
    )


def share_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether views ``a`` and ``b`` share a byte: exact for 2-D views of contiguous rows with one row
    stride in bytes (or a single row), conservative (their byte spans intersect) otherwise. For a
    wrapper that runs several ops whose launchers never see a pair of its tensors together."""
    a0, a1 = _byte_span(a)
    b0, b1 = _byte_span(b)
    if a0 >= b1 or b0 >= a1:
        return False
    if any(t.dim() != 2 or (t.shape[1] > 1 and t.stride(1) != 1) for t in (a, b)):
        return True
    strides = {t.stride(0) * t.element_size() for t in (a, b) if t.shape[0] > 1}
    if len(strides) != 1:
        return True  # two row strides: conservative; two single rows: their spans intersect (above)
    (stride,) = strides
    if stride <= 0:
        return True
    len_a, len_b = a.shape[1] * a.element_size(), b.shape[1] * b.element_size()
    d = b0 - a0
    # row i of a and row j of b share a byte iff -len_b < d + (j - i) * stride < len_a
    k_lo = max(-(a.shape[0] - 1), (-len_b - d) // stride + 1)
    k_hi = min(b.shape[0] - 1, -((d - len_a) // stride) - 1)
    return k_lo <= k_hi


def rows_are_views(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` reaches its launcher as a view of its own memory: a contiguous last dim
    (or one of size <= 1) and leading dims that flatten without a copy. Inputs that fail it are
    copied first, so the launcher's overlap test sees the copy: the wrappers then keep their own
    byte-range test for them (no ``dense_only``)."""
    if tensor.dim() == 0:
        return False
    if tensor.numel() == 0:
        return True  # nothing is launched
    if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        return False
    try:
        tensor.view(-1, tensor.shape[-1])
    except VIEW_ERRORS:
        return False
    return True


def unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with a last dim of size 1 given stride 1 (the same memory: that stride addresses
    nothing). torch leaves it free; the launchers' matchers require a contiguous last dim."""
    if tensor.dim() >= 1 and tensor.shape[-1] == 1 and tensor.stride(-1) != 1:
        return tensor.as_strided(tensor.shape, (*tensor.stride()[:-1], 1))
    return tensor


def check_no_self_overlap(op: str, arg: str, tensor: torch.Tensor) -> None:
    """RuntimeError unless every element of ``tensor`` (an output) has an address of its own: no dim of
    size > 1 with stride 0 (an expanded tensor), and each stride at least the extent of the dims with
    smaller strides (no overlapping rows). The C++ launchers' verify_no_self_overlap, with the op's
    argument name; an empty tensor passes. Skipped while tracing (``tracing()``: symbolic strides; the
    launcher checks when the op runs)."""
    if tensor.numel() == 0 or tracing():
        return
    dims = [(tensor.stride(d), tensor.shape[d], d) for d in range(tensor.dim()) if tensor.shape[d] > 1]
    for stride, size, d in dims:
        if stride == 0:
            fail(
                RuntimeError,
                op,
                arg,
                "strides",
                "no dim of size > 1 with stride 0 (elements at addresses of their own)",
                f"dim {d} of size {size} with stride 0 (an expanded tensor)",
            )
    extent = 1  # elements spanned by the dims with smaller strides
    for stride, size, d in sorted(dims):
        if stride < extent:
            fail(
                RuntimeError,
                op,
                arg,
                "strides",
                "elements at addresses of their own (each stride >= the extent of the dims with smaller strides)",
                f"dim {d} stride {stride} < extent {extent} of the dims with smaller strides",
            )
        extent += stride * (size - 1)


def check_tensor(
    op: str,
    arg: str,
    tensor: object,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    dtype_as: tuple[torch.Tensor, str] | None = None,
    device_as: tuple[torch.Tensor, str] | None = None,
    dims: Sequence[DimSpec] | None = None,
    shape_as: tuple[torch.Tensor, str] | None = None,
    last_dim_contiguous: bool = False,
    contiguous: bool = False,
) -> torch.Tensor:
    """The usual checks of one tensor argument, in a fixed order; returns ``tensor``.

    A CUDA tensor (always); then its dtype (one of ``dtypes``, or that of ``dtype_as = (ref,
    ref_arg)``); its device (that of ``device_as``, defaulting to the ``dtype_as`` reference); its
    shape (``dims``, see :func:`check_shape`, or that of ``shape_as = (ref, ref_arg)``); its layout
    (``contiguous``, or ``last_dim_contiguous``).

    Raises
    ------
    TypeError
        Not a tensor.
    RuntimeError
        Any other violation, as ``<op>: <arg> <what>: expected X, got Y``.
    """
    check_cuda(op, arg, tensor)
    assert isinstance(tensor, torch.Tensor)
    if dtypes is not None:
        check_dtype(op, arg, tensor, dtypes)
    if dtype_as is not None:
        check_dtype_as(op, arg, tensor, *dtype_as)
    device_ref = device_as if device_as is not None else dtype_as
    if device_ref is not None:
        check_same_device(op, arg, tensor, *device_ref)
    if dims is not None:
        check_shape(op, arg, tensor, dims)
    if shape_as is not None:
        check_shape_as(op, arg, tensor, *shape_as)
    if contiguous:
        check_contiguous(op, arg, tensor)
    elif last_dim_contiguous:
        check_last_dim_contiguous(op, arg, tensor)
    return tensor


_KIND_WORDS = {bool: "a bool", int: "an int", float: "a real number (int or float)"}
#: The largest finite float: a real-number scalar (``kind=float``) given as a larger int is refused,
#: since the wrappers and the FFI convert it with ``float()``.
_FLOAT_MAX = sys.float_info.max
#: The largest finite float32: the kernels take real-number parameters as float32.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def check_scalar(
    op: str,
    arg: str,
    value: object,
    kind: type = float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    optional: bool = False,
) -> None:
    """TypeError unless ``value`` is of ``kind`` (``bool``; ``int``, bools refused; ``float``, any int
    or float, bools refused), or None with ``optional``; ValueError unless it lies in
    ``[minimum, maximum]`` (``(minimum, maximum]`` with ``exclusive_minimum``). NaN is out of every
    range; with ``float``, so is an int past the float range (``float()`` would overflow)."""
    if value is None and optional:
        return
    if kind is bool:
        ok = isinstance(value, bool)
    else:
        ok = not isinstance(value, bool) and isinstance(value, (int,) if kind is int else (int, float))
    if not ok:
        word = _KIND_WORDS.get(kind, kind.__name__)
        fail(TypeError, op, arg, "type", f"{word}{' or None' if optional else ''}", type_name(value))
    if kind is float and isinstance(value, int) and abs(value) > _FLOAT_MAX:  # float(value) would overflow
        fail(ValueError, op, arg, "value", "a real number in the float range", f"an int of {value.bit_length()} bits")
    if minimum is None and maximum is None:
        return
    assert isinstance(value, (int, float))
    low_ok = minimum is None or (value > minimum if exclusive_minimum else value >= minimum)
    high_ok = maximum is None or value <= maximum
    if not (low_ok and high_ok):  # NaN fails both comparisons
        parts = []
        if minimum is not None:
            parts.append(f"{'>' if exclusive_minimum else '>='} {minimum}")
        if maximum is not None:
            parts.append(f"<= {maximum}")
        fail(ValueError, op, arg, "value", " and ".join(parts), value)


def check_finite_float32(op: str, arg: str, value: float) -> None:
    """ValueError unless the real number ``value`` (``check_scalar`` first) stays finite as the float32
    the kernel takes: NaN and inf are refused (``expected a finite number``), and so is a magnitude
    past ``FLOAT32_MAX``, which the conversion would turn into inf. A symbolic value (``torch.SymInt`` /
    ``SymFloat`` while tracing with dynamic shapes) is not checked: it has no value yet."""
    if not isinstance(value, (int, float)):
        return  # symbolic while tracing: the launcher's own check runs at call time
    # ints are finite: only their magnitude is checked (a comparison dynamo traces symbolically)
    if isinstance(value, float) and not math.isfinite(value):
        fail(ValueError, op, arg, "value", "a finite number", value)
    if abs(value) > FLOAT32_MAX:
        fail(ValueError, op, arg, "value", f"a magnitude of at most {FLOAT32_MAX:.8g} (float32)", value)


def check_static_scale(
    op: str, arg: str, scale: object, inv_arg: str, inv_scale: object, device_as: tuple[torch.Tensor, str]
) -> None:
    """The two forms of a static per-tensor quantization scale (store_cache_quant, the fp8 KV store of
    apply_rope_inplace_with_kvcache): ``scale`` None or one float32 on the device of ``device_as``
    (``[1]`` or 0-d), and ``inv_scale`` a real number, 1.0 when ``scale`` is given (one of the two).

    Raises
    ------
    TypeError
        ``scale`` neither None nor a tensor; ``inv_scale`` not a real number.
    ValueError
        ``inv_scale`` other than 1.0 with ``scale`` given.
    RuntimeError
        ``scale`` not float32, not on that device, or not one element.
    """
    check_scalar(op, inv_arg, inv_scale, float)
    if scale is None:
        return
    check_tensor(op, arg, scale, dtypes=(torch.float32,), device_as=device_as)
    assert isinstance(scale, torch.Tensor)
    if scale.numel() != 1 or scale.dim() > 1:
        fail(RuntimeError, op, arg, "shape", "[1] or [] (one float32 on the device)", tuple(scale.shape))
    if inv_scale != 1.0:
        fail(ValueError, op, inv_arg, "value", f"1.0 (the default) when {arg} is given", inv_scale)


def prepare_elementwise_out(
    op: str, src: torch.Tensor, out: torch.Tensor | None, src_arg: str = "src"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, out)`` for an element-wise op: ``src`` made contiguous (a copy if it was not); ``out``
    allocated like it, or checked to match it (shape, dtype, device), be contiguous and either be
    ``src`` itself or share no memory with it."""
    if not src.is_contiguous():
        src = src.contiguous()
    if out is None:
        return src, torch.empty_like(src)
    check_tensor(op, "out", out, dtype_as=(src, src_arg), contiguous=True)
    if out.shape != src.shape:
        fail(RuntimeError, op, "out", "shape", f"{tuple(src.shape)} (the shape of {src_arg})", tuple(out.shape))
    check_no_partial_overlap(op, "out", out, src, src_arg)
    return src, out


#: Set to 1 to make every op that takes slot or position indices check them on the host first.
CHECK_INDICES_ENV = "SGLANG_JIT_CHECK_INDICES"


def check_indices_enabled() -> bool:
    """True when ``SGLANG_JIT_CHECK_INDICES`` is 1/true/yes/on (any case): the index ops' host-side
    checks run (check_index_range and the ops' own). Read per call, so a test or a debugging session
    may set it at any time."""
    return env_flag(CHECK_INDICES_ENV)


def check_indices(
    op: str, arg: str, indices: torch.Tensor, size: int, *, skip_value: int | None = -1, dim_name: str = "size"
) -> None:
    """With ``SGLANG_JIT_CHECK_INDICES=1``: IndexError naming the first entry of ``indices`` outside
    ``[0, size)`` (other than ``skip_value``, which the op documents as skipped); otherwise nothing.

    The kernels never write out of bounds for such an index (they skip it); this check is for finding
    the caller's bug. It reads the indices on the host, so it synchronises the stream, and it is left
    out while the current stream is capturing a CUDA graph (no host read is possible there) and while
    tracing (``tracing()``; fake tensors: the op's torch.library body checks when it runs). The
    message reads ``store_cache: indices value: expected entries in [0, 64) (num_slots) or -1
    (skipped), got 70 at position 3``.
    """
    if not check_indices_enabled() or indices.numel() == 0 or tracing():
        return
    if indices.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    flat = indices.reshape(-1)
    bad = (flat < 0) | (flat >= size)
    if skip_value is not None:
        bad &= flat != skip_value
    if not bool(bad.any()):
        return
    first = int(bad.nonzero()[0, 0])
    value = int(flat[first])
    if indices.dim() > 1:
        position = tuple(int(i) for i in torch.unravel_index(torch.tensor(first), indices.shape))
    else:
        position = first
    allowed = f"entries in [0, {size}) ({dim_name})" + (f" or {skip_value} (skipped)" if skip_value is not None else "")
    fail(IndexError, op, arg, "value", allowed, f"{value} at position {position}")


@contextlib.contextmanager
def launcher_errors(op: str, names: dict[str, str] | None = None) -> Iterator[None]:
    """Prefix ``<op>: `` to a RuntimeError the C++ launcher raises inside the block (and, with
    ``names``, rename the launcher's argument names in the ``<arg> <what>`` head to the op's).

    The launcher's checks that Python does not repeat (exact memory overlap of interleaved views,
    expanded outputs) read ``<arg> <what>: expected X, got Y`` without the op (``k overlaps q:
    expected disjoint memory, got a partial overlap (...)``, ``out strides: expected no dim of size >
    1 with stride 0 ...``); under this block the message starts like every other error of the op
    (``fused_inplace_qknorm: k overlaps q: ...``). Those checks run before any launch.
    """
    try:
        yield
    except RuntimeError as exc:
        text = str(exc)
        # the launchers' checks raise RuntimeError itself; a subclass (a build's JITCompileError,
        # torch.OutOfMemoryError) keeps its type and fields
        if type(exc) is not RuntimeError or text.startswith(f"{op}: "):
            raise
        if names:
            head, colon, rest = text.partition(":")
            head = " ".join(names.get(word, word) for word in head.split(" "))
            for name, new in names.items():  # the detail: "(out [0x..), a [0x..))", "(out has ...; a [..."
                for before in ("(", ", ", "; "):
                    rest = rest.replace(f"{before}{name} [", f"{before}{new} [")
                rest = rest.replace(f"({name} has ", f"({new} has ")
            text = head + colon + rest
        raise RuntimeError(f"{op}: {text}") from None
