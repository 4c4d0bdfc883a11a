"""The JIT layer's public helpers: ``load_jit``, ``cache_once``, ``make_cpp_args`` and test-range knobs.

A kernel's Python wrapper compiles its module on first use::

    @cache_once
    def _jit_scale_module(dtype: torch.dtype) -> Module:
        args = make_cpp_args(dtype)
        return load_jit("scale", *args, cuda_files=["elementwise/scale.cuh"],
                        cuda_wrappers=[("scale", f"scale<{args}>")])
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

import torch

from sglang.jit_kernel._build import (
    JITCompileError,
    env_flag,
    load_artifact,
    make_spec,
)

if TYPE_CHECKING:
    from tvm_ffi.module import Module

__all__ = [
    "JITCompileError",
    "CPPArgList",
    "cache_once",
    "get_ci_test_range",
    "is_arch_support_pdl",
    "load_jit",
    "make_cpp_args",
    "should_run_full_tests",
]

F = TypeVar("F", bound=Callable[..., Any])
_MISSING = object()


def cache_once(fn: F) -> F:
    """Memoize ``fn`` on its (hashable) arguments in a plain dict.

    Unlike ``functools.lru_cache`` the wrapper is an ordinary Python function over a dict, which
    ``torch.compile`` can trace through. ``wrapper.cache_clear()`` empties the cache.
    """
    cache: dict[Any, Any] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        result = cache.get(key, _MISSING)
        if result is _MISSING:
            result = cache[key] = fn(*args, **kwargs)
        return result

    wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
    wrapper.cache = cache  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


_DTYPE_TO_CPP: dict[torch.dtype, str] = {
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
            return _DTYPE_TO_CPP[value]
        except KeyError:
            raise TypeError(
                f"make_cpp_args: no C++ type for {value}; supported dtypes: "
                f"{', '.join(str(d) for d in _DTYPE_TO_CPP)}"
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

    Raises
    ------
    TypeError
        Naming the value, for any other type or an unsupported dtype.
    """
    return CPPArgList(_cpp_arg(v) for v in values)


def _marker_name(marker: Sequence[Any]) -> str:
    if not marker:
        raise ValueError("load_jit: give at least one marker part (the module's name)")
    text = "_".join(str(part) for part in marker)
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    return name or "module"


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
) -> Module:
    """Compile (first use) or load (cached) a TVM-FFI module from files under ``csrc/``.

    Parameters
    ----------
    *marker : str | int | ...
        Parts of the module's unique name, e.g. ``("scale", "bf16_t")``; same marker and same
        sources/flags/toolchain → same cached binary.
    cpp_files, cuda_files : list of str
        Files relative to ``python/sglang/jit_kernel/csrc/`` (or absolute), included into one
        generated ``.cpp`` / ``.cu`` translation unit each.
    cpp_wrappers, cuda_wrappers : list of (export_name, cpp_symbol)
        Functions to export; ``export_name`` becomes an attribute of the returned module, e.g.
        ``("scale", "scale<bf16_t>")``.
    extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths : list of str
        Appended to the defaults (C++20, ``-O3``, ``--expt-relaxed-constexpr``, ``-gencode`` for the
        target architectures and ``-DSGL_CUDA_ARCH=<major*100+minor*10>``).
    build_directory : str, optional
        Cache root for this module instead of ``SGLANG_JIT_CACHE_DIR``.
    cuda_archs : str or list of str, optional
        Target architectures (``"9.0"``); default ``SGLANG_JIT_CUDA_ARCH``, else every visible GPU's.

    Returns
    -------
    tvm_ffi.Module

    Raises
    ------
    JITCompileError (a RuntimeError)
        If compilation fails: names the module, shows the first compiler error (file:line of the
        ``.cuh``) and the full log's path.
    RuntimeError
        No CUDA toolkit; no GPU and no ``SGLANG_JIT_CUDA_ARCH``; an unsafe cache directory;
        ``SGLANG_JIT_CRASH_ON_COMPILE=1`` and the module is not cached.
    FileNotFoundError, ValueError
        For a missing source file or malformed wrappers.
    """
    spec = make_spec(
        _marker_name(marker),
        cpp_files=list(cpp_files or []),
        cuda_files=list(cuda_files or []),
        cpp_wrappers=list(cpp_wrappers or []),
        cuda_wrappers=list(cuda_wrappers or []),
        extra_cflags=list(extra_cflags or []),
        extra_cuda_cflags=list(extra_cuda_cflags or []),
        extra_ldflags=list(extra_ldflags or []),
        extra_include_paths=list(extra_include_paths or []),
        archs=cuda_archs,
    )
    return load_artifact(spec, build_directory)


def should_run_full_tests() -> bool:
    """True when ``SGLANG_JIT_KERNEL_RUN_FULL_TESTS`` is 1/true/yes (any case): nightly-size grids."""
    return env_flag("SGLANG_JIT_KERNEL_RUN_FULL_TESTS")


T = TypeVar("T")


def get_ci_test_range(full_range: Sequence[T], ci_range: Sequence[T]) -> list[T]:
    """``full_range`` when ``should_run_full_tests()``, else the smaller ``ci_range``."""
    return list(full_range if should_run_full_tests() else ci_range)


def is_arch_support_pdl(device: torch.device | int | None = None) -> bool:
    """True when the GPU (default: the current one) supports Programmatic Dependent Launch (SM90+)."""
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

