#!/usr/bin/env python3
"""Run one CI suite of jit_kernel tests and benchmarks.

Files declare their suites with module-level ``register_*_ci(...)`` calls
(see ``python/sglang/jit_kernel/ci_register.py``); this script reads them from
each file's syntax tree, selects the files of one backend / suite / run kind,
and runs every selected file as its own process.

Examples
--------
::

    cd test && python3 run_suite.py --hw cpu --suite stage-a-kernel-cpu
    python3 test/run_suite.py --hw cuda --suite stage-b-kernel-unit-1-gpu-large \\
        --auto-partition-id 0 --auto-partition-size 2 --continue-on-error
    python3 test/run_suite.py --hw cuda --suite nightly-kernel-1-gpu --nightly --list
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Root of the repository this script lives in.
SCRIPT_REPO_ROOT = Path(__file__).resolve().parent.parent

#: Environment variable that points the runner at another repository root.
ROOT_ENV_VAR = "SGLANG_RUN_SUITE_ROOT"

#: Environment variable set for the child processes of nightly runs.
FULL_TESTS_ENV_VAR = "SGLANG_JIT_KERNEL_RUN_FULL_TESTS"

DEFAULT_TIMEOUT_PER_FILE = 1200.0


def _import_ci_register():
    """Import the registry, ``sglang.jit_kernel.ci_register``, from this repo if not installed.

    Not ``sglang.test.ci.ci_register``: beside the ``sglang`` distribution that name is
    sglang's own module, which has the markers but not this registry's suite table.

    Returns
    -------
    tuple of (module, bool)
        The module, and whether ``<repo>/python`` had to be added to
        ``sys.path`` (the children then get it on ``PYTHONPATH`` too).
    """
    try:
        from sglang.jit_kernel import ci_register  # type: ignore

        return ci_register, False
    except ImportError:
        pass
    sys.path.insert(0, str(SCRIPT_REPO_ROOT / "python"))
    # A different ``sglang`` may have been partly imported; drop it.
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    from sglang.jit_kernel import ci_register  # type: ignore

    return ci_register, True


ci_register, _ADDED_PYTHON_PATH = _import_ci_register()
CIRegistration = ci_register.CIRegistration

#: The per-commit (PR) suites of each backend, e.g. ``PER_COMMIT_SUITES["cuda"]`` holds
#: "stage-b-kernel-unit-1-gpu-large" (the JIT unit tests) and the benchmark smoke suite. Defined
#: once in ``ci_register.SUITES``, where ``False`` marks a per-commit suite and ``True`` a nightly one.
PER_COMMIT_SUITES: dict[str, list[str]] = {
    backend: [name for name, nightly in suites.items() if not nightly] for backend, suites in ci_register.SUITES.items()
}
#: The nightly suites of each backend (run with ``--nightly``).
NIGHTLY_SUITES: dict[str, list[str]] = {
    backend: [name for name, nightly in suites.items() if nightly] for backend, suites in ci_register.SUITES.items()
}


# ---------------------------------------------------------------------------
# Discovery and selection.
# ---------------------------------------------------------------------------
def _walk(base: Path, pattern: str) -> list[Path]:
    """Files under ``base`` matching ``pattern``, minus caches and __init__."""
    if not base.is_dir():
        return []
    return [p for p in base.rglob(pattern) if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts]


def discover_files(root: Path) -> list[Path]:
    """Find every file that must carry a CI registration.

    Parameters
    ----------
    root : pathlib.Path
        Repository root.

    Returns
    -------
    list of pathlib.Path
        ``python/sglang/jit_kernel/tests/**/test_*.py``,
        ``python/sglang/jit_kernel/benchmark/**/bench_*.py`` and
        ``test/registered/**/*.py``, sorted and without duplicates.
    """
    jit = root / "python" / "sglang" / "jit_kernel"
    found = set(_walk(jit / "tests", "test_*.py"))
    found.update(_walk(jit / "benchmark", "bench_*.py"))
    found.update(_walk(root / "test" / "registered", "*.py"))
    return sorted(found)


def _rel(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when possible, as a POSIX string."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def has_main_block(source: str) -> bool:
    """Whether a file has a top-level ``if __name__ == "__main__":`` block.

    run_suite runs each file as a script, so a test file without one would
    exit 0 without running any of its tests (and count as passed).
    """
    for node in ast.parse(source).body:
        test = node.test if isinstance(node, ast.If) else None
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "__name__"
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__"
        ):
            return True
    return False


def collect_all(root: Path, files: Sequence[Path]) -> tuple[list[CIRegistration], list[str]]:
    """Collect registrations of all files, gathering every error.

    Parameters
    ----------
    root : pathlib.Path
        Repository root, used for the relative file names.
    files : sequence of pathlib.Path
        Files to read.

    Returns
    -------
    tuple of (list of CIRegistration, list of str)
        The registrations (``filename`` relative to ``root``) and the error
        messages; a registration with a suite unknown to its backend, and a
        registered file without an ``if __name__ == "__main__":`` block
        (``has_main_block``), are errors.
    """
    regs: list[CIRegistration] = []
    errors: list[str] = []
    for path in files:
        rel = _rel(path, root)
        try:
            source = path.read_text(encoding="utf-8")
            found = ci_register.collect_registrations(rel, source=source)
        except (ValueError, OSError, UnicodeDecodeError) as e:
            errors.append(str(e))
            continue
        if found and not has_main_block(source):
            errors.append(
                f'{rel}: no top-level `if __name__ == "__main__":` block; run_suite runs each file as a '
                "script, so none of its tests would run (end it with "
                '`if __name__ == "__main__": sys.exit(pytest.main([__file__, "-v", "-s"]))`)'
            )
            continue
        for reg in found:
            if reg.suite not in ci_register.SUITES[reg.backend]:
                errors.append(
                    f"{rel}: unknown suite {reg.suite!r} for backend "
                    f"{reg.backend!r}; known suites: "
                    f"{', '.join(ci_register.known_suites(reg.backend))}"
                )
            else:
                regs.append(reg)
    return regs, errors


def select(
    regs: Sequence[CIRegistration], hw: str, suite: str, nightly: bool
) -> tuple[list[CIRegistration], list[CIRegistration]]:
    """Pick the registrations of one backend, suite and run kind.

    Parameters
    ----------
    regs : sequence of CIRegistration
        All registrations.
    hw : str
        Backend (``cpu``, ``cuda``, ``amd``, ...).
    suite : str
        Suite name.
    nightly : bool
        ``True`` selects only ``nightly=True`` registrations, ``False`` only
        ``nightly=False`` ones.

    Returns
    -------
    tuple of (list, list)
        ``(enabled, disabled)`` registrations, each sorted by file name.
    """
    chosen = sorted(
        (r for r in regs if r.backend == hw and r.suite == suite and r.nightly == nightly),
        key=lambda r: r.filename,
    )
    enabled = [r for r in chosen if r.disabled is None]
    disabled = [r for r in chosen if r.disabled is not None]
    return enabled, disabled


def partition(regs: Sequence[CIRegistration], size: int) -> list[list[CIRegistration]]:
    """Split registrations into ``size`` partitions of balanced est_time.

    Longest-first greedy: files sorted by descending ``est_time`` (ties by
    file name) each go to the partition with the smallest load so far (ties
    to the lowest index). Deterministic; every file lands in exactly one
    partition. Each partition is returned sorted by file name.

    Parameters
    ----------
    regs : sequence of CIRegistration
        Registrations to split.
    size : int
        Number of partitions, at least 1.

    Returns
    -------
    list of list of CIRegistration
        ``size`` partitions.
    """
    if size < 1:
        raise ValueError(f"partition size must be >= 1, got {size}")
    parts: list[list[CIRegistration]] = [[] for _ in range(size)]
    loads = [0.0] * size
    for reg in sorted(regs, key=lambda r: (-r.est_time, r.filename)):
        i = min(range(size), key=lambda k: (loads[k], k))
        parts[i].append(reg)
        loads[i] += reg.est_time
    return [sorted(p, key=lambda r: r.filename) for p in parts]


# ---------------------------------------------------------------------------
# Running.
# ---------------------------------------------------------------------------
@dataclass
class FileResult:
    """Outcome of one file: ``passed``, ``failed``, ``timed out`` or ``not run``."""

    filename: str
    status: str
    elapsed: float
    est_time: float
    returncode: int | None = None


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the process group of ``proc`` (and ``proc`` itself) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def run_file(path: Path, reg: CIRegistration, timeout: float, env: dict[str, str]) -> FileResult:
    """Run one file as ``[sys.executable, path]`` in its own process group.

    Parameters
    ----------
    path : pathlib.Path
        Absolute path of the file; it runs with its directory as cwd.
    reg : CIRegistration
        Its registration (for the name and estimate).
    timeout : float
        Seconds before the whole process group is killed.
    env : dict
        Environment of the child.

    Returns
    -------
    FileResult
        The outcome.
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(path)],
        cwd=str(path.parent),
        env=env,
        start_new_session=True,
    )
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return FileResult(reg.filename, "timed out", time.monotonic() - start, reg.est_time)
    except BaseException:
        _kill_group(proc)
        raise
    elapsed = time.monotonic() - start
    status = "passed" if rc == 0 else "failed"
    return FileResult(reg.filename, status, elapsed, reg.est_time, rc)


