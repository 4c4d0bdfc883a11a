"""CI registration for tests and benchmarks.

Every test file (``python/sglang/jit_kernel/tests/**/test_*.py``) and every
benchmark file (``python/sglang/jit_kernel/benchmark/**/bench_*.py``) declares
which CI suites run it by calling one of the ``register_*_ci`` functions at
module level::

    from sglang.test.ci.ci_register import register_cuda_ci

    register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large")

At runtime those calls do nothing. ``test/run_suite.py`` reads them from the
file's syntax tree with :func:`collect_registrations`, without importing the
file, so discovery never needs a GPU, CUDA or even torch.

The import path above is SGLang's (``sglang/test/ci/ci_register.py``, a file of
the ``sglang`` distribution). This package does not own that file: beside
sglang the import resolves to sglang's own module, whose ``register_*_ci``
markers take the same arguments; without sglang it resolves to a re-export of
this module (see the README, "Installing beside sglang"). The registry itself
(suite table, collector) lives here, under ``sglang.jit_kernel``, so the runner
reads the same rules either way.

The known backends and their suites are defined once, in :data:`SUITES`.
"""

from __future__ import annotations

import ast
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BACKENDS",
    "SUITES",
    "REGISTER_FUNCTIONS",
    "CIRegistration",
    "register_cuda_ci",
    "register_amd_ci",
    "register_cpu_ci",
    "collect_registrations",
    "known_suites",
    "is_nightly_suite",
]

# ---------------------------------------------------------------------------
# Suites, per backend. ``True`` marks a nightly suite, ``False`` a per-commit
# one. This is the single place where suite names are defined.
# ---------------------------------------------------------------------------
_GPU_SUITES: dict[str, bool] = {
    # Kernel unit tests, one large GPU, every commit.
    "stage-b-kernel-unit-1-gpu-large": False,
    # Kernel benchmarks (smoke runs), one large GPU, every commit.
    "stage-b-kernel-benchmark-1-gpu-large": False,
    # Full (slow) kernel tests, one GPU, nightly. The runner sets
    # SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1 for nightly runs.
    "nightly-kernel-1-gpu": True,
}

SUITES: dict[str, dict[str, bool]] = {
    "cuda": dict(_GPU_SUITES),
    "amd": dict(_GPU_SUITES),
    "cpu": {
        # Tests that need no GPU at all (tooling, CI registry, pure Python).
        "stage-a-kernel-cpu": False,
    },
}

#: Backends known to the registry and to ``test/run_suite.py --hw``.
BACKENDS: tuple[str, ...] = tuple(SUITES)

#: Name of each registration function -> the backend it registers for.
REGISTER_FUNCTIONS: dict[str, str] = {f"register_{b}_ci": b for b in BACKENDS}

# Parameters of every ``register_*_ci`` function, in positional order.
_PARAMS: tuple[str, ...] = ("est_time", "suite", "nightly", "disabled")
_REQUIRED: tuple[str, ...] = ("est_time", "suite")


@dataclass(frozen=True)
class CIRegistration:
    """One ``register_*_ci(...)`` call found in a file.

    Attributes
    ----------
    backend : str
        Hardware backend, one of :data:`BACKENDS` (``"cuda"``, ``"amd"``, ``"cpu"``).
    est_time : float
        Estimated wall time of the whole file, in seconds.
    suite : str
        Name of the CI suite the file belongs to.
    nightly : bool
        Whether the registration is for the nightly run.
    disabled : str or None
        Reason the file is disabled, or ``None`` when it is enabled.
    filename : str
        Path of the file that contains the call.
    """

    backend: str
    est_time: float
    suite: str
    nightly: bool
    disabled: str | None
    filename: str


