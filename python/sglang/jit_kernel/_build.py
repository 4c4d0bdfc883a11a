"""Toolchain discovery, the content-addressed build cache and the compile step behind ``load_jit``.

Layout of the cache root (``SGLANG_JIT_CACHE_DIR``, default ``$XDG_CACHE_HOME/sglang/jit_kernel``)::

    <root>/<name>-<key>/<name>.so     published artifact (directory renamed into place atomically)
    <root>/<name>-<key>/build.log     compiler output of that build (ptxas resource usage included)
    <root>/<name>-<key>/manifest.json what went into the key
    <root>/.staging/...               private build directories; never loaded from
    <root>/.locks/<name>-<key>.lock   one cross-process lock per key (+ ``.owner`` with the builder's pid)
    <root>/.logs/<name>-<key>.log     full log of a failed build

The key hashes the marker, the generated sources, the contents of every file the build includes
(all of ``include/``, the listed files with the files they include, every header under
``extra_include_paths``), the flags, the target architectures, the nvcc and host-compiler fingerprints
and the tvm-ffi version.  A warm load is a hash plus one ``dlopen``: no ninja, no subprocess; it sets the
entry directory's mtime, which ``sglang.jit_kernel.cache`` reads as "last used".
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from sglang.jit_kernel._arch import check_target_arch, host_device_archs, visible_device_archs
from sglang.jit_kernel._dependencies import resolve_dependencies

if TYPE_CHECKING:
    from tvm_ffi.module import Module

logger = logging.getLogger("sglang.jit_kernel")

PACKAGE_DIR = Path(__file__).resolve().parent
INCLUDE_DIR = PACKAGE_DIR / "include"
CSRC_DIR = PACKAGE_DIR / "csrc"

DEFAULT_CFLAGS = ("-std=c++20", "-O3", "-fPIC")
DEFAULT_CUDA_CFLAGS = ("-std=c++20", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC")

ENV_CACHE_DIR = "SGLANG_JIT_CACHE_DIR"
ENV_CUDA_ARCH = "SGLANG_JIT_CUDA_ARCH"
ENV_FORCE_RECOMPILE = "SGLANG_JIT_FORCE_RECOMPILE"
ENV_CRASH_ON_COMPILE = "SGLANG_JIT_CRASH_ON_COMPILE"
ENV_LOG_RESOURCE_USAGE = "SGLANG_JIT_LOG_RESOURCE_USAGE"
ENV_QUIET = "SGLANG_JIT_QUIET"

_TRUE_WORDS = ("1", "true", "yes", "on")


class JITCompileError(RuntimeError):
    """A JIT module failed to compile; the message names the module, the first error and the log path.

    Attributes
    ----------
    module_name : str
        The module (``load_jit``'s marker joined, e.g. ``scale_bf16_t``).
    first_error : str
        The first compiler error with its context lines, as in the message: the same text for two
        variants (dtypes) that fail on the same line of the same file.
    log_path : pathlib.Path or None
        The full build log.
    """

    def __init__(
        self, message: str, *, module_name: str = "", first_error: str = "", log_path: Path | None = None
    ) -> None:
        super().__init__(message)
        self.module_name = module_name
        self.first_error = first_error
        self.log_path = log_path


def env_flag(name: str) -> bool:
    """True when environment variable ``name`` is 1/true/yes/on (any case, surrounding blanks ignored)."""
    value = os.environ.get(name)  # unset: one dict lookup (the ops' eager paths read their flags per call)
    return value is not None and value.strip().lower() in _TRUE_WORDS


# ----------------------------------------------------------------------------------------------
# Toolchain
# ----------------------------------------------------------------------------------------------
_memo: dict[str, object] = {}


def _memoized(key: str, compute: Callable[[], object]) -> object:
    try:
        return _memo[key]
    except KeyError:
        value = _memo[key] = compute()
        return value


def _is_cuda_home(path: Path) -> bool:
    return (path / "bin" / "nvcc").exists() and (path / "include" / "cuda_runtime.h").exists()


def _nvcc_behind_wrapper(nvcc: Path) -> Path | None:
    """If ``nvcc`` is a shell script that execs another nvcc (as /usr/local/bin/nvcc does here), return it."""
    try:
        with open(nvcc, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    for match in re.finditer(rb"(/[^\s\"']+/bin/nvcc)\b", head):
        candidate = Path(match.group(1).decode()).resolve()
        if candidate != nvcc and candidate.exists():
            return candidate
    return None


def find_cuda_home() -> Path:
    """Locate the CUDA toolkit.

    Order: ``CUDA_HOME``, ``CUDA_PATH``, the real ``nvcc`` behind ``PATH`` (following symlinks and
    wrapper scripts that ``exec`` another nvcc), then ``/usr/local/cuda``.

    Raises
    ------
    RuntimeError
        If a variable names a directory without ``bin/nvcc``, or no toolkit is found.
    """

    def compute() -> Path:
        for var in ("CUDA_HOME", "CUDA_PATH"):
            value = os.environ.get(var)
            if value:
                home = Path(value)
                if not _is_cuda_home(home):
                    raise RuntimeError(
                        f"{var}={value} is not a CUDA toolkit (expected {home}/bin/nvcc and "
                        f"{home}/include/cuda_runtime.h)"
                    )
                return home.resolve()
        on_path = shutil.which("nvcc")
        if on_path is not None:
            nvcc = Path(on_path).resolve()
            behind = _nvcc_behind_wrapper(nvcc)
            for candidate in (behind, nvcc):
                if candidate is not None and _is_cuda_home(candidate.parent.parent):
                    return candidate.parent.parent
        default = Path("/usr/local/cuda")
        if _is_cuda_home(default):
            return default.resolve()
        raise RuntimeError("Could not find the CUDA toolkit: set CUDA_HOME to the directory that holds bin/nvcc")

    return _memoized("cuda_home", compute)  # type: ignore[return-value]


def find_host_compiler() -> str:
    """The host C++ compiler: ``$CXX`` or ``c++``."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise RuntimeError("No host C++ compiler found: set CXX or install g++")
    return cxx


def find_ninja() -> str:
    """The ninja executable, preferring the one of the ``ninja`` Python package."""
    try:
        import ninja  # noqa: PLC0415

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.exists():
            return str(candidate)
    except (ImportError, AttributeError):
        pass
    found = shutil.which("ninja")
    if found is None:
        raise RuntimeError("ninja not found: pip install ninja")
    return found


def _file_fingerprint(path: str | Path) -> str:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return f"{real}:missing"
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


#: Environment variables that change what nvcc or the host compiler builds without appearing in the
#: command line: part of every cache key (toolchain_fingerprint).
NVCC_ENV_FLAGS = (
    "NVCC_APPEND_FLAGS",
    "NVCC_PREPEND_FLAGS",
    "NVCC_CCBIN",
    "CPATH",
    "CPLUS_INCLUDE_PATH",
    "C_INCLUDE_PATH",
)


def _nvcc_host_fingerprint() -> str:
    """nvcc's own host compiler (it does not read ``$CXX``): ``NVCC_CCBIN`` (a compiler, or a directory
    holding ``gcc``), else ``gcc`` from PATH; a name that resolves to no file is recorded as given."""
    value = os.environ.get("NVCC_CCBIN", "").strip()
    if value:
        path = Path(value) / "gcc" if Path(value).is_dir() else Path(shutil.which(value) or value)
    else:
        found = shutil.which("gcc")
        path = Path(found) if found else None
    if path is None or not path.exists():
        return f"{value or 'gcc'}:missing"
    return _file_fingerprint(path)


def toolchain_fingerprint() -> dict[str, str]:
    """What identifies the toolchain, read without running a subprocess (so the warm path stays cheap).

    nvcc is identified by the toolkit's ``version.json`` and the nvcc binary (path, size, mtime); the host
    compiler (``$CXX``, and nvcc's own: ``NVCC_CCBIN`` or ``gcc``) by its resolved binary; tvm-ffi by
    its version; and the environment variables that nvcc and the host compiler read themselves (extra
    flags, include paths: ``NVCC_ENV_FLAGS``), as this process sees them first.
    """

    def compute() -> dict[str, str]:
        import tvm_ffi  # noqa: PLC0415

        cuda_home = find_cuda_home()
        version_json = cuda_home / "version.json"
        cuda_version = ""
        if version_json.exists():
            try:
                cuda_version = json.loads(version_json.read_text()).get("cuda", {}).get("version", "")
            except (OSError, ValueError):
                cuda_version = ""
        cxx = find_host_compiler()
        return {
            "cuda_home": str(cuda_home),
            "cuda_version": cuda_version,
            "nvcc": _file_fingerprint(cuda_home / "bin" / "nvcc"),
            "cicc": _file_fingerprint(cuda_home / "nvvm" / "bin" / "cicc"),
            "ptxas": _file_fingerprint(cuda_home / "bin" / "ptxas"),
            "cxx": _file_fingerprint(shutil.which(cxx) or cxx),
            "nvcc_host": _nvcc_host_fingerprint(),
            "tvm_ffi": str(getattr(tvm_ffi, "__version__", "unknown")),
            "env": json.dumps({name: os.environ[name] for name in NVCC_ENV_FLAGS if name in os.environ}),
        }

    return _memoized("toolchain", compute)  # type: ignore[return-value]


_ARCH_RE = re.compile(r"^(\d+)\.(\d)([af]?)$")  # minor 0-9, as nvcc spells them
_ARCH_DIGITS_RE = re.compile(r"\d{2,3}[af]?")
_ARCH_SEPARATOR_RE = re.compile(r"[\s,;]+")
_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # compiled at import: load_jit runs on warm paths

#: The targets set by ``utils.override_jit_cuda_arch``; None outside every override. A ContextVar, so
#: an override holds in the thread (or asyncio task) that entered it and in nothing started elsewhere.
arch_override: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "sglang_jit_cuda_arch_override", default=None
)


