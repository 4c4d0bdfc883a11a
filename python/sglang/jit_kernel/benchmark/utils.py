"""Benchmark helpers: CUDA-graph timing, cold-L2 input rotation, bytes-moved bandwidth, copy roof.

``run_benchmark(fn)`` is what the tutorial's ``triton.testing.perf_report`` functions return:
microseconds as (median, p80, p20). Memory-bound ops should also report GB/s from an explicit
bytes-moved count and the percentage of a device-to-device copy measured in the same process,
with inputs rotated past the L2 size so the cache is cold (``bench_rotating``, ``copy_roof_gbps``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sglang.jit_kernel._build import env_flag
from sglang.jit_kernel.utils import cache_once

DEFAULT_DEVICE = "cuda"
DEFAULT_DTYPE = torch.bfloat16
DEFAULT_QUANTILES = (0.5, 0.2, 0.8)


def is_in_ci() -> bool:
    """True when running under CI (``CI`` or ``SGLANG_IS_IN_CI`` set to 1/true/yes/on, any case)."""
    return env_flag("CI") or env_flag("SGLANG_IS_IN_CI")


def get_benchmark_range(full_range: Sequence[Any], ci_range: Sequence[Any]) -> list[Any]:
    """``ci_range`` under CI (short), ``full_range`` otherwise."""
    return list(ci_range if is_in_ci() else full_range)


def _do_bench_cudagraph(fn: Callable[[], Any], rep_ms: int) -> list[float]:
    import triton.testing  # noqa: PLC0415

    fn()  # warm up: compile / load outside the timed region
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, quantiles=list(DEFAULT_QUANTILES))


def run_benchmark(fn: Callable[[], Any], rep_ms: int = 20) -> tuple[float, float, float]:
    """Time ``fn`` by CUDA-graph replay (triton.testing.do_bench_cudagraph).

    Returns
    -------
    (median, p80, p20) : tuple of float
        Microseconds per call.
    """
    p50, p20, p80 = _do_bench_cudagraph(fn, rep_ms)
    return 1000.0 * p50, 1000.0 * p80, 1000.0 * p20


@cache_once
def l2_cache_bytes(device: int | None = None) -> int:
    """L2 size of the device in bytes (50 MiB if the property is unavailable)."""
    index = torch.cuda.current_device() if device is None else device
    props = torch.cuda.get_device_properties(index)
    return int(getattr(props, "L2_cache_size", 50 << 20))


def num_rotating_sets(bytes_per_set: int, max_sets: int = 64) -> int:
    """How many input sets make one pass over them at least 4x the L2 size (at least 2, at most
    ``max_sets``: below L2 / max_sets bytes per set, about 0.8 MB on an H200, the pass fits in L2
    and the timing is partly L2-warm, as a decode step's input produced by the previous kernel)."""
    return max(2, min(max_sets, math.ceil(4 * l2_cache_bytes() / max(bytes_per_set, 1))))


#: Calls shorter than this (µs) are timed in several CUDA-graph captures (``bench_rotating``).
SHORT_CALL_US = 5.0
#: Captures timed for a short call; the middle one is reported.
SHORT_CALL_CAPTURES = 5


def bench_rotating(
    call: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    rep_ms: int = 50,
    captures: int | None = None,
) -> tuple[float, float, float]:
    """Time ``call(*inputs)`` per call with cold L2: one graph replays the call over every input set.

    ``captures=None``: calls under ``SHORT_CALL_US`` (decode sizes) are timed in
    ``SHORT_CALL_CAPTURES`` separate graph captures and the capture with the middle median is
    reported (on an H200 the same kernel on the same buffers measured 0.99 µs in some captures and
    1.05 in others, stable within a capture, so one capture can land on either side); longer calls
    in one. An int times exactly that many captures (>= 1) and reports the middle one.

    Returns
    -------
    (median, p80, p20) : tuple of float
        Microseconds per call.
    """
    sets = [tuple(s) for s in input_sets]

    def one_pass() -> None:
        for s in sets:
            call(*s)

    if captures is not None and captures < 1:
        raise ValueError(f"bench_rotating: captures must be >= 1 or None, got {captures}")
    n = len(sets)

    def capture() -> tuple[float, ...]:
        return tuple(1000.0 * t / n for t in _do_bench_cudagraph(one_pass, rep_ms))

    timed = [capture()]
    if captures is None:
        captures = SHORT_CALL_CAPTURES if timed[0][0] < SHORT_CALL_US else 1
    timed += [capture() for _ in range(captures - 1)]
    p50, p20, p80 = sorted(timed)[len(timed) // 2]
    return p50, p80, p20


def bench_rotating_events(
    call: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    rep_ms: int = 100,
) -> float:
    """Median µs per ``call(*inputs)`` with cold L2, timed with events around eager launches (no
    graph): the method for a same-size device copy, which a graph would run on a copy engine. The
    launch gaps between back-to-back kernels are included; compare only against rows timed the same
    way."""
    import triton.testing  # noqa: PLC0415

    sets = [tuple(s) for s in input_sets]

    def one_pass() -> None:
        for s in sets:
            call(*s)

    one_pass()
    torch.cuda.synchronize()
    return 1000.0 * triton.testing.do_bench(one_pass, rep=rep_ms, return_mode="median") / len(sets)


@cache_once
def exit_unless_gpu(script: str) -> None:
    """Exit 0 with a one-line note when no CUDA GPU is visible (a GPU benchmark then measures
    nothing, like a skipped GPU test); return otherwise.

    Parameters
    ----------
    script : str
        The benchmark's file name or path (``__file__``); the note names the file (e.g.
        ``"bench_norm.py"``).
    """
    if not torch.cuda.is_available():
        name = os.path.basename(script)
        print(f"skip: {name} needs a CUDA GPU (none visible); run it on a machine with an NVIDIA GPU", flush=True)
        raise SystemExit(0)


def copy_roof_gbps(nbytes: int = 1 << 30) -> float:
    """Bandwidth of a device-to-device copy of ``nbytes`` bf16 (bytes read + written, GB/s).

    Timed with events (``triton.testing.do_bench``), not graph replay: captured into a graph, a
    same-device ``copy_`` becomes a memcpy node that runs on a copy engine at about two thirds of the
    SM copy's bandwidth, which is not the roof a kernel is held to. At 1 GiB launch gaps are noise.
    """
    import triton.testing  # noqa: PLC0415

    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=DEFAULT_DEVICE)
    dst = torch.empty_like(src)
    median_ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200, return_mode="median")  # noqa: F821 (false positive: the lambda runs before the `del` below)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (median_ms * 1e-3) / 1e9


