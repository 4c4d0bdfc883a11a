"""``python -m sglang.jit_kernel build --all`` compiles every registered variant without a GPU, and
``prebuild`` then finds each one in the cache.

Compiles every shipped kernel for sm_90 on an empty cache: slow on a small CPU machine (minutes), and
slower as ops are added to ``registry.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang.jit_kernel.registry import all_ops
from sglang.jit_kernel.testing import requires_nvcc
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=600, suite="stage-a-kernel-cpu")

# Variants already in the cache load without compiling, even with SGLANG_JIT_CRASH_ON_COMPILE=1.
PREBUILD_CACHED = textwrap.dedent(
    """\
    import json
    from sglang.jit_kernel.cache import prebuild
    print(json.dumps(sorted(prebuild())))
    """
)


@requires_nvcc
def test_build_all_produces_every_registered_variant(tmp_path: Path):
    cache_dir = tmp_path / "cache"
    env = {
        **os.environ,
        "SGLANG_JIT_CACHE_DIR": str(cache_dir),
        "SGLANG_JIT_CUDA_ARCH": "9.0",
        "PYTHONWARNINGS": "ignore",
    }
    for name in ("SGLANG_JIT_FORCE_RECOMPILE", "SGLANG_JIT_CRASH_ON_COMPILE"):
        env.pop(name, None)
    expected = sorted(name for entry in all_ops().values() for name in entry.variant_names())
    assert expected, "registry.py lists no variant"

    result = subprocess.run(
        [sys.executable, "-m", "sglang.jit_kernel", "build", "--all", "-j", str(os.cpu_count() or 1)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = re.search(r"built (\d+)/(\d+) variants in ([\d.]+) s", result.stdout)
    assert summary, result.stdout
    assert int(summary.group(1)) == int(summary.group(2)) == len(expected)
    for name in expected:  # one progress line per variant
        assert re.search(rf"\] \d+/{len(expected)} {re.escape(name)} +ok ", result.stdout), name
    built = [p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(built) == len(expected)

    check = subprocess.run(
        [sys.executable, "-c", PREBUILD_CACHED],
        env={**env, "SGLANG_JIT_CRASH_ON_COMPILE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip().splitlines()[-1] == repr(expected).replace("'", '"')


# With explicit archs, prebuild builds for them even when this process already holds the module for
# its own target (the wrapper's memo), and restores SGLANG_JIT_CUDA_ARCH afterwards.
PREBUILD_OTHER_ARCH = textwrap.dedent(
    """\
    import json, os
    from sglang.jit_kernel.add_constant import _jit_add_constant_module
    from sglang.jit_kernel.cache import prebuild
    _jit_add_constant_module(1)
    names = prebuild(["add_constant"], archs="8.0", jobs=1)
    print(json.dumps({"names": names, "env": os.environ["SGLANG_JIT_CUDA_ARCH"]}))
    """
)


@requires_nvcc
def test_prebuild_for_another_arch(tmp_path: Path):
    cache_dir = tmp_path / "cache"
    env = {**os.environ, "SGLANG_JIT_CACHE_DIR": str(cache_dir), "SGLANG_JIT_CUDA_ARCH": "9.0", "PYTHONWARNINGS": "ignore"}
    for name in ("SGLANG_JIT_FORCE_RECOMPILE", "SGLANG_JIT_CRASH_ON_COMPILE"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", PREBUILD_OTHER_ARCH], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"names": ["add_constant[1]"], "env": "9.0"}
    archs = sorted(json.loads((p / "manifest.json").read_text())["archs"][0] for p in cache_dir.iterdir() if not p.name.startswith("."))
    assert archs == ["8.0", "9.0"]



def test_ops_sharing_a_module_build_its_variants_once():
    """`build fused_add_rmsnorm` (an op whose module is rmsnorm's) builds the norm module's
    variants instead of nothing; an op named twice through one module builds it once."""
    from sglang.jit_kernel.cache import entries_to_build

    registry = all_ops()
    names = lambda ops: [entry.name for entry in entries_to_build(registry, ops)]  # noqa: E731
    assert names(["fused_add_rmsnorm"]) == ["rmsnorm"]
    assert names(["fused_inplace_qknorm", "gemma_rmsnorm", "rmsnorm"]) == ["rmsnorm"]
    assert names(["scale", "gemma_fused_add_rmsnorm"]) == ["scale", "rmsnorm"]
    every = names(None)
    assert len(every) == len(set(every)) and all(registry[name].variants for name in every)
    assert {entry.build for entry in registry.values()} == {registry[name].build for name in every}


def test_build_cli_names_the_module_of_a_shared_op(monkeypatch, capsys):
    """`build fused_inplace_qknorm` says it builds rmsnorm's module and which ops that module
    serves (its progress lines name rmsnorm's variants); the compile itself is stubbed out."""
    import sglang.jit_kernel.cache as cache
    from sglang.jit_kernel.__main__ import build_variants

    calls = []
    monkeypatch.setattr(cache, "build_variants", lambda names, **kwargs: calls.append(names) or [])
    assert build_variants(["fused_inplace_qknorm", "scale"], jobs=1) == 0
    out = capsys.readouterr().out
    assert "fused_inplace_qknorm: built as rmsnorm's module (one module serves fused_add_rmsnorm, " in out
    assert "gemma_rmsnorm, rmsnorm)" in out
    assert "scale: built as" not in out  # an op with its own variants needs no note
    assert calls == [["fused_inplace_qknorm", "scale"]]


@pytest.mark.parametrize("command", ["build", "check"])
def test_jobs_must_be_positive(command: str, capsys):
    """``-j 0`` (or negative) would build nothing: argparse rejects it, naming the argument."""
    from sglang.jit_kernel.__main__ import main

    args = [command, "-j", "0"] + (["scale"] if command == "build" else [])
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert "argument -j/--jobs: must be >= 1, got 0" in capsys.readouterr().err


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