def parse_arch(arch: str) -> tuple[int, int, str]:
    """Parse ``"9.0"`` / ``"9.0a"`` / ``"90"`` into (major, minor, suffix).

    Raises
    ------
    ValueError
        If the text is not a compute capability.
    """
    text = arch.strip()
    if _ARCH_DIGITS_RE.fullmatch(text):
        suffix = text[-1] if text[-1] in "af" else ""
        digits = text.rstrip("af")
        text = f"{digits[:-1]}.{digits[-1]}{suffix}"
    match = _ARCH_RE.match(text)
    if not match:
        raise ValueError(f"invalid CUDA architecture {arch!r}: expected e.g. '9.0', '9.0a' or '8.6'")
    return int(match.group(1)), int(match.group(2)), match.group(3)


def resolve_cuda_archs(archs: Sequence[str] | str | None = None) -> tuple[str, ...]:
    """The target architectures of a build, as normalised strings like ``("9.0",)``.

    Order: ``archs`` if given; the innermost ``override_jit_cuda_arch`` block of this thread;
    ``SGLANG_JIT_CUDA_ARCH`` (space/comma/semicolon separated); the compute capabilities of every visible
    GPU (so a tensor on any device index has code for its GPU).

    Raises
    ------
    RuntimeError
        With no GPU visible and ``SGLANG_JIT_CUDA_ARCH`` unset, or a visible GPU below compute
        capability 8.0 (``_arch.check_devices``: the message names it).
    ValueError
        For a malformed architecture, a target below 8.0 (``_arch.check_target_arch``), or targets
        given (``archs``, the override, the variable) that name none.
    TypeError
        For ``archs`` neither a string nor a list of strings.
    """
    source = "the requested architectures"  # where the targets came from, for check_target_arch
    if archs is None:
        archs = arch_override.get()
        if archs is not None:
            source = "override_jit_cuda_arch"
    if archs is None:
        env = os.environ.get(ENV_CUDA_ARCH, "").strip()
        if env:
            archs, source = env, f"{ENV_CUDA_ARCH}={env}"
    if isinstance(archs, str):
        archs = [a for a in _ARCH_SEPARATOR_RE.split(archs) if a]
    elif archs is not None:
        try:
            archs = list(archs)
        except TypeError:
            raise TypeError(f"CUDA architectures must be a string or a list of strings, got {archs!r}") from None
        for a in archs:
            if not isinstance(a, str):
                raise TypeError(f"CUDA architecture {a!r} ({type(a).__name__}): expected a string like '9.0'")
    if archs is not None and not archs:  # given, but naming none: not the same as "not given"
        raise ValueError(f"no CUDA architecture in {source}: expected e.g. '9.0' or ['8.0', '9.0']")
    if archs:
        out = []
        for a in archs:
            major, minor, suffix = parse_arch(a)
            check_target_arch(major, minor, suffix, source)
            norm = f"{major}.{minor}{suffix}"
            if norm not in out:
                out.append(norm)
        return tuple(sorted(out))

    detected = _memoized("device_archs", visible_device_archs)  # raises for a GPU below 8.0
    if not detected:
        raise RuntimeError(
            f"No CUDA GPU is visible, so the target architecture is unknown: set {ENV_CUDA_ARCH} "
            f"(e.g. {ENV_CUDA_ARCH}=9.0) to compile without a GPU"
        )
    return detected  # type: ignore[return-value]


def arch_flags(archs: Sequence[str]) -> list[str]:
    """nvcc ``-gencode`` flags plus ``-DSGL_CUDA_ARCH=<major*100+minor*10>`` of the lowest target."""
    flags = []
    parsed = [parse_arch(a) for a in archs]
    for major, minor, suffix in parsed:
        flags.append(f"-gencode=arch=compute_{major}{minor}{suffix},code=sm_{major}{minor}{suffix}")
    lowest = min(major * 100 + minor * 10 for major, minor, _ in parsed)
    flags.append(f"-DSGL_CUDA_ARCH={lowest}")
    return flags


# ----------------------------------------------------------------------------------------------
# Cache root
# ----------------------------------------------------------------------------------------------
def cache_root() -> Path:
    """The cache root, created owner-only (0700).

    Raises
    ------
    RuntimeError
        If the directory is writable by group or others, or owned by another user: a planted
        shared library must never be loaded.
    """
    value = os.environ.get(ENV_CACHE_DIR)
    if value:
        root = Path(value).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(base) / "sglang" / "jit_kernel"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_private_dir(root)
    return root


def check_private_dir(path: Path) -> None:
    """Refuse a directory that another user could write to (see ``cache_root``)."""
    st = path.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeError(
            f"JIT cache directory {path} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}); refusing to load code from it. Run `chmod 700 {path}` or "
            f"point {ENV_CACHE_DIR} at a private directory"
        )
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise RuntimeError(
            f"JIT cache directory {path} belongs to uid {st.st_uid}, not to this user "
            f"({os.getuid()}); refusing to load code from it. Point {ENV_CACHE_DIR} at a private directory"
        )


# ----------------------------------------------------------------------------------------------
# Sources and key
# ----------------------------------------------------------------------------------------------
# Not anchored at line starts, so the regex engine can skip ahead to each '#' (about 10x faster on the
# warm path); an include inside a comment is then followed too, which only hashes one more file.
_INCLUDE_RE = re.compile(r'#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]')