def eager_wall_us(fn: Callable[[], Any], calls: int = 10_000, warmup: int = 200) -> float:
    """Mean host wall time per call (µs) of ``calls`` back-to-back eager calls and one final sync:
    the launch overhead a decode step pays, not kernel time."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


@dataclass
class BenchRow:
    """One printed row: an op, a case, a provider and its time."""

    op: str
    case: str
    provider: str
    median_us: float
    bytes_moved: int

    @property
    def gbps(self) -> float:
        return self.bytes_moved / (self.median_us * 1e-6) / 1e9 if self.median_us > 0 else float("nan")


def format_rows(rows: Sequence[BenchRow], roof_gbps: float) -> str:
    """A fixed-width table: op, case, provider, median µs, GB/s, % of the copy roof."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    lines = [
        f"# {name}; copy roof {roof_gbps:.0f} GB/s (1 GiB bf16 device copy, same process); "
        "CUDA-graph median, inputs rotated (cold L2 from ~1 MB per call; smaller cases partly L2-resident;"
        f" calls under {SHORT_CALL_US:g} us: the middle of {SHORT_CALL_CAPTURES} captures)",
        f"{'op':<22} {'case':<26} {'provider':<16} {'us':>9} {'GB/s':>8} {'%copy':>6}",
    ]
    for r in rows:
        lines.append(
            f"{r.op:<22} {r.case:<26} {r.provider:<16} {r.median_us:>9.2f} {r.gbps:>8.0f} "
            f"{100 * r.gbps / roof_gbps:>6.1f}"
        )
    return "\n".join(lines)


def sweep_rows(
    op: str,
    sizes: Sequence[int],
    providers: dict[str, Callable[..., Any]],
    make_set: Callable[[int], Sequence[Any]],
    case: Callable[[int], str],
    bytes_moved: Callable[[int], int],
) -> list[BenchRow]:
    """Rows of every provider at every size: cold L2 (``bench_rotating`` over enough fresh input sets,
    ``make_set(size)``, to pass 4x the L2) and ``"<provider> one input"`` (one set replayed, the
    tutorial's method). A provider that raises on a case prints one ``# ... skipped`` line instead."""
    rows = []
    for size in sizes:
        nbytes = bytes_moved(size)
        sets = [make_set(size) for _ in range(num_rotating_sets(nbytes))]
        for name, call in providers.items():
            for label, use in (("", sets), (" one input", sets[:1])):
                try:
                    median, _, _ = bench_rotating(call, use)
                except Exception as exc:  # noqa: BLE001 - a baseline that cannot run this case
                    print(f"# {op} {case(size)} {name}{label}: skipped ({type(exc).__name__}: {str(exc)[:80]})")
                    continue
                rows.append(BenchRow(op, case(size), name + label, median, nbytes))
        del sets
        torch.cuda.empty_cache()
    return rows


def same_size_note(rows: list[BenchRow]) -> str:
    """jit and torch as % of a device copy of the same bytes, all three timed with events."""
    lines = ["# % of a same-size device copy (events over eager launches, cold L2)"]
    by_case: dict[str, dict[str, float]] = {}
    for r in rows:
        by_case.setdefault(r.case, {})[r.provider] = r.median_us
    for case, t in by_case.items():
        if "copy (events)" in t:
            copy = t["copy (events)"]
            lines.append(
                f"{case:<18} copy {copy:8.2f} us  jit {t['jit (events)']:8.2f} us ({100 * copy / t['jit (events)']:5.1f} %)"
                f"  torch {t['torch (events)']:8.2f} us ({100 * copy / t['torch (events)']:5.1f} %)"
            )
    return "\n".join(lines)


_COMPILED: dict[str, Callable[..., Any]] = {}


def compiled_once(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(fn)``, made once per ``name`` (a torch baseline row compiles on its first call,
    outside the timed region, and is reused for every size)."""
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn)
    return _COMPILED[name]


def with_env(name: str, value: str | None, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called with environment variable ``name`` set to ``value`` (None: unset), restored after
    each call. For the launchers' A/B knobs, which C++ reads at each call (so at graph capture)."""

    def call(*args: Any) -> Any:
        old = os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value
        try:
            return fn(*args)
        finally:
            os.environ.pop(name, None)
            if old is not None:
                os.environ[name] = old

    return call
