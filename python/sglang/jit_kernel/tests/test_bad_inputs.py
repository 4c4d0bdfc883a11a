"""Bad and awkward inputs against scale, add_constant and the norm ops, one pytest case each.

The rule under test (docs: OP_CHECKLIST "Bad input"): a bad input gets the exception type its op
documents, with a message that starts with ``<op>: <arg>``, raised before any launch -- every tensor
the caller passed is byte-identical afterwards and the CUDA context still runs work -- never a CUDA
fault or a silently wrong answer. Good but awkward inputs (odd sizes, unaligned and strided views,
empty tensors, NaN/inf, other devices, side streams, graphs) give the fp32 reference's answer
(``testing.TOLERANCE``), outputs placed inside poisoned buffers so that stray writes show. A few
corners the docstrings leave open ("either" cases: a requires-grad leaf, a bool factor, hidden sizes
past the kernel's limit) pass with the right answer or with the documented error naming the argument.

Norm cases run twice: ``cold`` clears norm.py's fast-path tables first (the Python-checked path),
``warm`` loads every dtype's module first (2-D inputs and any q go straight to the C++ launcher,
checked by its TensorMatcher). Every case synchronizes every device inside it, so an asynchronous
fault fails the case that caused it (a fault poisons the context: later cases fail too, the first
failure is the culprit). Cases on CPU tensors run without a GPU; the others skip with the reason.
Heavy cases (more than 2^31 elements, 9-70 GiB of GPU memory) run only with
``SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1`` and skip when that much memory is not free.
"""

from __future__ import annotations

import collections
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import sglang.jit_kernel.norm as norm
from sglang.jit_kernel.add_constant import add_constant
from sglang.jit_kernel.scale import scale
from sglang.jit_kernel.testing import (
    FLOAT_DTYPES,
    HAS_CUDA,
    TOLERANCE,
    assert_poison_intact,
    padded,
    poisoned,
    requires_cuda,
    requires_two_gpus,
)
from sglang.jit_kernel.utils import get_ci_test_range, should_run_full_tests
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=180, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=900, suite="nightly-kernel-1-gpu", nightly=True)

