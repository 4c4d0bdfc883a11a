"""Command line of the JIT kernel system.

python -m sglang.jit_kernel [clangd] [--overwrite] [--arch 9.0]   write a .clangd for the headers
python -m sglang.jit_kernel check [OP ...] [-j N]                  build, verify and time every op (or the named ones)
python -m sglang.jit_kernel build [--all | OP ...] [--arch 9.0 ...] [-j N]   prebuild variants
python -m sglang.jit_kernel cache info | clear | prune [--days N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.jit_kernel.registry import OpEntry

DEFAULT_ARCH = "9.0"


# ---------------------------------------------------------------------------------------------
# clangd
# ---------------------------------------------------------------------------------------------
def write_clangd(output: Path, arch: str, overwrite: bool) -> int:
    """Write a .clangd that lets clangd parse csrc/ and include/ as CUDA for ``arch``."""
    import tvm_ffi.libinfo as libinfo

    from sglang.jit_kernel._build import INCLUDE_DIR, find_cuda_home, parse_arch

    if output.exists() and not overwrite:
        print(f"{output} exists; pass --overwrite to replace it", file=sys.stderr)
        return 1
    major, minor, suffix = parse_arch(arch)
    try:
        cuda_home = str(find_cuda_home())
    except RuntimeError:
        cuda_home = "/usr/local/cuda"
    flags = [
        "-xcuda",
        f"--cuda-gpu-arch=sm_{major}{minor}{suffix}",
        f"--cuda-path={cuda_home}",
        "-std=c++20",
        f"-DSGL_CUDA_ARCH={major * 100 + minor * 10}",
        f"-I{INCLUDE_DIR}",
        f"-I{libinfo.find_include_path()}",
        f"-I{libinfo.find_dlpack_include_path()}",
        f"-I{cuda_home}/include",
    ]
    flags = list(dict.fromkeys(flags))  # tvm-ffi ships dlpack in its own include dir
    body = "CompileFlags:\n  Add:\n" + "".join(f"    - {f}\n" for f in flags)
    body += "  Remove:\n    - --expt-relaxed-constexpr\n    - -gencode*\n    - -Xcompiler*\n"
    output.write_text(body)
    print(f"wrote {output} (sm_{major}{minor}{suffix})")
    return 0


# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------
_DTYPE_WORDS = re.compile(
    r"(?<![A-Za-z0-9])(?:(?:fp16|bf16|fp32|fp64|fp8_e4m3|fp8_e5m2|u?int\d+)_t|b?float\d+|half)(?![A-Za-z0-9])"
)


def _error_key(error: str) -> str:
    """A variant's error with its dtype names and cache keys blanked: the key under which one error
    failing several dtypes of a module is reported once. Only a grouping key: the printed error is
    the first variant's own text."""
    return re.sub(r"-[0-9a-f]{12,}", "-<key>", _DTYPE_WORDS.sub("<T>", error))