# ---------------------------------------------------------------------------
# Runtime no-ops.
# ---------------------------------------------------------------------------
_REGISTER_DOC = """Register the calling file for {hardware} CI suite.

    Does nothing at runtime; ``test/run_suite.py`` reads the call statically.
    Call it at module level with literal arguments only.

    Parameters
    ----------
    est_time : int or float
        Estimated wall time of the whole file, in seconds.
    suite : str
        Suite name, one of ``SUITES["{backend}"]``.
    nightly : bool, optional
        Register for the nightly run instead of the per-commit run.
    disabled : str or None, optional
        When set, the file is listed as disabled with this reason and not run.

    Returns
    -------
    None
    """


def _make_register(backend: str, hardware: str) -> Callable[..., None]:
    """One runtime no-op per backend, named ``register_<backend>_ci`` (the collector's names)."""

    def register(
        est_time: int | float,
        suite: str,
        nightly: bool = False,
        disabled: str | None = None,
    ) -> None:
        return None

    register.__name__ = register.__qualname__ = f"register_{backend}_ci"
    register.__doc__ = _REGISTER_DOC.format(hardware=hardware, backend=backend)
    return register


register_cuda_ci = _make_register("cuda", "an NVIDIA CUDA")
register_amd_ci = _make_register("amd", "an AMD ROCm")
register_cpu_ci = _make_register("cpu", "a CPU-only (no GPU needed)")


# ---------------------------------------------------------------------------
# Suite helpers.
# ---------------------------------------------------------------------------
def known_suites(backend: str, nightly: bool | None = None) -> list[str]:
    """Return the suite names defined for a backend.

    Parameters
    ----------
    backend : str
        One of :data:`BACKENDS`.
    nightly : bool or None, optional
        ``True``: only nightly suites; ``False``: only per-commit suites;
        ``None`` (default): all of them.

    Returns
    -------
    list of str
        Suite names, sorted.

    Raises
    ------
    ValueError
        If ``backend`` is unknown.
    """
    if backend not in SUITES:
        raise ValueError(f"Unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}")
    return sorted(name for name, is_nightly in SUITES[backend].items() if nightly is None or is_nightly == nightly)


def is_nightly_suite(backend: str, suite: str) -> bool:
    """Return whether ``suite`` is a nightly suite of ``backend``.

    Parameters
    ----------
    backend : str
        One of :data:`BACKENDS`.
    suite : str
        A suite name of that backend.

    Returns
    -------
    bool
        ``True`` for nightly suites.

    Raises
    ------
    ValueError
        If the backend or the suite is unknown.
    """
    names = known_suites(backend)
    if suite not in SUITES[backend]:
        raise ValueError(f"Unknown suite {suite!r} for backend {backend!r}; known suites: {', '.join(names)}")
    return SUITES[backend][suite]