def _child_env(nightly: bool) -> dict[str, str]:
    """Environment for the child processes."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if nightly:
        env[FULL_TESTS_ENV_VAR] = "1"
    if _ADDED_PYTHON_PATH:
        extra = str(SCRIPT_REPO_ROOT / "python")
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = extra + (os.pathsep + old if old else "")
    return env


def cuda_gpu_visible() -> bool:
    """True when ``nvidia-smi -L`` lists a GPU and CUDA_VISIBLE_DEVICES does not hide every GPU."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU" in listing


NO_GPU_NOTE = (
    "Note: no CUDA GPU is visible: the GPU tests in these files skip, so PASSED below means only "
    "that nothing failed (run the cuda suites on a machine with an NVIDIA GPU)."
)


def _print_summary(results: Sequence[FileResult], header: str) -> int:
    """Print the summary block; return the process exit code."""
    passed = sum(r.status == "passed" for r in results)
    failed = sum(r.status in ("failed", "timed out") for r in results)
    print(f"\n{'=' * 20} Summary: {header} {'=' * 20}", flush=True)
    for r in results:
        if r.status == "not run":
            print(f"  NOT RUN    {r.filename} (est {r.est_time:.0f}s)")
            continue
        label = {"passed": "PASSED", "failed": "FAILED", "timed out": "TIMED OUT"}[r.status]
        extra = f", exit code {r.returncode}" if r.status == "failed" else ""
        print(f"  {label:<10} {r.filename} (elapsed {r.elapsed:.1f}s, est {r.est_time:.0f}s{extra})")
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# CLI.
# ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """Build the command-line parser.

    Returns
    -------
    argparse.ArgumentParser
        The parser of ``run_suite.py``.
    """
    suites = "; ".join(f"{b}: {', '.join(ci_register.known_suites(b))}" for b in ci_register.BACKENDS)
    parser = argparse.ArgumentParser(
        prog="run_suite.py",
        description=(
            "Run the jit_kernel test/benchmark files registered (register_*_ci) "
            "for one backend and suite, each as its own process."
        ),
        epilog=(
            f"Suites per backend: {suites}. "
            f"The repository root is found from this script's location; set "
            f"{ROOT_ENV_VAR}=<dir> (or pass --repo-root) to run against another "
            f"tree, e.g. a fake repository in tests. Nightly runs set "
            f"{FULL_TESTS_ENV_VAR}=1 for every file."
        ),
    )
    parser.add_argument("--hw", required=True, choices=list(ci_register.BACKENDS), help="hardware backend")
    parser.add_argument("--suite", required=True, help="suite name (see below)")
    parser.add_argument(
        "--nightly",
        action="store_true",
        help="select nightly=True registrations (default: only nightly=False ones)",
    )
    parser.add_argument(
        "--timeout-per-file",
        type=float,
        default=DEFAULT_TIMEOUT_PER_FILE,
        metavar="SECONDS",
        help=f"kill a file's process group after this long (default {DEFAULT_TIMEOUT_PER_FILE:.0f})",
    )
    parser.add_argument(
        "--continue-on-error",
        action="store_true",
        help="keep running after a failure (default: stop at the first one)",
    )
    parser.add_argument("--auto-partition-id", type=int, default=None, help="index of this partition (0-based)")
    parser.add_argument(
        "--auto-partition-size",
        type=int,
        default=None,
        help="number of partitions (files balanced by est_time)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the selected files and their estimated total; run nothing",
    )
    parser.add_argument(
        "--repo-root",
        default=None,
        help=f"repository root to scan (testing; default: ${ROOT_ENV_VAR} or this script's repo)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments; ``sys.argv[1:]`` when omitted.

    Returns
    -------
    int
        Exit code: 0 when everything selected passed (or ``--list``), 1 on a
        failure, timeout or registry error, 2 on a usage error or when this
        interpreter cannot import torch (nothing is run).
    """
    parser = build_parser()
    args = parser.parse_args(argv)

    root_arg = args.repo_root or os.environ.get(ROOT_ENV_VAR) or str(SCRIPT_REPO_ROOT)
    root = Path(root_arg).resolve()
    if not root.is_dir():
        parser.error(f"repository root {root} is not a directory")

    known = ci_register.known_suites(args.hw)
    if args.suite not in known:
        parser.error(f"unknown suite {args.suite!r} for --hw {args.hw}; known suites: {', '.join(known)}")
    if ci_register.is_nightly_suite(args.hw, args.suite) != args.nightly:
        kind = "nightly" if args.nightly else "per-commit"
        print(
            f"warning: suite {args.suite!r} is not a {kind} suite; selecting "
            f"nightly={args.nightly} registrations anyway",
            file=sys.stderr,
        )

    pid, psize = args.auto_partition_id, args.auto_partition_size
    if (pid is None) != (psize is None):
        parser.error("--auto-partition-id and --auto-partition-size go together")
    if psize is not None and (psize < 1 or not 0 <= pid < psize):
        parser.error(
            f"need --auto-partition-size >= 1 and 0 <= --auto-partition-id < size (got id={pid}, size={psize})"
        )
    if args.timeout_per_file <= 0:
        parser.error("--timeout-per-file must be positive")

    files = discover_files(root)
    regs, errors = collect_all(root, files)
    if errors:
        print(f"CI registry errors ({len(errors)}), nothing was run:", file=sys.stderr)
        for msg in errors:
            print(f"  {msg}", file=sys.stderr)
        return 1

    enabled, disabled = select(regs, args.hw, args.suite, args.nightly)
    header = f"hw={args.hw} suite={args.suite} nightly={args.nightly}"
    if psize is not None:
        enabled = partition(enabled, psize)[pid]
        header += f" partition={pid}/{psize}"

    if disabled:
        print(f"Disabled files ({len(disabled)}), not run:")
        for r in disabled:
            print(f"  {r.filename}: {r.disabled}")

    total = sum(r.est_time for r in enabled)
    print(f"Selected {len(enabled)} file(s) [{header}], estimated total {total:.0f}s:")
    for r in enabled:
        print(f"  {r.filename} (est {r.est_time:.0f}s)")
    sys.stdout.flush()
    if args.list:
        return 0
    if enabled and importlib.util.find_spec("torch") is None:
        # Every file runs under this interpreter: without torch each would fail on import.
        print(
            f"run_suite: torch is not importable by {sys.executable}, which runs every selected file; "
            "run it in the environment the package is installed in (README: `source .venv/bin/activate`, "
            "then `cd test && python3 run_suite.py ...`). Nothing was run.",
            file=sys.stderr,
        )
        return 2

    no_gpu = args.hw == "cuda" and not cuda_gpu_visible()
    if no_gpu:
        print(NO_GPU_NOTE, flush=True)
    env = _child_env(args.nightly)
    results: list[FileResult] = []
    stop = False
    for i, reg in enumerate(enabled, 1):
        if stop:
            results.append(FileResult(reg.filename, "not run", 0.0, reg.est_time))
            continue
        print(f"\n[{i}/{len(enabled)}] {reg.filename} (est {reg.est_time:.0f}s)", flush=True)
        result = run_file(root / reg.filename, reg, args.timeout_per_file, env)
        results.append(result)
        print(
            f"[{i}/{len(enabled)}] {reg.filename}: {result.status} in {result.elapsed:.1f}s",
            flush=True,
        )
        if result.status != "passed" and not args.continue_on_error:
            stop = True
    if no_gpu:
        print("\n" + NO_GPU_NOTE, flush=True)
    return _print_summary(results, header)


if __name__ == "__main__":
    sys.exit(main())
