"""Inspect, clean and fill the JIT build cache (``python -m sglang.jit_kernel cache|build``).

The cache itself (its layout, the key, the lock) is built by ``sglang.jit_kernel._build``; see
``docs/developer_guide/jit_cache.md``. This module reads and cleans it:

* ``cache_info()``: entries, their sizes and how long ago each was last used (the entry directory's
  mtime, which ``load_artifact`` sets whenever a process loads the entry from disk);
* ``clear_cache()`` / ``prune_cache(max_age_days)``: remove entries (all, or those unused for that
  long), staging leftovers of builds no process runs (their key's lock is free) and lock files nobody holds;

and fills it ahead of time:

* ``prebuild(ops, archs, jobs)``: compile every registered variant (``registry.all_ops()``) in
  parallel, e.g. before CUDA-graph capture or while building a container image.

Nothing here imports torch unless a prebuild needs the ops, so ``cache info`` stays fast.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING

from sglang.jit_kernel._build import ENV_CUDA_ARCH, cache_root, resolve_cuda_archs, terminate_builds

if TYPE_CHECKING:
    from filelock import BaseFileLock

__all__ = [
    "CacheEntry",
    "CacheInfo",
    "VariantResult",
    "build_variants",
    "cache_info",
    "cache_root",
    "clear_cache",
    "prebuild",
    "prune_cache",
]

#: A published entry: ``<module name>-<20 hex digit key>`` (``build_artifact``'s ``entry``).
_ENTRY_RE = re.compile(r"^(?P<module>[A-Za-z0-9_]+)-(?P<key>[0-9a-f]{20})$")
#: A builder's staging directory: ``<module>-<key>-<pid>-<8 hex>`` (``build_artifact``'s ``staging``).
#: Anything else under ``.staging`` (``old-...`` entries moved aside for removal) has no live owner.
_STAGING_RE = re.compile(r"^(?P<entry>[A-Za-z0-9_]+-[0-9a-f]{20})-\d+-[0-9a-f]{8}$")
#: A staging directory older than this is a leftover even if its key's lock is held (a builder on
#: another host sharing the cache, where the lock may not reach): no JIT build takes an hour.
STAGING_MAX_AGE_S = 3600.0

_SECONDS_PER_DAY = 86400.0


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One published module in the cache.

    ``name`` is the directory name (``<module>-<key>``), ``size_bytes`` the size of everything in it,
    ``last_used`` the epoch time it was last loaded from disk or built, ``age_days`` the days since.
    """

    name: str
    path: Path
    size_bytes: int
    last_used: float
    age_days: float


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """A snapshot of the cache: ``items`` (oldest use first), their count and total size, and the
    number of staging leftovers (``staging``: builds whose key's lock no process holds, or older than an
    hour)."""

    root: Path
    items: list[CacheEntry]
    staging: int

    @property
    def entries(self) -> int:
        return len(self.items)

    @property
    def total_bytes(self) -> int:
        return sum(item.size_bytes for item in self.items)


