"""The JIT layer's public helpers: ``load_jit``, ``cache_once``, ``make_cpp_args``, the target
architecture (``get_jit_cuda_arch``, ``override_jit_cuda_arch``), extra header-only dependencies
(``register_dependency``) and test-range knobs.

A kernel's Python wrapper compiles its module on first use::

    @cache_once
    def _jit_scale_module(dtype: torch.dtype) -> Module:
        args = make_cpp_args(dtype)
        return load_jit("scale", *args, cuda_files=["elementwise/scale.cuh"],
                        cuda_wrappers=[("scale", f"scale<{args}>")])
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import torch

from sglang.jit_kernel._build import (
    ForeignModule,
    JITCompileError,
    JITModule,
    arch_override,
    env_flag,
    load_artifact,
    make_spec,
    parse_arch,
    resolve_cuda_archs,
)
from sglang.jit_kernel._dependencies import register_dependency

__all__ = [
    "CPP_DTYPE_MAP",
    "CPPArgList",
    "CUDAArch",
    "ForeignModule",
    "JITCompileError",
    "cache_once",
    "get_ci_test_range",
    "get_jit_cuda_arch",
    "get_jit_cuda_archs",
    "is_arch_support_pdl",
    "is_hip_runtime",
    "load_jit",
    "make_cpp_args",
    "override_jit_cuda_arch",
    "register_dependency",
    "should_run_full_tests",
]

F = TypeVar("F", bound=Callable[..., Any])
_MISSING = object()


def cache_once(fn: F) -> F:
    """Memoize ``fn`` on its (hashable) arguments in a plain dict.

    Unlike ``functools.lru_cache`` the wrapper is an ordinary Python function over a dict, which
    ``torch.compile`` can trace through. ``wrapper.cache_clear()`` empties the cache.

    Parameters
    ----------
    fn : callable
        The function to memoize; its positional and keyword arguments form the key (hashed as
        Python compares them: ``1``, ``1.0`` and ``True`` are one entry), with the targets of an
        enclosing :func:`override_jit_cuda_arch` (a module built for another architecture is not
        returned outside it).

    Returns
    -------
    callable
        The wrapper (``functools.wraps(fn)``), with ``cache_clear`` and ``cache`` attributes.

    Raises
    ------
    TypeError
        From the wrapper, when called with an unhashable argument (the dict lookup); whatever ``fn``
        raises is not cached.
    """
    cache: dict[Any, Any] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = (args, arch_override.get(), tuple(sorted(kwargs.items()))) if kwargs else (args, arch_override.get())
        result = cache.get(key, _MISSING)
        if result is _MISSING:
            result = cache[key] = fn(*args, **kwargs)
        return result

    wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
    wrapper.cache = cache  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


#: torch dtype -> the C++ alias the headers define for it (``include/sgl_kernel/utils.cuh``: ``fp16_t``,
#: ``bf16_t``, ``fp8_e4m3_t``...; integers and bool by their standard names). The one table behind
#: ``make_cpp_args``: a dtype added here becomes a template argument there.
CPP_DTYPE_MAP: dict[torch.dtype, str] = {
    torch.float32: "fp32_t",
    torch.float16: "fp16_t",
    torch.bfloat16: "bf16_t",
    torch.float64: "fp64_t",
    torch.int8: "int8_t",
    torch.int16: "int16_t",
    torch.int32: "int32_t",
    torch.int64: "int64_t",
    torch.uint8: "uint8_t",
    torch.bool: "bool",
    torch.float8_e4m3fn: "fp8_e4m3_t",
    torch.float8_e5m2: "fp8_e5m2_t",
}


class CPPArgList(tuple):
    """C++ template arguments: a tuple of strings that prints as ``"a, b, c"``.

    Splat it into ``load_jit``'s marker (``*args``) and format it into a symbol (``f"op<{args}>"``).
    """

    def __str__(self) -> str:
        return ", ".join(self)

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731


def _cpp_arg(value: Any) -> str:
    if isinstance(value, torch.dtype):
        try:
            return CPP_DTYPE_MAP[value]
        except KeyError:
            raise TypeError(
                f"make_cpp_args: no C++ type for {value}; supported dtypes: {', '.join(str(d) for d in CPP_DTYPE_MAP)}"
            ) from None
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if text in ("inf", "-inf", "nan"):
            raise TypeError(f"make_cpp_args: {value!r} has no C++ literal")
        return f"{text}f" if ("." in text or "e" in text) else f"{text}.0f"
    if isinstance(value, str):
        return value
    raise TypeError(
        f"make_cpp_args: cannot turn {value!r} (type {type(value).__name__}) into a C++ template "
        "argument; expected bool, int, float, str or a torch dtype"
    )


def make_cpp_args(*values: Any) -> CPPArgList:
    """Convert Python values to C++ template arguments.

    torch dtypes map to the headers' aliases (``torch.bfloat16`` → ``bf16_t``, ``torch.float8_e4m3fn``
    → ``fp8_e4m3_t``...), bools to ``true``/``false``, ints to decimal literals, floats to ``float``
    literals (``0.5f``), strings pass through.

    Parameters
    ----------
    *values : torch.dtype | bool | int | float | str
        The template arguments, in order.

    Returns
    -------
    CPPArgList
        One string per value; ``str()`` joins them with ``", "``.

    Raises
    ------
    TypeError
        Naming the value, for any other type, an unsupported dtype, or a float inf / NaN (no C++
        literal).
    """
    return CPPArgList(_cpp_arg(v) for v in values)


def _marker_name(marker: Sequence[Any]) -> str:
    if not marker:
        raise ValueError("load_jit: give at least one marker part (the module's name)")
    text = "_".join(str(part) for part in marker)
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_") or "module"
    if len(name) > _MAX_NAME:  # a file name has 255 bytes: keep a readable prefix and a digest of the rest
        name = f"{name[: _MAX_NAME - 17]}_{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return name


#: Longest module name; the cache entry adds "-" and a 20-character key, the library ".so".
_MAX_NAME = 120


def _words(label: str, value: object, path_ok: bool = False) -> list[str]:
    """A list-of-strings argument of load_jit as a list; TypeError for a bare string (which would be
    taken character by character) or an item that is not a string (or a path, with ``path_ok``)."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        raise TypeError(f"load_jit: {label} must be a list of strings, got the string {value!r} (wrap it in a list)")
    try:
        items = list(value)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"load_jit: {label} must be a list of strings, got {type(value).__name__}") from None
    kinds = (str, os.PathLike) if path_ok else (str,)
    for item in items:
        if not isinstance(item, kinds):
            raise TypeError(f"load_jit: {label} entries must be strings, got {type(item).__name__} {item!r}")
    return [os.fspath(item) for item in items]


