"""The catalogue of shipped ops, filled by the ops themselves.

An op's wrapper module (``python/sglang/jit_kernel/<op>.py``) registers the op next to its code::

    register_op(
        "scale",
        build=_jit_scale_module,                      # the @cache_once module builder
        variants=[(torch.float16,), (torch.bfloat16,), (torch.float32,)],  # its build arguments
        check_cases=_check_cases,                     # () -> list[CheckCase], for `check`
    )

Several ops served by one module (the norm ops) register the module once with ``register_module``
and pass it as ``module=``. ``all_ops()`` imports every wrapper module of the package (each top-level
module whose name does not start with ``_`` and is not infrastructure), so ``build``, ``check`` and
``prebuild()`` find every op without a central list.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "CheckCase",
    "JitModule",
    "OpEntry",
    "TORCH_LIBRARY",
    "all_modules",
    "all_ops",
    "register_module",
    "register_op",
    "unknown_op_message",
]

#: The torch.library namespace of every op of this package (``torch.ops.sglang_jit_kernel.*``); never
#: ``sgl_kernel``, which the sgl-kernel package owns.
TORCH_LIBRARY = "sglang_jit_kernel"

# Top-level modules of the package that are not op wrappers.
INFRASTRUCTURE = frozenset({"registry", "utils", "cache", "testing", "ci_register"})

HOW_TO_REGISTER = (
    "an op registers itself in its wrapper module python/sglang/jit_kernel/<op>.py with "
    "sglang.jit_kernel.registry.register_op(name, build=<its @cache_once module builder>, "
    "variants=[<build arguments>, ...], check_cases=<optional: function returning CheckCase list>) "
    "(see docs/developer_guide/development_jit_kernel_guide.md, 'Register the op')"
)


@dataclass(frozen=True)
class CheckCase:
    """One correctness-and-speed case of an op, run by ``python -m sglang.jit_kernel check``.

    ``make_inputs()`` draws fresh random inputs (a tuple); ``call(*inputs)`` runs the op alone (it is
    what ``check`` times) and returns its result; ``output(result, *inputs)`` (optional) turns that
    result into the one tensor compared, outside the timed call (e.g. packs a quantized tensor and its
    scales; None: the result itself is compared; for in-place ops, return the mutated tensor from
    either); ``reference(*inputs)`` returns the expected
    output from an fp32 computation on the same inputs, rounded to the output dtype (``check`` calls
    it before ``call`` mutates anything); ``bytes_moved`` is the fewest bytes the op must read plus
    write; ``dtype`` selects the tolerance (integer dtypes compare exactly); ``tolerance``
    (``(rtol, atol)``, optional) replaces it for an op whose documented error is wider than one ulp.
    """

    label: str
    make_inputs: Callable[[], tuple]
    call: Callable[..., torch.Tensor]
    reference: Callable[..., torch.Tensor]
    bytes_moved: int
    dtype: torch.dtype
    tolerance: tuple[float, float] | None = None
    output: Callable[..., torch.Tensor] | None = None

    def compared(self, result: Any, inputs: tuple) -> torch.Tensor:
        """The tensor ``check`` compares with the reference: ``output(result, *inputs)``, or
        ``result`` when the case has no ``output``."""
        return result if self.output is None else self.output(result, *inputs)


def _show(value: Any) -> str:
    return str(value).replace("torch.", "")


@dataclass(eq=False)
class JitModule:
    """A compiled module: its builder, the build arguments of every shipped variant, the ops it serves."""

    name: str
    build: Callable[..., Any]
    variants: tuple[tuple, ...]
    source: str
    ops: list[str] = field(default_factory=list)

    def variant_names(self) -> list[str]:
        """``["norm[float16]", "norm[bfloat16]", ...]``."""
        return [f"{self.name}[{', '.join(_show(a) for a in args)}]" for args in self.variants]


@dataclass(frozen=True, eq=False)
class OpEntry:
    """An op: its name, the module that serves it, its check cases."""

    name: str
    module: JitModule
    check_cases: Callable[[], list[CheckCase]]
    source: str

    @property
    def build(self) -> Callable[..., Any]:
        return self.module.build

    @property
    def variants(self) -> tuple[tuple, ...]:
        return self.module.variants

    def variant_names(self) -> list[str]:
        return self.module.variant_names()


_MODULES: dict[str, JitModule] = {}
_OPS: dict[str, OpEntry] = {}


def _caller_module(depth: int = 2) -> str:
    import sys  # noqa: PLC0415

    return sys._getframe(depth).f_globals.get("__name__", "?")


def _variant_tuple(name: str, variants: Sequence[Any]) -> tuple[tuple, ...]:
    out = []
    for args in variants:
        if not isinstance(args, tuple):
            raise TypeError(
                f"register: {name} variants item type: expected a tuple of build arguments, "
                f"got {type(args).__name__} ({args!r})"
            )
        out.append(args)
    return tuple(out)


def register_module(name: str, build: Callable[..., Any], variants: Sequence[tuple]) -> JitModule:
    """Declare a module builder shared by several ops, and the build arguments it ships with.

    Parameters
    ----------
    name : str
        Display name of its variants (``"norm"`` shows ``norm[bfloat16]``).
    build : callable
        The wrapper's ``@cache_once`` builder; ``build(*args)`` compiles or loads one variant.
    variants : sequence of tuple
        One tuple of ``build`` arguments per variant that ``build --all`` / ``prebuild()`` compiles.

    Returns
    -------
    JitModule
        Pass it to :func:`register_op` as ``module=``.

    Raises
    ------
    ValueError
        If another module already registered ``name`` (re-registering from the same wrapper module,
        e.g. on a reload, replaces the entry).
    TypeError
        If a variant is not a tuple.
    """
    source = _caller_module()
    previous = _MODULES.get(name)
    if previous is not None and previous.source != source:
        raise ValueError(
            f"register_module: name value: expected a name not yet registered, got {name!r} "
            f"(already registered by {previous.source})"
        )
    module = JitModule(name, build, _variant_tuple(name, variants), source)
    _MODULES[name] = module
    return module


def register_op(
    name: str,
    *,
    module: JitModule | None = None,
    build: Callable[..., Any] | None = None,
    variants: Sequence[tuple] = (),
    check_cases: Callable[[], list[CheckCase]] | None = None,
) -> OpEntry:
    """Register an op where it is defined: what ``build``/``prebuild()`` compile and ``check`` runs.

    Parameters
    ----------
    name : str
        The op's name (its Python function, its exported symbol).
    module : JitModule, optional
        The shared module serving it (from :func:`register_module`). Give either this, or ``build``.
    build : callable, optional
        The op's own ``@cache_once`` module builder: a module named ``name`` is registered for it.
    variants : sequence of tuple
        With ``build``: the build arguments of each shipped variant. Default none. Ignored with
        ``module`` (the module's own variants apply).
    check_cases : callable, optional
        ``() -> list[CheckCase]``: the cases ``check`` runs (fresh random inputs, an fp32 reference,
        bytes moved). None: the op is built by ``check`` but not run.

    Returns
    -------
    OpEntry
        The registered entry (re-registering from the same wrapper module replaces it).

    Raises
    ------
    TypeError
        If neither or both of ``module`` and ``build`` are given (``register_op: <name> module/build:
        expected exactly one of module= or build=, got both``), or, with ``build``, a variant is not a
        tuple.
    ValueError
        If another wrapper module already registered ``name``.
    """
    source = _caller_module()
    if (module is None) == (build is None):
        raise TypeError(
            f"register_op: {name} module/build: expected exactly one of module= or build=, "
            f"got {'both' if module is not None else 'neither'}"
        )
    previous = _OPS.get(name)
    if previous is not None and previous.source != source:
        raise ValueError(
            f"register_op: name value: expected a name not yet registered, got {name!r} "
            f"(already registered by {previous.source})"
        )
    if module is None:
        module = JitModule(name, build, _variant_tuple(name, variants), source)  # type: ignore[arg-type]
        _MODULES[name] = module
    if name not in module.ops:
        module.ops.append(name)
    entry = OpEntry(name, module, check_cases or (lambda: []), source)
    _OPS[name] = entry
    return entry


def wrapper_module_names() -> list[str]:
    """Names of the package's op wrapper modules (``scale``, ``norm``, ...), sorted."""
    import sglang.jit_kernel as package  # noqa: PLC0415

    return sorted(
        info.name
        for info in pkgutil.iter_modules(package.__path__)
        if not info.ispkg and not info.name.startswith("_") and info.name not in INFRASTRUCTURE
    )


def _import_wrappers() -> list[str]:
    """Import every wrapper module; returns those that registered no op."""
    silent = []
    for name in wrapper_module_names():
        full = f"sglang.jit_kernel.{name}"
        importlib.import_module(full)
        if not any(entry.source == full for entry in _OPS.values()):
            silent.append(name)
    return silent


def all_ops() -> dict[str, OpEntry]:
    """Every registered op by name, in the order of the wrapper modules (sorted) and of registration.

    Imports every wrapper module of the package first (cheap: no compile, no GPU query).

    Returns
    -------
    dict of str to OpEntry
        A new dict; op name -> its entry.

    Raises
    ------
    Exception
        Whatever importing a wrapper module raises (e.g. ``ImportError``, or the ``ValueError`` of a
        name registered twice) propagates unchanged.
    """
    _import_wrappers()
    order = {name: i for i, name in enumerate(wrapper_module_names())}
    entries = sorted(_OPS.values(), key=lambda e: order.get(e.source.rsplit(".", 1)[-1], len(order)))
    return {e.name: e for e in entries}


def all_modules(ops: Sequence[str] | str | None = None) -> list[JitModule]:
    """The modules serving ``ops`` (every op if None), each once, in op order.

    Parameters
    ----------
    ops : str or sequence of str, optional
        Op names (one name as a string); None (default) means every registered op, an empty
        sequence none.

    Returns
    -------
    list of JitModule
        One entry per distinct module, in the order of the first op it serves.

    Raises
    ------
    ValueError
        For an unknown op name: :func:`unknown_op_message`.
    TypeError
        For a name that is not a string.
    """
    if isinstance(ops, str):
        ops = [ops]
    for name in ops or []:
        if not isinstance(name, str):
            raise TypeError(f"op names must be strings, got {type(name).__name__} {name!r}")
    registry = all_ops()
    unknown = [name for name in (ops or []) if name not in registry]
    if unknown:
        raise ValueError(unknown_op_message(unknown, registry))
    modules: dict[int, JitModule] = {}
    for name in ops if ops is not None else list(registry):
        module = registry[name].module
        modules.setdefault(id(module), module)
    return list(modules.values())


def unknown_op_message(unknown: Sequence[str], registry: dict[str, OpEntry] | None = None) -> str:
    """The error for op names nobody registered: the known ops, the wrapper modules that register
    none, and how an op registers.

    Parameters
    ----------
    unknown : sequence of str
        The names not found.
    registry : dict of str to OpEntry, optional
        The known ops; None (default) means :func:`all_ops`.

    Returns
    -------
    str
        ``"unknown op(s): a, b (did you mean ...?); known ops: ...; ... An op registers itself ..."``
        (the close matches only when there are some). Raises only what importing the wrappers raises.
    """
    import difflib  # noqa: PLC0415

    silent = _import_wrappers()
    known = registry if registry is not None else all_ops()
    near = set()
    for name in unknown:  # close spellings (rmsnrom), and names that start with its stem (silu2 -> silu_and_mul)
        near.update(difflib.get_close_matches(name, list(known), n=3, cutoff=0.6))
        stem = name.rstrip("0123456789_")
        if len(stem) >= 3:
            near.update(k for k in known if k.startswith(stem))
    message = f"unknown op(s): {', '.join(unknown)}"
    if near:
        message += f" (did you mean {', '.join(sorted(near))}?)"
    message += f"; known ops: {', '.join(sorted(known)) or 'none'}"
    if silent:
        message += f"; wrapper modules registering no op: {', '.join(silent)}"
    return f"{message}. {HOW_TO_REGISTER[0].upper()}{HOW_TO_REGISTER[1:]}"