def _tree_bytes(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:  # removed while we walk
                pass
    return total


def _scan_entries(root: Path, now: float) -> list[CacheEntry]:
    items = []
    for child in root.iterdir():
        if not _ENTRY_RE.match(child.name) or not child.is_dir():
            continue
        try:
            last_used = child.stat().st_mtime
        except OSError:
            continue
        items.append(
            CacheEntry(
                name=child.name,
                path=child,
                size_bytes=_tree_bytes(child),
                last_used=last_used,
                age_days=max(0.0, now - last_used) / _SECONDS_PER_DAY,
            )
        )
    return sorted(items, key=lambda item: item.last_used)


def _take_free_lock(lock_path: Path) -> BaseFileLock | None:
    """The build lock at ``lock_path``, acquired, if no process holds it (a build of its key is
    running otherwise); the caller releases it. A builder that tries the lock meanwhile waits its next
    poll (0.5 s)."""
    from filelock import FileLock, Timeout  # noqa: PLC0415

    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def _lock_held(root: Path, entry: str) -> bool:
    """Whether a process holds the build lock of ``entry`` (``<module>-<key>``): a build of it is
    running. The file lock, not the builder's pid, decides: a builder in another container sharing
    the cache has a pid this process cannot see."""
    lock_path = root / ".locks" / f"{entry}.lock"
    if not lock_path.exists():
        return False
    lock = _take_free_lock(lock_path)
    if lock is None:
        return True
    lock.release()
    return False


def _staging_leftovers(root: Path, now: float) -> list[Path]:
    """Staging directories no running build owns: their key's build lock is free, or they are older
    than an hour, or they are not a builder's (entries moved aside for removal)."""
    staging_root = root / ".staging"
    if not staging_root.is_dir():
        return []
    leftovers = []
    for child in staging_root.iterdir():
        match = _STAGING_RE.match(child.name)
        try:
            age = now - child.lstat().st_mtime
        except OSError:
            continue
        if match is None or age > STAGING_MAX_AGE_S or not _lock_held(root, match.group("entry")):
            leftovers.append(child)
    return leftovers


def _remove_tree(path: Path, root: Path) -> bool:
    """Remove ``path``; an entry is first renamed into ``.staging`` so that it disappears at once and a
    concurrent loader sees either the whole entry or none of it."""
    if path.parent == root:
        staging_root = root / ".staging"
        staging_root.mkdir(exist_ok=True, mode=0o700)
        trash = staging_root / f"old-{path.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:  # another cleaner was first
            return False
        path = trash
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    return True


def _remove_unheld_locks(root: Path, only: set[str] | None = None) -> int:
    """Delete lock files (and their ``.owner``) that no process holds; ``only``: entry names to consider."""
    locks = root / ".locks"
    if not locks.is_dir():
        return 0
    removed = 0
    for lock_path in locks.glob("*.lock"):
        if only is not None and lock_path.stem not in only:
            continue
        lock = _take_free_lock(lock_path)
        if lock is None:  # a build of this key is running
            continue
        try:
            lock_path.with_suffix(".owner").unlink(missing_ok=True)
            lock_path.unlink(missing_ok=True)
            removed += 1
        finally:
            lock.release()
    return removed


def cache_info() -> CacheInfo:
    """Describe the cache at ``cache_root()``.

    Returns
    -------
    CacheInfo
        ``.entries`` (count), ``.total_bytes``, ``.staging`` (leftover staging directories) and
        ``.items``: one ``CacheEntry`` per published module, least recently used first, each with
        ``.name``, ``.size_bytes`` and ``.age_days`` (days since it was last loaded or built).

    Raises
    ------
    RuntimeError
        If the cache directory is writable by group or others, or owned by another user.
    """
    root = cache_root()
    now = time.time()
    return CacheInfo(root=root, items=_scan_entries(root, now), staging=len(_staging_leftovers(root, now)))


def clear_cache() -> int:
    """Remove every entry, the staging leftovers, the logs of failed builds and the lock files that no
    process holds. A build in progress keeps its staging directory and lock and publishes normally.

    Returns
    -------
    int
        The number of entries removed.

    Raises
    ------
    RuntimeError
        If the cache directory is unsafe (see ``cache_info``).
    """
    root = cache_root()
    now = time.time()
    removed = sum(_remove_tree(item.path, root) for item in _scan_entries(root, now))
    for leftover in _staging_leftovers(root, now):
        _remove_tree(leftover, root)
    shutil.rmtree(root / ".logs", ignore_errors=True)
    shutil.rmtree(root / ".stamps", ignore_errors=True)  # key shortcuts (see _build.stamped_key)
    _remove_unheld_locks(root)
    return removed


def prune_cache(max_age_days: float) -> int:
    """Remove entries not used (loaded from disk or built) for more than ``max_age_days`` days, staging
    directories whose key's build lock is free or that are older than an hour, failed-build logs older than
    ``max_age_days``, and the unheld lock files of removed entries.

    Parameters
    ----------
    max_age_days : float
        Age limit in days (fractions allowed); ``0`` removes every entry not in use right now.

    Returns
    -------
    int
        The number of entries removed.

    Raises
    ------
    TypeError
        If ``max_age_days`` is not a number.
    ValueError
        If ``max_age_days`` is negative or NaN.
    RuntimeError
        If the cache directory is unsafe (see ``cache_info``).
    """
    if isinstance(max_age_days, bool) or not isinstance(max_age_days, numbers.Real):
        raise TypeError(f"prune_cache: max_age_days must be a number of days, got {type(max_age_days).__name__}")
    if not max_age_days >= 0:  # NaN too
        raise ValueError(f"prune_cache: max_age_days must be >= 0, got {max_age_days}")
    root = cache_root()
    now = time.time()
    gone = set()
    for item in _scan_entries(root, now):
        if item.age_days > max_age_days and _remove_tree(item.path, root):
            gone.add(item.name)
    for leftover in _staging_leftovers(root, now):
        _remove_tree(leftover, root)
    logs = root / ".logs"
    if logs.is_dir():
        for log in logs.iterdir():
            try:
                if now - log.stat().st_mtime > max_age_days * _SECONDS_PER_DAY:
                    log.unlink()
            except OSError:
                pass
    _remove_unheld_locks(root, only=gone)
    return len(gone)


# ----------------------------------------------------------------------------------------------
# Prebuilding
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class VariantResult:
    """The outcome of building one variant: its display name (``scale[bfloat16]``), the error
    (``"JITCompileError: ..."``, None on success), the wall time in seconds, and whether it came from
    the cache (nothing compiled)."""

    name: str
    error: str | None
    seconds: float
    cached: bool = False


def _build_one(
    name: str, build: Callable[..., object], args: tuple, on_start: Callable[[str], None] | None = None
) -> VariantResult:
    from sglang.jit_kernel._build import compiles_in_thread  # noqa: PLC0415

    if on_start is not None:
        on_start(name)
    before = getattr(compiles_in_thread, "count", 0)
    start = time.perf_counter()
    try:
        build(*args)
    except Exception as exc:  # report every failure, keep building the rest
        return VariantResult(name, f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
    cached = getattr(compiles_in_thread, "count", 0) == before
    return VariantResult(name, None, time.perf_counter() - start, cached)


def build_variants(
    ops: Sequence[str] | str | None = None,
    archs: Sequence[str] | str | None = None,
    jobs: int | None = None,
    on_done: Callable[[VariantResult, int, int], None] | None = None,
    on_start: Callable[[str], None] | None = None,
) -> list[VariantResult]:
    """Build every variant of ``ops`` (all registered ops if None) on ``jobs`` threads, without raising
    for a failed variant; ``on_start(name)`` is called as each one starts (on its worker thread) and
    ``on_done(result, done, total)`` as each one finishes.

    See ``prebuild`` for the parameters. Returns the results in completion order.

    Raises
    ------
    ValueError
        For an op name that is not registered (naming it and the known ops), or a malformed arch.
    RuntimeError
        With ``archs`` None, no ``SGLANG_JIT_CUDA_ARCH`` and no GPU visible.
    """
    from sglang.jit_kernel.registry import all_modules  # noqa: PLC0415  (imports torch and every op)

    modules = all_modules(ops)  # ValueError naming an unknown op and how ops register
    resolved = resolve_cuda_archs(archs)  # fail once, before any build, when no target is known
    variants = []
    for module in modules:
        # With explicit archs, skip the wrapper's per-process memo: it may hold the module built for
        # this process's own GPUs, which would make the call a no-op for the requested targets.
        build = getattr(module.build, "__wrapped__", module.build) if archs is not None else module.build
        variants += [(name, build, args) for name, args in zip(module.variant_names(), module.variants)]
    previous = os.environ.get(ENV_CUDA_ARCH)
    if archs is not None:
        os.environ[ENV_CUDA_ARCH] = " ".join(resolved)
    results: list[VariantResult] = []
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1)) as pool:
            futures = [pool.submit(_build_one, *variant, on_start) for variant in variants]
            try:
                for done, future in enumerate(as_completed(futures), 1):
                    result = future.result()
                    results.append(result)
                    if on_done is not None:
                        on_done(result, done, len(futures))
            except BaseException:  # Ctrl-C, SystemExit: no queued variant starts, running ones stop
                pool.shutdown(wait=False, cancel_futures=True)
                terminate_builds(stop_new=False)
                raise
    finally:
        if archs is not None:
            if previous is None:
                os.environ.pop(ENV_CUDA_ARCH, None)
            else:
                os.environ[ENV_CUDA_ARCH] = previous
    return results