def _package_dependencies(files: Sequence[Path], extra_dirs: Sequence[Path] = ()) -> list[Path]:
    """``files`` plus every file they include, transitively, that is found next to the including file,
    in ``csrc/``, ``include/`` or one of ``extra_dirs`` (the ``extra_include_paths``).

    Files outside the package are followed too: a listed file given by absolute path (a user's or a
    test's kernel in another folder) must not go stale when a header beside it changes. Includes found
    in none of those folders (the standard library, tvm-ffi, CUDA) are covered by the toolchain
    fingerprint instead.
    """
    # This scan runs on every load_jit call, warm ones included, so it works on strings, a miss (most
    # includes are system headers) costs a set lookup in the folder's listing rather than a stat, and
    # a found file is not resolved again: every base folder is resolved already, so only a ``..`` in
    # the include needs realpath to name the file the compiler opens.
    listings: dict[str, frozenset[str]] = {}
    fixed_bases = [str(CSRC_DIR), str(INCLUDE_DIR), *(str(d) for d in extra_dirs)]

    def lookup(base: str, name: str) -> str | None:
        first = name.split("/", 1)[0]
        if first not in (".", ".."):
            names = listings.get(base)
            if names is None:
                try:
                    names = listings[base] = frozenset(os.listdir(base))
                except OSError:
                    names = listings[base] = frozenset()
            if first not in names:
                return None
        joined = os.path.join(base, name)
        if not os.path.isfile(joined):
            return None
        return os.path.realpath(joined) if ".." in name else os.path.normpath(joined)

    seen: dict[str, None] = {}
    stack = [str(f) for f in files]
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen[path] = None
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        for name in _INCLUDE_RE.findall(text):
            for base in (os.path.dirname(path), *fixed_bases):
                hit = lookup(base, name)
                if hit is not None:
                    stack.append(hit)
                    break
    return [Path(p) for p in sorted(seen)]


def _header_files(directory: Path) -> list[Path]:
    suffixes = {".h", ".hpp", ".cuh", ".inl", ".inc"}
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in suffixes)


@dataclasses.dataclass
class BuildSpec:
    """Everything that determines one JIT module's binary."""

    name: str
    cuda_source: str | None
    cpp_source: str | None
    cuda_cflags: list[str]
    cflags: list[str]
    ldflags: list[str]
    include_paths: list[str]
    archs: tuple[str, ...]
    sources: list[Path]  # the listed cpp/cuda files
    extra_dirs: list[Path]  # extra_include_paths that are folders
    # header_only=False: the listed files, each compiled as its own translation unit (no generated one)
    cuda_units: list[Path] = dataclasses.field(default_factory=list)
    cpp_units: list[Path] = dataclasses.field(default_factory=list)
    # extra_dependencies: their include folders (the included headers' contents enter the key, not
    # every header there) and "name=version" entries
    dependency_dirs: list[Path] = dataclasses.field(default_factory=list)
    dependency_versions: list[str] = dataclasses.field(default_factory=list)
    _dependencies: list[Path] | None = dataclasses.field(default=None, repr=False)

    @property
    def dependencies(self) -> list[Path]:
        """Every file whose contents enter the key: the listed files and the package / extra-dir /
        extra-dependency files they include (transitively), and every header under include/ and the
        extra dirs. Computed on first use (the warm path usually needs only ``stamp_paths``' stats)."""
        if self._dependencies is None:
            bases = [*self.extra_dirs, *self.dependency_dirs]
            deps = _package_dependencies(self.sources, bases) + _header_files(INCLUDE_DIR)
            for extra in self.extra_dirs:
                deps += _header_files(extra)
            self._dependencies = list(dict.fromkeys(deps))
        return self._dependencies

    def stamp_paths(self) -> list[Path]:
        """What the stamp of a key records the stats of: the dependencies and the folders an
        include is looked up in (a file added there can change what an include resolves to)."""
        dirs = {p.parent for p in self.dependencies} | {CSRC_DIR, INCLUDE_DIR, *self.extra_dirs, *self.dependency_dirs}
        dirs |= {p for p in INCLUDE_DIR.rglob("*") if p.is_dir()}
        return [*self.dependencies, *sorted(dirs)]

    def digest(self) -> str:
        """A digest of everything but the dependency contents (names the key's stamp)."""
        return self._hash(with_files=False)

    def key(self) -> str:
        """A 20-hex-digit digest of the spec, the dependency contents and the toolchain."""
        return self._hash(with_files=True)

    def _hash(self, with_files: bool) -> str:
        h = hashlib.sha256()

        def put(tag: str, value: str | bytes) -> None:
            data = value.encode() if isinstance(value, str) else value
            h.update(f"{tag}:{len(data)}:".encode())
            h.update(data)

        put("name", self.name)
        put("cuda_source", self.cuda_source or "")
        put("cpp_source", self.cpp_source or "")
        for tag, values in (
            ("cuda_cflags", self.cuda_cflags),
            ("cflags", self.cflags),
            ("ldflags", self.ldflags),
            ("include_paths", self.include_paths),
            ("archs", list(self.archs)),
        ):
            put(tag, "\x00".join(values))
        # Hashed only when used, so that the keys of modules without them stay what they were.
        if self.cuda_units or self.cpp_units:
            put("units", "\x00".join(map(str, [*self.cuda_units, "", *self.cpp_units])))
        if self.dependency_versions:
            put("dependency_versions", "\x00".join(self.dependency_versions))
        if with_files:
            for path in self.dependencies:
                put("file", str(path))
                put("content", path.read_bytes())
        else:
            put("sources", "\x00".join(map(str, self.sources)))
            put("extra_dirs", "\x00".join(map(str, self.extra_dirs)))
        for k, v in sorted(toolchain_fingerprint().items()):
            put(k, v)
        return h.hexdigest()[:20]