# ---------------------------------------------------------------------------
# Static collection.
# ---------------------------------------------------------------------------
def _literal(node: ast.expr, name: str, where: str) -> Any:
    """Evaluate a literal argument node or raise a ValueError."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(
            f"{where}: argument {name!r} must be a literal, got expression `{ast.unparse(node)}`"
        ) from None


def _check_value(name: str, value: Any, where: str) -> Any:
    """Type-check one evaluated argument and return its normalized value."""
    if name == "est_time":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(
                f"{where}: est_time must be an int or float (seconds), got {type(value).__name__} {value!r}"
            )
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{where}: est_time must be a positive finite number of seconds, got {value!r}")
        return float(value)
    if name == "suite":
        if not isinstance(value, str):
            raise ValueError(f"{where}: suite must be a str, got {type(value).__name__} {value!r}")
        if not value.strip():
            raise ValueError(f"{where}: suite must be a non-empty string")
        return value
    if name == "nightly":
        if not isinstance(value, bool):
            raise ValueError(f"{where}: nightly must be a bool, got {type(value).__name__} {value!r}")
        return value
    if name == "disabled":
        if value is not None and not isinstance(value, str):
            raise ValueError(
                f"{where}: disabled must be a str (the reason) or None, got {type(value).__name__} {value!r}"
            )
        if isinstance(value, str) and not value.strip():
            raise ValueError(f"{where}: disabled must be a non-empty reason string or None")
        return value
    raise AssertionError(name)  # pragma: no cover


def _parse_call(call: ast.Call, backend: str, filename: str) -> CIRegistration:
    """Turn one ``register_*_ci(...)`` call node into a CIRegistration."""
    func_name = f"register_{backend}_ci"
    where = f"{filename}:{call.lineno}: {func_name}()"
    nodes: dict[str, ast.expr] = {}

    for arg in call.args:
        if isinstance(arg, ast.Starred):
            raise ValueError(f"{where}: starred arguments (*args) are not allowed")
    if len(call.args) > len(_PARAMS):
        raise ValueError(
            f"{where}: too many positional arguments ({len(call.args)} given, "
            f"at most {len(_PARAMS)}: {', '.join(_PARAMS)})"
        )
    for name, arg in zip(_PARAMS, call.args):
        nodes[name] = arg

    for kw in call.keywords:
        if kw.arg is None:
            raise ValueError(f"{where}: **kwargs arguments are not allowed")
        if kw.arg not in _PARAMS:
            raise ValueError(f"{where}: unknown argument {kw.arg!r} (allowed: {', '.join(_PARAMS)})")
        if kw.arg in nodes:
            raise ValueError(f"{where}: argument {kw.arg!r} given more than once")
        nodes[kw.arg] = kw.value

    for name in _REQUIRED:
        if name not in nodes:
            raise ValueError(f"{where}: missing required argument {name!r}")

    values: dict[str, Any] = {"nightly": False, "disabled": None}
    for name, node in nodes.items():
        values[name] = _check_value(name, _literal(node, name, where), where)

    return CIRegistration(
        backend=backend,
        est_time=values["est_time"],
        suite=values["suite"],
        nightly=values["nightly"],
        disabled=values["disabled"],
        filename=filename,
    )


def collect_registrations(path: str | os.PathLike[str], source: str | None = None) -> list[CIRegistration]:
    """Read the CI registrations of a file from its syntax tree.

    The file is parsed, never imported. Only module-level expression
    statements that call one of the bare names in :data:`REGISTER_FUNCTIONS`
    count; calls inside functions, classes or ``if`` blocks, and attribute
    calls such as ``ci.register_cuda_ci(...)``, are ignored.

    Parameters
    ----------
    path : str or os.PathLike
        The Python file to read.
    source : str, optional
        The file's source text; read from ``path`` when omitted.

    Returns
    -------
    list of CIRegistration
        The registrations, in file order (at least one).

    Raises
    ------
    ValueError
        If the file cannot be parsed, has no registration
        (``"No CI registry found in <file>"``), or a registration is
        malformed: starred or ``**`` arguments, unknown or duplicated
        arguments, too many positional arguments, missing ``est_time`` or
        ``suite``, non-literal or wrongly typed values, or the same
        (backend, suite, nightly) registered twice.
    """
    filename = os.fspath(path)
    if source is None:
        with open(filename, encoding="utf-8") as f:
            source = f.read()
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise ValueError(f"{filename}: cannot parse file to read CI registrations: {e}") from None

    registrations: list[CIRegistration] = []
    seen: dict[tuple[str, str, bool], int] = {}
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
            continue
        call = stmt.value
        if not isinstance(call.func, ast.Name):
            continue
        backend = REGISTER_FUNCTIONS.get(call.func.id)
        if backend is None:
            continue
        reg = _parse_call(call, backend, filename)
        key = (reg.backend, reg.suite, reg.nightly)
        if key in seen:
            raise ValueError(
                f"{filename}:{call.lineno}: {call.func.id}() registers suite "
                f"{reg.suite!r} (nightly={reg.nightly}) again; first registered "
                f"at line {seen[key]}"
            )
        seen[key] = call.lineno
        registrations.append(reg)

    if not registrations:
        raise ValueError(
            f"No CI registry found in {filename}: add a module-level call such as "
            f'register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large") '
            f"(from sglang.test.ci.ci_register)"
        )
    return registrations