OPS: dict[str, Callable[..., Any]] = {
    "scale": scale,
    "add_constant": add_constant,
    "rmsnorm": norm.rmsnorm,
    "gemma_rmsnorm": norm.gemma_rmsnorm,
    "fused_add_rmsnorm": norm.fused_add_rmsnorm,
    "gemma_fused_add_rmsnorm": norm.gemma_fused_add_rmsnorm,
    "fused_inplace_qknorm": norm.fused_inplace_qknorm,
}
NORM_OPS = ("rmsnorm", "gemma_rmsnorm", "fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "fused_inplace_qknorm")
RMS_OFFSET = {"rmsnorm": 0.0, "gemma_rmsnorm": 1.0, "fused_add_rmsnorm": 0.0, "gemma_fused_add_rmsnorm": 1.0}

#: Messages of CUDA faults and internal errors (never a validation error).
FAULT = re.compile(
    r"illegal memory access|misaligned address|unspecified launch failure|device-side assert|"
    r"illegal instruction|CUDA error|cudaError|CUDA_ERROR|launch failure|invalid resource handle|"
    r"invalid device context|operation not permitted when stream is capturing",
    re.IGNORECASE,
)
GUARD = 64  # poisoned elements on each side of an output view
CHUNK = 1 << 26  # elements compared at a time in huge tensors
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

full_tests_only = pytest.mark.skipif(
    not should_run_full_tests(),
    reason="heavy case (> 2^31 elements, GiBs of GPU memory): runs with SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1",
)


# ---------------------------------------------------------------------------------------------
# The case table: one pytest case per (op, name[, mode])
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    fn: Callable[[], None]
    mode: str | None  # "cold" / "warm" for norm cases on a GPU
    mem_gib: int  # GPU memory the case needs free (heavy cases)

    def run(self) -> None:
        if self.mem_gib:
            torch.cuda.empty_cache()
            free = torch.cuda.mem_get_info(0)[0]
            if free < self.mem_gib << 30:
                pytest.skip(f"needs ~{self.mem_gib} GiB of free GPU memory, {free / 2**30:.1f} GiB free")
        torch.manual_seed(1234)
        if HAS_CUDA:
            torch.cuda.set_device(0)
        if self.mode == "cold":  # every fast-path table (_RMSNORM_FNS, ...): the next call takes the checked path
            for name, table in vars(norm).items():
                if name.startswith("_") and name.endswith("_FNS") and isinstance(table, dict):
                    table.clear()
        elif self.mode == "warm":
            for dtype in FLOAT_DTYPES:
                norm._load_rmsnorm(dtype), norm._load_fused_add_rmsnorm(dtype), norm._load_qknorm(dtype, False)
        try:
            self.fn()
        finally:
            if HAS_CUDA:
                torch.cuda.set_device(0)


CASES: dict[str, list] = collections.defaultdict(list)


def case(op: str, name: str, gpus: int = 1, mem_gib: int = 0) -> Callable:
    """Register ``fn`` as the case ``op/name``: needs ``gpus`` GPUs (0: CPU tensors only); norm
    cases on a GPU run in both modes; ``mem_gib`` > 0 marks a heavy case."""

    def register(fn: Callable[[], None]) -> Callable[[], None]:
        marks = [requires_cuda] if gpus else []
        if gpus >= 2:
            marks.append(requires_two_gpus)
        if mem_gib:
            marks.append(full_tests_only)
        modes = ("cold", "warm") if gpus and op in NORM_OPS else (None,)
        for mode in modes:
            case_id = name if mode is None else f"{name}-{mode}"
            assert case_id not in {p.id for p in CASES[op]}, f"duplicate case {op}/{case_id}"
            CASES[op].append(pytest.param(Case(fn, mode, mem_gib), id=case_id, marks=marks))
        return fn

    return register


# ---------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------
def sync_all() -> None:
    """Wait for every initialised device (an asynchronous fault surfaces here, in its case)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def assert_context_healthy() -> None:
    """Every initialised device still runs work (a fault would have poisoned its context)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            assert float(torch.full((4,), 2.0, device=f"cuda:{index}").sum()) == 8.0
            torch.cuda.synchronize(index)


def dense(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with the default strides. (``t.contiguous()`` returns ``t`` itself when only
    size-1 dims have odd strides, e.g. ``b[2::3][:1]``, and ``.view(torch.uint8)`` of that fails.)"""
    return torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t)


def _raw(t: torch.Tensor) -> torch.Tensor:
    return dense(t.detach()).reshape(-1).view(torch.uint8)


def snapshot(tensors: dict[str, Any]) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, tensor, bytes) of every tensor argument; meta tensors hold no data and are left out
    (torch.equal has no meta kernel): a case on them still asserts the error."""
    return [(name, t, _raw(t).clone()) for name, t in tensors.items() if isinstance(t, torch.Tensor) and not t.is_meta]


def changed(snaps: list[tuple[str, torch.Tensor, torch.Tensor]]) -> list[str]:
    """Names of the snapshotted tensors whose bytes changed (NaN-safe: bytes, not values)."""
    return [name for name, t, before in snaps if not torch.equal(_raw(t), before)]


def assert_unchanged(snaps: list[tuple[str, torch.Tensor, torch.Tensor]]) -> None:
    modified = changed(snaps)
    assert not modified, f"argument(s) {', '.join(modified)} modified (a launch before the check?)"


def assert_names(error: BaseException, exc, op: str, arg: str | tuple[str, ...]) -> None:
    """``error`` is an ``exc`` (a type or tuple) whose message starts with ``<op>: <arg>`` (any of
    ``arg`` if a tuple), and no CUDA fault."""
    message = str(error)
    assert not FAULT.search(message), f"CUDA fault / internal error, not a validation error: {message}"
    names = (arg,) if isinstance(arg, str) else arg
    wanted = exc.__name__ if isinstance(exc, type) else " or ".join(e.__name__ for e in exc)
    assert isinstance(error, exc), f"expected {wanted}, got {type(error).__name__}: {message}"
    pattern = rf"^{re.escape(op)}: (?:{'|'.join(map(re.escape, names))})\b"
    assert re.match(pattern, message), f"message does not start with '{op}: {'|'.join(names)}': {message}"


def expect_error(op: str, exc, arg: str | tuple[str, ...], args: tuple, kwargs: dict) -> BaseException:
    """``OPS[op](*args, **kwargs)`` raises ``exc`` naming ``arg`` before any launch: every tensor
    it was given is unchanged and the CUDA context is healthy. Returns the error."""
    fn = OPS[op]
    snaps = snapshot(inspect.signature(fn).bind(*args, **kwargs).arguments)
    try:
        fn(*args, **kwargs)
        sync_all()
    except Exception as error:  # noqa: BLE001 - judged below
        assert_names(error, exc, op, arg)
        raised = error
    else:
        pytest.fail(
            f"{op}: bad input accepted (expected {exc.__name__} naming {arg}); "
            f"modified: {', '.join(changed(snaps)) or 'nothing'}"
        )
    assert_unchanged(snaps)
    assert_context_healthy()
    return raised


def expect_result(
    call: Callable[[], Any], check: Callable[[], None], keep: dict[str, Any] | None = None, either: tuple | None = None
) -> None:
    """``call()`` succeeds, then ``check()``'s assertions hold and the tensors of ``keep`` (read-only
    arguments) are unchanged. ``either = (exc, op, arg)``: an undocumented corner, where that error
    (before any launch) is as good as the right answer."""
    snaps = snapshot(keep or {})
    try:
        call()
        sync_all()
    except Exception as error:  # noqa: BLE001 - judged below
        if either is None or FAULT.search(str(error)):
            raise
        assert_names(error, *either)
    else:
        check()
    assert_unchanged(snaps)
    assert_context_healthy()


def assert_matches(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` equals ``want`` within the dtype's tolerance; NaN where ``want`` is NaN, the same
    infinities; integers exactly. Huge tensors are compared in chunks."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
    if got.numel() > 2 * CHUNK:
        flat_got, flat_want = got.reshape(-1), want.reshape(-1)
        for lo in range(0, got.numel(), CHUNK):
            assert_matches(f"{name}[flat {lo}:+{CHUNK}]", flat_got[lo : lo + CHUNK], flat_want[lo : lo + CHUNK])
        return
    if got.numel() == 0:
        return
    if not got.is_floating_point():
        assert torch.equal(got, want), f"{name}: {(got != want).sum().item()} of {got.numel()} elements differ"
        return
    g, w = got.detach().float(), want.detach().float()
    assert torch.equal(g.isnan(), w.isnan()), f"{name}: NaN pattern differs at {(g.isnan() != w.isnan()).sum().item()}"
    inf = g.isinf() | w.isinf()
    assert torch.equal(g[inf], w[inf]), f"{name}: inf pattern differs"
    finite = g.isfinite() & w.isfinite()
    rtol, atol = TOLERANCE[want.dtype]
    bad = finite & ((g - w).abs() > atol + rtol * w.abs())
    if bad.any():
        i = bad.flatten().nonzero()[0].item()
        pytest.fail(
            f"{name}: {bad.sum().item()} of {g.numel()} elements wrong; first at flat {i}: "
            f"got {g.flatten()[i].item():.6g}, expected {w.flatten()[i].item():.6g}"
        )


# ---------------------------------------------------------------------------------------------
# Inputs and fp32 references
# ---------------------------------------------------------------------------------------------
def dev(index: int = 0) -> torch.device:
    return torch.device("cuda", index)


def rnd(
    *shape: int, dtype: torch.dtype = BF16, device: torch.device | None = None, offset: int = 0, scale: float = 1.0
) -> torch.Tensor:
    """A random tensor; ``offset`` > 0 makes it a view that many elements into a larger storage."""
    device = dev() if device is None else device
    n = math.prod(shape) + offset
    if dtype.is_complex:
        flat = torch.randn(n, dtype=dtype, device=device)
    elif dtype.is_floating_point:
        flat = (torch.randn(n, device=device) * scale).to(dtype)
    elif dtype == torch.bool:
        flat = torch.randint(0, 2, (n,), device=device).bool()
    elif dtype == torch.uint8:
        flat = torch.randint(0, 200, (n,), dtype=dtype, device=device)
    else:
        flat = torch.randint(-1000, 1000, (n,), dtype=dtype, device=device)
    return flat[offset:].view(shape)


class Poisoned:
    """A view of ``shape`` ``offset`` elements into a poisoned buffer with GUARD poisoned elements
    on both sides (an output, or with ``like`` a copy of it for in-place ops)."""

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device | None = None,
        offset: int = 0,
        like: torch.Tensor | None = None,
    ) -> None:
        src = poisoned(shape, dtype, dev() if device is None else device) if like is None else like
        self.pad, self.numel = GUARD + offset, src.numel()
        self.t, self.buffer = padded(src, self.pad)

    def assert_intact(self) -> None:
        assert_poison_intact(self.buffer, self.pad, self.numel)


def rms_ref(
    x: torch.Tensor, w: torch.Tensor, eps: float, offset: float = 0.0, cast_first: bool = False
) -> torch.Tensor:
    normed = x.detach().float() * torch.rsqrt(x.detach().float().pow(2).mean(-1, keepdim=True) + eps)
    if cast_first:
        normed = normed.to(x.dtype).float()
    return (normed * (w.detach().float() + offset)).to(x.dtype)


def fused_ref(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float, offset: float):
    """(normalised output, rounded sum) of the fused add: the norm of the rounded sum."""
    total = (x.detach().float() + r.detach().float()).to(x.dtype)
    return rms_ref(total, w, eps, offset), total


def nan_inf_rows(dtype: torch.dtype) -> torch.Tensor:
    """[6, 64]: a NaN, a +inf, a -inf and an all-zero row among random ones."""
    x = rnd(6, 64, dtype=dtype)
    x[1, 5], x[2, 7], x[3, 0], x[4] = float("nan"), float("inf"), -float("inf"), 0.0
    return x


def side_stream_call(prepare: Callable[[], None], call: Callable[[], None]) -> Callable[[], None]:
    """On a side stream: a 50M-cycle sleep, ``prepare()`` (fills the input), then ``call()``; an op
    launching on any other stream reads the input before it is filled."""

    def run() -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(50_000_000)
            prepare()
            call()
        stream.synchronize()

    return run


def graph_replay_call(call: Callable[[], None], inputs: list[torch.Tensor], outputs: list[torch.Tensor]):
    """An eager warm-up call, a capture of ``call()``, new random inputs, zeroed outputs, replay."""

    def run() -> None:
        call()
        sync_all()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        for t in inputs:
            t.copy_(torch.randn_like(t))
        for t in outputs:
            t.zero_()
        graph.replay()

    return run


def periodic(lo: int, n: int, period: int, shift: int = 0) -> torch.Tensor:
    """fp32 ``(i % period) - shift`` for i in [lo, lo + n): a pattern huge tensors are filled with in
    chunks (an int64 arange of 2^31 elements alone would take 16 GiB)."""
    return (torch.arange(lo, lo + n, device=dev()) % period - shift).float()


def fill_periodic(t: torch.Tensor, period: int, shift: int = 0) -> torch.Tensor:
    flat = t.view(-1)
    for lo in range(0, flat.numel(), CHUNK):
        n = min(CHUNK, flat.numel() - lo)
        flat[lo : lo + n] = periodic(lo, n, period, shift).to(t.dtype)
    return t


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def register_errors(op: str, table: list[tuple]) -> None:
    """Error cases ``(name, exc, arg, make[, gpus])``: ``make()`` -> ``(args, kwargs)`` of the op."""
    for name, exc, arg, make, *gpus in table:

        @case(op, name, gpus=gpus[0] if gpus else 1)
        def _(exc=exc, arg=arg, make=make) -> None:
            args, kwargs = make()
            expect_error(op, exc, arg, args, kwargs)


def numpy_array(*shape: int):
    np = pytest.importorskip("numpy")
    return np.ones(shape, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# scale
# ---------------------------------------------------------------------------------------------
register_errors(
    "scale",
    [
        ("src_cpu", RuntimeError, "src", lambda: ((torch.randn(8), 2.0), {}), 0),
        ("src_list", TypeError, "src", lambda: (([1.0, 2.0], 2.0), {}), 0),
        ("src_None", TypeError, "src", lambda: ((None, 2.0), {}), 0),
        ("src_numpy", TypeError, "src", lambda: ((numpy_array(4), 2.0), {}), 0),
        *[
            (f"src_dtype_{d}", RuntimeError, "src", lambda d=d: ((rnd(16, dtype=dtype_of(d)), 2.0), {}))
            for d in ("int32", "float64", "float8_e4m3fn", "bool", "int64", "complex64")
        ],
        ("out_dtype_mismatch", RuntimeError, "out", lambda: ((rnd(4, 8), 2.0), {"out": rnd(4, 8, dtype=FP16)})),
        ("out_shape_mismatch", RuntimeError, "out", lambda: ((rnd(4, 8), 2.0), {"out": rnd(4, 9)})),
        ("out_same_numel_other_shape", RuntimeError, "out", lambda: ((rnd(4, 8), 2.0), {"out": rnd(32)})),
        ("out_noncontiguous", RuntimeError, "out", lambda: ((rnd(8, 4), 2.0), {"out": rnd(4, 8).t()})),
        ("out_expanded_stride0", RuntimeError, "out", lambda: ((rnd(4, 8), 2.0), {"out": rnd(1, 8).expand(4, 8)})),
        ("out_cpu", RuntimeError, "out", lambda: ((rnd(4, 8), 2.0), {"out": torch.zeros(4, 8, dtype=BF16)})),
        ("out_list", TypeError, "out", lambda: ((rnd(4), 2.0), {"out": [0.0] * 4})),
        ("src_transposed_out_is_src", RuntimeError, "out", lambda: (lambda x: ((x, 3.0), {"out": x}))(rnd(16, 24).t())),
        # documented: out must not partially overlap src
        (
            "out_overlaps_src_shift+1",
            RuntimeError,
            "out",
            lambda: (lambda b: ((b[:-1], 2.0), {"out": b[1:]}))(rnd((1 << 20) + 1, dtype=FP32)),
        ),
        (
            "out_overlaps_src_shift-1",
            RuntimeError,
            "out",
            lambda: (lambda b: ((b[1:], 2.0), {"out": b[:-1]}))(rnd((1 << 20) + 1, dtype=FP32)),
        ),
        # documented: factor must be an int or a float
        ("factor_tensor_cpu", TypeError, "factor", lambda: ((rnd(64), torch.tensor(2.0)), {})),
        ("factor_tensor_cuda", TypeError, "factor", lambda: ((rnd(64), torch.tensor(2.0, device=dev())), {})),
        ("factor_str", TypeError, "factor", lambda: ((rnd(64), "2.0"), {})),
        ("factor_None", TypeError, "factor", lambda: ((rnd(64), None), {})),
        ("factor_complex", TypeError, "factor", lambda: ((rnd(64), 1j), {})),
        ("factor_list", TypeError, "factor", lambda: ((rnd(64), [2.0]), {})),
        ("out_on_cuda1", RuntimeError, "out", lambda: ((rnd(64), 2.0), {"out": rnd(64, device=dev(1))}), 2),
    ],
)


def scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    """The reference: fp32 product of the same inputs, one rounding."""
    return (x.float() * torch.tensor(float(factor), dtype=FP32, device=x.device)).to(x.dtype)


def scale_result_case(
    name: str, make: Callable[[], torch.Tensor], factor: float, either: bool = False, gpus: int = 1, mem_gib: int = 0
) -> None:
    """``scale(x, factor)`` (allocated out) equals the reference; ``x`` unchanged."""

    @case("scale", name, gpus=gpus, mem_gib=mem_gib)
    def _() -> None:
        x = make()
        result = {}
        expect_result(
            lambda: result.setdefault("out", scale(x, factor)),
            lambda: assert_matches("out", result["out"], scaled(x, factor)),
            keep={"src": x},
            either=((TypeError, ValueError), "scale", "factor") if either else None,
        )


scale_result_case("src_transposed_copied", lambda: rnd(16, 24).t(), 3.0)
scale_result_case("src_expanded_stride0", lambda: rnd(1, 24).expand(5, 24), -2.0)
scale_result_case("zero_dim", lambda: torch.tensor(1.5, dtype=FP32, device=dev()), 2.0)
for _shape in ((0,), (0, 5), (5, 0), (3, 0, 7)):
    scale_result_case(
        f"empty_{'x'.join(map(str, _shape))}", lambda s=_shape: torch.empty(s, dtype=FP16, device=dev()), 2.0
    )
for _name, _factor, _either in (
    ("nan", float("nan"), False),
    ("inf", float("inf"), False),
    ("neg_zero", -0.0, False),
    ("int", 3, False),
    ("huge_1e39", 1e39, True),
    ("bool_True", True, True),
):
    scale_result_case(f"factor_{_name}", lambda: rnd(257, dtype=FP32), _factor, either=_either)
scale_result_case("src_on_cuda1_current_cuda0", lambda: rnd(4097, device=dev(1), offset=1), 3.0, gpus=2)


@case("scale", "nan_inf_inputs_propagate")
def _() -> None:
    x = rnd(1000, dtype=FP16)
    x[::7], x[3::11], x[5::13] = float("nan"), float("inf"), -float("inf")
    result = {}
    expect_result(
        lambda: result.setdefault("out", scale(x, 0.5)), lambda: assert_matches("out", result["out"], scaled(x, 0.5))
    )


@case("scale", "src_requires_grad")
def _() -> None:
    x = rnd(64, dtype=FP32).requires_grad_(True)
    result = {}
    expect_result(
        lambda: result.setdefault("out", scale(x, 2.0)),
        lambda: assert_matches("out", result["out"], scaled(x.detach(), 2.0)),
        either=(RuntimeError, "scale", "src"),
    )


for _dtn in ("float16", "bfloat16", "float32"):
    for _n in (1, 3, 7, 33, 1000003):
        for _src_off, _out_off in ((0, 0), (1, 0), (0, 1), (1, 3), (3, 5)):

            @case("scale", f"{_dtn}_n{_n}_srcoff{_src_off}_outoff{_out_off}")
            def _(dtype=dtype_of(_dtn), n=_n, src_off=_src_off, out_off=_out_off) -> None:  # noqa: B008 (binds this case's dtype)
                x = rnd(n, dtype=dtype, offset=src_off)
                out = Poisoned((n,), dtype, offset=out_off)

                def check() -> None:
                    assert_matches("out", out.t, scaled(x, 0.75))
                    out.assert_intact()

                expect_result(lambda: scale(x, 0.75, out=out.t), check, keep={"src": x})


@case("scale", "in_place_out_is_src")
def _() -> None:
    x = Poisoned((1001,), BF16, offset=1, like=rnd(1001))
    want = scaled(x.t, 1.5)

    def check() -> None:
        assert_matches("out", x.t, want)
        x.assert_intact()

    expect_result(lambda: scale(x.t, 1.5, out=x.t), check)


@case("scale", "huge_2pow31_plus_7_fp16", mem_gib=9)
def _() -> None:
    n = 2**31 + 7
    x = fill_periodic(torch.empty(n, dtype=FP16, device=dev()), 1000)
    result = {}

    def check() -> None:
        for lo in (0, 2**31 - 4096, n - 4096):
            assert_matches(f"out[{lo}:+4096]", result["out"][lo : lo + 4096], scaled(x[lo : lo + 4096], 0.5))

    expect_result(lambda: result.setdefault("out", scale(x, 0.5)), check)


@case("scale", "side_stream")
def _() -> None:
    src = rnd(1 << 22, dtype=FP32)
    x = torch.zeros_like(src)
    result = {}
    expect_result(
        side_stream_call(lambda: x.copy_(src), lambda: result.setdefault("out", scale(x, 2.0))),
        lambda: assert_matches("out", result["out"], scaled(src, 2.0)),
    )


@case("scale", "cuda_graph_capture")
def _() -> None:
    x = rnd(4096, dtype=FP32)
    out = torch.empty_like(x)
    expect_result(
        graph_replay_call(lambda: scale(x, 2.0, out=out), [x], [out]),
        lambda: assert_matches("out", out, scaled(x, 2.0)),
    )


# ---------------------------------------------------------------------------------------------
# add_constant
# ---------------------------------------------------------------------------------------------
def int_src(*shape: int, device: torch.device | None = None, offset: int = 0) -> torch.Tensor:
    return rnd(*shape, dtype=torch.int32, device=device, offset=offset)


def cuda_or_cpu_arange() -> torch.Tensor:
    """int32 [8] on the GPU when there is one (checks of ``constant`` come before those of src)."""
    return torch.arange(8, dtype=torch.int32, device=dev() if HAS_CUDA else "cpu")


register_errors(
    "add_constant",
    [
        ("src_cpu", RuntimeError, "src", lambda: ((torch.arange(8, dtype=torch.int32), 1), {}), 0),
        ("src_list", TypeError, "src", lambda: (([1, 2], 1), {}), 0),
        *[
            (f"constant_{name}", exc, "constant", lambda c=c: ((cuda_or_cpu_arange(), c()), {}), 0)
            for name, exc, c in (
                ("bool_True", TypeError, lambda: True),
                ("float_1.0", TypeError, lambda: 1.0),
                ("str", TypeError, lambda: "1"),
                ("None", TypeError, lambda: None),
                ("tensor", TypeError, lambda: torch.tensor(1)),
                ("2pow31", ValueError, lambda: 2**31),
                ("minus_2pow31_minus_1", ValueError, lambda: -(2**31) - 1),
                ("2pow63", ValueError, lambda: 2**63),
            )
        ],
        *[
            (f"src_dtype_{d}", RuntimeError, "src", lambda d=d: ((rnd(16, dtype=dtype_of(d)), 1), {}))
            for d in ("float32", "int64", "int16", "uint8", "bool", "float16")
        ],
        ("out_mismatch_dtype", RuntimeError, "out", lambda: ((int_src(8), 1), {"out": rnd(8, dtype=torch.int64)})),
        ("out_mismatch_shape", RuntimeError, "out", lambda: ((int_src(8), 1), {"out": int_src(2, 4)})),
        ("out_noncontiguous", RuntimeError, "out", lambda: ((int_src(8, 4), 1), {"out": int_src(4, 8).t()})),
        ("out_cpu", RuntimeError, "out", lambda: ((int_src(8), 1), {"out": torch.zeros(8, dtype=torch.int32)})),
        ("out_on_cuda1", RuntimeError, "out", lambda: ((int_src(8), 1), {"out": int_src(8, device=dev(1))}), 2),
    ],
)


def add_constant_case(name: str, make: Callable[[], torch.Tensor], constant: int = 1, gpus: int = 1) -> None:
    """``add_constant(x, constant)`` (allocated out) equals the int64 reference wrapped to int32."""

    @case("add_constant", name, gpus=gpus)
    def _() -> None:
        x = make()
        want = ((x.long() + constant + 2**31) % 2**32 - 2**31).to(torch.int32)
        result = {}
        expect_result(
            lambda: result.setdefault("out", add_constant(x, constant)),
            lambda: assert_matches("out", result["out"], want),
            keep={"src": x},
        )


_WRAP_VALUES = [0, 1, -1, 2**31 - 1, -(2**31), 12345, -12345]
for _c in (1, 2**31 - 1, -(2**31)):
    add_constant_case(
        f"wraparound_constant_{_c}", lambda: torch.tensor(_WRAP_VALUES, dtype=torch.int32, device=dev()), _c
    )
for _shape in ((0,), (4, 0), ()):
    add_constant_case(
        f"shape_{'x'.join(map(str, _shape)) or 'scalar0d'}",
        lambda s=_shape: torch.full(s, 5, dtype=torch.int32, device=dev()),
    )
add_constant_case("transposed_src_copied", lambda: int_src(16, 8).t())
add_constant_case("src_on_cuda1_current_cuda0", lambda: int_src(1001, device=dev(1)), gpus=2)

for _src_off, _out_off in ((1, 0), (0, 1), (3, 1)):

    @case("add_constant", f"misaligned_srcoff{_src_off}_outoff{_out_off}")
    def _(src_off=_src_off, out_off=_out_off) -> None:
        x = int_src(1001, offset=src_off)
        out = Poisoned((1001,), torch.int32, offset=out_off)

        def check() -> None:
            assert_matches("out", out.t, x + 1)
            out.assert_intact()

        expect_result(lambda: add_constant(x, 1, out=out.t), check, keep={"src": x})


@case("add_constant", "in_place")
def _() -> None:
    x = int_src(1001)
    want = x + 1
    expect_result(lambda: add_constant(x, 1, out=x), lambda: assert_matches("out", x, want))


@case("add_constant", "out_overlaps_src_shift+1")
def _() -> None:
    buf = int_src((1 << 20) + 1)
    src, out = buf[:-1], buf[1:]
    want = src + 1
    expect_result(
        lambda: add_constant(src, 1, out=out),
        lambda: assert_matches("out", out, want),
        either=(RuntimeError, "add_constant", "out"),
    )


# ---------------------------------------------------------------------------------------------
# rmsnorm, gemma_rmsnorm
# ---------------------------------------------------------------------------------------------
ROWS, HIDDEN = 7, 256
_MISSING: Any = object()


def rms_args(x=_MISSING, w=_MISSING, **kwargs) -> tuple[tuple, dict]:
    """(input, weight), kwargs: [ROWS, HIDDEN] bf16 input and [HIDDEN] weight unless given."""
    return (rnd(ROWS, HIDDEN) if x is _MISSING else x, rnd(HIDDEN) if w is _MISSING else w), kwargs


register_errors(
    "rmsnorm",
    [
        ("input_cpu", RuntimeError, "input", lambda: ((torch.randn(4, 8), torch.randn(8)), {}), 0),
        ("input_list", TypeError, "input", lambda: (([[1.0, 2.0]], torch.randn(2)), {}), 0),
        ("input_None", TypeError, "input", lambda: ((None, torch.randn(2)), {}), 0),
        # documented: cast_x_before_out_mul must be a bool
        ("cast_x_before_out_mul_str", TypeError, "cast_x_before_out_mul", lambda: rms_args(cast_x_before_out_mul="no")),
    ],
)


def overlapping_out(step: int, h: int) -> tuple[tuple, dict]:
    """fp32 rmsnorm arguments whose out is input's buffer shifted by ``step`` elements."""
    rows = 4096 if h <= 4096 else 512
    buf = rnd(rows * h + step, dtype=FP32)
    x, out = buf[: rows * h].view(rows, h), buf[step : step + rows * h].view(rows, h)
    return rms_args(x=x, w=rnd(h, dtype=FP32), out=out)


RMS_ERRORS = [
    ("weight_cpu", RuntimeError, "weight", lambda: rms_args(w=torch.randn(HIDDEN).bfloat16())),
    ("weight_list", TypeError, "weight", lambda: rms_args(w=[1.0] * HIDDEN)),
    ("weight_none", TypeError, "weight", lambda: rms_args(w=None)),
    ("out_cpu", RuntimeError, "out", lambda: rms_args(out=torch.zeros(ROWS, HIDDEN, dtype=BF16))),
    ("out_list", TypeError, "out", lambda: rms_args(out=[[0.0] * HIDDEN] * ROWS)),
    ("input_int32", RuntimeError, "input", lambda: rms_args(x=rnd(ROWS, HIDDEN, dtype=torch.int32))),
    (
        "input_float64",
        RuntimeError,
        "input",
        lambda: rms_args(x=rnd(ROWS, HIDDEN, dtype=torch.float64), w=rnd(HIDDEN, dtype=torch.float64)),
    ),
    (
        "input_fp8_e4m3",
        RuntimeError,
        "input",
        lambda: rms_args(x=rnd(ROWS, HIDDEN, dtype=torch.float8_e4m3fn), w=rnd(HIDDEN, dtype=torch.float8_e4m3fn)),
    ),
    ("weight_fp16_input_bf16", RuntimeError, "weight", lambda: rms_args(w=rnd(HIDDEN, dtype=FP16))),
    ("weight_fp32_input_bf16", RuntimeError, "weight", lambda: rms_args(w=rnd(HIDDEN, dtype=FP32))),
    ("out_fp16_input_bf16", RuntimeError, "out", lambda: rms_args(out=rnd(ROWS, HIDDEN, dtype=FP16))),
    ("out_fp32_input_bf16", RuntimeError, "out", lambda: rms_args(out=rnd(ROWS, HIDDEN, dtype=FP32))),
    ("weight_shape_H+1", RuntimeError, "weight", lambda: rms_args(w=rnd(HIDDEN + 1))),
    ("weight_shape_H-1", RuntimeError, "weight", lambda: rms_args(w=rnd(HIDDEN - 1))),
    ("weight_2d_1xH", RuntimeError, "weight", lambda: rms_args(w=rnd(1, HIDDEN))),
    ("weight_0dim", RuntimeError, "weight", lambda: rms_args(w=rnd(1).view(()))),
    ("weight_noncontig_stride2", RuntimeError, "weight", lambda: rms_args(w=rnd(2 * HIDDEN)[::2])),
    ("weight_expanded_stride0", RuntimeError, "weight", lambda: rms_args(w=rnd(1).expand(HIDDEN))),
    ("out_shape_mismatch", RuntimeError, "out", lambda: rms_args(out=rnd(ROWS + 1, HIDDEN))),
    ("out_3d_same_numel", RuntimeError, "out", lambda: rms_args(out=rnd(ROWS, 1, HIDDEN))),
    ("out_1d_same_numel", RuntimeError, "out", lambda: rms_args(out=rnd(ROWS * HIDDEN))),
    ("input_lastdim_stride2", RuntimeError, "input", lambda: rms_args(x=rnd(ROWS, 2 * HIDDEN)[:, ::2])),
    ("input_transposed", RuntimeError, "input", lambda: rms_args(x=rnd(HIDDEN, ROWS).t(), w=rnd(ROWS))),
    ("out_transposed", RuntimeError, "out", lambda: rms_args(out=rnd(HIDDEN, ROWS).t())),
    ("input_0dim", RuntimeError, "input", lambda: rms_args(x=rnd(1).view(()), w=rnd(1))),
    ("eps_negative", ValueError, "eps", lambda: rms_args(eps=-1e-6)),
    ("eps_nan", ValueError, "eps", lambda: rms_args(eps=float("nan"))),
    ("eps_str", TypeError, "eps", lambda: rms_args(eps="1e-6")),
    ("eps_None", TypeError, "eps", lambda: rms_args(eps=None)),
    ("out_expanded_stride0_rows", RuntimeError, "out", lambda: rms_args(out=rnd(1, HIDDEN).expand(ROWS, HIDDEN))),
    (
        "out_3d_nonflattenable",
        RuntimeError,
        "out",
        lambda: rms_args(x=rnd(2, 3, HIDDEN), out=rnd(3, 2, HIDDEN).transpose(0, 1)),
    ),
    # documented: out must not partially overlap input
    *[
        (
            f"out_partially_overlaps_input_shift_{what}",
            RuntimeError,
            "out",
            lambda step=step, h=h: overlapping_out(step, h),
        )
        for what, step, h in (
            ("1elem", 1, 4096),
            ("1row", 4096, 4096),
            ("1row_smallH", 64, 64),
            ("1elem_H16384", 1, 16384),
        )
    ],
    ("weight_on_cuda1", RuntimeError, "weight", lambda: rms_args(w=rnd(HIDDEN, device=dev(1))), 2),
    ("out_on_cuda1", RuntimeError, "out", lambda: rms_args(out=rnd(ROWS, HIDDEN, device=dev(1))), 2),
    (
        "input_on_cuda1_weight_cuda0",
        RuntimeError,
        ("weight", "input"),
        lambda: rms_args(x=rnd(ROWS, HIDDEN, device=dev(1))),
        2,
    ),
]
for _op in ("rmsnorm", "gemma_rmsnorm"):
    register_errors(_op, RMS_ERRORS)


def rms_result_case(
    ops: tuple[str, ...],
    name: str,
    make: Callable[[], torch.Tensor],
    woff: int = 0,
    out_offset: int | None = None,
    eps: float = 1e-6,
    either: tuple[type, tuple] | None = None,
    cast_first: bool = False,
    pdl: bool | None = None,
    gpus: int = 1,
    mem_gib: int = 0,
) -> None:
    """``op(x, w, ...)`` equals the reference; allocated out, or with ``out_offset`` a poisoned
    out at that offset; x and w unchanged. ``either = (exc, args)``: that error is also a pass."""
    for op in ops:

        @case(op, name, gpus=gpus, mem_gib=mem_gib)
        def _(op=op) -> None:
            x = make()
            w = rnd(x.shape[-1], dtype=x.dtype, offset=woff, device=x.device)
            kwargs: dict[str, Any] = {"eps": eps}
            if cast_first:
                kwargs["cast_x_before_out_mul"] = True
            if pdl is not None:
                kwargs["enable_pdl"] = pdl
            want = rms_ref(x, w, eps, RMS_OFFSET[op], cast_first)
            alt = None if either is None else (either[0], op, either[1])
            if out_offset is None:
                result = {}
                expect_result(
                    lambda: result.setdefault("out", OPS[op](x, w, **kwargs)),
                    lambda: assert_matches("out", result["out"], want),
                    {"input": x, "weight": w},
                    alt,
                )
                return
            out = Poisoned(tuple(x.shape), x.dtype, x.device, offset=out_offset)

            def check() -> None:
                assert_matches("out", out.t, want)
                out.assert_intact()

            expect_result(lambda: OPS[op](x, w, out=out.t, **kwargs), check, {"input": x, "weight": w}, alt)


RMS = ("rmsnorm", "gemma_rmsnorm")
HIDDEN_LIMIT = (RuntimeError, ("input", "hidden_size"))  # past the kernel's hidden-size limit: this error is fine
EPS_LIMIT = (ValueError, ("eps",))
_RMS_HIDDEN = get_ci_test_range(
    full_range=(1, 2, 3, 5, 8, 33, 127, 128, 1000, 1023, 4096, 4097, 5120, 8192, 16384, 32768),
    ci_range=(1, 3, 33, 1000, 4097, 16384),
)
_RMS_MISALIGNED = get_ci_test_range(
    full_range=[
        (x, w, o, h)
        for x, w, o in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (3, 5, 7), (2, 0, 2), (4, 4, 4))
        for h in (128, 4096, 1000)
    ],
    ci_range=[(x, w, o, h) for x, w, o in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (3, 5, 7)) for h in (128, 1000)],
)
for _dtn in ("float16", "bfloat16", "float32"):
    _d = dtype_of(_dtn)
    for _h in _RMS_HIDDEN:
        rms_result_case(RMS, f"{_dtn}_H{_h}", lambda d=_d, h=_h: rnd(ROWS, h, dtype=d), out_offset=0)
    for _xo, _wo, _oo, _h in _RMS_MISALIGNED:
        rms_result_case(
            RMS,
            f"{_dtn}_H{_h}_misaligned_x{_xo}_w{_wo}_out{_oo}",
            lambda d=_d, h=_h, o=_xo: rnd(ROWS, h, dtype=d, offset=o),
            woff=_wo,
            out_offset=_oo,
        )
    rms_result_case(RMS, f"{_dtn}_nan_inf_rows_propagate", lambda d=_d: nan_inf_rows(d))
    rms_result_case(RMS, f"{_dtn}_nan_inf_rows_propagate_H4096", lambda d=_d: torch.cat([nan_inf_rows(d)] * 64, dim=1))
for _h in (65536, 70000, 70001, 2**20, 2**20 + 1):
    rms_result_case(RMS, f"bfloat16_huge_H{_h}", lambda h=_h: rnd(3, h), out_offset=1, either=HIDDEN_LIMIT)
rms_result_case(RMS, "float32_huge_H1048576", lambda: rnd(2, 2**20, dtype=FP32), out_offset=0, either=HIDDEN_LIMIT)
rms_result_case(
    ("rmsnorm",),
    "float16_1row_H2pow31-3_int32_overflow",
    lambda: rnd(1, 2**31 - 3, dtype=FP16),
    either=HIDDEN_LIMIT,
    mem_gib=60,
)
rms_result_case(RMS, "float16_rows0", lambda: rnd(0, HIDDEN, dtype=FP16), out_offset=0)
rms_result_case(RMS, "float16_hidden0", lambda: rnd(ROWS, 0, dtype=FP16), out_offset=0)
rms_result_case(RMS, "float16_rows0_hidden0", lambda: rnd(0, 0, dtype=FP16))
rms_result_case(RMS, "bfloat16_1d_input", lambda: rnd(HIDDEN), out_offset=0)
rms_result_case(RMS, "bfloat16_3d_input", lambda: rnd(2, 3, HIDDEN), out_offset=1)
rms_result_case(RMS, "bfloat16_4d_input", lambda: rnd(2, 2, 3, 8))
rms_result_case(RMS, "bfloat16_many_rows_1M", lambda: rnd(1 << 20, 16))
rms_result_case(RMS, "bfloat16_3d_nonflattenable_input", lambda: rnd(3, 2, HIDDEN).transpose(0, 1))
rms_result_case(RMS, "bfloat16_row_stride_odd", lambda: rnd(ROWS, HIDDEN + 1)[:, :HIDDEN], out_offset=0)
rms_result_case(
    RMS, "bfloat16_row_stride_odd_misaligned", lambda: rnd(ROWS, HIDDEN + 3, offset=1)[:, 1 : HIDDEN + 1], out_offset=3
)
rms_result_case(RMS, "bfloat16_rows_expanded_stride0", lambda: rnd(1, HIDDEN).expand(ROWS, HIDDEN), out_offset=0)
rms_result_case(("rmsnorm",), "bfloat16_cast_x_before_out_mul", lambda: rnd(ROWS, 4096), cast_first=True)
rms_result_case(
    ("rmsnorm",),
    "float16_cast_x_before_out_mul_misaligned",
    lambda: rnd(ROWS, 1001, dtype=FP16, offset=1),
    woff=1,
    out_offset=1,
    cast_first=True,
)
rms_result_case(RMS, "bfloat16_pdl_on", lambda: rnd(ROWS, 4096), pdl=True)
rms_result_case(RMS, "bfloat16_pdl_off", lambda: rnd(ROWS, 4096), pdl=False)
rms_result_case(RMS, "eps_inf", lambda: rnd(ROWS, 128, dtype=FP32), eps=float("inf"), either=EPS_LIMIT)
rms_result_case(RMS, "eps_huge_1e300", lambda: rnd(ROWS, 128, dtype=FP32), eps=1e300, either=EPS_LIMIT)
rms_result_case(RMS, "eps_zero", lambda: rnd(ROWS, 128, dtype=FP32), eps=0.0)
rms_result_case(RMS, "float32_values_1e20_sumsq_overflow", lambda: rnd(ROWS, 128, dtype=FP32, scale=1e20))
rms_result_case(RMS, "float16_values_60000", lambda: torch.full((ROWS, 128), 60000.0, dtype=FP16, device=dev()))
rms_result_case(RMS, "float32_denormal_values", lambda: rnd(ROWS, 128, dtype=FP32, scale=1e-40))
rms_result_case(RMS, "input_on_cuda1_current_cuda0", lambda: rnd(ROWS, HIDDEN, device=dev(1), offset=1), gpus=2)

for _op in RMS:

    @case(_op, "all_on_cuda0_inside_device1_ctx", gpus=2)
    def _(op=_op) -> None:
        x, w = rnd(ROWS, HIDDEN), rnd(HIDDEN)
        result = {}

        def call() -> None:
            with torch.cuda.device(1):
                result["out"] = OPS[op](x, w)

        expect_result(call, lambda: assert_matches("out", result["out"], rms_ref(x, w, 1e-6, RMS_OFFSET[op])))

    @case(_op, "out_is_input_in_place")
    def _(op=_op) -> None:
        x, w = Poisoned((ROWS, 4096), BF16, offset=1, like=rnd(ROWS, 4096)), rnd(4096)
        want = rms_ref(x.t, w, 1e-6, RMS_OFFSET[op])

        def check() -> None:
            assert_matches("out", x.t, want)
            x.assert_intact()

        expect_result(lambda: OPS[op](x.t, w, out=x.t), check, {"weight": w})

    @case(_op, "input_requires_grad")
    def _(op=_op) -> None:
        x, w = rnd(ROWS, HIDDEN, dtype=FP32).requires_grad_(), rnd(HIDDEN, dtype=FP32)
        result = {}
        expect_result(
            lambda: result.setdefault("out", OPS[op](x, w)),
            lambda: assert_matches("out", result["out"], rms_ref(x, w, 1e-6, RMS_OFFSET[op])),
            either=(RuntimeError, op, "input"),
        )

    @case(_op, "weight_is_nn_Parameter")
    def _(op=_op) -> None:
        x, w = rnd(ROWS, HIDDEN), torch.nn.Parameter(rnd(HIDDEN))
        result = {}
        expect_result(
            lambda: result.setdefault("out", OPS[op](x, w)),
            lambda: assert_matches("out", result["out"], rms_ref(x, w, 1e-6, RMS_OFFSET[op])),
            either=(RuntimeError, op, "weight"),
        )

    @case(_op, "side_stream")
    def _(op=_op) -> None:
        src, w = rnd(4096, 4096), rnd(4096)
        x = torch.zeros_like(src)
        result = {}
        expect_result(
            side_stream_call(lambda: x.copy_(src), lambda: result.setdefault("out", OPS[op](x, w))),
            lambda: assert_matches("out", result["out"], rms_ref(src, w, 1e-6, RMS_OFFSET[op])),
        )

    @case(_op, "cuda_graph_capture")
    def _(op=_op) -> None:
        x, w = rnd(64, 4096), rnd(4096)
        out = torch.empty_like(x)
        expect_result(
            graph_replay_call(lambda: OPS[op](x, w, out=out), [x], [out]),
            lambda: assert_matches("out", out, rms_ref(x, w, 1e-6, RMS_OFFSET[op])),
        )


@case("rmsnorm", "hidden_2pow31_rejected", mem_gib=13)
def _() -> None:
    h = 2**31
    x, w = torch.zeros(1, h, dtype=FP16, device=dev()), torch.zeros(h, dtype=FP16, device=dev())
    out = torch.full((1, h), 1.0, dtype=FP16, device=dev())
    expect_result(
        lambda: norm.rmsnorm(x, w, out=out),
        lambda: assert_matches("out[:, -4096:]", out[:, -4096:], torch.zeros_like(out[:, -4096:])),
        either=(RuntimeError, "rmsnorm", ("input", "hidden_size")),
    )


# ---------------------------------------------------------------------------------------------
# fused_add_rmsnorm, gemma_fused_add_rmsnorm
# ---------------------------------------------------------------------------------------------
def fused_args(x=_MISSING, r=_MISSING, w=_MISSING, **kwargs) -> tuple[tuple, dict]:
    """(input, residual, weight), kwargs: [ROWS, HIDDEN] bf16 rows and [HIDDEN] weight unless given."""
    x = rnd(ROWS, HIDDEN) if x is _MISSING else x
    r = rnd(ROWS, HIDDEN) if r is _MISSING else r
    return (x, r, rnd(HIDDEN) if w is _MISSING else w), kwargs


register_errors(
    "fused_add_rmsnorm",
    [
        ("input_cpu", RuntimeError, "input", lambda: ((torch.randn(4, 8), torch.randn(4, 8), torch.randn(8)), {}), 0),
    ],
)
FUSED_ERRORS = [
    ("residual_cpu", RuntimeError, "residual", lambda: fused_args(r=torch.randn(ROWS, HIDDEN).bfloat16())),
    ("residual_None", TypeError, "residual", lambda: fused_args(r=None)),
    ("residual_list", TypeError, "residual", lambda: fused_args(r=[[0.0] * HIDDEN] * ROWS)),
    ("weight_cpu", RuntimeError, "weight", lambda: fused_args(w=torch.randn(HIDDEN).bfloat16())),
    ("input_int32", RuntimeError, "input", lambda: fused_args(x=rnd(ROWS, HIDDEN, dtype=torch.int32))),
    *[
        (
            f"input_{name}_all",
            RuntimeError,
            "input",
            lambda d=d: fused_args(x=rnd(ROWS, HIDDEN, dtype=d), r=rnd(ROWS, HIDDEN, dtype=d), w=rnd(HIDDEN, dtype=d)),
        )
        for name, d in (("float64", torch.float64), ("fp8", torch.float8_e5m2))
    ],
    ("residual_fp16_input_bf16", RuntimeError, "residual", lambda: fused_args(r=rnd(ROWS, HIDDEN, dtype=FP16))),
    ("residual_fp32_input_bf16", RuntimeError, "residual", lambda: fused_args(r=rnd(ROWS, HIDDEN, dtype=FP32))),
    ("weight_fp32_input_bf16", RuntimeError, "weight", lambda: fused_args(w=rnd(HIDDEN, dtype=FP32))),
    ("residual_shape_mismatch_rows", RuntimeError, "residual", lambda: fused_args(r=rnd(ROWS + 1, HIDDEN))),
    ("residual_shape_mismatch_hidden", RuntimeError, "residual", lambda: fused_args(r=rnd(ROWS, 2 * HIDDEN))),
    ("residual_3d_same_numel", RuntimeError, "residual", lambda: fused_args(r=rnd(ROWS, 1, HIDDEN))),
    ("weight_shape_H+1", RuntimeError, "weight", lambda: fused_args(w=rnd(HIDDEN + 1))),
    ("weight_noncontig", RuntimeError, "weight", lambda: fused_args(w=rnd(2 * HIDDEN)[::2])),
    ("input_transposed", RuntimeError, "input", lambda: fused_args(x=rnd(HIDDEN, HIDDEN).t(), r=rnd(HIDDEN, HIDDEN))),
    (
        "residual_transposed",
        RuntimeError,
        "residual",
        lambda: fused_args(x=rnd(HIDDEN, HIDDEN), r=rnd(HIDDEN, HIDDEN).t()),
    ),
    ("residual_lastdim_stride2", RuntimeError, "residual", lambda: fused_args(r=rnd(ROWS, 2 * HIDDEN)[:, ::2])),
    ("input_0dim", RuntimeError, "input", lambda: fused_args(x=rnd(1).view(()), r=rnd(1).view(()), w=rnd(1))),
    (
        "input_3d_nonflattenable",
        RuntimeError,
        "input",
        lambda: fused_args(x=rnd(3, 2, HIDDEN).transpose(0, 1), r=rnd(2, 3, HIDDEN)),
    ),
    ("eps_negative", ValueError, "eps", lambda: fused_args(eps=-1.0)),
    ("eps_nan", ValueError, "eps", lambda: fused_args(eps=float("nan"))),
    ("eps_str", TypeError, "eps", lambda: fused_args(eps="x")),
    ("residual_is_input", RuntimeError, "residual", lambda: (lambda x: fused_args(x=x, r=x))(rnd(ROWS, HIDDEN))),
    (
        "residual_overlaps_input_shift_1row",
        RuntimeError,
        "residual",
        lambda: (lambda b: fused_args(x=b[:ROWS], r=b[1 : ROWS + 1]))(rnd(ROWS + 1, HIDDEN)),
    ),
    (
        "residual_expanded_stride0_rows",
        RuntimeError,
        "residual",
        lambda: fused_args(r=rnd(1, HIDDEN).expand(ROWS, HIDDEN)),
    ),
    ("input_expanded_stride0_rows", RuntimeError, "input", lambda: fused_args(x=rnd(1, HIDDEN).expand(ROWS, HIDDEN))),
    ("residual_on_cuda1", RuntimeError, "residual", lambda: fused_args(r=rnd(ROWS, HIDDEN, device=dev(1))), 2),
    ("weight_on_cuda1", RuntimeError, "weight", lambda: fused_args(w=rnd(HIDDEN, device=dev(1))), 2),
]
FUSED = ("fused_add_rmsnorm", "gemma_fused_add_rmsnorm")
for _op in FUSED:
    register_errors(_op, FUSED_ERRORS)


def fused_result_case(
    ops: tuple[str, ...],
    name: str,
    make: Callable[[], torch.Tensor],
    make_r: Callable[[torch.Tensor], torch.Tensor] | None = None,
    offsets: tuple[int, int, int] | None = (0, 0, 0),
    eps: float = 1e-6,
    either: tuple[type, tuple] | None = None,
    gpus: int = 1,
    mem_gib: int = 0,
) -> None:
    """``op(x, r, w)`` leaves the reference's output in x and rounded sum in r; w unchanged.
    ``offsets = (x, r, w)``: x and r are poisoned copies at those offsets; None: in place on the
    views ``make`` / ``make_r`` built (strided ones)."""
    for op in ops:

        @case(op, name, gpus=gpus, mem_gib=mem_gib)
        def _(op=op) -> None:
            x0 = make()
            r0 = rnd(*x0.shape, dtype=x0.dtype, device=x0.device) if make_r is None else make_r(x0)
            w = rnd(x0.shape[-1], dtype=x0.dtype, device=x0.device, offset=offsets[2] if offsets else 0)
            want_out, want_sum = fused_ref(x0, r0, w, eps, RMS_OFFSET[op])
            guarded = (
                []
                if offsets is None
                else [Poisoned(tuple(x0.shape), x0.dtype, offset=o, like=t) for o, t in zip(offsets[:2], (x0, r0))]
            )
            x, r = (x0, r0) if offsets is None else (guarded[0].t, guarded[1].t)

            def check() -> None:
                assert_matches("input (out)", x, want_out)
                assert_matches("residual (sum)", r, want_sum)
                for g in guarded:
                    g.assert_intact()

            alt = None if either is None else (either[0], op, either[1])
            expect_result(lambda: OPS[op](x, r, w, eps=eps), check, {"weight": w}, alt)


_FUSED_HIDDEN = get_ci_test_range(
    full_range=(1, 3, 8, 33, 128, 1000, 4096, 4097, 8192, 16384, 32768), ci_range=(1, 33, 1000, 4097, 16384)
)
_FUSED_MISALIGNED = get_ci_test_range(
    full_range=[
        (x, r, w, h)
        for x, r, w in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (3, 5, 7), (2, 2, 2))
        for h in (128, 4096, 1000)
    ],
    ci_range=[(x, r, w, h) for x, r, w in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (3, 5, 7)) for h in (128, 1000)],
)
for _dtn in ("float16", "bfloat16", "float32"):
    _d = dtype_of(_dtn)
    for _h in _FUSED_HIDDEN:
        fused_result_case(FUSED, f"{_dtn}_H{_h}", lambda d=_d, h=_h: rnd(ROWS, h, dtype=d))
    for _xo, _ro, _wo, _h in _FUSED_MISALIGNED:
        fused_result_case(
            FUSED,
            f"{_dtn}_H{_h}_misaligned_x{_xo}_res{_ro}_w{_wo}",
            lambda d=_d, h=_h: rnd(ROWS, h, dtype=d),
            offsets=(_xo, _ro, _wo),
        )
    fused_result_case(FUSED, f"{_dtn}_nan_inf_propagate", lambda d=_d: nan_inf_rows(d), offsets=None)
    fused_result_case(
        FUSED,
        f"{_dtn}_sum_overflows_dtype",
        lambda d=_d: torch.full((ROWS, 64), torch.finfo(d).max, dtype=d, device=dev()),
        make_r=lambda x: torch.full_like(x, torch.finfo(x.dtype).max),
        offsets=None,
    )
for _h in (65536, 70000, 70001, 2**20):
    fused_result_case(FUSED, f"bfloat16_huge_H{_h}", lambda h=_h: rnd(3, h), offsets=(1, 1, 0), either=HIDDEN_LIMIT)
fused_result_case(
    ("fused_add_rmsnorm",),
    "float16_1row_H2pow31-3_int32_overflow",
    lambda: rnd(1, 2**31 - 3, dtype=FP16),
    either=HIDDEN_LIMIT,
    mem_gib=70,
)
fused_result_case(FUSED, "float16_rows0", lambda: rnd(0, HIDDEN, dtype=FP16))
fused_result_case(FUSED, "float16_hidden0", lambda: rnd(ROWS, 0, dtype=FP16))
fused_result_case(FUSED, "bfloat16_1d", lambda: rnd(HIDDEN))
fused_result_case(FUSED, "bfloat16_3d", lambda: rnd(2, 3, HIDDEN))
fused_result_case(
    FUSED,
    "bfloat16_row_strides_differ",
    lambda: rnd(ROWS, HIDDEN + 8)[:, :HIDDEN],
    make_r=lambda x: rnd(ROWS, HIDDEN + 1)[:, :HIDDEN],
    offsets=None,
)
fused_result_case(
    FUSED,
    "bfloat16_row_strides_odd_misaligned",
    lambda: rnd(ROWS, HIDDEN + 3, offset=1)[:, 1 : HIDDEN + 1],
    make_r=lambda x: rnd(ROWS, HIDDEN + 5, offset=3)[:, 2 : HIDDEN + 2],
    offsets=None,
)
fused_result_case(FUSED, "eps_inf", lambda: rnd(ROWS, 128, dtype=FP32), eps=float("inf"), either=EPS_LIMIT)
fused_result_case(FUSED, "eps_zero", lambda: rnd(ROWS, 128, dtype=FP32), eps=0.0)
fused_result_case(FUSED, "float32_values_1e20", lambda: rnd(ROWS, 128, dtype=FP32, scale=1e20), offsets=None)
fused_result_case(FUSED, "all_on_cuda1_current_cuda0", lambda: rnd(ROWS, HIDDEN, device=dev(1)), offsets=None, gpus=2)

for _op in FUSED:

    @case(_op, "leaf_requires_grad_in_place")
    def _(op=_op) -> None:
        x = rnd(ROWS, HIDDEN, dtype=FP32).requires_grad_()
        r, w = rnd(ROWS, HIDDEN, dtype=FP32), rnd(HIDDEN, dtype=FP32)
        want_out, want_sum = fused_ref(x, r, w, 1e-6, RMS_OFFSET[op])

        def check() -> None:
            assert_matches("input (out)", x.detach(), want_out)
            assert_matches("residual (sum)", r, want_sum)

        # torch refuses in-place writes to a leaf that requires grad: an error naming input is fine
        expect_result(lambda: OPS[op](x, r, w), check, either=(RuntimeError, op, "input"))

    @case(_op, "side_stream")
    def _(op=_op) -> None:
        src, r, w = rnd(4096, 4096), rnd(4096, 4096), rnd(4096)
        want_out, want_sum = fused_ref(src, r, w, 1e-6, RMS_OFFSET[op])
        x = torch.zeros_like(src)

        def check() -> None:
            assert_matches("input (out)", x, want_out)
            assert_matches("residual (sum)", r, want_sum)

        expect_result(side_stream_call(lambda: x.copy_(src), lambda: OPS[op](x, r, w)), check)


# ---------------------------------------------------------------------------------------------
# fused_inplace_qknorm
# ---------------------------------------------------------------------------------------------
TOKENS, Q_HEADS, KV_HEADS, HEAD_DIM = 5, 8, 2, 128


def qk_args(q=_MISSING, k=_MISSING, qw=_MISSING, kw=_MISSING, **kwargs) -> tuple[tuple, dict]:
    """(q, k, q_weight, k_weight), kwargs: [5, 8, 128] / [5, 2, 128] bf16 and [128] weights unless given."""
    q = rnd(TOKENS, Q_HEADS, HEAD_DIM) if q is _MISSING else q
    k = rnd(TOKENS, KV_HEADS, HEAD_DIM) if k is _MISSING else k
    return (q, k, rnd(HEAD_DIM) if qw is _MISSING else qw, rnd(HEAD_DIM) if kw is _MISSING else kw), kwargs


def qk_all(dtype: torch.dtype) -> tuple[tuple, dict]:
    return qk_args(
        rnd(TOKENS, Q_HEADS, HEAD_DIM, dtype=dtype),
        rnd(TOKENS, KV_HEADS, HEAD_DIM, dtype=dtype),
        rnd(HEAD_DIM, dtype=dtype),
        rnd(HEAD_DIM, dtype=dtype),
    )


register_errors(
    "fused_inplace_qknorm",
    [
        (
            "q_cpu",
            RuntimeError,
            "q",
            lambda: ((torch.randn(2, 4, 8), torch.randn(2, 1, 8), torch.randn(8), torch.randn(8)), {}),
            0,
        ),
        (
            "q_numpy",
            TypeError,
            "q",
            lambda: ((numpy_array(2, 4, 8), numpy_array(2, 1, 8), torch.randn(8), torch.randn(8)), {}),
            0,
        ),
        ("k_cpu", RuntimeError, "k", lambda: qk_args(k=torch.randn(TOKENS, KV_HEADS, HEAD_DIM).bfloat16())),
        ("q_weight_cpu", RuntimeError, "q_weight", lambda: qk_args(qw=torch.randn(HEAD_DIM).bfloat16())),
        ("k_weight_cpu", RuntimeError, "k_weight", lambda: qk_args(kw=torch.randn(HEAD_DIM).bfloat16())),
        ("k_None", TypeError, "k", lambda: qk_args(k=None)),
        ("q_weight_list", TypeError, "q_weight", lambda: qk_args(qw=[1.0] * HEAD_DIM)),
        ("k_weight_None", TypeError, "k_weight", lambda: qk_args(kw=None)),
        ("q_2d", RuntimeError, "q", lambda: qk_args(q=rnd(TOKENS, Q_HEADS * HEAD_DIM))),
        ("k_2d", RuntimeError, "k", lambda: qk_args(k=rnd(TOKENS, KV_HEADS * HEAD_DIM))),
        ("q_4d", RuntimeError, "q", lambda: qk_args(q=rnd(TOKENS, Q_HEADS, 1, HEAD_DIM))),
        ("k_4d", RuntimeError, "k", lambda: qk_args(k=rnd(TOKENS, KV_HEADS, 1, HEAD_DIM))),
        ("q_int32", RuntimeError, "q", lambda: qk_args(q=rnd(TOKENS, Q_HEADS, HEAD_DIM, dtype=torch.int32))),
        ("q_float64_all", RuntimeError, "q", lambda: qk_all(torch.float64)),
        ("q_fp8_all", RuntimeError, "q", lambda: qk_all(torch.float8_e4m3fn)),
        ("k_fp16_q_bf16", RuntimeError, "k", lambda: qk_args(k=rnd(TOKENS, KV_HEADS, HEAD_DIM, dtype=FP16))),
        ("q_weight_fp32", RuntimeError, "q_weight", lambda: qk_args(qw=rnd(HEAD_DIM, dtype=FP32))),
        ("k_weight_fp16", RuntimeError, "k_weight", lambda: qk_args(kw=rnd(HEAD_DIM, dtype=FP16))),
        ("k_head_dim_mismatch", RuntimeError, "k", lambda: qk_args(k=rnd(TOKENS, KV_HEADS, HEAD_DIM // 2))),
        (
            "q_head_dim_vs_weights",
            RuntimeError,
            "q_weight",
            lambda: qk_args(q=rnd(TOKENS, Q_HEADS, 64), k=rnd(TOKENS, KV_HEADS, 64)),
        ),
        ("k_num_tokens_mismatch", RuntimeError, "k", lambda: qk_args(k=rnd(TOKENS + 1, KV_HEADS, HEAD_DIM))),
        ("q_weight_shape_D+1", RuntimeError, "q_weight", lambda: qk_args(qw=rnd(HEAD_DIM + 1))),
        ("k_weight_shape_D-1", RuntimeError, "k_weight", lambda: qk_args(kw=rnd(HEAD_DIM - 1))),
        ("k_weight_2d", RuntimeError, "k_weight", lambda: qk_args(kw=rnd(1, HEAD_DIM))),
        ("q_weight_noncontig", RuntimeError, "q_weight", lambda: qk_args(qw=rnd(2 * HEAD_DIM)[::2])),
        ("q_lastdim_stride2", RuntimeError, "q", lambda: qk_args(q=rnd(TOKENS, Q_HEADS, 2 * HEAD_DIM)[:, :, ::2])),
        ("k_lastdim_transposed", RuntimeError, "k", lambda: qk_args(k=rnd(TOKENS, HEAD_DIM, KV_HEADS).transpose(1, 2))),
        ("q_0dim", RuntimeError, "q", lambda: qk_args(q=rnd(1).view(()))),
        ("eps_negative", ValueError, "eps", lambda: qk_args(eps=-1e-5)),
        ("eps_nan", ValueError, "eps", lambda: qk_args(eps=float("nan"))),
        ("eps_list", TypeError, "eps", lambda: qk_args(eps=[1e-6])),
        (
            "k_is_q_same_tensor",
            RuntimeError,
            "k",
            lambda: (lambda q: qk_args(q=q, k=q))(rnd(TOKENS, Q_HEADS, HEAD_DIM)),
        ),
        (
            "k_overlaps_q_shift_1head",
            RuntimeError,
            "k",
            lambda: (lambda b: qk_args(q=b[:, 0:4], k=b[:, 3:5]))(rnd(TOKENS, 6, HEAD_DIM)),
        ),
        (
            "q_heads_expanded_stride0",
            RuntimeError,
            "q",
            lambda: qk_args(q=rnd(TOKENS, 1, HEAD_DIM).expand(TOKENS, Q_HEADS, HEAD_DIM)),
        ),
        (
            "k_tokens_expanded_stride0",
            RuntimeError,
            "k",
            lambda: qk_args(k=rnd(1, KV_HEADS, HEAD_DIM).expand(TOKENS, KV_HEADS, HEAD_DIM)),
        ),
        ("k_on_cuda1", RuntimeError, "k", lambda: qk_args(k=rnd(TOKENS, KV_HEADS, HEAD_DIM, device=dev(1))), 2),
        ("k_weight_on_cuda1", RuntimeError, "k_weight", lambda: qk_args(kw=rnd(HEAD_DIM, device=dev(1))), 2),
    ],
)


def qk_result_case(
    name: str,
    tokens: int = TOKENS,
    q_heads: int = Q_HEADS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
    dtype: torch.dtype = BF16,
    offsets: tuple[int, int, int, int] = (0, 0, 0, 0),
    fused: bool = False,
    eps: float = 1e-6,
    either: tuple | None = None,
    device: int = 0,
    make: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> None:
    """q and k normalised in place against the reference; the weights unchanged. ``offsets = (q, k,
    q_weight, k_weight)``. ``fused``: q and k are views of one poisoned [tokens, (Hq + 2 Hk) * D]
    qkv buffer (at the q offset), whose v part must stay as it was; otherwise poisoned copies.
    ``make``: q and k as built (no guards)."""

    @case("fused_inplace_qknorm", name, gpus=2 if device else 1)
    def _() -> None:
        place = dev(device)
        guarded = []
        v_part = None
        if make is not None:
            q, k = make()
        elif fused:
            width = (q_heads + 2 * kv_heads) * head_dim
            qkv = Poisoned(
                (tokens, width),
                dtype,
                place,
                offset=offsets[0],
                like=torch.randn(tokens, width, device=place).to(dtype),
            )
            guarded.append(qkv)
            q = qkv.t[:, : q_heads * head_dim].view(tokens, q_heads, head_dim)
            k = qkv.t[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
            v_part = (qkv.t[:, (q_heads + kv_heads) * head_dim :], qkv.t[:, (q_heads + kv_heads) * head_dim :].clone())
        else:
            guarded = [
                Poisoned(
                    (tokens, heads, head_dim),
                    dtype,
                    place,
                    offset=o,
                    like=rnd(tokens, heads, head_dim, dtype=dtype, device=place),
                )
                for heads, o in ((q_heads, offsets[0]), (kv_heads, offsets[1]))
            ]
            q, k = guarded[0].t, guarded[1].t
        qw = rnd(q.shape[-1], dtype=q.dtype, device=q.device, offset=offsets[2])
        kw = rnd(q.shape[-1], dtype=q.dtype, device=q.device, offset=offsets[3])
        want_q, want_k = rms_ref(q, qw, eps), rms_ref(k, kw, eps)

        def check() -> None:
            assert_matches("q", q, want_q)
            assert_matches("k", k, want_k)
            for g in guarded:
                g.assert_intact()
            if v_part is not None:
                assert torch.equal(*v_part), "the v part of the qkv buffer was modified"

        alt = None if either is None else (either[0], "fused_inplace_qknorm", either[1])
        expect_result(
            lambda: norm.fused_inplace_qknorm(q, k, qw, kw, eps=eps), check, {"q_weight": qw, "k_weight": kw}, alt
        )


_QK_DIMS = get_ci_test_range(full_range=(1, 3, 8, 64, 80, 96, 128, 256, 512, 1000), ci_range=(1, 3, 64, 80, 128, 1000))
_QK_MISALIGNED = get_ci_test_range(
    full_range=[
        (o, d) for o in ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 3, 5, 7)) for d in (64, 128)
    ],
    ci_range=[(o, d) for o in ((1, 0, 0, 0), (0, 0, 0, 1), (1, 3, 5, 7)) for d in (64, 128)],
)
for _dtn in ("float16", "bfloat16", "float32"):
    _d = dtype_of(_dtn)
    for _dim in _QK_DIMS:
        qk_result_case(f"{_dtn}_D{_dim}", head_dim=_dim, dtype=_d)
        qk_result_case(f"{_dtn}_D{_dim}_fused_qkv", head_dim=_dim, dtype=_d, fused=True)
    for _offsets, _dim in _QK_MISALIGNED:
        qk_result_case(
            f"{_dtn}_D{_dim}_misaligned_q{_offsets[0]}_k{_offsets[1]}_qw{_offsets[2]}_kw{_offsets[3]}",
            head_dim=_dim,
            dtype=_d,
            offsets=_offsets,
        )
    qk_result_case(f"{_dtn}_fused_qkv_misaligned_base", dtype=_d, fused=True, offsets=(1, 0, 0, 0))
qk_result_case("bfloat16_odd_heads_fused", q_heads=7, kv_heads=3, fused=True)
qk_result_case("bfloat16_hk0", kv_heads=0)
qk_result_case("bfloat16_hq0", q_heads=0)
qk_result_case("bfloat16_hq0_hk0", q_heads=0, kv_heads=0)
qk_result_case("bfloat16_tokens0", tokens=0)
qk_result_case("bfloat16_head_dim0", head_dim=0)
for _dim in (16384, 65536):
    qk_result_case(
        f"bfloat16_head_dim_{_dim}", head_dim=_dim, q_heads=2, kv_heads=1, either=(RuntimeError, ("q", "head_dim"))
    )
qk_result_case("bfloat16_many_tokens_100k", tokens=100_000, q_heads=4, kv_heads=1, head_dim=64)
qk_result_case("eps_inf", dtype=FP32, eps=float("inf"), either=EPS_LIMIT)
qk_result_case("eps_zero", dtype=FP32, eps=0.0)
qk_result_case("all_on_cuda1_current_cuda0", device=1)
qk_result_case("all_on_cuda1_fused_current_cuda0", device=1, fused=True)
qk_result_case(
    "bfloat16_nan_inf_heads", make=lambda: (nan_inf_rows(BF16).view(3, 2, 64), nan_inf_rows(BF16).view(3, 2, 64))
)


@case("fused_inplace_qknorm", "float16_rows_over_2pow32_D1", mem_gib=40)
def _() -> None:
    """num_tokens * num_heads > 2^32 rows (the 64-bit row -> (token, head) division path)."""
    tokens = 2**31 + 1
    q = fill_periodic(torch.empty(tokens, 2, 1, dtype=FP16, device=dev()), 7, 3)  # values -3 .. 3
    k = fill_periodic(torch.empty(tokens, 1, 1, dtype=FP16, device=dev()), 5, 2)  # values -2 .. 2
    qw, kw = torch.tensor([0.5], dtype=FP16, device=dev()), torch.tensor([2.0], dtype=FP16, device=dev())

    def check() -> None:
        for name, t, m, w in (("q", q, 7, 0.5), ("k", k, 5, 2.0)):
            flat = t.view(-1)
            for lo in range(0, flat.numel(), CHUNK):
                n = min(CHUNK, flat.numel() - lo)
                x = periodic(lo, n, m, m // 2)
                want = (x * torch.rsqrt(x * x + 1e-6) * w).to(FP16)
                assert_matches(f"{name}[flat {lo}:+{n}]", flat[lo : lo + n], want)

    expect_result(lambda: norm.fused_inplace_qknorm(q, k, qw, kw), check)


@case("fused_inplace_qknorm", "q_requires_grad_leaf")
def _() -> None:
    q = rnd(TOKENS, Q_HEADS, HEAD_DIM, dtype=FP32).requires_grad_()
    k = rnd(TOKENS, KV_HEADS, HEAD_DIM, dtype=FP32)
    qw, kw = rnd(HEAD_DIM, dtype=FP32), rnd(HEAD_DIM, dtype=FP32)
    want_q, want_k = rms_ref(q, qw, 1e-6), rms_ref(k, kw, 1e-6)

    def check() -> None:
        assert_matches("q", q.detach(), want_q)
        assert_matches("k", k, want_k)

    expect_result(
        lambda: norm.fused_inplace_qknorm(q, k, qw, kw), check, either=(RuntimeError, "fused_inplace_qknorm", "q")
    )


@case("fused_inplace_qknorm", "side_stream")
def _() -> None:
    src, k = rnd(8192, 8, 128), rnd(8192, 2, 128)
    qw, kw = rnd(128), rnd(128)
    want_q, want_k = rms_ref(src, qw, 1e-6), rms_ref(k, kw, 1e-6)
    q = torch.zeros_like(src)

    def check() -> None:
        assert_matches("q", q, want_q)
        assert_matches("k", k, want_k)

    expect_result(side_stream_call(lambda: q.copy_(src), lambda: norm.fused_inplace_qknorm(q, k, qw, kw)), check)


# ---------------------------------------------------------------------------------------------
# Shared helpers of the quantization and MoE sections
# ---------------------------------------------------------------------------------------------
import contextlib  # noqa: E402 - kept beside the sections that use it
import os  # noqa: E402

import sglang.jit_kernel.per_token_group_quant_8bit as ptgq  # noqa: E402
from sglang.jit_kernel.grouped_topk import grouped_topk  # noqa: E402
from sglang.jit_kernel.moe_align import align_reference, max_num_tokens_padded, moe_align_block_size  # noqa: E402
from sglang.jit_kernel.moe_topk_sigmoid import topk_sigmoid  # noqa: E402
from sglang.jit_kernel.moe_topk_softmax import topk_softmax  # noqa: E402
from sglang.jit_kernel.per_tensor_quant_fp8 import per_tensor_quant_fp8  # noqa: E402
from sglang.jit_kernel.per_tensor_quant_fp8 import reference as tensor_quant_reference  # noqa: E402

FP8 = torch.float8_e4m3fn
OPS.update(
    {
        "per_tensor_quant_fp8": per_tensor_quant_fp8,
        "per_token_group_quant_8bit": ptgq.per_token_group_quant_8bit,
        "topk_softmax": topk_softmax,
        "topk_sigmoid": topk_sigmoid,
        "grouped_topk": grouped_topk,
        "moe_align_block_size": moe_align_block_size,
    }
)


@contextlib.contextmanager
def env(name: str, value: str | None):
    """``os.environ[name] = value`` (None: unset) inside the block, restored after."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class Guarded8:
    """A [rows, cols] 8-bit output (``dtype`` fp8 / int8 / int32 words) at element ``offset`` of a
    0xA5-filled byte buffer, row stride ``stride`` (default cols), GUARD bytes on both sides."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype, offset: int = 0, stride: int | None = None):
        stride = cols if stride is None else stride
        size = torch.empty((), dtype=dtype).element_size()
        n = (GUARD + offset + max(rows - 1, 0) * stride + cols + GUARD) * size
        self.buf = torch.full((n,), 0xA5, dtype=torch.uint8, device=dev())
        flat = self.buf.view(dtype)
        self.t = flat[GUARD + offset :].as_strided((rows, cols), (stride, 1))
        self.rows, self.cols, self.stride, self.offset = rows, cols, stride, offset

    def assert_intact(self) -> None:
        """Every byte outside the view is still 0xA5."""
        mask = torch.ones_like(self.buf, dtype=torch.bool)
        flat = self.t.reshape(-1) if self.t.is_contiguous() else None
        size = self.t.element_size()
        base = self.t.data_ptr() - self.buf.data_ptr()
        for r in range(self.rows):  # small outputs only (a Python loop over rows)
            lo = base + r * self.stride * size
            mask[lo : lo + self.cols * size] = False
        del flat
        outside = self.buf[mask]
        assert bool((outside == 0xA5).all()), f"{int((outside != 0xA5).sum())} bytes outside the output changed"


def bytes_equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    g, w = dense(got).view(torch.uint8), dense(want).view(torch.uint8)
    if not torch.equal(g, w):
        bad = (g != w).reshape(-1).nonzero()[:, 0]
        pytest.fail(f"{name}: {bad.numel()} bytes differ, first at byte {int(bad[0])}")


# ---------------------------------------------------------------------------------------------
# per_tensor_quant_fp8 (accumulate, new today)
# ---------------------------------------------------------------------------------------------
def ptq_args(x=_MISSING, q=_MISSING, s=_MISSING, *rest, **kwargs) -> tuple[tuple, dict]:
    """(input [4, 64] bf16, output_q fp8, output_s fp32 [1]) unless given."""
    x = rnd(4, 64) if x is _MISSING else x
    q = torch.empty(4, 64, dtype=FP8, device=dev()) if q is _MISSING else q
    s = torch.zeros(1, device=dev()) if s is _MISSING else s
    return (x, q, s, *rest), kwargs


def _fp32_in_bytes_as_fp8() -> tuple[tuple, dict]:
    """output_q: the first bytes of each row of an fp32 input, viewed as fp8 (shared memory)."""
    x = rnd(4, 64, dtype=FP32)
    q = x.view(torch.uint8)[:, :64].view(FP8)
    return ptq_args(x, q)


register_errors(
    "per_tensor_quant_fp8",
    [
        *[
            (f"accumulate_{name}", TypeError, "accumulate", lambda v=v: ptq_args(accumulate=v()))
            for name, v in (
                ("int_1", lambda: 1),
                ("int_0", lambda: 0),
                ("None", lambda: None),
                ("str", lambda: "False"),
                ("tensor_bool", lambda: torch.tensor(False)),
            )
        ],
        ("accumulate_numpy_bool", TypeError, "accumulate", lambda: ptq_args(accumulate=numpy_bool(False))),
        # is_static is the 4th positional argument (input, output_q, output_s, is_static, *, eps, accumulate)
        (
            "accumulate_non_bool_with_is_static",
            TypeError,
            "accumulate",
            lambda: ptq_args(_MISSING, _MISSING, _MISSING, True, accumulate=0),
        ),
        ("is_static_int", TypeError, "is_static", lambda: ptq_args(_MISSING, _MISSING, _MISSING, 1)),
        ("output_s_two_elements", RuntimeError, "output_s", lambda: ptq_args(s=torch.zeros(2, device=dev()))),
        ("output_s_empty", RuntimeError, "output_s", lambda: ptq_args(s=torch.zeros(0, device=dev()))),
        (
            "output_s_float64",
            RuntimeError,
            "output_s",
            lambda: ptq_args(s=torch.zeros(1, dtype=torch.float64, device=dev())),
        ),
        ("output_s_cpu", RuntimeError, "output_s", lambda: ptq_args(s=torch.zeros(1))),
        ("output_s_meta", RuntimeError, "output_s", lambda: ptq_args(s=torch.zeros(1, device="meta"))),
        ("output_s_python_float", TypeError, "output_s", lambda: ptq_args(s=0.0)),
        (
            "output_s_is_an_input_element",
            RuntimeError,
            "output_s",
            lambda: (lambda x: ptq_args(x, s=x[1, 3:4]))(rnd(4, 64, dtype=FP32)),
        ),
        (
            "output_s_inside_output_q_bytes",
            RuntimeError,
            "output_s",
            lambda: (lambda q: ptq_args(q=q, s=q.view(torch.uint8).view(-1)[8:12].view(FP32)))(
                torch.empty(4, 64, dtype=FP8, device=dev())
            ),
        ),
        ("output_q_shares_input_bytes", RuntimeError, "output_q", _fp32_in_bytes_as_fp8),
        (
            "output_q_int8",
            RuntimeError,
            "output_q",
            lambda: ptq_args(q=torch.empty(4, 64, dtype=torch.int8, device=dev())),
        ),
        ("output_q_shape", RuntimeError, "output_q", lambda: ptq_args(q=torch.empty(4, 65, dtype=FP8, device=dev()))),
        (
            "output_q_lastdim_stride2",
            RuntimeError,
            "output_q",
            lambda: ptq_args(q=torch.empty(4, 128, dtype=FP8, device=dev())[:, ::2]),
        ),
        (
            "input_0dim",
            RuntimeError,
            "input",
            lambda: ptq_args(rnd(1).view(()), torch.empty((), dtype=FP8, device=dev())),
        ),
        ("input_bool", RuntimeError, "input", lambda: ptq_args(rnd(4, 64, dtype=torch.bool))),
        ("input_complex64", RuntimeError, "input", lambda: ptq_args(rnd(4, 64, dtype=torch.complex64))),
        ("input_meta", RuntimeError, "input", lambda: ptq_args(torch.empty(4, 64, dtype=BF16, device="meta"))),
        ("input_python_float", TypeError, "input", lambda: ptq_args(1.5)),
        ("eps_negative", ValueError, "eps", lambda: ptq_args(eps=-1.0)),
        ("eps_nan", ValueError, "eps", lambda: ptq_args(eps=float("nan"))),
        ("eps_bool", TypeError, "eps", lambda: ptq_args(eps=True)),
    ],
)


def numpy_bool(value: bool):
    np = pytest.importorskip("numpy")
    return np.bool_(value)


def warm_quant_module() -> None:
    """Load every input dtype's per_token_group_quant_8bit (fp8) and per_tensor_quant_fp8 modules (the
    wrappers' eager fast paths go straight to C++)."""
    import sglang.jit_kernel.per_tensor_quant_fp8 as ptq

    for dtype in FLOAT_DTYPES:
        ptgq._fn(dtype, FP8, False)
        ptq._fn(dtype)


# The same bad scalars with the module loaded: the fast path must not let them through to C++.
for _name, _kw in (("eps_bool_warm", {"eps": True}), ("accumulate_int_warm", {"accumulate": 1})):

    @case("per_tensor_quant_fp8", _name)
    def _(kw=_kw) -> None:
        warm_quant_module()
        args, kwargs = ptq_args(**kw)
        expect_error("per_tensor_quant_fp8", TypeError, next(iter(kw)), args, kwargs)


def ptq_result_case(
    name: str,
    make: Callable[[], torch.Tensor],
    accumulate: bool,
    stale: float,
    is_static: bool = False,
    s_view: Callable[[torch.Tensor], torch.Tensor] | None = None,
    q_offset: int = 0,
    warm: bool = False,
) -> None:
    """``output_s`` holds ``stale`` before the call (inside a 0xA5-guarded fp32 buffer via
    ``s_view``); the documented result: dynamic accumulate False -> the tensor's scale, True ->
    max(stale, scale); static -> output_s unchanged, q from it."""

    @case("per_tensor_quant_fp8", name)
    def _() -> None:
        if warm:
            warm_quant_module()
        x = make()
        s_buf = torch.full((16,), -7.0, device=dev())
        s = s_view(s_buf) if s_view is not None else s_buf[5:6]
        s.fill_(stale)
        others = s_buf.clone()
        q = Guarded8(1, x.numel(), FP8, offset=q_offset)
        q_t = q.t.view(-1)[: x.numel()].view(x.shape)
        if is_static:
            want_q, want_s = tensor_quant_reference(x, scale=torch.full((1,), stale, device=dev()))
            want_s = torch.full((1,), stale, device=dev())
        else:
            want_q, want_s = tensor_quant_reference(x)
            if accumulate:
                want_s = torch.fmax(want_s, torch.full_like(want_s, stale))  # fmaxf: a NaN ignored
                want_q, _ = tensor_quant_reference(x, scale=want_s)

        def check() -> None:
            bytes_equal("output_s", s.reshape(1), want_s.reshape(1))
            bytes_equal("output_q", q_t, want_q)
            q.assert_intact()
            mask = torch.ones(16, dtype=torch.bool, device=dev())
            mask[(s.data_ptr() - s_buf.data_ptr()) // 4] = False
            assert torch.equal(s_buf[mask], others[mask]), "fp32 words beside output_s changed"

        expect_result(
            lambda: per_tensor_quant_fp8(x, q_t, s, is_static, accumulate=accumulate), check, keep={"input": x}
        )


for _warm in (False, True):
    _w = "_warm" if _warm else ""
    for _acc in (False, True):
        for _size, _make in (
            ("small_fused", lambda: rnd(3, 100)),  # one row of <= 2048 chunks: the single pass
            ("large_two_pass", lambda: rnd(64, 4096)),
            ("strided_rows_two_pass", lambda: rnd(8, 136)[:, 3:131]),  # rows of an odd, misaligned view
        ):
            for _stale_name, _stale in (("stale_1e9", 1e9), ("stale_nan", float("nan")), ("stale_0", 0.0)):
                if _acc and _stale != _stale and _size != "small_fused":
                    continue  # below: a NaN left in output_s with accumulate (undocumented corner)
                ptq_result_case(f"accumulate_{_acc}_{_size}_{_stale_name}{_w}", _make, _acc, _stale, warm=_warm)
    ptq_result_case(
        f"static_accumulate_False_keeps_scale{_w}", lambda: rnd(5, 64), False, 0.25, is_static=True, warm=_warm
    )
    ptq_result_case(f"output_s_0dim{_w}", lambda: rnd(4, 64), False, 1e9, s_view=lambda b: b[3:4].view(()), warm=_warm)
    ptq_result_case(f"output_s_1x1{_w}", lambda: rnd(4, 64), False, 1e9, s_view=lambda b: b[3:4].view(1, 1), warm=_warm)
    ptq_result_case(
        f"output_s_stride3_view{_w}", lambda: rnd(4, 64), False, 1e9, s_view=lambda b: b[2::3][:1], warm=_warm
    )
    ptq_result_case(
        f"output_s_size1_dim_stride7{_w}",
        lambda: rnd(4, 64),
        False,
        1e9,
        s_view=lambda b: b.as_strided((1, 1), (7, 5), 9),
        warm=_warm,
    )
    ptq_result_case(f"output_q_misaligned_by_1{_w}", lambda: rnd(4, 64), False, 1e9, q_offset=1, warm=_warm)


@case("per_tensor_quant_fp8", "cuda_graph_accumulate_False_replays_fresh_scale")
def _() -> None:
    """Captured with accumulate=False: each replay overwrites output_s (no max with the last
    replay's scale), for both the single-pass and the two-pass shape."""
    for shape in ((1, 256), (64, 4096)):
        x = rnd(*shape, scale=100.0)
        q = torch.empty(shape, dtype=FP8, device=dev())
        s = torch.zeros(1, device=dev())
        per_tensor_quant_fp8(x, q, s, accumulate=False)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            per_tensor_quant_fp8(x, q, s, accumulate=False)
        x.copy_(rnd(*shape, scale=0.01))  # a much smaller maximum: accumulating would keep the old scale
        graph.replay()
        torch.cuda.synchronize()
        want_q, want_s = tensor_quant_reference(x)
        bytes_equal(f"output_s {shape}", s, want_s)
        bytes_equal(f"output_q {shape}", q, want_q)
    assert_context_healthy()


# Undocumented corner (the caller is told to zero output_s): a NaN left in output_s with
# accumulate=True. The single pass takes fmaxf(scale, NaN) = scale; the two-pass path max-reduces
# with atomic::max's integer trick, where NaN (0x7FC00000) beats every finite positive scale. The
# paths should agree (expected here: NaN ignored, as fmaxf and the small path do).
ptq_result_case("accumulate_True_large_two_pass_stale_nan_like_single_pass", lambda: rnd(64, 4096), True, float("nan"))


# ---------------------------------------------------------------------------------------------
# per_token_group_quant_8bit (each kernel the launcher picks)
# ---------------------------------------------------------------------------------------------


def gq_args(x=_MISSING, q=_MISSING, s=_MISSING, g: Any = 128, *rest, **kwargs) -> tuple[tuple, dict]:
    """(input [4, 256] bf16, output_q fp8, output_s fp32 [4, 256 / g], g, 1e-10, -448, 448)."""
    x = rnd(4, 256) if x is _MISSING else x
    q = torch.empty(x.shape, dtype=FP8, device=dev()) if q is _MISSING else q
    s = torch.empty(4, 2, device=dev()) if s is _MISSING else s
    scalars = rest if rest else (1e-10, -448.0, 448.0)
    return (x, q, s, g, *scalars), kwargs


register_errors(
    "per_token_group_quant_8bit",
    [
        ("group_size_48", ValueError, "group_size", lambda: gq_args(g=48)),
        ("group_size_8", ValueError, "group_size", lambda: gq_args(g=8)),
        (
            "group_size_2048",
            ValueError,
            "group_size",
            lambda: gq_args(rnd(4, 2048), s=torch.empty(4, 1, device=dev()), g=2048),
        ),
        (
            "group_size_1024_float32",
            ValueError,
            "group_size",
            lambda: gq_args(rnd(4, 1024, dtype=FP32), s=torch.empty(4, 1, device=dev()), g=1024),
        ),
        ("group_size_bool", TypeError, "group_size", lambda: gq_args(g=True)),
        ("group_size_float", TypeError, "group_size", lambda: gq_args(g=128.0)),
        (
            "hidden_not_multiple_of_group",
            RuntimeError,
            "input",
            lambda: gq_args(rnd(4, 200), s=torch.empty(4, 1, device=dev())),
        ),
        ("output_s_cols_3", RuntimeError, "output_s", lambda: gq_args(s=torch.empty(4, 3, device=dev()))),
        ("output_s_rows_5", RuntimeError, "output_s", lambda: gq_args(s=torch.empty(5, 2, device=dev()))),
        (
            "output_s_expanded_stride0",
            RuntimeError,
            "output_s",
            lambda: gq_args(s=torch.empty(4, 1, device=dev()).expand(4, 2)),
        ),
        (
            "output_s_int32_without_ue8m0",
            RuntimeError,
            "output_s",
            lambda: gq_args(s=torch.empty(4, 2, dtype=torch.int32, device=dev())),
        ),
        (
            "output_s_float32_with_ue8m0",
            RuntimeError,
            "output_s",
            lambda: gq_args(s=torch.empty(4, 1, device=dev()), scale_ue8m0=True),
        ),
        (
            "ue8m0_with_int8_output",
            RuntimeError,
            "output_q",
            lambda: gq_args(  # int8's own bounds: the ue8m0 rule is what refuses it
                _MISSING,
                torch.empty(4, 256, dtype=torch.int8, device=dev()),
                torch.empty(4, 1, dtype=torch.int32, device=dev()),
                128,
                1e-10,
                -128.0,
                127.0,
                scale_ue8m0=True,
            ),
        ),
        (
            "output_q_uint8",
            RuntimeError,
            "output_q",
            lambda: gq_args(q=torch.empty(4, 256, dtype=torch.uint8, device=dev())),
        ),
        (
            "output_q_lastdim_stride2",
            RuntimeError,
            "output_q",
            lambda: gq_args(q=torch.empty(4, 512, dtype=FP8, device=dev())[:, ::2]),
        ),
        (
            "output_q_shares_input_bytes",
            RuntimeError,
            "output_q",
            lambda: (lambda x: gq_args(x, q=x.view(torch.uint8)[:, :256].view(FP8)))(rnd(4, 256, dtype=FP32)),
        ),
        (
            "output_s_inside_input",
            RuntimeError,
            "output_s",
            lambda: (lambda x: gq_args(x, s=x[:, :2]))(rnd(4, 256, dtype=FP32)),
        ),
        (
            "fp8_min_nan",
            ValueError,
            ("fp8_min", "fp8_max"),
            lambda: gq_args(rnd(4, 256), _MISSING, _MISSING, 128, 1e-10, float("nan"), 448.0),
        ),
        (
            "fp8_min_ge_max",
            ValueError,
            ("fp8_min", "fp8_max"),
            lambda: gq_args(rnd(4, 256), _MISSING, _MISSING, 128, 1e-10, 448.0, -448.0),
        ),
        (
            "fp8_min_bool",
            TypeError,
            "fp8_min",
            lambda: gq_args(rnd(4, 256), _MISSING, _MISSING, 128, 1e-10, True, 448.0),
        ),
        ("eps_bool", TypeError, "eps", lambda: gq_args(rnd(4, 256), _MISSING, _MISSING, 128, True, -448.0, 448.0)),
        ("eps_negative", ValueError, "eps", lambda: gq_args(rnd(4, 256), _MISSING, _MISSING, 128, -1.0, -448.0, 448.0)),
        ("scale_ue8m0_int", TypeError, "scale_ue8m0", lambda: gq_args(scale_ue8m0=1)),
        (
            "input_0dim",
            RuntimeError,
            "input",
            lambda: gq_args(rnd(1).view(()), torch.empty((), dtype=FP8, device=dev())),
        ),
        ("input_bool", RuntimeError, "input", lambda: gq_args(rnd(4, 256, dtype=torch.bool))),
        ("input_complex64", RuntimeError, "input", lambda: gq_args(rnd(4, 256, dtype=torch.complex64))),
        ("input_meta", RuntimeError, "input", lambda: gq_args(torch.empty(4, 256, dtype=BF16, device="meta"))),
        ("input_cpu", RuntimeError, "input", lambda: gq_args(torch.randn(4, 256).bfloat16())),
        (
            "input_python_float",
            TypeError,
            "input",
            lambda: gq_args(2.0, torch.empty(4, 256, dtype=FP8, device=dev())),  # (gq_args reads x.shape)
        ),
        ("output_s_meta", RuntimeError, "output_s", lambda: gq_args(s=torch.empty(4, 2, device="meta"))),
    ],
)

# The same with the module loaded (2-D tensors take the eager fast path straight to C++): a bool
# scalar must not be converted to 1.0 by the FFI and let through.
for _name, _pos, _value, _exc, _arg in (
    ("eps_bool_warm", 4, True, TypeError, "eps"),
    ("fp8_min_bool_warm", 5, False, TypeError, "fp8_min"),
    ("fp8_max_bool_warm", 6, True, TypeError, "fp8_max"),
    ("fp8_min_nan_warm", 5, float("nan"), ValueError, ("fp8_min", "fp8_max")),
    ("group_size_48_warm", 3, 48, ValueError, "group_size"),
):

    @case("per_token_group_quant_8bit", _name)
    def _(pos=_pos, value=_value, exc=_exc, arg=_arg) -> None:
        warm_quant_module()
        args, kwargs = gq_args()
        args = (*args[:pos], value, *args[pos + 1 :])
        expect_error("per_token_group_quant_8bit", exc, arg, args, kwargs)


def pack_ue8m0(s: torch.Tensor) -> torch.Tensor:
    """fp32 power-of-two scales [M, G] -> int32 words [M, ceil(G / 4)]: exponent byte of group g at
    byte g % 4, bytes past the last group 0."""
    m, g = s.shape
    exps = ((s.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    words = torch.zeros(m, (g + 3) // 4 * 4, dtype=torch.uint8, device=s.device)
    words[:, :g] = exps
    return words.view(torch.int32)


def gq_result_case(
    name: str,
    m: int,
    k: int,
    g: int,
    dtype: torch.dtype = BF16,
    out: torch.dtype = FP8,
    ue8m0: bool = False,
    column_major: bool = False,
    x_offset: int = 0,
    x_pad: int = 0,
    q_offset: int = 0,
    q_pad: int = 0,
    bounds: tuple[float, float] | None = None,
    guard: bool = True,
    mem_gib: int = 0,
) -> None:
    """The op against the fp32 emulation, bit for bit: input [m, k] (row stride k +
    x_pad, at element x_offset), output_q in a guarded buffer (offset q_offset, row stride
    k + q_pad), output_s row- or column-major (TMA-style, rows padded to 4) in a guarded buffer."""
    lo, hi = bounds if bounds is not None else ((-448.0, 448.0) if out == FP8 else (-128.0, 127.0))

    @case("per_token_group_quant_8bit", name, mem_gib=mem_gib)
    def _() -> None:
        x = rnd(m, k + x_pad, dtype=dtype, offset=x_offset)[:, :k]
        q = Guarded8(m, k, out, offset=q_offset, stride=k + q_pad) if guard else None
        q_t = q.t if guard else torch.empty(m, k, dtype=out, device=dev())
        cols = (k // g + 3) // 4 if ue8m0 else k // g
        s_dtype = torch.int32 if ue8m0 else FP32
        if column_major:
            m_pad = (m + 3) // 4 * 4
            s_holder = Guarded8(cols, m_pad, s_dtype) if guard else None
            s_t = (s_holder.t if guard else torch.empty(cols, m_pad, dtype=s_dtype, device=dev())).t()[:m]
        else:
            s_holder = Guarded8(m, cols, s_dtype) if guard else None
            s_t = s_holder.t if guard else torch.empty(m, cols, dtype=s_dtype, device=dev())
        want_q, want_s = ptgq.reference(x, g, 1e-10, lo, hi, out, ue8m0)
        want_s = pack_ue8m0(want_s) if ue8m0 else want_s

        def check() -> None:
            bytes_equal("output_q", q_t, want_q)
            bytes_equal("output_s", s_t, want_s)
            if guard:
                q.assert_intact()
                s_holder.assert_intact()

        def call() -> None:
            ptgq.per_token_group_quant_8bit(x, q_t, s_t, g, 1e-10, lo, hi, ue8m0)

        expect_result(call, check, keep={"input": x})


gq_result_case("bf16_g16_two_chunk_groups", 5, 48, 16)
gq_result_case("fp16_g16_odd_groups", 3, 16 * 7, 16, dtype=FP16)
gq_result_case("fp32_g16_four_chunk_groups", 5, 16 * 3, 16, dtype=FP32)
gq_result_case("fp32_g512_max", 3, 1024, 512, dtype=FP32)
gq_result_case("bf16_g1024_max", 3, 2048, 1024)
gq_result_case("bf16_g128_3_groups", 7, 384, 128)
gq_result_case("bf16_g128_q_misaligned_1", 7, 384, 128, q_offset=1)
gq_result_case("bf16_g128_q_misaligned_8_pair_unaligned", 7, 384, 128, q_offset=8)  # 8-, not 16-byte aligned
gq_result_case("bf16_g128_q_row_stride_odd", 7, 384, 128, q_pad=8)  # row stride 392: rows 8-byte aligned only
gq_result_case("bf16_g128_input_misaligned_1", 7, 384, 128, x_offset=1, x_pad=1)
gq_result_case("fp32_g64_input_misaligned_and_q_offset_3", 6, 192, 64, dtype=FP32, x_offset=3, x_pad=5, q_offset=3)
gq_result_case("int8_bf16_g64_misaligned", 5, 320, 64, out=torch.int8, q_offset=1)
gq_result_case("int8_fp32_g32_narrow_bounds", 5, 96, 32, dtype=FP32, out=torch.int8, bounds=(-100.0, 50.0))
gq_result_case("fp8_narrow_bounds_clamped", 5, 256, 128, bounds=(-200.0, 100.0))
gq_result_case("column_major_fp32_scales", 10, 384, 128, column_major=True)
gq_result_case("ue8m0_5_groups_column_major", 10, 640, 128, ue8m0=True, column_major=True)  # 2 words, 3 zero bytes
gq_result_case("ue8m0_row_major_g16_q_misaligned", 6, 16 * 9, 16, ue8m0=True, q_offset=5)
gq_result_case("one_row", 1, 128, 128)
gq_result_case("rows_256_last_paired_small_tiles", 256, 128, 128)
gq_result_case("rows_257_first_sector_tiles", 257, 128, 128)
# Past the gridDim.y cap (65535 blocks of 4 one-tile rows): the paired 2x2 tiles (bf16 g16) and the
# sector kernel (fp32 g16; bf16 rows of two 128-chunk tiles) loop over the rows.
gq_result_case("rows_over_grid_y_cap_4x65535_paired_tiles", 4 * 65535 + 5, 16, 16, guard=False)
gq_result_case("rows_over_grid_y_cap_2x65535_two_sector_tiles", 2 * 65535 + 3, 1280, 128, guard=False, mem_gib=1)
gq_result_case("fp32_rows_over_grid_y_cap_4x65535_sectors", 4 * 65535 + 1, 16, 16, dtype=FP32, guard=False)


def documented_group_quant(x: torch.Tensor, g: int, eps: float, lo: float, hi: float, out: torch.dtype):
    """(q, s) of the docstring's arithmetic, inf kept: a group holding +-inf has max|x| = inf, so
    s = clamp(inf / 448, FLT_MIN, FLT_MAX) = FLT_MAX; NaN is ignored by the maximum. (``ptgq.reference``
    differs there: its emulate_amax uses torch.nan_to_num, which also maps inf to FLT_MAX, giving
    s = FLT_MAX / 448 for such groups; the finite groups are the same.)"""
    from sglang.jit_kernel._quant_8bit import emulate_quant, emulate_scale

    m, k = x.shape
    groups = x.float().reshape(m, k // g, g)
    amax = torch.where(groups.isnan(), 0.0, groups.abs()).amax(dim=-1)
    s = emulate_scale(amax, eps, 448.0 if out == FP8 else 127.0)
    return emulate_quant(groups, s.unsqueeze(-1), lo, hi, out).reshape(m, k), s


@case("per_token_group_quant_8bit", "nan_inf_groups")
def _() -> None:
    """The documented scales: FLT_MAX for a group holding +-inf, NaN ignored by the maximum; q: +-448
    for +-inf, NaN for NaN."""
    x = rnd(4, 256)
    x[0, 3], x[1, 130], x[2, 0], x[3] = float("nan"), float("inf"), -float("inf"), 0.0
    want_q, want_s = documented_group_quant(x, 128, 1e-10, -448.0, 448.0, FP8)
    flt_max = torch.finfo(FP32).max
    assert want_s[1, 1] == flt_max and want_s[2, 0] == flt_max and torch.isfinite(want_s).all()
    assert want_q[1, 130].float() == 448.0 and want_q[2, 0].float() == -448.0 and want_q[0, 3].float().isnan()
    wrong: list[str] = []

    def compare(q: torch.Tensor, s: torch.Tensor) -> None:
        for name, got, want in (("output_q", q, want_q), ("output_s", s, want_s)):
            g, w = got.view(torch.uint8), want.view(torch.uint8)
            if not torch.equal(g, w):
                rows = sorted({int(i) // g.shape[1] for i in (g != w).reshape(-1).nonzero()[:, 0]})
                values = f" (got {got[rows].tolist()}, want {want[rows].tolist()})" if name == "output_s" else ""
                wrong.append(f"{name}: {int((g != w).sum())} bytes differ in rows {rows}{values}")

    q = torch.empty(4, 256, dtype=FP8, device=dev())
    s = torch.empty(4, 2, device=dev())
    expect_result(
        lambda: ptgq.per_token_group_quant_8bit(x, q, s, 128, 1e-10, -448.0, 448.0),
        lambda: compare(q, s),
        keep={"input": x},
    )
    assert not wrong, "; ".join(wrong)


@case("per_token_group_quant_8bit", "cuda_graph_small_and_sector_paths")
def _() -> None:
    for rows in (64, 300):  # the paired tiles, the sector kernel
        x = rnd(rows, 512)
        q = torch.empty(rows, 512, dtype=FP8, device=dev())
        s = torch.empty(rows, 4, device=dev())
        call = lambda q=q, s=s, x=x: ptgq.per_token_group_quant_8bit(x, q, s, 128, 1e-10, -448.0, 448.0)  # noqa: E731
        graph_replay_call(call, [x], [q.view(torch.uint8), s])()
        want_q, want_s = ptgq.reference(x, 128, 1e-10, -448.0, 448.0, FP8)
        bytes_equal(f"output_q {rows} rows", q, want_q)
        bytes_equal(f"output_s {rows} rows", s, want_s)
    assert_context_healthy()


# ---------------------------------------------------------------------------------------------
# MoE routing and moe_align: results at the shapes' kernel boundaries
# ---------------------------------------------------------------------------------------------
def route_args(e: int = 64, k: int = 4, t: int = 5, gating=_MISSING, **kwargs) -> tuple[tuple, dict]:
    """(topk_weights [t, k] fp32, topk_ids int32, gating_output [t, e] bf16)."""
    g = rnd(t, e) if gating is _MISSING else gating
    w = torch.empty(t, k, device=dev())
    ids = torch.empty(t, k, dtype=torch.int32, device=dev())
    return (w, ids, g), kwargs


_ROUTE_ERRORS = [
    ("bias_length_E+1", RuntimeError, "correction_bias", lambda: route_args(correction_bias=rnd(65, dtype=FP32))),
    ("bias_length_E-1", RuntimeError, "correction_bias", lambda: route_args(correction_bias=rnd(63, dtype=FP32))),
    ("bias_int32", RuntimeError, "correction_bias", lambda: route_args(correction_bias=rnd(64, dtype=torch.int32))),
    ("bias_float64", RuntimeError, "correction_bias", lambda: route_args(correction_bias=rnd(64, dtype=torch.float64))),
    ("bias_cpu", RuntimeError, "correction_bias", lambda: route_args(correction_bias=torch.zeros(64))),
    ("bias_meta", RuntimeError, "correction_bias", lambda: route_args(correction_bias=torch.zeros(64, device="meta"))),
    ("bias_2d", RuntimeError, "correction_bias", lambda: route_args(correction_bias=rnd(1, 64, dtype=FP32))),
    ("bias_0dim", RuntimeError, "correction_bias", lambda: route_args(correction_bias=rnd(1, dtype=FP32).view(()))),
    ("bias_python_float", TypeError, "correction_bias", lambda: route_args(correction_bias=0.5)),
    ("topk_gt_num_experts", RuntimeError, "topk_weights", lambda: route_args(e=8, k=9)),
    (
        "topk_ids_int64",
        RuntimeError,
        "topk_ids",
        lambda: (lambda a: ((a[0][0], a[0][1].long(), a[0][2]), {}))(route_args()),
    ),
    ("gating_lastdim_stride2", RuntimeError, "gating_output", lambda: route_args(gating=rnd(5, 128)[:, ::2])),
    ("gating_3d", RuntimeError, "gating_output", lambda: route_args(gating=rnd(5, 1, 64))),
    ("gating_0dim", RuntimeError, "gating_output", lambda: route_args(gating=rnd(1).view(()))),
    ("gating_bool", RuntimeError, "gating_output", lambda: route_args(gating=rnd(5, 64, dtype=torch.bool))),
    ("gating_complex64", RuntimeError, "gating_output", lambda: route_args(gating=rnd(5, 64, dtype=torch.complex64))),
    ("gating_meta", RuntimeError, "gating_output", lambda: route_args(gating=torch.empty(5, 64, device="meta"))),
    ("gating_python_float", TypeError, "gating_output", lambda: route_args(gating=1.0)),
    (
        "weights_overlap_ids",
        RuntimeError,
        ("topk_weights", "topk_ids"),
        lambda: (lambda b: ((b[:20].view(5, 4), b[8:28].view(torch.int32).view(5, 4), rnd(5, 64)), {}))(
            torch.empty(40, device=dev())
        ),
    ),
    ("renormalize_int", TypeError, "renormalize", lambda: route_args(renormalize=1)),
]
register_errors(
    "topk_softmax",
    _ROUTE_ERRORS
    + [
        ("softcap_negative", ValueError, "moe_softcapping", lambda: route_args(moe_softcapping=-1.0)),
        ("softcap_nan", ValueError, "moe_softcapping", lambda: route_args(moe_softcapping=float("nan"))),
    ],
)
register_errors("topk_sigmoid", _ROUTE_ERRORS)


def gt_args(e: int = 256, groups: Any = 8, topk_group: Any = 4, topk: Any = 8, **over) -> tuple[tuple, dict]:
    scores = over.pop("scores", rnd(5, e, dtype=FP32))
    bias = over.pop("bias", rnd(e, dtype=FP32))
    renorm = over.pop("renormalize", True)
    return (scores, bias, groups, topk_group, topk, renorm), over


register_errors(
    "grouped_topk",
    [
        ("groups_0", ValueError, "num_expert_group", lambda: gt_args(groups=0)),
        ("groups_33", ValueError, "num_expert_group", lambda: gt_args(e=264, groups=33)),
        ("groups_not_divisor", ValueError, "num_expert_group", lambda: gt_args(groups=7)),
        ("groups_bool", TypeError, "num_expert_group", lambda: gt_args(groups=True)),
        ("topk_group_gt_groups", ValueError, "topk_group", lambda: gt_args(topk_group=9)),
        ("topk_gt_kept_experts", ValueError, "topk", lambda: gt_args(topk_group=1, topk=33)),
        ("topk_0", ValueError, "topk", lambda: gt_args(topk=0)),
        ("renormalize_int", TypeError, "renormalize", lambda: gt_args(renormalize=1)),
        ("scaling_factor_inf", ValueError, "scaling_factor", lambda: gt_args(scaling_factor=float("inf"))),
        ("bias_length", RuntimeError, "bias", lambda: gt_args(bias=rnd(255, dtype=FP32))),
        ("bias_cpu", RuntimeError, "bias", lambda: gt_args(bias=torch.zeros(256))),
        ("bias_int64", RuntimeError, "bias", lambda: gt_args(bias=rnd(256, dtype=torch.int64))),
        ("bias_python_float", TypeError, "bias", lambda: gt_args(bias=0.1)),
        ("scores_meta", RuntimeError, "scores", lambda: gt_args(scores=torch.empty(5, 256, device="meta"))),
        ("scores_bool", RuntimeError, "scores", lambda: gt_args(scores=rnd(5, 256, dtype=torch.bool))),
        ("scores_0dim", RuntimeError, "scores", lambda: gt_args(scores=rnd(1).view(()))),
        ("scores_python_float", TypeError, "scores", lambda: gt_args(scores=1.0)),
    ],
)


def route_result_case(op: str, name: str, e: int, k: int, make=None, bias: bool = False, softcap: float = 0.0) -> None:
    """The fp64 reference's routing (the same choice, near ties aside), outputs inside NaN / -7 buffers."""
    from moe_reference import assert_routing_matches, grid_logits, sigmoid_reference, softmax_reference

    @case(op, name)
    def _() -> None:
        gating = grid_logits(6, e, FP32) if make is None else make()
        b = (torch.arange(e, device=dev()).float() % 5 - 2) / 16 if bias else None
        w_buf = torch.full((gating.shape[0], k + 3), float("nan"), device=dev())
        ids_buf = torch.full((gating.shape[0], k + 3), -7, dtype=torch.int32, device=dev())
        w, ids = w_buf[:, 1 : k + 1], ids_buf[:, 2 : k + 2]
        if op == "topk_softmax":
            keys, wall, ref_ids = softmax_reference(gating, k, True, softcap, b)
            call = lambda: topk_softmax(w, ids, gating, True, softcap, b)  # noqa: E731
        else:
            keys, wall, ref_ids = sigmoid_reference(gating, k, True, b)
            call = lambda: topk_sigmoid(w, ids, gating, True, b)  # noqa: E731
        expect_result(
            call,
            lambda: assert_routing_matches(
                w, ids, keys, wall, ref_ids, True, eps=0.0 if op == "topk_softmax" else 1e-20
            ),
            keep={"gating_output": gating},
        )
        assert torch.isnan(w_buf[:, 0]).all() and (ids_buf[:, :2] == -7).all(), "wrote before the outputs"


def nan_inf_logits(e: int) -> torch.Tensor:
    x = rnd(6, e, dtype=FP32)
    x[0, 1], x[1, :3], x[2, e - 1], x[3] = float("nan"), float("inf"), -float("inf"), float("nan")
    x[4] = -float("inf")
    return x


for _op in ("topk_softmax", "topk_sigmoid"):
    for _e, _k in (
        (1, 1),
        (2, 2),
        (32, 32),
        (33, 32),
        (64, 64),
        (1024, 32),
        (1024, 33),
        (1025, 8),
        (160, 8),
        (1000, 1),
    ):
        route_result_case(_op, f"E{_e}_k{_k}", _e, _k)
        route_result_case(_op, f"E{_e}_k{_k}_bias", _e, _k, bias=True)
    route_result_case(_op, "E64_k64_k_equals_E_bias", 64, 64, bias=True)
    route_result_case(
        _op, "gating_rows_stride_odd_misaligned_E256", 256, 8, make=lambda: rnd(6, 263, dtype=BF16, offset=1)[:, 3:259]
    )
    route_result_case(_op, "gating_fp16_rows_stride_E+1", 128, 8, make=lambda: rnd(6, 129, dtype=FP16)[:, :128])
    route_result_case(_op, "gating_rows_expanded_stride0", 64, 4, make=lambda: rnd(1, 64, dtype=FP32).expand(6, 64))
    route_result_case(_op, "nan_inf_logits_E64", 64, 4, make=lambda: nan_inf_logits(64))
    route_result_case(_op, "nan_inf_logits_E256", 256, 8, make=lambda: nan_inf_logits(256))
    route_result_case(_op, "nan_inf_logits_E2000_v1", 2000, 8, make=lambda: nan_inf_logits(2000))
route_result_case("topk_softmax", "E256_softcap_nan_rows", 256, 8, make=lambda: nan_inf_logits(256), softcap=30.0)


def grouped_result_case(
    name: str, e: int, groups: int, topk_group: int, topk: int, make=None, bias: bool = True
) -> None:
    from moe_reference import assert_routing_matches, grid_logits, grouped_reference

    @case("grouped_topk", name)
    def _() -> None:
        b = (torch.arange(e, device=dev()).float() % 7 - 3) / 16 if bias else None
        if make is None:
            # Grid logits of the first seed whose rows have well-separated kept groups: the topk_group-th
            # and next group scores equal (an exact tie, kept) or apart by more than the tolerance (with
            # 32 groups, seed 0 has a row within 4e-5). Deterministic: the same seed on every run.
            for seed in range(32):
                scores = grid_logits(6, e, FP32, seed=seed)
                if not bool(grouped_reference(scores, b, groups, topk_group, topk)[3].any()):
                    break
        else:
            scores = make()
        keys, wall, ref_ids, ambiguous = grouped_reference(scores, b, groups, topk_group, topk)
        assert not bool(ambiguous.any()), "test input with a near-tie of groups"
        out = {}
        expect_result(
            lambda: out.setdefault("r", grouped_topk(scores, b, groups, topk_group, topk, True, 2.5)),
            lambda: assert_routing_matches(out["r"][0], out["r"][1], keys, wall, ref_ids, True, 1e-20, 2.5),
            keep={"scores": scores},
        )


grouped_result_case("E256_g8_v2", 256, 8, 4, 8)
grouped_result_case("E1024_g32_lanes1_v2", 1024, 32, 4, 32)
grouped_result_case("E1024_g32_topk33_v1", 1024, 32, 4, 33)
grouped_result_case("E96_g32_group3_v1", 96, 32, 8, 8)
grouped_result_case("E64_g1_all_kept", 64, 1, 1, 32)
grouped_result_case("E256_g8_topk_equals_kept_experts", 256, 8, 1, 32)
grouped_result_case("E256_g8_nan_inf", 256, 8, 4, 8, make=lambda: nan_inf_logits(256)[:3])
grouped_result_case("E32_g32_group1", 32, 32, 8, 8)


@case("moe_align_block_size", "small_shapes_against_reference")
def _() -> None:
    for num_experts, block in ((8, 16), (256, 64), (1, 4)):
        ids = torch.randint(0, num_experts, (33, 8), dtype=torch.int32, device=dev())
        sorted_len = max_num_tokens_padded(ids.numel(), num_experts, block)
        sorted_ids = torch.full((sorted_len,), -5, dtype=torch.int32, device=dev())
        expert_ids = torch.full((sorted_len // block + 1,), -5, dtype=torch.int32, device=dev())
        post = torch.zeros(1, dtype=torch.int32, device=dev())
        cumsum = torch.zeros(num_experts + 1, dtype=torch.int32, device=dev())
        total_w, cumsum_w, experts_w, sorted_w = align_reference(ids, num_experts, block, sorted_len)

        def check() -> None:
            total = int(total_w)  # noqa: B023 - called within this iteration
            assert torch.equal(post, total_w), f"num_tokens_post_pad {post.tolist()} != {total_w.tolist()}"  # noqa: B023 - called within this iteration
            assert torch.equal(cumsum, cumsum_w), "cumsum_buffer"  # noqa: B023 - called within this iteration
            assert torch.equal(expert_ids[: experts_w.numel()], experts_w), "expert_ids"  # noqa: B023 - called within this iteration
            assert torch.equal(sorted_ids[:total], sorted_w[:total]), "sorted_token_ids"  # noqa: B023 - called within this iteration

        expect_result(
            lambda: moe_align_block_size(ids, num_experts, block, sorted_ids, expert_ids, post, cumsum, True),  # noqa: B023 - called within this iteration
            check,
            keep={"topk_ids": ids},
        )


# ---------------------------------------------------------------------------------------------
# Every op of the catalogue: generic attacks on its first-checked tensor argument
# ---------------------------------------------------------------------------------------------
def _catalogue() -> dict[str, tuple[Callable[..., Any], Callable[[Any], tuple[tuple, dict]], str]]:
    """op -> (function, make(device) -> plausible (args, kwargs), the first tensor it checks)."""
    import importlib

    from sglang.jit_kernel import registry

    def t(*shape, dtype=BF16):
        return lambda d: torch.zeros(shape, dtype=dtype, device=d)

    i32, i64 = torch.int32, torch.int64
    makers: dict[str, tuple[Callable[[Any], tuple[tuple, dict]], str]] = {
        "silu_and_mul": (lambda d: ((t(4, 64)(d),), {}), "input"),
        "gelu_and_mul": (lambda d: ((t(4, 64)(d),), {}), "input"),
        "gelu_tanh_and_mul": (lambda d: ((t(4, 64)(d),), {}), "input"),
        "add_constant": (lambda d: ((t(8, dtype=i32)(d), 1), {}), "src"),
        "downcast_fp8": (
            lambda d: (
                (
                    t(4, 2, 64)(d),
                    t(4, 2, 64)(d),
                    t(16, 2, 64, dtype=FP8)(d),
                    t(16, 2, 64, dtype=FP8)(d),
                    t(1, dtype=FP32)(d),
                    t(1, dtype=FP32)(d),
                    t(4, dtype=i64)(d),
                ),
                {},
            ),
            "k",
        ),
        "clamp_position": (lambda d: ((t(8, dtype=i64)(d),), {}), "seq_lens"),
        "concat_mla_k": (lambda d: ((t(4, 128, 192)(d), t(4, 128, 128)(d), t(4, 1, 64)(d)), {}), "k"),
        "concat_mla_absorb_q": (lambda d: ((t(4, 128, 512)(d), t(4, 128, 64)(d)), {}), "a"),
        "fused_qk_norm_rope": (
            lambda d: (
                (
                    t(4, 3 * 128)(d),
                    1,
                    1,
                    1,
                    128,
                    1e-6,
                    t(128)(d),
                    t(128)(d),
                    10000.0,
                    True,
                    t(4, dtype=i32)(d),
                    1.0,
                    0.0,
                    0.0,
                    1.0,
                ),
                {},
            ),
            "qkv",
        ),
        "grouped_topk": (lambda d: ((t(4, 64, dtype=FP32)(d), None, 8, 4, 8, True), {}), "scores"),
        "store_cache": (
            lambda d: ((t(4, 128)(d), t(4, 128)(d), t(16, 128)(d), t(16, 128)(d), t(4, dtype=i64)(d)), {}),
            "k",
        ),
        "store_cache_quant": (
            lambda d: (
                (
                    t(4, 128)(d),
                    t(4, 128)(d),
                    t(16, 128, dtype=FP8)(d),
                    t(16, 128, dtype=FP8)(d),
                    t(4, dtype=i64)(d),
                    t(1, dtype=FP32)(d),
                    t(1, dtype=FP32)(d),
                ),
                {},
            ),
            "k",
        ),
        "set_mla_kv_buffer": (
            lambda d: ((t(16, 1, 576)(d), t(4, dtype=i64)(d), t(4, 1, 512)(d), t(4, 1, 64)(d)), {}),
            "kv_buffer",
        ),
        "moe_align_block_size": (
            lambda d: (
                (
                    t(4, 2, dtype=i32)(d),
                    8,
                    16,
                    t(200, dtype=i32)(d),
                    t(20, dtype=i32)(d),
                    t(1, dtype=i32)(d),
                    t(9, dtype=i32)(d),
                ),
                {},
            ),
            "topk_ids",
        ),
        "moe_sum_reduce": (lambda d: ((t(4, 2, 64)(d), t(4, 64)(d)), {}), "input"),
        "topk_sigmoid": (lambda d: ((t(4, 2, dtype=FP32)(d), t(4, 2, dtype=i32)(d), t(4, 8)(d)), {}), "gating_output"),
        "topk_softmax": (lambda d: ((t(4, 2, dtype=FP32)(d), t(4, 2, dtype=i32)(d), t(4, 8)(d)), {}), "gating_output"),
        "rmsnorm": (lambda d: ((t(4, 64)(d), t(64)(d)), {}), "input"),
        "rmsnorm_hf": (lambda d: ((t(4, 64)(d), t(64)(d)), {}), "input"),
        "fused_add_rmsnorm": (lambda d: ((t(4, 64)(d), t(4, 64)(d), t(64)(d)), {}), "input"),
        "gemma_rmsnorm": (lambda d: ((t(4, 64)(d), t(64)(d)), {}), "input"),
        "gemma_fused_add_rmsnorm": (lambda d: ((t(4, 64)(d), t(4, 64)(d), t(64)(d)), {}), "input"),
        "fused_inplace_qknorm": (lambda d: ((t(4, 8, 128)(d), t(4, 2, 128)(d), t(128)(d), t(128)(d)), {}), "q"),
        "fused_inplace_qknorm_across_heads": (
            lambda d: ((t(4, 8 * 128)(d), t(4, 2 * 128)(d), t(8 * 128)(d), t(2 * 128)(d)), {}),
            "q",
        ),
        "per_tensor_quant_fp8": (lambda d: ((t(4, 64)(d), t(4, 64, dtype=FP8)(d), t(1, dtype=FP32)(d)), {}), "input"),
        "per_token_group_quant_8bit": (
            lambda d: ((t(4, 256)(d), t(4, 256, dtype=FP8)(d), t(4, 2, dtype=FP32)(d), 128, 1e-10, -448.0, 448.0), {}),
            "input",
        ),
        "per_token_quant_fp8": (lambda d: ((t(4, 64)(d), t(4, 64, dtype=FP8)(d), t(4, 1, dtype=FP32)(d)), {}), "input"),
        "per_token_group_quant": (lambda d: ((t(4, 512)(d),), {"fuse_silu_and_mul": True}), "input"),
        "rmsnorm_quant": (lambda d: ((t(4, 256)(d), t(256)(d), 1e-6), {}), "input"),
        "fused_add_rmsnorm_quant": (lambda d: ((t(4, 256)(d), t(4, 256)(d), t(256)(d), 1e-6), {}), "input"),
        "apply_rope_inplace": (
            lambda d: (
                (t(4, 8, 128)(d), t(4, 2, 128)(d), t(64, 128, dtype=FP32)(d), t(4, dtype=i64)(d)),
                {"is_neox": True},
            ),
            "q",
        ),
        "apply_rope_inplace_with_kvcache": (
            lambda d: (
                (
                    t(4, 8, 128)(d),
                    t(4, 2, 128)(d),
                    t(4, 2, 128)(d),
                    t(16, 2, 128)(d),
                    t(16, 2, 128)(d),
                    t(64, 128, dtype=FP32)(d),
                    t(4, dtype=i64)(d),
                    t(4, dtype=i64)(d),
                ),
                {"is_neox": True},
            ),
            "q",
        ),
        "rotary_embedding": (
            lambda d: ((t(4, dtype=i64)(d), t(4, 8 * 128)(d), t(4, 2 * 128)(d), 128, t(64, 128, dtype=FP32)(d)), {}),
            "positions",
        ),
        "scale": (lambda d: ((t(8)(d), 2.0), {}), "src"),
    }
    out, missing = {}, []
    for name, entry in registry.all_ops().items():
        module = importlib.import_module(entry.source)
        fn = getattr(module, name, None) or getattr(module, f"{name}_cuda", None)
        if fn is None or name not in makers:
            missing.append(name)  # reported by test_every_registered_op_is_in_the_catalogue
            continue
        out[name] = (fn, *makers[name])
    return out, missing


CATALOGUE, _UNCATALOGUED = _catalogue()


def test_every_registered_op_is_in_the_catalogue() -> None:
    """Every op that registers itself gets the every-op bad-input cases below (runs without a GPU)."""
    assert not _UNCATALOGUED, (
        f"registered op(s) {_UNCATALOGUED} have no entry in the `makers` table of "
        "tests/test_bad_inputs.py::_catalogue (op name -> (a function of the device giving valid (args, "
        "kwargs), the name of one tensor argument)), or no function of that name in their module: add "
        "one so that the every-op bad-input cases (wrong device, mixed devices, ...) cover them"
    )


def _replace_first(args: tuple, kwargs: dict, fn: Callable, arg: str, value: Any) -> tuple[tuple, dict]:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.arguments[arg] = value
    return bound.args, bound.kwargs


def _generic(fn: Callable, make: Callable, arg: str, attack: str) -> tuple[tuple, dict, type]:
    """(args, kwargs, expected exception) of one attack on ``arg``."""
    if attack in ("all_cpu", "all_meta"):
        args, kwargs = make("cpu" if attack == "all_cpu" else "meta")
        return args, kwargs, RuntimeError
    args, kwargs = make(dev())
    first = inspect.signature(fn).bind(*args, **kwargs).arguments[arg]
    value = {
        "meta": lambda: torch.empty(first.shape, dtype=first.dtype, device="meta"),
        "cpu": lambda: torch.zeros(first.shape, dtype=first.dtype),
        "0dim": lambda: torch.zeros((), dtype=first.dtype, device=dev()),
        "bool": lambda: torch.zeros(first.shape, dtype=torch.bool, device=dev()),
        "complex64": lambda: torch.zeros(first.shape, dtype=torch.complex64, device=dev()),
        "python_float": lambda: 1.5,
    }[attack]()
    args, kwargs = _replace_first(args, kwargs, fn, arg, value)
    return args, kwargs, TypeError if attack == "python_float" else RuntimeError


GENERIC_ATTACKS = ("all_cpu", "all_meta", "python_float", "meta", "cpu", "0dim", "bool", "complex64")


def _scale_0dim() -> None:
    x = torch.tensor(1.5, dtype=BF16, device=dev())
    out = {}
    expect_result(
        lambda: out.setdefault("r", scale(x, 2.0)),
        lambda: assert_matches("out", out["r"], scaled(x, 2.0)),
        keep={"src": x},
    )


def _add_constant_0dim() -> None:
    x = torch.tensor(41, dtype=torch.int32, device=dev())
    out = {}

    def check() -> None:
        assert out["r"].shape == () and out["r"].dtype == torch.int32, f"{out['r'].shape} {out['r'].dtype}"
        assert int(out["r"]) == 42, f"add_constant(41, 1) gave {int(out['r'])}"

    expect_result(lambda: out.setdefault("r", add_constant(x, 1)), check, keep={"src": x})


def _moe_align_0dim() -> None:
    """A 0-d topk_ids is one routed id (topk_ids is flattened): the outputs of the 1-element 1-D ids."""
    ids = torch.tensor(3, dtype=torch.int32, device=dev())
    sorted_ids = torch.full((200,), -5, dtype=torch.int32, device=dev())
    expert_ids = torch.full((20,), -5, dtype=torch.int32, device=dev())
    post = torch.zeros(1, dtype=torch.int32, device=dev())
    cumsum = torch.zeros(9, dtype=torch.int32, device=dev())
    total_w, cumsum_w, experts_w, sorted_w = align_reference(ids.view(1), 8, 16, 200)

    def check() -> None:
        assert torch.equal(post, total_w), f"num_tokens_post_pad {post.tolist()} != {total_w.tolist()}"
        assert torch.equal(cumsum, cumsum_w), f"cumsum_buffer {cumsum.tolist()} != {cumsum_w.tolist()}"
        assert torch.equal(expert_ids[: experts_w.numel()], experts_w), "expert_ids"
        assert torch.equal(sorted_ids, sorted_w), "sorted_token_ids (padded with numel = 1)"

    expect_result(
        lambda: moe_align_block_size(ids, 8, 16, sorted_ids, expert_ids, post, cumsum, True),
        check,
        keep={"topk_ids": ids},
    )


#: Attacks that are valid inputs of these ops: the right result instead of an error. A 0-d tensor
#: is one element for the elementwise ops and one routed id for moe_align (it flattens topk_ids).
GENERIC_RESULTS: dict[tuple[str, str], Callable[[], None]] = {
    ("scale", "0dim"): _scale_0dim,
    ("add_constant", "0dim"): _add_constant_0dim,
    ("moe_align_block_size", "0dim"): _moe_align_0dim,
}
_GENERIC_PARAMS = [
    pytest.param(
        op,
        attack,
        id=f"{op}-{attack}",
        marks=[] if attack in ("all_cpu", "all_meta", "python_float") else [requires_cuda],
    )
    for op in CATALOGUE
    for attack in GENERIC_ATTACKS
]


@pytest.mark.parametrize(("op", "attack"), _GENERIC_PARAMS)
def test_catalogue_generic(op: str, attack: str) -> None:
    """The op's first-checked tensor argument on the meta device / the CPU (all tensors, or that one),
    0-d, bool, complex, or a Python float: the documented error naming it, before any launch. A
    bool / complex dtype may instead be reported on another argument that must match its dtype
    (``concat_mla_k: k_nope dtype: expected bool (the dtype of k), got bfloat16``): the message
    then starts with ``<op>: <another argument of op> dtype``. GENERIC_RESULTS: valid inputs, the result."""
    if (op, attack) in GENERIC_RESULTS:
        GENERIC_RESULTS[op, attack]()
        return
    fn, make, arg = CATALOGUE[op]
    if attack == "python_float" and not HAS_CUDA:
        args, kwargs = make("cpu")
        args, kwargs = _replace_first(args, kwargs, fn, arg, 1.5)
        exc = TypeError
    else:
        args, kwargs, exc = _generic(fn, make, arg, attack)
    bound = inspect.signature(fn).bind(*args, **kwargs).arguments
    snaps = snapshot({k: v for k, v in bound.items() if not (isinstance(v, torch.Tensor) and v.is_meta)})
    with pytest.raises(Exception) as info:  # noqa: PT011 - judged by assert_names
        fn(*args, **kwargs)
        sync_all()
    if attack in ("bool", "complex64"):
        names = tuple(inspect.signature(fn).parameters)
        assert_names(info.value, exc, fn.__name__, names)  # the message names the public function
        what = re.match(rf"^{re.escape(fn.__name__)}: (\w+) (\w+)", str(info.value))
        assert what and (what[1] == arg or what[2] == "dtype"), f"another argument, not a dtype error: {info.value}"
    else:
        assert_names(info.value, exc, fn.__name__, arg)  # the message names the public function
    assert_unchanged(snaps)
    assert_context_healthy()


# ---------------------------------------------------------------------------------------------
# The tests: one per op, parametrized over its cases
# ---------------------------------------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "bad_input_case" in metafunc.fixturenames:
        metafunc.parametrize("bad_input_case", CASES[metafunc.function.__name__.removeprefix("test_")])


def test_scale(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_add_constant(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_rmsnorm(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_gemma_rmsnorm(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_fused_add_rmsnorm(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_gemma_fused_add_rmsnorm(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_fused_inplace_qknorm(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_per_tensor_quant_fp8(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_per_token_group_quant_8bit(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_topk_softmax(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_topk_sigmoid(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_grouped_topk(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_moe_align_block_size(bad_input_case: Case) -> None:
    bad_input_case.run()


def test_foreign_scalar_type_is_named_with_its_module():
    """A numpy bool is not a bool: the message names numpy's type, not a bare ``bool``."""
    np = pytest.importorskip("numpy")
    from sglang.jit_kernel.per_token_group_quant import per_token_group_quant  # noqa: PLC0415

    with pytest.raises(TypeError, match=r"scale_ue8m0 type: expected a bool, got numpy\.bool_?$"):
        per_token_group_quant(torch.zeros(4, 256, dtype=torch.bfloat16), scale_ue8m0=np.True_)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