def make_spec(
    name: str,
    cpp_files: Sequence[str],
    cuda_files: Sequence[str],
    cpp_wrappers: Sequence[tuple[str, str]],
    cuda_wrappers: Sequence[tuple[str, str]],
    extra_cflags: Sequence[str],
    extra_cuda_cflags: Sequence[str],
    extra_ldflags: Sequence[str],
    extra_include_paths: Sequence[str],
    archs: Sequence[str] | None,
    extra_dependencies: Sequence[str] = (),
    header_only: bool = True,
) -> BuildSpec:
    """Generate the sources and flags of a module (see ``load_jit``)."""
    import tvm_ffi.libinfo as libinfo  # noqa: PLC0415

    cpp_paths = [_csrc_path(f, "cpp_files") for f in cpp_files]
    cuda_paths = [_csrc_path(f, "cuda_files") for f in cuda_files]
    if not cpp_paths and not cuda_paths:
        raise ValueError("load_jit: give at least one file in cpp_files or cuda_files")
    for label, wrappers in (("cpp_wrappers", cpp_wrappers), ("cuda_wrappers", cuda_wrappers)):
        for item in wrappers:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise ValueError(f"load_jit: {label} entries must be (export_name, cpp_symbol), got {item!r}")
            if not _IDENTIFIER_RE.fullmatch(str(item[0])):
                raise ValueError(f"load_jit: export name {item[0]!r} in {label} is not a C identifier")

    def source(paths: list[Path], wrappers: Sequence[tuple[str, str]]) -> str | None:
        if not paths and not wrappers:
            return None
        lines = [
            "// Generated by sglang.jit_kernel.load_jit: includes the listed csrc files and exports the wrappers.",
            "#include <tvm/ffi/container/tensor.h>",
            "#include <tvm/ffi/function.h>",
        ]
        lines += [f'#include "{p}"' for p in paths]
        lines += [f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({export}, ({symbol}));" for export, symbol in wrappers]
        return "\n".join(lines) + "\n"

    if header_only:
        cuda_source = source(cuda_paths, cuda_wrappers)
        cpp_source = source(cpp_paths, cpp_wrappers)
        cuda_units: list[Path] = []
        cpp_units: list[Path] = []
    else:
        if cuda_wrappers or cpp_wrappers:
            raise ValueError(
                "load_jit: with header_only=False the listed files are compiled as they are and export "
                "their own functions (TVM_FFI_DLL_EXPORT_TYPED_FUNC); give no cuda_wrappers / cpp_wrappers"
            )
        cuda_source = cpp_source = None
        cuda_units, cpp_units = cuda_paths, cpp_paths
    if cuda_source is None and cpp_wrappers and not cpp_paths:
        raise ValueError("load_jit: cpp_wrappers given without cpp_files")
    has_cuda = cuda_source is not None or bool(cuda_units)
    resolved_archs = resolve_cuda_archs(archs) if has_cuda else ()
    dependencies = resolve_dependencies(extra_dependencies)
    dependency_dirs = [d for dep in dependencies for d in dep.include_dirs]
    cuda_home = find_cuda_home()
    include_paths = [str(INCLUDE_DIR), libinfo.find_include_path(), libinfo.find_dlpack_include_path()]
    include_paths += [str(Path(p).resolve()) for p in extra_include_paths]
    include_paths += [str(d) for d in dependency_dirs]
    include_paths = list(dict.fromkeys(include_paths))
    extra_dirs = [Path(p).resolve() for p in extra_include_paths if Path(p).is_dir()]
    cflags = [*DEFAULT_CFLAGS, f"-I{cuda_home / 'include'}", *extra_cflags]
    cuda_cflags = [*DEFAULT_CUDA_CFLAGS, *arch_flags(resolved_archs), *extra_cuda_cflags] if resolved_archs else []
    return BuildSpec(
        name=name,
        cuda_source=cuda_source,
        cpp_source=cpp_source,
        cuda_cflags=cuda_cflags,
        cflags=cflags,
        ldflags=list(extra_ldflags),
        include_paths=include_paths,
        archs=tuple(resolved_archs),
        sources=cpp_paths + cuda_paths,
        extra_dirs=extra_dirs,
        cuda_units=cuda_units,
        cpp_units=cpp_units,
        dependency_dirs=list(dict.fromkeys(dependency_dirs)),
        dependency_versions=[f"{dep.name}={dep.version}" for dep in dependencies],
    )


def _csrc_path(name: str, label: str) -> Path:
    path = Path(name)
    if not path.is_absolute():
        path = CSRC_DIR / path
    path = path.resolve()
    if not path.is_file():
        raise FileNotFoundError(f"load_jit: {label} entry {name!r} not found (looked for {path})")
    return path


# ----------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------
def _ninja_escape(text: str) -> str:
    return text.replace("$", "$$").replace(":", "$:").replace(" ", "$ ")


def _command_words(words: Sequence[str | Path]) -> str:
    """Paths and other single arguments as part of a ninja variable of a command line: each one
    shell-quoted (a directory with a space stays one argument), ``$`` escaped for ninja."""
    return " ".join(shlex.quote(str(word)) for word in words).replace("$", "$$")


def _shell_flags(flags: Sequence[str]) -> str:
    """Compiler and linker flags as part of a ninja variable: shell text, as torch's cpp_extension
    takes them (an entry may hold several words, ``'-DMSG="a b"'`` quotes as in a shell, an empty
    entry is nothing), with ``$`` escaped so that ninja hands it to the shell instead of reading it as
    one of its own variables."""
    return " ".join(flag for flag in flags if flag.strip()).replace("$", "$$")


def _write_build_files(spec: BuildSpec, directory: Path) -> None:
    import tvm_ffi.libinfo as libinfo  # noqa: PLC0415

    cuda_home = find_cuda_home()
    cxx = find_host_compiler()
    includes = [f"-I{p}" for p in spec.include_paths]
    tvm_lib = Path(libinfo.find_libtvm_ffi())
    # -z defs: a symbol the module uses but nothing defines fails the link (a JITCompileError naming
    # it), not the process at the first call ("symbol lookup error" under lazy binding).
    ldflags = ["-shared", "-Wl,-z,defs", f"-L{tvm_lib.parent}", "-ltvm_ffi"]
    if spec.cuda_source is not None or spec.cuda_units:
        lib64 = cuda_home / "lib64"
        ldflags += [f"-L{lib64}", "-lcudart", f"-Wl,-rpath,{lib64}"]
    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {_command_words([cuda_home / 'bin' / 'nvcc'])}",
        f"cxx = {cxx.replace('$', '$$')}",  # CXX may be a command with arguments ("ccache g++")
        f"cuda_cflags = {_shell_flags(spec.cuda_cflags)} {_command_words(includes)} --resource-usage",
        f"cflags = {_shell_flags(spec.cflags)} {_command_words(includes)}",
        f"ldflags = {_command_words(ldflags)} {_shell_flags(spec.ldflags)}",
        # -x: a listed .cuh / .h compiled as its own unit (header_only=False) is CUDA / C++ source,
        # not a header (g++ would write a precompiled header for a .h)
        "rule cuda_compile",
        "  command = $nvcc $cuda_cflags -x cu -c $in -o $out",
        "rule cxx_compile",
        "  command = $cxx $cflags -x c++ -c $in -o $out",
        "rule link",
        "  command = $cxx $in $ldflags -o $out",
    ]
    objects = []
    if spec.cuda_source is not None:
        (directory / "main.cu").write_text(spec.cuda_source)
        lines.append("build main_cu.o: cuda_compile main.cu")
        objects.append("main_cu.o")
    if spec.cpp_source is not None:
        (directory / "main.cpp").write_text(spec.cpp_source)
        lines.append("build main_cpp.o: cxx_compile main.cpp")
        objects.append("main_cpp.o")
    for rule, units in (("cuda_compile", spec.cuda_units), ("cxx_compile", spec.cpp_units)):
        for path in units:
            obj = f"unit{len(objects)}_{re.sub(r'[^A-Za-z0-9_]', '_', path.name)}.o"
            lines.append(f"build {obj}: {rule} {_ninja_escape(str(path))}")
            objects.append(obj)
    lines.append(f"build {spec.name}.so: link {' '.join(objects)}")
    lines.append(f"default {spec.name}.so")
    (directory / "build.ninja").write_text("\n".join(lines) + "\n")


_ERROR_RE = re.compile(
    r"^(?P<loc>[^\s:()]+(?:\((?P<nv_line>\d+)\)|:(?P<gcc_line>\d+)(?::\d+)?)):\s*(?:fatal\s+)?error\b.*$",
    re.MULTILINE,
)


#: Context lines wider than this are cut to a window around the caret (nvcc prints the whole expanded
#: line of a macro: ~900 characters for an export binding).
CONTEXT_WIDTH = 160


