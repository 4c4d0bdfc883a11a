"""Header-only C++ dependencies of JIT modules: ``load_jit(..., extra_dependencies=["cutlass"])``.

A dependency is a name, a function returning its include directories and, optionally, a version.
``flashinfer`` and ``cutlass`` (the CUTLASS that the ``flashinfer-python`` wheel bundles under
``flashinfer/data/cutlass``) are built in; ``register_dependency`` adds more.

What enters a module's cache key (see ``_build.BuildSpec``): the include directories (as flags), the
version, and the contents of every dependency header the build includes, followed transitively from
the listed files. Not every header under the directories: the bundled CUTLASS alone is ~900 files and
29 MB, which a cold key would read and a warm one would stat. An include the scan cannot follow (a
macro such as ``#include CUDA_STD_HEADER(tuple)``) names a toolkit header, which the toolchain
fingerprint covers; the version covers whatever else a release changes.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

#: pip's name of the package that ships the built-in dependencies' headers.
FLASHINFER_DIST = "flashinfer-python"

_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_VERSION_RE = re.compile(r"""__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""")


@dataclasses.dataclass(frozen=True)
class _Dependency:
    include_paths_fn: Callable[[], Sequence[str | os.PathLike]]
    version: str | Callable[[], str | None] | None


@dataclasses.dataclass(frozen=True)
class ResolvedDependency:
    """A dependency as one build sees it: its include directories (resolved) and version ("" if none)."""

    name: str
    include_dirs: tuple[Path, ...]
    version: str


_registry: dict[str, _Dependency] = {}
#: Resolved once per process: on the warm path a dependency costs a dict lookup, not a metadata scan
#: of sys.path. A package upgraded under a running process is seen by its next process (header edits
#: are seen at once: their contents are in the key).
_resolved: dict[str, ResolvedDependency] = {}


def register_dependency(
    name: str,
    include_paths_fn: Callable[[], Sequence[str | os.PathLike]],
    version: str | Callable[[], str | None] | None = None,
) -> None:
    """Make ``name`` usable in ``load_jit(..., extra_dependencies=[name])``.

    Parameters
    ----------
    name : str
        The dependency's name (letters, digits, ``_ . -``). Registering a known name again replaces it,
        e.g. ``cutlass`` pointed at a standalone CUTLASS checkout.
    include_paths_fn : callable () -> list of str or PathLike
        Returns the include directories, each of which must exist. Called at the first build that
        lists ``name`` in a process (not at registration), so that a package that is not installed
        only fails the modules that need it. It may raise ``ImportError`` (or ``ModuleNotFoundError``)
        with a message that says how to install the package; ``load_jit`` re-raises it naming the
        dependency.
    version : str or callable () -> str, optional
        The dependency's version, entered into the cache key with the contents of the headers the
        build includes; a callable is called once per process, at the first build that lists ``name``.

    Raises
    ------
    ValueError
        If ``name`` is empty or has other characters.
    TypeError
        If ``include_paths_fn`` is not callable, or ``version`` is neither a string, a callable nor None.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"register_dependency: name must be letters, digits, '_', '.' or '-', got {name!r}")
    if not callable(include_paths_fn):
        raise TypeError(f"register_dependency: include_paths_fn of {name!r} must be callable, got {include_paths_fn!r}")
    if version is not None and not isinstance(version, str) and not callable(version):
        raise TypeError(f"register_dependency: version of {name!r} must be a str, a callable or None, got {version!r}")
    _registry[name] = _Dependency(include_paths_fn, version)
    _resolved.pop(name, None)


def known_dependencies() -> list[str]:
    """The registered dependency names, sorted."""
    return sorted(_registry)


def resolve_dependencies(names: Sequence[str]) -> list[ResolvedDependency]:
    """The include directories and versions of ``names`` (duplicates dropped, order kept).

    Raises
    ------
    ValueError
        For a name that is not registered; the message lists the known ones.
    ModuleNotFoundError
        If the package that provides a dependency is not installed: names the dependency and how to
        install it.
    FileNotFoundError
        If an include directory of a dependency does not exist.
    """
    out = []
    for name in dict.fromkeys(names):
        resolved = _resolved.get(name)
        if resolved is None:
            resolved = _resolved[name] = _resolve(name)
        out.append(resolved)
    return out


def _resolve(name: str) -> ResolvedDependency:
    dependency = _registry.get(name)
    if dependency is None:
        raise ValueError(
            f"load_jit: unknown extra dependency {name!r}; known: {', '.join(known_dependencies())} "
            "(add one with sglang.jit_kernel.utils.register_dependency)"
        )
    try:
        paths = list(dependency.include_paths_fn())
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"load_jit: extra dependency {name!r} is not available: {exc}", name=exc.name
        ) from exc
    dirs = []
    for path in paths:
        directory = Path(path).resolve()
        if not directory.is_dir():
            raise FileNotFoundError(
                f"load_jit: include directory {directory} of extra dependency {name!r} does not exist "
                "(the installed package may not ship it)"
            )
        dirs.append(directory)
    version = dependency.version() if callable(dependency.version) else dependency.version
    return ResolvedDependency(name, tuple(dict.fromkeys(dirs)), str(version or ""))


# ----------------------------------------------------------------------------------------------
# Built-in: flashinfer and its bundled CUTLASS
# ----------------------------------------------------------------------------------------------
def _flashinfer_root() -> Path:
    """The installed ``flashinfer`` package's folder, found without importing it (its import loads
    torch extensions and may JIT-compile)."""
    spec = importlib.util.find_spec("flashinfer")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "data").is_dir():
            return Path(location)
    raise ModuleNotFoundError(
        f"the Python package {FLASHINFER_DIST} (import name flashinfer) is not installed, or ships no "
        f"data/ folder of headers: pip install {FLASHINFER_DIST}",
        name="flashinfer",
    )


def _flashinfer_version() -> str:
    """The version of the flashinfer found by ``_flashinfer_root``: its ``_build_meta.py`` /
    ``version.py`` literal (the very copy whose headers are used), else the distribution metadata."""
    root = _flashinfer_root()
    for meta in ("_build_meta.py", "version.py"):
        try:
            match = _VERSION_RE.search((root / meta).read_text(errors="replace"))
        except OSError:
            continue
        if match:
            return match.group(1)
    try:
        return importlib.metadata.version(FLASHINFER_DIST)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _cutlass_include_paths() -> list[Path]:
    data = _flashinfer_root() / "data"
    return [data / "cutlass" / "include", data / "cutlass" / "tools" / "util" / "include"]


def _flashinfer_include_paths() -> list[Path]:
    """What FlashInfer's own JIT puts on the include path (less the CCCL that overrides the toolkit's):
    its headers, csrc (``tvm_ffi_utils.h``), the bundled CUTLASS and spdlog (``flashinfer/logging.h``)."""
    data = _flashinfer_root() / "data"
    optional = [data / "csrc", *_cutlass_include_paths(), data / "spdlog" / "include"]
    return [data / "include", *(p for p in optional if p.is_dir())]


register_dependency("flashinfer", _flashinfer_include_paths, _flashinfer_version)
register_dependency("cutlass", _cutlass_include_paths, _flashinfer_version)