def load_jit(
    *marker: Any,
    cpp_files: Sequence[str] | None = None,
    cuda_files: Sequence[str] | None = None,
    cpp_wrappers: Sequence[tuple[str, str]] | None = None,
    cuda_wrappers: Sequence[tuple[str, str]] | None = None,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    build_directory: str | None = None,
    cuda_archs: Sequence[str] | str | None = None,
    extra_dependencies: Sequence[str] | None = None,
    header_only: bool = True,
) -> JITModule | ForeignModule:
    """Compile (first use) or load (cached) a TVM-FFI module from files under ``csrc/``.

    Parameters
    ----------
    *marker : str | int | ...
        Parts of the module's unique name, e.g. ``("scale", "bf16_t")``; same marker and same
        sources/flags/toolchain → same cached binary.
    cpp_files, cuda_files : list of str
        Files relative to ``python/sglang/jit_kernel/csrc/`` (or absolute). With ``header_only=True``
        they are included into one generated ``.cpp`` / ``.cu`` translation unit each; with
        ``header_only=False`` each is compiled as its own translation unit (as C++ / CUDA whatever its
        extension).
    cpp_wrappers, cuda_wrappers : list of (export_name, cpp_symbol)
        Functions to export (``header_only=True`` only; may be empty when the files export their own);
        ``export_name`` becomes an attribute of the returned module, e.g. ``("scale", "scale<bf16_t>")``.
    extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths : list of str
        Appended to the defaults (C++20, ``-O3``, ``--expt-relaxed-constexpr``, ``-gencode`` for the
        target architectures and ``-DSGL_CUDA_ARCH=<major*100+minor*10>``). A flag entry is shell
        text, as torch's cpp_extension takes it: it may hold several words, quotes as in a shell
        (``'-DMSG="a b"'``), and an empty entry adds nothing; the cache key holds the text as written.
        An include path is one directory, spaces and all.
    build_directory : str, optional
        Cache root for this module instead of ``SGLANG_JIT_CACHE_DIR``.
    cuda_archs : str or list of str, optional
        Target architectures (``"9.0"``); default: the innermost ``override_jit_cuda_arch`` block of
        this thread, else ``SGLANG_JIT_CUDA_ARCH``, else every visible GPU's.
    extra_dependencies : list of str, optional
        Header-only C++ dependencies by name: ``"flashinfer"``, ``"cutlass"`` (the CUTLASS bundled in
        the ``flashinfer-python`` wheel) or one added with ``register_dependency``. Their include
        directories (from the installed package) go on the include path; their version and the
        contents of the headers the build includes enter the cache key.
    header_only : bool
        True (default): the listed files are ``#include``-d into one generated translation unit that
        exports ``cpp_wrappers`` / ``cuda_wrappers``. False: every listed file is compiled as it is and
        exports its own functions with ``TVM_FFI_DLL_EXPORT_TYPED_FUNC`` (so it includes
        ``<tvm/ffi/function.h>`` itself); no wrappers may be given.

    Returns
    -------
    JITModule
        A thin proxy of the loaded ``tvm_ffi.Module``: ``module.<export_name>`` is the function (a
        plain instance-dict hit after its first use); a name the module does not export raises
        ``AttributeError`` naming the module and listing its functions; other attributes are forwarded.
        A CUDA build with code for none of the GPUs (targets from ``cuda_archs``,
        :func:`override_jit_cuda_arch` or ``SGLANG_JIT_CUDA_ARCH``; the visible GPUs once torch has
        initialised CUDA, the host's as NVML reports them before) is compiled and cached but not
        loaded: a ``ForeignModule`` comes back, and calling one of its functions raises
        ``RuntimeError``. Loaded, such a build makes the process's own build of the same kernel
        fail to launch ("no kernel image").

    Raises
    ------
    JITCompileError (a RuntimeError)
        If compilation fails: names the module, shows the first compiler error (file:line of the
        ``.cuh``) and the full log's path.
    RuntimeError
        No CUDA toolkit; no GPU and no ``SGLANG_JIT_CUDA_ARCH``; an unsafe cache directory;
        ``SGLANG_JIT_CRASH_ON_COMPILE=1`` and the module is not cached.
    TypeError
        For a list argument given as a bare string (``cuda_files="k.cuh"``) or holding a non-string,
        a ``header_only`` that is not a bool, or a ``cuda_archs`` entry that is not a string.
    FileNotFoundError, ValueError
        For a missing source file or malformed wrappers; ``ValueError`` for a ``cuda_archs`` that names
        no architecture (``""``, ``[]``) or a malformed one; ``ValueError`` for an unknown
        ``extra_dependencies`` name (listing the known ones) or wrappers with ``header_only=False``;
        ``FileNotFoundError`` for an include directory that an installed dependency lacks.
    ModuleNotFoundError
        If the package behind an ``extra_dependencies`` name is not installed: names it and how to
        install it (``pip install flashinfer-python``).
    """
    if not isinstance(header_only, bool):
        raise TypeError(f"load_jit: header_only must be a bool, got {type(header_only).__name__} {header_only!r}")
    if isinstance(cuda_wrappers, str) or isinstance(cpp_wrappers, str):
        raise TypeError("load_jit: cuda_wrappers / cpp_wrappers must be lists of (export_name, cpp_symbol)")
    spec = make_spec(
        _marker_name(marker),
        cpp_files=_words("cpp_files", cpp_files, path_ok=True),
        cuda_files=_words("cuda_files", cuda_files, path_ok=True),
        cpp_wrappers=list(cpp_wrappers or []),
        cuda_wrappers=list(cuda_wrappers or []),
        extra_cflags=_words("extra_cflags", extra_cflags),
        extra_cuda_cflags=_words("extra_cuda_cflags", extra_cuda_cflags),
        extra_ldflags=_words("extra_ldflags", extra_ldflags),
        extra_include_paths=_words("extra_include_paths", extra_include_paths, path_ok=True),
        archs=cuda_archs,
        extra_dependencies=_words("extra_dependencies", extra_dependencies),
        header_only=header_only,
    )
    return load_artifact(spec, build_directory)