def build_variants(names: list[str] | None, jobs: int, quiet: bool = False, archs: list[str] | None = None) -> int:
    """Compile every variant of the named ops (all ops if ``names`` is None) in parallel, through
    ``sglang.jit_kernel.cache.build_variants`` (the path of ``prebuild``).

    Prints the modules to build and the ops each serves, a line as each variant starts and one as it
    ends (``cached`` when it came from the cache), an error failing several variants of a module once
    (``also for float16, float32``), and a summary. Returns the number of failures.
    """
    from sglang.jit_kernel.cache import VariantResult
    from sglang.jit_kernel.cache import build_variants as build_all
    from sglang.jit_kernel.registry import all_modules

    try:
        modules = all_modules(names)
    except ValueError as exc:  # unknown op: the known ones and how an op registers
        print(exc, file=sys.stderr)
        return 1
    if not quiet:
        for module in modules:
            served = ", ".join(module.ops)
            print(f"{module.name}: {len(module.variants)} variant(s), serves {served}", flush=True)
    failures: dict[str, list[tuple[str, str]]] = {}  # grouping key -> (variant name, its error)

    def emit(line: str) -> None:
        # One write per line: `started` runs on the build threads, and print() writes the text and its
        # newline separately, so lines of two threads could interleave.
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def started(name: str) -> None:
        if not quiet:
            emit(f"  start  {name}")

    def report(result: VariantResult, done: int, total: int) -> None:
        bar = "#" * (20 * done // total)
        if result.error is None:
            status = "cached" if result.cached else f"built {result.seconds:6.1f} s"
        else:
            status = f"FAILED {result.seconds:6.1f} s"
            failures.setdefault(_error_key(result.error), []).append((result.name, result.error))
        if not quiet or result.error is not None:
            emit(f"[{bar:<20}] {done}/{total} {result.name:<40} {status}")

    start = time.perf_counter()
    try:
        results = build_all(names, archs=archs, jobs=jobs, on_done=report, on_start=started)
    except (ValueError, RuntimeError) as exc:  # bad arch, no target architecture
        print(exc, file=sys.stderr)
        return 1
    for failed in failures.values():
        (first, error), others = failed[0], [name for name, _ in failed[1:]]
        also = f" (also for {', '.join(n[n.index('[') + 1 : -1] for n in others)})" if others else ""
        print(f"{first}{also}:\n  {error}", file=sys.stderr)
    count = sum(len(v) for v in failures.values())
    cached = sum(1 for r in results if r.cached)
    print(
        f"built {len(results) - count}/{len(results)} variants ({cached} cached) in {time.perf_counter() - start:.1f} s"
    )
    return count


# ---------------------------------------------------------------------------------------------
# cache
# ---------------------------------------------------------------------------------------------
def cache_command(action: str, days: float) -> int:
    from sglang.jit_kernel import cache

    try:
        root = cache.cache_root()
    except RuntimeError as exc:  # unsafe cache directory
        print(exc, file=sys.stderr)
        return 1
    if action == "info":
        info = cache.cache_info()
        print(f"cache root: {root}")
        print(f"entries: {info.entries}  size: {info.total_bytes / 2**20:.1f} MiB  staging leftovers: {info.staging}")
        for entry in sorted(info.items, key=lambda e: e.name):
            print(f"  {entry.name:<48} {entry.size_bytes / 2**20:7.2f} MiB  last used {entry.age_days:6.1f} days ago")
        return 0
    if action == "clear":
        removed = cache.clear_cache()
        print(f"removed {removed} entries from {root}")
        return 0
    removed = cache.prune_cache(max_age_days=days)
    print(f"pruned {removed} entries unused for more than {days:g} days from {root}")
    return 0


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------
def _case_labels(entry: OpEntry) -> list[str]:
    """The labels of an op's check cases, without a GPU: the cases are built lazily by their
    ``check_cases`` function, which allocates nothing until ``make_inputs`` runs."""
    try:
        return [case.label for case in entry.check_cases()]
    except Exception:  # a case list that needs a GPU to be listed
        return []


def _selected_ops(names: list[str] | None) -> dict[str, OpEntry]:
    """Every registered op in registration order, or the named ones in that order (ValueError naming
    the unknown ones, as ``build`` answers them)."""
    from sglang.jit_kernel.registry import all_modules, all_ops

    ops = all_ops()
    if not names:
        return ops
    all_modules(names)  # raises ValueError: unknown op(s), the known ones, how an op registers
    wanted = set(names)
    return {name: entry for name, entry in ops.items() if name in wanted}


def check(jobs: int, names: list[str] | None = None) -> int:
    """The main job: build every op (or the named ones), verify each case against its fp32 reference,
    time it. A case that raises is a failure row (its exception on the line), not the end of the run.
    Returns 1 on any failure (build, wrong result, exception) or unknown op name, else 0."""
    import torch

    try:
        ops = _selected_ops(names)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1

    has_gpu = torch.cuda.is_available()
    if not has_gpu:
        source = (
            "from SGLANG_JIT_CUDA_ARCH"
            if "SGLANG_JIT_CUDA_ARCH" in os.environ
            else "the default; set SGLANG_JIT_CUDA_ARCH for another"
        )
        os.environ.setdefault("SGLANG_JIT_CUDA_ARCH", DEFAULT_ARCH)
        print(
            f"No CUDA GPU visible: compiling {'the named ops' if names else 'every op'} for "
            f"{os.environ['SGLANG_JIT_CUDA_ARCH']} "
            f"({source}); nothing can be run here."
        )
    failures = build_variants(list(ops) if names else None, jobs)
    if not has_gpu:
        if failures:  # which variants failed is printed above; no row may read "compiled"
            print(f"compile-only check: {failures} failed; no op was run (no GPU)")
            return 1
        width = max(len(name) for name in ops) + 1
        mwidth = max(len(e.module.name) for e in ops.values()) + 1
        print(f"{'op':<{width}} {'module':<{mwidth}} {'cases':>5}  status")
        for entry in ops.values():
            print(
                f"{entry.name:<{width}} {entry.module.name:<{mwidth}} {len(_case_labels(entry)):>5}  "
                "compiled; not run (no GPU)"
            )
        print("compile-only check: all variants compiled; no op was run (no GPU)")
        return 0

    from sglang.jit_kernel.benchmark.utils import (
        BenchRow,
        bench_rotating,
        copy_roof_gbps,
        num_rotating_sets,
    )
    from sglang.jit_kernel.testing import TOLERANCE

    roof = copy_roof_gbps()
    print(f"# {torch.cuda.get_device_name()}; copy roof {roof:.0f} GB/s (1 GiB bf16 device copy)")
    width = max(len(name) for name in ops) + 1
    print(f"{'op':<{width}} {'case':<36} {'correct':<8} {'max err':>9} {'us':>9} {'GB/s':>8} {'%copy':>6}")
    bad = failures
    for entry in ops.values():
        for case in entry.check_cases():
            try:
                inputs = case.make_inputs()
                expected = case.reference(*inputs)
                actual = case.compared(case.call(*inputs), inputs)
                torch.cuda.synchronize()
                if case.dtype.is_floating_point:
                    rtol, atol = case.tolerance or TOLERANCE[case.dtype]
                    diff = (actual.float() - expected.float()).abs()
                    ok = bool(torch.all(diff <= atol + rtol * expected.float().abs()).item())
                    max_err = float(diff.max().item()) if diff.numel() else 0.0
                else:
                    ok = bool(torch.equal(actual, expected))
                    max_err = float((actual.long() - expected.long()).abs().max().item()) if actual.numel() else 0.0
                sets = [case.make_inputs() for _ in range(num_rotating_sets(case.bytes_moved))]
                median, _, _ = bench_rotating(case.call, sets)
            except Exception as exc:  # one broken case is a failure row; the other ops still run
                bad += 1
                message = " ".join(f"{type(exc).__name__}: {exc}".split())
                print(f"{entry.name:<{width}} {case.label:<36} {'ERROR':<8} {message[:300]}", flush=True)
                torch.cuda.empty_cache()
                continue
            row = BenchRow(entry.name, case.label, "jit", median, case.bytes_moved)
            bad += 0 if ok else 1
            print(
                f"{entry.name:<{width}} {case.label:<36} {'yes' if ok else 'NO':<8} {max_err:>9.2e} "
                f"{median:>9.2f} {row.gbps:>8.0f} {100 * row.gbps / roof:>6.1f}",
                flush=True,
            )
            del sets, inputs
            torch.cuda.empty_cache()
    print("all ops correct" if bad == 0 else f"{bad} failure(s)")
    return 1 if bad else 0


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``-j 0`` would build nothing)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def age_days(text: str) -> float:
    """argparse type: a number of days >= 0 (not NaN)."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of days >= 0, got {text}")
    return value


@contextlib.contextmanager
def _stop_builds_on_sigterm() -> Iterator[None]:
    """Inside: SIGTERM (``kill``, a job scheduler) stops the builds in progress, then exits with status
    143. The signal reaches only this process, and the ninja / nvcc processes its build threads
    started would otherwise run on. The previous handler is restored on the way out (main() may be
    called from a test process). Only in the main thread, where Python handles signals."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    from sglang.jit_kernel._build import terminate_builds

    def stop(signum: int, frame: object) -> None:
        terminate_builds()  # no build starts after this, whatever the exception below meets
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang.jit_kernel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing .clangd")
    parser.add_argument("--arch", default=DEFAULT_ARCH, help="GPU architecture for .clangd (default 9.0)")
    parser.add_argument("--output", type=Path, default=None, help="where to write .clangd (default: the package dir)")

    clangd = sub.add_parser("clangd", help="write a .clangd for the headers (the default command)")
    # SUPPRESS: given before the command, the top-level options are not reset by these defaults
    clangd.add_argument("--overwrite", action="store_true", default=argparse.SUPPRESS)
    clangd.add_argument("--arch", default=argparse.SUPPRESS)
    clangd.add_argument("--output", type=Path, default=argparse.SUPPRESS)

    chk = sub.add_parser("check", help="build every op, verify against its torch reference, time each")
    chk.add_argument("ops", nargs="*", help="op names (default: every op)")
    chk.add_argument(
        "-j", "--jobs", type=positive_int, default=os.cpu_count() or 1, help="parallel builds (default: the CPU count)"
    )

    bld = sub.add_parser("build", help="prebuild op variants (works without a GPU)")
    bld.add_argument("ops", nargs="*", help="op names (or --all: every op; not both)")
    bld.add_argument("--all", action="store_true", help="every variant of every op")
    bld.add_argument(
        "--arch",
        action="append",
        default=None,
        help="target architecture, repeatable (default: SGLANG_JIT_CUDA_ARCH, else the visible "
        f"GPUs, else {DEFAULT_ARCH})",
    )
    bld.add_argument(
        "-j", "--jobs", type=positive_int, default=os.cpu_count() or 1, help="parallel builds (default: the CPU count)"
    )

    cch = sub.add_parser("cache", help="inspect or clean the JIT cache")
    cch.add_argument("action", choices=["info", "clear", "prune"])
    cch.add_argument("--days", type=age_days, default=30.0, help="prune: entries unused for this many days")

    args = parser.parse_args(argv)
    if args.command in (None, "clangd"):
        from sglang.jit_kernel._build import PACKAGE_DIR

        return write_clangd(args.output or PACKAGE_DIR / ".clangd", args.arch, args.overwrite)
    if args.command in ("check", "build"):
        # These print a line as each variant starts and ends: the per-compile stderr lines would repeat them.
        os.environ.setdefault("SGLANG_JIT_QUIET", "1")
        # The registry (torch and every op) first: a SIGTERM during those imports could meet code that
        # swallows the SystemExit; builds_stopped() still tells main that the run was stopped.
        import signal  # noqa: PLC0415

        import sglang.jit_kernel.registry  # noqa: F401, PLC0415
        from sglang.jit_kernel._build import builds_stopped  # noqa: PLC0415

        with _stop_builds_on_sigterm():
            status = _check_or_build(args, bld)
        if builds_stopped():
            print("stopped by SIGTERM", file=sys.stderr)
            return 128 + signal.SIGTERM
        return status
    return cache_command(args.action, args.days)


def _check_or_build(args: argparse.Namespace, bld: argparse.ArgumentParser) -> int:
    if args.command == "check":
        return check(args.jobs, args.ops or None)
    if args.command == "build":
        if not args.all and not args.ops:
            bld.error("name ops to build, or pass --all")
        if args.all and args.ops:
            bld.error(f"--all builds every op: name ops or pass --all, not both (got {' '.join(args.ops)})")
        if args.ops and not args.all:
            from sglang.jit_kernel.registry import all_modules

            try:
                all_modules(args.ops)  # an unknown name is answered before anything else
            except ValueError as exc:
                print(exc, file=sys.stderr)
                return 1
        archs = args.arch
        if not archs and not os.environ.get("SGLANG_JIT_CUDA_ARCH"):
            import torch

            if not torch.cuda.is_available():
                print(
                    f"No CUDA GPU visible and neither --arch nor SGLANG_JIT_CUDA_ARCH given: building for {DEFAULT_ARCH}"
                )
                archs = [DEFAULT_ARCH]
        return 1 if build_variants(None if args.all else args.ops, args.jobs, archs=archs) else 0
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `... | head` closed the pipe: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