def prebuild(
    ops: Sequence[str] | str | None = None,
    archs: Sequence[str] | str | None = None,
    jobs: int | None = None,
) -> list[str]:
    """Compile (or find in the cache) every variant of the registered ops, in parallel.

    Call it before CUDA-graph capture or at image build time so that no op compiles later. Variants
    already cached cost one hash and one ``dlopen`` each (none for a build for GPUs this host does
    not have: ``load_jit``, Returns).

    Parameters
    ----------
    ops : str or sequence of str, optional
        Op names from ``registry.all_ops()`` (``["scale"]``, or one name as ``"scale"``); default
        every op.
    archs : str or sequence of str, optional
        Target architectures (``"9.0"``, ``["8.0", "9.0"]``); default ``SGLANG_JIT_CUDA_ARCH``, else
        the visible GPUs'. ``SGLANG_JIT_CUDA_ARCH`` is set to them for the duration of the call
        (process-wide), then restored.
    jobs : int, optional
        Variants built at once (threads, each running one ninja); default ``os.cpu_count()``.

    Returns
    -------
    list of str
        The names of the built variants (``"scale[bfloat16]"``), in completion order.

    Raises
    ------
    ValueError
        For an unknown op name or a malformed arch (before any build).
    TypeError
        For an op name or an arch that is not a string (before any build).
    RuntimeError
        Without a target architecture (no ``archs``, no ``SGLANG_JIT_CUDA_ARCH``, no GPU); or, after
        every variant was tried, if any failed: one line per failure (a ``JITCompileError`` names the
        module, its first compiler error and the log path).
    """
    results = build_variants(ops, archs, jobs)
    failures = [r for r in results if r.error is not None]
    if failures:
        lines = "\n".join(f"  {r.name}: {r.error}" for r in failures)
        raise RuntimeError(f"prebuild: {len(failures)} of {len(results)} variants failed:\n{lines}")
    return [r.name for r in results]