# ----------------------------------------------------------------------------------------------
# Target architecture and runtime
# ----------------------------------------------------------------------------------------------
class CUDAArch(NamedTuple):
    """A CUDA compute capability as ``load_jit`` targets it: ``CUDAArch(9, 0, "a")`` prints ``9.0a``.

    ``suffix`` is ``""``, ``"a"`` (architecture-specific features, e.g. sm_90a's wgmma) or ``"f"``
    (family-specific). Compares as a tuple, so ``get_jit_cuda_arch() >= (9, 0)`` asks for SM90+.
    """

    major: int
    minor: int
    suffix: str = ""

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"


def get_jit_cuda_archs() -> tuple[CUDAArch, ...]:
    """Every architecture a ``load_jit`` call without ``cuda_archs`` would target now, lowest first.

    Order of precedence: the innermost ``override_jit_cuda_arch`` block of this thread, then
    ``SGLANG_JIT_CUDA_ARCH``, then the compute capability of every visible GPU.

    Returns
    -------
    tuple of CUDAArch
        E.g. ``(CUDAArch(8, 0, ""), CUDAArch(9, 0, "a"))`` for ``SGLANG_JIT_CUDA_ARCH="8.0 9.0a"``.

    Raises
    ------
    RuntimeError
        With no GPU visible, no override and ``SGLANG_JIT_CUDA_ARCH`` unset.
    ValueError
        If ``SGLANG_JIT_CUDA_ARCH`` holds a malformed architecture.
    """
    return tuple(sorted(CUDAArch(*parse_arch(a)) for a in resolve_cuda_archs()))