def _clip_context(context: list[str]) -> list[str]:
    """Cut over-wide context lines: a source line followed by its caret line to a window of
    ``CONTEXT_WIDTH`` characters around the caret (both lines shifted alike), any other to its start."""
    out = list(context)
    for i, line in enumerate(out):
        if len(line) <= CONTEXT_WIDTH:
            continue
        caret_line = out[i + 1] if i + 1 < len(out) else ""
        column = caret_line.find("^")
        if column < 0 or caret_line[:column].strip():
            out[i] = line[:CONTEXT_WIDTH] + " ..."
            continue
        start = max(0, min(column - CONTEXT_WIDTH // 2, len(line) - CONTEXT_WIDTH))
        prefix = "... " if start > 0 else ""
        suffix = " ..." if start + CONTEXT_WIDTH < len(line) else ""
        out[i] = prefix + line[start : start + CONTEXT_WIDTH] + suffix
        out[i + 1] = " " * (len(prefix) + column - start) + caret_line[column:].rstrip()[:CONTEXT_WIDTH]
        break
    return out


_CUDAFE_OBJECT_RE = re.compile(r"tmpxft_[0-9a-f_]+-\d+_(?P<unit>\w+)\.cudafe1\.cpp")
_SECTION_OFFSET_RE = re.compile(r"\((\.[\w.]+)\+0x[0-9a-f]+\)")


def _linker_text(text: str) -> str:
    """A linker message with nvcc's temporary host file named after its unit (``main.cu``) and section
    offsets dropped, so one error reads the same for every dtype and process."""
    return _SECTION_OFFSET_RE.sub(r"(\1)", _CUDAFE_OBJECT_RE.sub(r"\g<unit>.cu", text))


def first_compiler_error(log: str) -> str:
    """The first compiler error of a build log with the (at most two) lines after it, nvcc or gcc
    format; context lines wider than ``CONTEXT_WIDTH`` are cut around the caret."""
    match = _ERROR_RE.search(log)
    if match is None:
        lines = log.splitlines()
        # The linker's own line names the cause ("ld: cannot find -lfoo"), not collect2's, and not
        # its warnings. "ld: x.o: in function `f()':" comes with the next line ("undefined reference").
        for i, line in enumerate(lines):
            if "ld: " in line and "collect2" not in line and "ld: warning:" not in line:
                shown = lines[i : i + 2] if line.rstrip().endswith("':") else [line]
                return _linker_text("\n".join(part.strip() for part in shown))
        for i, line in enumerate(lines):
            if "error" in line.lower() or "fatal" in line.lower():  # e.g. "nvcc fatal : Unsupported gpu architecture"
                # A tool's own complaint just before it ("/x/gcc: No such file or directory") is the
                # cause; ninja's lines and the echoed command line are not.
                before = lines[i - 1].strip() if i > 0 else ""
                if ": " in before and not before.startswith(("[", "FAILED:", "ninja:")):
                    return f"{before}\n{line.strip()}"
                return line.strip()
        return log.strip().splitlines()[-1] if log.strip() else "(no compiler output)"
    rest = log[match.end() :].lstrip("\n").splitlines()
    context = [line for line in rest[:2] if line.strip() and not _ERROR_RE.match(line)]
    return "\n".join([match.group(0).strip(), *_clip_context(context)])


_GENERATED_REF_RE = re.compile(r"(?:^|[\s/])main\.(?P<ext>cu|cpp)(?:\((?P<nv_line>\d+)\)|:(?P<gcc_line>\d+))", re.M)
_WRAPPER_LINE_RE = re.compile(r"TVM_FFI_DLL_EXPORT_TYPED_FUNC\((?P<export>[^,]+), \((?P<symbol>.*)\)\);")
# What looks like a function or function template name in C++ source: an identifier before "(".
_CALLABLE_NAME_RE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_SYMBOL_BASE_RE = re.compile(r"\s*(?:[A-Za-z_][A-Za-z0-9_]*\s*::\s*)*(?P<base>[A-Za-z_][A-Za-z0-9_]*)")
_CXX_KEYWORDS = frozenset(
    "if for while switch return sizeof alignof alignas decltype static_assert static_cast reinterpret_cast "
    "const_cast dynamic_cast catch noexcept defined operator throw new delete typeid requires".split()
)


@dataclasses.dataclass(frozen=True)
class _Binding:
    """An export line of the generated main.cu / main.cpp that a compiler error points at."""

    kind: str  # "cuda_wrappers" or "cpp_wrappers"
    export: str
    symbol: str
    line: str  # the generated line, e.g. TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, (scale<bf16_t>));


def _binding_at_fault(first_error: str, spec: BuildSpec, log: str = "") -> _Binding | None:
    """The export line that the first error, or a note of the log it expands from, points at."""
    for ref in _GENERATED_REF_RE.finditer(f"{first_error}\n{log}"):
        source = spec.cuda_source if ref.group("ext") == "cu" else spec.cpp_source
        lines = (source or "").splitlines()
        number = int(ref.group("nv_line") or ref.group("gcc_line"))
        wrapper = _WRAPPER_LINE_RE.search(lines[number - 1]) if 0 < number <= len(lines) else None
        if wrapper is not None:
            kind = "cuda_wrappers" if ref.group("ext") == "cu" else "cpp_wrappers"
            return _Binding(kind, wrapper.group("export"), wrapper.group("symbol"), lines[number - 1])
    return None


def suggest_symbol(symbol: str, sources: Sequence[Path]) -> list[str]:
    """``symbol`` with its function name replaced by the closest names (difflib) that look like
    function or function template names in ``sources``; [] when the name is declared there (then the
    fault is elsewhere, e.g. missing template arguments) or nothing is close."""
    match = _SYMBOL_BASE_RE.match(symbol)
    if match is None:
        return []
    names: set[str] = set()
    for path in sources:
        try:
            text = _COMMENT_RE.sub(" ", Path(path).read_text(errors="replace"))
        except OSError:
            continue
        names.update(n for n in _CALLABLE_NAME_RE.findall(text) if n not in _CXX_KEYWORDS)
    base = match.group("base")
    if base in names:
        return []
    close = difflib.get_close_matches(base, sorted(names), n=3, cutoff=0.6)
    return [symbol[: match.start("base")] + name + symbol[match.end("base") :] for name in close]


def generated_file_hint(first_error: str, spec: BuildSpec, log: str = "") -> str:
    """A line naming the wrapper entry at fault when the first error, or a note of the log it
    expands from, points at an export line of the generated main.cu / main.cpp (which only includes
    the listed files and exports the wrappers), with a "did you mean" from the function names in the
    listed files for a misspelt symbol; a generic line for other errors located in the generated
    file; "" otherwise."""
    binding = _binding_at_fault(first_error, spec, log)
    if binding is not None:
        suggestions = suggest_symbol(binding.symbol, spec.sources)
        did_you_mean = f"; did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
        return (
            f"(in the binding generated for {binding.kind} entry ('{binding.export}', '{binding.symbol}'): "
            "the C++ symbol must name a function declared by the listed files, with its template "
            f"arguments, e.g. 'scale<bf16_t>'{did_you_mean})\n"
        )
    generated = _GENERATED_REF_RE.match(first_error.lstrip())
    if generated is not None:
        return (
            f"(main.{generated.group('ext')} is generated by load_jit: it includes the listed files and "
            "exports the wrappers)\n"
        )
    return ""


_UNDEFINED_SYMBOL_RE = re.compile(
    r"undefined reference to [`'](?P<symbol>[^`']+)'|Unresolved extern function '(?P<mangled>[^']+)'"
)
_EXPORT_FUNCTION_RE = re.compile(r"in function [`']__tvm_ffi_(?P<export>[A-Za-z_][A-Za-z0-9_]*)'")
_NVCC_ERROR_COUNT_RE = re.compile(r"^(?P<count>\d+) errors? detected in the compilation", re.M)


def _demangle(symbol: str) -> str:
    """``symbol`` demangled by c++filt (``_Z3fooi`` -> ``foo(int)``), or as it is without one."""
    tool = shutil.which("c++filt")
    if tool is None:
        return symbol
    try:
        done = subprocess.run([tool, symbol], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return symbol
    return done.stdout.strip() or symbol


def undefined_symbol_hint(first_error: str, spec: BuildSpec) -> str:
    """For a link error about a function declared but defined nowhere (ld's "undefined reference",
    ptxas's "Unresolved extern function" for device code): a line with its demangled name, the first
    line of the listed files that names it, the export that calls it, and what to do; "" otherwise."""
    match = _UNDEFINED_SYMBOL_RE.search(first_error)
    if match is None:
        return ""
    device = match.group("mangled") is not None
    symbol = _demangle(match.group("mangled")) if device else match.group("symbol")
    if symbol.startswith(("vtable for ", "typeinfo for ", "VTT for ")):
        return ""  # a class's key function is missing: the linker's own words say it best
    head = symbol.split("(", 1)[0]
    while re.search(r"<[^<>]*>", head):  # template arguments out, innermost first
        head = re.sub(r"<[^<>]*>", "", head)
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", head)
    base = names[-1] if names else ""
    where = ""
    use = re.compile(rf"\b{re.escape(base)}\s*[(<]") if base else None
    for path in spec.sources if use is not None else ():
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            continue
        number = next((i for i, line in enumerate(lines, 1) if use.search(line)), 0)
        if number:
            where = f", named at {Path(path).name}:{number},"
            break
    caller = _EXPORT_FUNCTION_RE.search(first_error)
    called = f" (called from the export '{caller.group('export')}')" if caller else ""
    if device:  # without -rdc a device function links only within its own translation unit
        return (
            f"({symbol}{where} is a device function declared but not defined in the translation unit "
            "that calls it: define it there or in a header it includes (device code is compiled "
            "without relocatable device code, -rdc, so another unit's definition does not link))\n"
        )
    fix = "define it in a listed file, or link the library that defines it (extra_ldflags)"
    return f"({symbol}{where} is declared but defined nowhere in the build{called}: {fix})\n"


def error_count_note(log: str) -> str:
    """A note saying how many errors the log holds, when it holds more than one."""
    counts = [int(m.group("count")) for m in _NVCC_ERROR_COUNT_RE.finditer(log)]
    count = max(sum(counts), len(_ERROR_RE.findall(log)))
    return f"(the first of {count} errors; the full log has them all)\n" if count > 1 else ""


def shown_compiler_error(spec: BuildSpec, log: str) -> str:
    """The first error as a ``JITCompileError`` shows it (its ``first_error``): ``first_compiler_error``,
    with an error located on an export line of the generated file shown with that line instead of the
    context nvcc prints (the export macro expanded: ~900 characters)."""
    first = first_compiler_error(log)
    if _GENERATED_REF_RE.match(first.lstrip()):
        binding = _binding_at_fault(first, spec)
        if binding is not None:
            first = f"{first.splitlines()[0]}\n  {binding.line}"
    return first


def _announce(text: str) -> None:
    """One line to stderr about a first-use compile, so that its seconds are not silent: unless
    ``SGLANG_JIT_QUIET=1``, or the ``sglang.jit_kernel`` logger already emits INFO records (it logs the
    same event then)."""
    if env_flag(ENV_QUIET) or (logger.isEnabledFor(logging.INFO) and logger.hasHandlers()):
        return
    print(f"[sglang.jit_kernel] {text}", file=sys.stderr, flush=True)


def target_label(archs: Sequence[str]) -> str:
    """``("8.0", "9.0a")`` -> ``"sm_80, sm_90a"``; ``"host"`` for a C++-only module."""
    if not archs:
        return "host"
    return ", ".join(f"sm_{major}{minor}{suffix}" for major, minor, suffix in map(parse_arch, archs))


#: ninja processes of builds in progress (any thread), for terminate_builds; once it has run, no new
#: build starts in this process.
_LIVE_NINJA: set[subprocess.Popen] = set()
_LIVE_NINJA_LOCK = threading.Lock()
_BUILDS_STOPPED = threading.Event()


def _run_ninja(directory: Path) -> tuple[bool, str]:
    command = [find_ninja(), "-C", str(directory)]
    jobs = os.environ.get("MAX_JOBS")
    if jobs:
        command += ["-j", jobs]
    with _LIVE_NINJA_LOCK:  # the check and the registration under one lock: terminate_builds sees every build
        if _BUILDS_STOPPED.is_set():
            return False, "build not started: this process is stopping its builds (terminate_builds)"
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        _LIVE_NINJA.add(proc)
    with proc:
        try:
            output, _ = proc.communicate()
        finally:
            with _LIVE_NINJA_LOCK:
                _LIVE_NINJA.discard(proc)
    return proc.returncode == 0, output


def terminate_builds(wait_s: float = 5.0, stop_new: bool = True) -> int:
    """Stop every build this process has in progress: SIGTERM to each ninja (which stops the compiler
    processes it started), SIGKILL to one still running after ``wait_s`` seconds; with ``stop_new``,
    builds asked for afterwards fail at once without starting (for a process on its way out; see
    builds_stopped). Returns how many were running. For a command line that
    is itself being terminated: its build threads then see their ninja fail and return, so the
    process can exit without leaving compilers behind (a signal to the Python process alone does not
    reach them)."""
    with _LIVE_NINJA_LOCK:
        if stop_new:
            _BUILDS_STOPPED.set()
        live = list(_LIVE_NINJA)
    for proc in live:
        with contextlib.suppress(OSError):
            proc.terminate()
    deadline = time.monotonic() + wait_s
    for proc in live:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                proc.kill()
    return len(live)


def builds_stopped() -> bool:
    """True once terminate_builds (with stop_new) has run in this process."""
    return _BUILDS_STOPPED.is_set()


def resource_usage_lines(log: str) -> list[str]:
    """The ptxas lines of a build log: registers, shared memory, spills per kernel."""
    return [line.strip() for line in log.splitlines() if "ptxas" in line and "info" in line]


def _owner_of(lock_path: Path, wait_s: float = 1.0) -> str:
    """The pid written by the process holding ``lock_path`` (it writes it right after taking the lock,
    and removes it before releasing it): polled for up to ``wait_s`` seconds, else ``"unknown"``."""
    owner_path = lock_path.with_suffix(".owner")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            owner = owner_path.read_text().strip()
        except OSError:
            owner = ""
        if owner or time.monotonic() >= deadline:
            return owner or "unknown"
        time.sleep(0.02)


#: Per-thread count of modules this thread compiled (not loaded from the cache): ``build`` and ``check``
#: read it around one variant's build to report ``cached`` vs compiled.
compiles_in_thread = threading.local()


def build_artifact(
    spec: BuildSpec, root: Path, key: str, force: bool = False, damaged: tuple[int, int] | None = None
) -> Path:
    """Build ``spec`` unless a complete artifact for ``key`` exists; return the artifact's path.

    One lock per key serialises builders across processes; the build runs in a private staging
    directory that is renamed into place only once complete. ``damaged``: the (inode, mtime_ns) of
    a library that failed to load as damaged; it is replaced unless another process already did.

    Raises
    ------
    JITCompileError
        If the compiler fails (first error, module name and the full log's path in the message).
    """
    from filelock import FileLock, Timeout  # noqa: PLC0415

    entry = root / f"{spec.name}-{key}"
    artifact = entry / f"{spec.name}.so"
    locks = root / ".locks"
    locks.mkdir(exist_ok=True, mode=0o700)
    lock_path = locks / f"{spec.name}-{key}.lock"
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        owner = _owner_of(lock_path)
        logger.info("Waiting for pid %s, which is compiling JIT module %s (lock %s)", owner, spec.name, lock_path)
        _announce(f"waiting for pid {owner}, which is compiling {spec.name}")
        while True:  # in steps, so that terminate_builds (a SIGTERM to build / check) ends the wait
            if _BUILDS_STOPPED.is_set():
                raise JITCompileError(
                    f"JIT module '{spec.name}' not built: this process is stopping its builds (terminate_builds)",
                    module_name=spec.name,
                ) from None
            try:
                lock.acquire(timeout=0.5)
                break
            except Timeout:
                continue
    try:
        lock_path.with_suffix(".owner").write_text(str(os.getpid()))
        if artifact.exists() and not force and (damaged is None or _identity(artifact) != damaged):
            return artifact
        staging_root = root / ".staging"
        staging_root.mkdir(exist_ok=True, mode=0o700)
        staging = staging_root / f"{spec.name}-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(mode=0o700)
        try:
            _write_build_files(spec, staging)
            (staging / "manifest.json").write_text(
                json.dumps(
                    {
                        "name": spec.name,
                        "key": key,
                        "archs": list(spec.archs),
                        "cuda_cflags": spec.cuda_cflags,
                        "cflags": spec.cflags,
                        "ldflags": spec.ldflags,
                        "dependencies": [str(p) for p in spec.dependencies],
                        "toolchain": toolchain_fingerprint(),
                        "built_by_pid": os.getpid(),
                        "built_at": time.time(),
                    },
                    indent=1,
                )
            )
            target = target_label(spec.archs)
            logger.info("Compiling JIT module %s for %s", spec.name, target)
            _announce(f"compiling {spec.name} for {target} (first use; later loads come from the cache)")
            start = time.perf_counter()
            compiles_in_thread.count = getattr(compiles_in_thread, "count", 0) + 1
            ok, log = _run_ninja(staging)
            seconds = time.perf_counter() - start
            (staging / "build.log").write_text(log)
            if not ok:
                _announce(f"{spec.name} for {target} failed to compile after {seconds:.1f} s")
                logs = root / ".logs"
                logs.mkdir(exist_ok=True, mode=0o700)
                log_path = logs / f"{spec.name}-{key}.log"
                log_path.write_text(log)
                first = shown_compiler_error(spec, log)
                raise JITCompileError(
                    f"JIT module '{spec.name}' failed to compile:\n{first}\n{generated_file_hint(first, spec, log)}"
                    f"{undefined_symbol_hint(first, spec)}{error_count_note(log)}Full log: {log_path}",
                    module_name=spec.name,
                    first_error=first,
                    log_path=log_path,
                )
            # A forced rebuild, or an entry whose library is gone (deleted by hand, a full disk):
            # move the old entry aside, then publish.
            if entry.exists() and (force or damaged is not None or not artifact.exists()):
                trash = staging_root / f"old-{entry.name}-{uuid.uuid4().hex[:8]}"
                try:
                    os.rename(entry, trash)
                except FileNotFoundError:  # another forced builder moved it first
                    pass
                shutil.rmtree(trash, ignore_errors=True)
            try:
                os.rename(staging, entry)
            except OSError:
                # Only reachable when two builders of one key ran at once, which the lock prevents
                # unless its file was deleted under a waiter (`cache clear`). The first one's
                # artifact is built from the same inputs: keep it, drop ours.
                if not artifact.exists():
                    raise
            logger.info("Compiled JIT module %s in %.2f s (%s)", spec.name, seconds, entry)
            _announce(f"compiled {spec.name} for {target} in {seconds:.1f} s")
            if env_flag(ENV_LOG_RESOURCE_USAGE):
                for line in resource_usage_lines(log):
                    logger.info("%s: %s", spec.name, line)
            return artifact
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    finally:
        # no stale pid for the next waiter to name
        lock_path.with_suffix(".owner").unlink(missing_ok=True)
        lock.release()


_loaded: dict[Path, JITModule] = {}
#: Artifacts rebuilt under SGLANG_JIT_FORCE_RECOMPILE by this process: each is forced once per process,
#: not on every ``load_jit`` call (``dlopen`` would hand back the first copy of the path anyway).
_forced: set[Path] = set()


def _identity(path: Path) -> tuple[int, int] | None:
    """(inode, mtime_ns) of ``path``: which file a name refers to, to tell a replaced one; None if
    there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _refuse_compile(spec: BuildSpec, artifact: Path, force: bool, damaged: bool = False) -> None:
    if env_flag(ENV_CRASH_ON_COMPILE):
        if damaged:
            why = f"its cached library is damaged ({artifact})"
        elif force:
            why = f"{ENV_FORCE_RECOMPILE}=1 asks to rebuild it"
        else:
            why = f"it is not in the cache ({artifact})"
        raise RuntimeError(
            f"JIT module '{spec.name}' would be compiled ({why}), but {ENV_CRASH_ON_COMPILE}=1 forbids "
            "compiling; prebuild it with `python -m sglang.jit_kernel build --all` (or `build OP ...`) "
            "or unset the variable"
        )


def _mark_used(entry: Path) -> None:
    """Set the entry directory's mtime to now: its "last used" time for ``cache prune``.

    Called when this process loads the entry from disk, so at most once per process and entry.
    """
    try:
        os.utime(entry)
    except OSError:  # a read-only cache (e.g. baked into an image) is still usable
        pass


def _stat_record(path: Path) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [str(path), -1, 0, 0, 0]
    return [str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def stamped_key(spec: BuildSpec, root: Path) -> str:
    """``spec.key()`` without reading the dependencies when nothing they are made of has changed.

    A stamp (``<root>/.stamps/<name>-<digest>.json``) records the key with the stats (size, mtime,
    ctime, inode) of every dependency and include folder taken before their contents were hashed.
    When all still match, the key is reused: an edit changes ctime even when mtime is set back, so
    a stale key is never served. Otherwise the key is recomputed from contents and the stamp
    rewritten. Costs one small read and a stat per dependency instead of hashing every header.
    """
    stamps = root / ".stamps"
    stamp = stamps / f"{spec.name}-{spec.digest()}.json"
    try:
        recorded = json.loads(stamp.read_text())
        if recorded["files"] and all(_stat_record(Path(r[0])) == r for r in recorded["files"]):
            return str(recorded["key"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    files = [_stat_record(p) for p in spec.stamp_paths()]  # stats first, then contents
    key = spec.key()
    try:
        stamps.mkdir(exist_ok=True, mode=0o700)
        tmp = stamps / f".{stamp.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(json.dumps({"key": key, "files": files}))
        os.replace(tmp, stamp)
    except OSError:
        pass  # a read-only cache still works, just without the shortcut
    return key


#: nvcc flags that choose targets: a build given one of its own may have code that ``spec.archs``
#: does not list.
_TARGET_FLAG_RE = re.compile(r"^(-gencode|--generate-code|-arch|--gpu-architecture|-code|--gpu-code)\b")


def runs_on(target: str, device: str) -> bool:
    """Whether code built for ``target`` runs on a GPU of compute capability ``device``: the same major
    and a minor no higher (SASS is not forward compatible across majors; the builds carry no PTX), or
    exactly ``device`` for an arch-specific target (``9.0a``)."""
    t_major, t_minor, suffix = parse_arch(target)
    d_major, d_minor, _ = parse_arch(device)
    if suffix == "a":
        return (t_major, t_minor) == (d_major, d_minor)
    return t_major == d_major and t_minor <= d_minor


def foreign_build(spec: BuildSpec) -> tuple[str, ...]:
    """The GPUs' compute capabilities when ``spec`` is a CUDA build with code for none of them; ``()``
    when it runs on one of them, or when no GPU is known. Once torch has initialised CUDA, the
    visible GPUs are asked; before (asking torch would initialise CUDA, and a later fork could not
    use it), NVML is asked for the host's GPUs (``_arch.host_device_archs``), and with no answer
    from NVML the build counts as runnable."""
    if spec.cuda_source is None and not spec.cuda_units:
        return ()
    generated = {f for f in arch_flags(spec.archs) if f.startswith("-gencode=")}
    if any(_TARGET_FLAG_RE.match(f) and f not in generated for f in spec.cuda_cflags):
        return ()  # targets of the caller's own flags (PTX, say): spec.archs does not list them
    import torch  # noqa: PLC0415

    if torch.cuda.is_initialized():
        try:
            devices = _memoized("device_archs", visible_device_archs)
        except RuntimeError:  # a GPU below 8.0: resolve_cuda_archs names it where it matters
            return ()
    else:  # loaded before CUDA starts, such a build breaks the own build's launches just the same
        devices = _memoized("host_device_archs", host_device_archs) or ()
    if not devices or any(runs_on(t, d) for t in spec.archs for d in devices):
        return ()
    return devices  # type: ignore[return-value]


class ForeignModule:
    """What ``load_jit`` returns for a module built only for GPUs this process does not have
    (``override_jit_cuda_arch``, ``SGLANG_JIT_CUDA_ARCH``, ``cuda_archs=``, ``prebuild(archs=...)``):
    the artifact is compiled and cached, but not loaded: loaded, before or after CUDA starts, such a
    build makes the process's own build of the same kernel fail to launch ("no kernel image"; the
    mechanism inside the CUDA runtime is not established). ``module.<name>`` of an exported function
    (read from the file) is a stand-in whose call raises RuntimeError, as does an attribute of
    ``tvm_ffi.Module`` (``get_function``...); another name raises AttributeError."""

    __slots__ = ("_jit_artifact_", "_jit_archs_", "_jit_devices_", "_jit_functions_")

    def __init__(self, artifact: Path, archs: tuple[str, ...], devices: tuple[str, ...]) -> None:
        self._jit_artifact_ = artifact
        self._jit_archs_ = archs
        self._jit_devices_ = devices
        self._jit_functions_: list[str] | None = None

    def __getattr__(self, name: str) -> Any:
        import tvm_ffi  # noqa: PLC0415

        if name.startswith(("__", "_jit_")):
            raise AttributeError(name)
        module_attribute = hasattr(tvm_ffi.Module, name)  # get_function, kind...: nothing to give
        if name not in exported_functions(self) and not module_attribute:
            raise AttributeError(missing_function_message(self, name))
        message = (
            f"JIT module {self._jit_artifact_.stem} was built for compute capability "
            f"{', '.join(self._jit_archs_)}, and the GPUs here are {', '.join(self._jit_devices_)}: "
            f"it is cached ({self._jit_artifact_.parent}) but not loaded, so {name} cannot run here. "
            "Build it for these GPUs: outside override_jit_cuda_arch, with cuda_archs= / "
            "SGLANG_JIT_CUDA_ARCH naming their capability or unset (an op wrapper keeps the module it "
            "got until its cache_clear() or a new process)"
        )

        if module_attribute:
            raise RuntimeError(message)

        def refuse(*args: object, **kwargs: object) -> NoReturn:
            raise RuntimeError(message)

        return refuse

    def __repr__(self) -> str:
        return f"<ForeignModule {self._jit_artifact_.stem} ({self._jit_artifact_}), not loaded>"


#: dlopen's words for a library file that is not a whole shared object (truncated, overwritten).
_DAMAGED_LIBRARY_SIGNS = ("file too short", "cannot read file data", "invalid ELF header")


def _truncated_library(path: Path) -> str | None:
    """Why the ELF shared library at ``path`` is shorter than its own headers say, or None.

    dlopen maps a library by its program headers, so one cut short past them (a full disk, a partial
    copy) maps pages beyond the end of the file and the process dies of SIGBUS at the first touch;
    a check of the header and section tables against the file's size, before the dlopen, turns that
    into a rebuild. Files that are no 64-bit ELF are left to dlopen, which refuses them cleanly."""
    try:
        with open(path, "rb") as f:
            header = f.read(64)
            size = os.fstat(f.fileno()).st_size
            if len(header) < 64 or header[:5] != b"\x7fELF\x02":
                return None
            order = "<" if header[5] == 1 else ">"
            phoff, shoff = struct.unpack_from(order + "QQ", header, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", header, 0x36)
            if phentsize < 56:  # not a 64-bit program header: a header dlopen refuses by itself
                return None
            if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
                return f"{size} bytes, shorter than its header and section tables"
            f.seek(phoff)
            table = f.read(phnum * phentsize)
    except (OSError, struct.error):
        return None
    for i in range(phnum):
        kind, _flags, offset, _vaddr, _paddr, filesz = struct.unpack_from(order + "IIQQQQ", table, i * phentsize)
        if kind == 1 and offset + filesz > size:  # PT_LOAD
            return f"{size} bytes, shorter than its loadable segments ({offset + filesz} bytes)"
    return None


def load_artifact(spec: BuildSpec, build_directory: str | None = None) -> JITModule | ForeignModule:
    """Return the module for ``spec``: from this process, from the cache, or by compiling it. A CUDA
    build with code for none of the GPUs (``foreign_build``) is compiled (or found) but not loaded:
    a :class:`ForeignModule` comes back."""
    import tvm_ffi  # noqa: PLC0415

    root = Path(build_directory).expanduser() if build_directory else cache_root()
    if build_directory:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_private_dir(root)
    key = stamped_key(spec, root)
    artifact = root / f"{spec.name}-{key}" / f"{spec.name}.so"
    force = env_flag(ENV_FORCE_RECOMPILE) and artifact not in _forced
    module = _loaded.get(artifact)
    if module is not None and not force:
        return module
    built = False
    if force or not artifact.exists():
        _refuse_compile(spec, artifact, force)
        artifact = build_artifact(spec, root, key, force=force)
        built = True
        if force:
            _forced.add(artifact)
    elif env_flag(ENV_LOG_RESOURCE_USAGE):
        log_path = artifact.parent / "build.log"
        if log_path.exists():
            for line in resource_usage_lines(log_path.read_text()):
                logger.info("%s: %s", spec.name, line)
    devices = foreign_build(spec)
    if devices:
        if not built:
            _mark_used(artifact.parent)
        return ForeignModule(artifact, spec.archs, devices)
    module = None
    damage = None if built else _truncated_library(artifact)  # dlopen of such a file ends in SIGBUS
    if damage is None:
        try:
            module = tvm_ffi.load_module(str(artifact))
        except Exception as exc:
            vanished = not artifact.exists()
            # dlopen names the file it could not read: this library, not one it depends on.
            if built or not (vanished or any(f"{artifact}: {sign}" in str(exc) for sign in _DAMAGED_LIBRARY_SIGNS)):
                raise
            damage = None if vanished else str(exc)
    if module is None:
        # The entry vanished between the check and the dlopen (`cache clear` / `prune` elsewhere), or
        # its library is damaged (truncated by a full disk or a copy): build it again, once for all
        # the processes that find it so (build_artifact compares the file under the lock).
        identity = _identity(artifact) if damage is not None else None
        if damage is not None:
            logger.warning("JIT module %s: %s is damaged (%s); rebuilding it", spec.name, artifact, damage)
        _refuse_compile(spec, artifact, False, damaged=damage is not None)
        artifact = build_artifact(spec, root, key, damaged=identity)
        built = True
        module = tvm_ffi.load_module(str(artifact))
    if not built:
        _mark_used(artifact.parent)
    module = JITModule(module, artifact)
    _loaded[artifact] = module
    return module


# ----------------------------------------------------------------------------------------------
# Loaded modules: a missing function names the ones there are
# ----------------------------------------------------------------------------------------------
_EXPORT_SYMBOL_RE = re.compile(rb"(?<=\x00)__tvm_ffi_([A-Za-z_][A-Za-z0-9_]*)\x00")  # whole strings only


class JITModule:
    """What ``load_jit`` returns: a thin proxy of the loaded ``tvm_ffi.Module`` whose error for a
    missing function names the module, lists its functions and suggests the closest.

    ``module.fn`` costs what it costs on the ``tvm_ffi.Module``: the first access fetches the function
    and stores it in the proxy's ``__dict__``, so later ones are a plain instance-dict hit (``__getattr__``
    runs only on a miss). Everything else (``get_function``, ``implements_function``, ``kind``...) is
    forwarded; the wrapped module itself is ``module._jit_module_``.
    """

    __slots__ = ("__dict__", "_jit_module_", "_jit_artifact_", "_jit_functions_")

    def __init__(self, module: Module, artifact: Path) -> None:
        self._jit_module_ = module
        self._jit_artifact_ = artifact
        self._jit_functions_: list[str] | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("__", "_jit_")):  # protocol probes (copy, pickle...) and unset slots
            raise AttributeError(name)
        try:
            value = getattr(self._jit_module_, name)
        except AttributeError:
            raise AttributeError(missing_function_message(self, name)) from None
        if not hasattr(type(self._jit_module_), name):  # an exported function, not a method or property
            self.__dict__[name] = value
        return value

    def __dir__(self) -> list[str]:
        return sorted({*object.__dir__(self), *exported_functions(self)})

    def __repr__(self) -> str:
        return f"<JITModule {self._jit_artifact_.stem} ({self._jit_artifact_})>"


def exported_functions(module: JITModule | ForeignModule) -> list[str]:
    """The functions a JIT module exports, sorted: the ``__tvm_ffi_<name>`` symbols of its shared
    library that a loaded module confirms (``implements_function``), less tvm-ffi's metadata/doc
    companions. Read from the file on the first call (an error path), then kept on the module."""
    if module._jit_functions_ is None:
        try:
            found = {m.decode() for m in _EXPORT_SYMBOL_RE.findall(module._jit_artifact_.read_bytes())}
        except OSError:
            found = set()
        companions = {
            n for n in found for tag in ("_metadata_", "_doc_") if n.startswith(tag) and n[len(tag) :] in found
        }
        names = found - companions
        if isinstance(module, JITModule):
            names = {n for n in names if module._jit_module_.implements_function(n)}
        module._jit_functions_ = sorted(names)
    return module._jit_functions_


def missing_function_message(module: JITModule | ForeignModule, name: str) -> str:
    """``JIT module 'm' has no function 'x'`` with a "did you mean" and the module's functions."""
    functions = exported_functions(module)
    close = difflib.get_close_matches(name, functions, n=3, cutoff=0.6)
    did_you_mean = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    listing = ", ".join(functions) if functions else "none found"
    return f"JIT module '{module._jit_artifact_.stem}' has no function '{name}'{did_you_mean}; its functions: {listing}"


def python_executable() -> str:
    """The interpreter running this process (used by CLI helpers that spawn builders)."""
    return sys.executable