def get_jit_cuda_arch() -> CUDAArch:
    """The lowest architecture a ``load_jit`` call without ``cuda_archs`` would target now.

    That is the one the headers see as ``SGL_CUDA_ARCH`` (``major * 100 + minor * 10``), so code that
    picks a kernel variant for the build asks this. With several targets, ``get_jit_cuda_archs`` lists
    them all.

    Returns
    -------
    CUDAArch
        ``(major, minor, suffix)``, e.g. ``CUDAArch(9, 0, "")`` on an H100 / H200.

    Raises
    ------
    RuntimeError, ValueError
        As ``get_jit_cuda_archs`` does.
    """
    return get_jit_cuda_archs()[0]


@contextlib.contextmanager
def override_jit_cuda_arch(major: int, minor: int, suffix: str = "") -> Iterator[CUDAArch]:
    """Make ``load_jit`` target ``major.minor<suffix>`` inside the ``with`` block; restored after.

    It takes precedence over ``SGLANG_JIT_CUDA_ARCH`` and the visible GPUs, not over an explicit
    ``cuda_archs=`` argument. Blocks nest (the innermost wins) and the previous target comes back
    when a block exits, also by an exception.

    Thread safety: the override lives in a ``contextvars.ContextVar``, so it holds only in the thread
    (or asyncio task) that entered the block; other threads, and threads started inside the block,
    keep their own targets (run a worker with ``contextvars.copy_context().run`` to pass it on).
    Unlike ``prebuild(archs=...)`` it does not touch ``os.environ``.

    An op's wrapper memoises its module per dtype and per override (``@cache_once`` keys on the
    override's targets): inside the block it builds the block's module, outside it gets its own back.
    A build for GPUs this process does not have is cached, not loaded (``load_jit``, Returns).

    Parameters
    ----------
    major, minor : int
        The compute capability, e.g. ``9, 0``.
    suffix : str
        ``""``, ``"a"`` or ``"f"`` (``9, 0, "a"`` is sm_90a).

    Yields
    ------
    CUDAArch
        The architecture in force inside the block.

    Raises
    ------
    ValueError
        If ``major`` is not a non-negative int, ``minor`` not an int in 0..9, or ``suffix`` not ``""``,
        ``"a"`` or ``"f"`` (a ValueError also for a wrong type, e.g. a bool or float ``major``):
        ``override_jit_cuda_arch: minor value: expected an int in 0..9, got 10``.
    """
    for label, value, top in (("major", major, None), ("minor", minor, 9)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (top is not None and value > top):
            raise ValueError(
                f"override_jit_cuda_arch: {label} value: expected an int in 0..{top or 'N'}, got {value!r}"
            )
    if suffix not in ("", "a", "f"):
        raise ValueError(f"override_jit_cuda_arch: suffix value: expected '', 'a' or 'f', got {suffix!r}")
    arch = CUDAArch(*parse_arch(f"{major}.{minor}{suffix}"))
    token = arch_override.set((str(arch),))
    try:
        yield arch
    finally:
        arch_override.reset(token)


def is_hip_runtime() -> bool:
    """Whether torch is a ROCm (HIP) build.

    Returns
    -------
    bool
        True when ``torch.version.hip`` is set, else False. Never raises.
    """
    return bool(getattr(torch.version, "hip", None))


def should_run_full_tests() -> bool:
    """Whether the tests run their full (nightly-size) grids.

    Returns
    -------
    bool
        True when ``SGLANG_JIT_KERNEL_RUN_FULL_TESTS`` is 1/true/yes/on (any case), else False.
    """
    return env_flag("SGLANG_JIT_KERNEL_RUN_FULL_TESTS")


T = TypeVar("T")


def get_ci_test_range(full_range: Sequence[T], ci_range: Sequence[T]) -> list[T]:
    """``full_range`` when ``should_run_full_tests()``, else the smaller ``ci_range``.

    Parameters
    ----------
    full_range, ci_range : sequence
        The full grid and the CI subset.

    Returns
    -------
    list
        A new list of the chosen sequence's items.
    """
    return list(full_range if should_run_full_tests() else ci_range)


def is_arch_support_pdl(device: torch.device | int | None = None) -> bool:
    """Whether a GPU supports Programmatic Dependent Launch (SM90+).

    Parameters
    ----------
    device : torch.device, int or None
        The CUDA device (a ``torch.device`` without an index, or None, means the current one).

    Returns
    -------
    bool
        True for compute capability major >= 9; False when CUDA is not available. The capability is
        cached per device index.

    Raises
    ------
    RuntimeError, AssertionError
        From ``torch.cuda.get_device_capability`` for an index that names no device.
    """
    if not torch.cuda.is_available():
        return False
    if isinstance(device, torch.device):
        index = device.index if device.index is not None else torch.cuda.current_device()
    else:
        index = torch.cuda.current_device() if device is None else int(device)
    return _device_major(index) >= 9


@cache_once
def _device_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]
