"""``python -m sglang.jit_kernel build --all`` compiles every registered variant without a GPU, and
``prebuild`` then finds each one in the cache.

With ``SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1`` (nightly) the CLI compiles every shipped variant for
sm_90 on an empty cache: minutes on a small CPU machine. CI compiles each module's bfloat16 variants
(its first variant where none takes bfloat16: index dtypes, byte widths), in parallel on every core,
and checks that they load from the cache without compiling; ``test_arch_compile.py`` compiles one
variant of each module for 8.0 and 10.0. Either way into the session's sm_90 cache (conftest), from
which the other compile tests load their modules.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang.jit_kernel.registry import all_modules, all_ops
from sglang.jit_kernel.testing import requires_nvcc
from sglang.jit_kernel.utils import should_run_full_tests
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


# Loads each (module name, variant index) of a JSON list from the cache, without compiling.
LOAD_CACHED = textwrap.dedent(
    """\
    import json, sys
    from sglang.jit_kernel.registry import all_modules
    modules = {m.name: m for m in all_modules()}
    for name, index in json.loads(sys.argv[1]):
        module = modules[name]
        getattr(module.build, "__wrapped__", module.build)(*module.variants[index])
    print("loaded", len(json.loads(sys.argv[1])))
    """
)


def ci_variants() -> list[tuple[str, int]]:
    """(module name, variant index) of CI's builds: each module's bfloat16 variants, or its first
    variant when none takes bfloat16."""
    import torch  # noqa: PLC0415

    chosen = []
    for module in all_modules():
        indices = [i for i, args in enumerate(module.variants) if torch.bfloat16 in args] or [0]
        chosen += [(module.name, i) for i in indices]
    return chosen


@requires_nvcc
@pytest.mark.skipif(should_run_full_tests(), reason="SGLANG_JIT_KERNEL_RUN_FULL_TESTS: the CLI builds every variant")
def test_ci_variants_compile_and_load_from_the_cache(monkeypatch: pytest.MonkeyPatch, sm90_cache_dir: Path):
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(sm90_cache_dir))
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    for name in ("SGLANG_JIT_FORCE_RECOMPILE", "SGLANG_JIT_CRASH_ON_COMPILE"):
        monkeypatch.delenv(name, raising=False)
    modules = {m.name: m for m in all_modules()}
    chosen = ci_variants()
    assert {name for name, _ in chosen} == set(modules), "every module builds at least one variant"

    def build(item: tuple[str, int]) -> object:
        module = modules[item[0]]
        build = getattr(module.build, "__wrapped__", module.build)  # not this process's memo
        return build(*module.variants[item[1]])

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        built = list(pool.map(build, chosen))
    assert all(m is not None for m in built)
    check = subprocess.run(
        [sys.executable, "-c", LOAD_CACHED, json.dumps(chosen)],
        env={**os.environ, "SGLANG_JIT_CRASH_ON_COMPILE": "1", "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip().splitlines()[-1] == f"loaded {len(chosen)}"


@requires_nvcc
@pytest.mark.skipif(not should_run_full_tests(), reason="nightly (SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1): every variant")
def test_build_all_produces_every_registered_variant(sm90_cache_dir: Path):
    # The session's sm_90 cache (conftest): the compile tests after this one load from it. Variants a
    # test before this one compiled there are reported cached; every other one is compiled here.
    cache_dir = sm90_cache_dir
    before = {p.name for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")}
    env = {
        **os.environ,
        "SGLANG_JIT_CACHE_DIR": str(cache_dir),
        "SGLANG_JIT_CUDA_ARCH": "9.0",
        "PYTHONWARNINGS": "ignore",
    }
    for name in ("SGLANG_JIT_FORCE_RECOMPILE", "SGLANG_JIT_CRASH_ON_COMPILE"):
        env.pop(name, None)
    expected = sorted(name for module in all_modules() for name in module.variant_names())
    assert expected, "no registered op lists a variant"

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
    summary = re.search(r"built (\d+)/(\d+) variants \((\d+) cached\) in ([\d.]+) s", result.stdout)
    assert summary, result.stdout
    assert int(summary.group(1)) == int(summary.group(2)) == len(expected)
    assert int(summary.group(3)) == len(before)  # every variant not built before compiled now
    for name in expected:  # a line as each variant starts, one as it ends
        assert re.search(rf"^  start  {re.escape(name)}$", result.stdout, re.M), name
        end = r"(built +[\d.]+ s|cached)" if before else r"built +[\d.]+ s"
        assert re.search(rf"\] \d+/{len(expected)} {re.escape(name)} +{end}$", result.stdout, re.M), name
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
    env = {
        **os.environ,
        "SGLANG_JIT_CACHE_DIR": str(cache_dir),
        "SGLANG_JIT_CUDA_ARCH": "9.0",
        "PYTHONWARNINGS": "ignore",
    }
    for name in ("SGLANG_JIT_FORCE_RECOMPILE", "SGLANG_JIT_CRASH_ON_COMPILE"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", PREBUILD_OTHER_ARCH], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"names": ["add_constant[1]"], "env": "9.0"}
    archs = sorted(
        json.loads((p / "manifest.json").read_text())["archs"][0]
        for p in cache_dir.iterdir()
        if not p.name.startswith(".")
    )
    assert archs == ["8.0", "9.0"]


def test_ops_sharing_a_module_build_its_variants_once():
    """`build gemma_fused_add_rmsnorm` (an op served by fused_add_rmsnorm's module) builds that module's
    variants; ops named twice through one module build it once; every registered op has a module with
    variants."""
    from sglang.jit_kernel.registry import all_modules

    names = lambda ops: [module.name for module in all_modules(ops)]  # noqa: E731
    assert names(["gemma_fused_add_rmsnorm"]) == ["fused_add_rmsnorm"]
    assert names(["rmsnorm_hf", "gemma_rmsnorm", "rmsnorm"]) == ["rmsnorm"]
    assert names(["scale", "fused_inplace_qknorm_across_heads"]) == ["scale", "fused_inplace_qknorm"]
    every = all_modules()
    assert len({id(m) for m in every}) == len(every) and all(m.variants for m in every)
    registry = all_ops()
    assert {id(entry.module) for entry in registry.values()} == {id(m) for m in every}
    assert sorted(op for m in every for op in m.ops) == sorted(registry)


def test_build_cli_shows_each_module_with_the_ops_it_serves(monkeypatch, capsys):
    """`build fused_inplace_qknorm scale` lists the qk-norm module with every op it serves, then scale;
    the compile itself is stubbed out."""
    import sglang.jit_kernel.cache as cache
    from sglang.jit_kernel.__main__ import build_variants

    calls = []
    monkeypatch.setattr(cache, "build_variants", lambda names, **kwargs: calls.append(names) or [])
    assert build_variants(["fused_inplace_qknorm", "scale"], jobs=1) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"^fused_inplace_qknorm: 6 variant\(s\), serves fused_inplace_qknorm, fused_inplace_qknorm_across_heads$",
        out,
        re.M,
    ), out
    assert re.search(r"^scale: 3 variant\(s\), serves scale$", out, re.M), out
    assert calls == [["fused_inplace_qknorm", "scale"]]


def test_build_cli_reports_one_error_for_every_dtype_once(monkeypatch, capsys):
    """An error failing every variant of a module is printed once, "also for" the other dtypes."""
    import sglang.jit_kernel.cache as cache
    from sglang.jit_kernel.__main__ import build_variants

    def failing(names, on_done=None, on_start=None, **kwargs):
        results = []
        for i, dtype in enumerate(["float16", "bfloat16", "float32"]):
            name = f"scale[{dtype}]"
            on_start(name)
            error = f"JITCompileError: JIT module 'scale_{dtype}_t' failed to compile:\nscale.cuh:3: error: boom"
            results.append(cache.VariantResult(name, error, 1.0))
            on_done(results[-1], i + 1, 3)
        return results

    monkeypatch.setattr(cache, "build_variants", failing)
    assert build_variants(["scale"], jobs=1) == 3
    err = capsys.readouterr().err
    assert err.count("error: boom") == 1, err
    assert "scale[float16] (also for bfloat16, float32):" in err
    assert "JIT module 'scale_float16_t' failed" in err  # the first variant's own text, not the key


def test_build_cli_keeps_the_error_text_of_a_variant(monkeypatch, capsys):
    """Grouping blanks dtype names only in the key: identifiers that start with the module's name
    (a misspelt kernel) and the log path's key are printed as the compiler wrote them."""
    import sglang.jit_kernel.cache as cache
    from sglang.jit_kernel.__main__ import build_variants

    error = (
        "JITCompileError: JIT module 'scale_fp16_t' failed to compile:\nscale.cuh:9: error: identifier "
        '"scale_kernell" is undefined\nFull log: /c/.logs/scale_fp16_t-0123456789abcdef0123.log'
    )

    def failing(names, on_done=None, on_start=None, **kwargs):
        result = cache.VariantResult("scale[float16]", error, 1.0)
        on_done(result, 1, 1)
        return [result]

    monkeypatch.setattr(cache, "build_variants", failing)
    assert build_variants(["scale"], jobs=1) == 1
    err = capsys.readouterr().err
    assert 'identifier "scale_kernell" is undefined' in err
    assert "scale_fp16_t-0123456789abcdef0123.log" in err


def test_unknown_op_lists_the_known_ones_and_how_to_register(capsys):
    from sglang.jit_kernel.__main__ import main

    assert main(["build", "no_such_op", "--arch", "9.0"]) == 1
    err = capsys.readouterr().err
    assert "unknown op(s): no_such_op; known ops: " in err and "scale" in err and "rmsnorm" in err
    assert "register_op(" in err and "python/sglang/jit_kernel/<op>.py" in err
    assert main(["build", "silu2", "--arch", "9.0"]) == 1
    assert "unknown op(s): silu2 (did you mean silu_and_mul?); known ops: " in capsys.readouterr().err
    assert main(["build", "rmsnrom", "--arch", "9.0"]) == 1
    assert "did you mean " in capsys.readouterr().err


def test_check_named_ops_builds_and_lists_only_those(monkeypatch, capsys):
    """`check scale rmsnorm` on a machine without a GPU compiles the two ops' modules (the compile
    stubbed out here) and lists only their rows; other ops are neither built nor listed."""
    import sglang.jit_kernel.cache as cache
    from sglang.jit_kernel.__main__ import main

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    calls = []
    monkeypatch.setattr(cache, "build_variants", lambda names, **kwargs: calls.append(names) or [])
    assert main(["check", "scale", "rmsnorm", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert calls == [["rmsnorm", "scale"]] or calls == [["scale", "rmsnorm"]], calls
    rows = [line.split()[0] for line in out.splitlines() if line.endswith("compiled; not run (no GPU)")]
    assert sorted(rows) == ["rmsnorm", "scale"], out
    assert "compile-only check: all variants compiled" in out


def test_check_without_gpu_lists_no_op_as_compiled_after_a_failure(monkeypatch, capsys):
    import sglang.jit_kernel.cache as cache
    from sglang.jit_kernel.__main__ import main

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)

    def failing(names, on_done=None, on_start=None, **kwargs):
        result = cache.VariantResult("scale[float16]", "JITCompileError: boom", 1.0)
        on_done(result, 1, 1)
        return [result]

    monkeypatch.setattr(cache, "build_variants", failing)
    assert main(["check", "scale", "-j", "1"]) == 1
    out = capsys.readouterr().out
    assert "compiled; not run" not in out and "compile-only check: 1 failed; no op was run (no GPU)" in out, out


def test_check_unknown_op_is_answered_before_any_build(monkeypatch, capsys):
    import sglang.jit_kernel.cache as cache
    from sglang.jit_kernel.__main__ import main

    calls = []
    monkeypatch.setattr(cache, "build_variants", lambda names, **kwargs: calls.append(names) or [])
    assert main(["check", "rmsnrom"]) == 1
    err = capsys.readouterr().err
    assert "unknown op(s): rmsnrom (did you mean " in err and "rmsnorm" in err and "known ops: " in err
    assert calls == []


def test_interrupt_cancels_the_queued_builds(monkeypatch):
    """Ctrl-C (or any exception) while build_variants waits: the variants not started yet never
    start, and the exception reaches the caller (before, the pool ran every queued build first)."""
    import threading
    import time

    import sglang.jit_kernel.cache as cache

    started = []
    gate = threading.Event()

    def fake_build_one(name, build, args, on_start=None):
        started.append(name)
        if len(started) > 1:
            gate.wait(5)
        return cache.VariantResult(name, None, 0.0)

    def interrupt(result, done, total):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "_build_one", fake_build_one)
    with pytest.raises(KeyboardInterrupt):
        cache.build_variants(["rmsnorm", "scale", "silu_and_mul"], archs=["9.0"], jobs=1, on_done=interrupt)
    gate.set()
    time.sleep(0.2)
    assert len(started) == 1, started


def _descendants(root: int) -> dict[int, str]:
    """``{pid: command}`` of every live process below ``root`` (from /proc)."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = commands.get(child, "")
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@requires_nvcc
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_sigterm_stops_the_builds_it_started(tmp_path: Path):
    """SIGTERM to `python -m sglang.jit_kernel build` while it compiles: the process exits with 143
    and the ninja / nvcc processes below it are gone too (the signal reaches only the Python
    process; the CLI stops its builds before exiting)."""
    import signal
    import time

    env = dict(os.environ, SGLANG_JIT_CACHE_DIR=str(tmp_path / "cache"), SGLANG_JIT_CUDA_ARCH="9.0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang.jit_kernel", "build", "scale", "-j", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the test's own process group stays out of it
    )
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        compilers: dict[int, str] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            below = _descendants(proc.pid)
            compilers = {pid: cmd for pid, cmd in below.items() if "nvcc" in cmd or "cicc" in cmd or "ptxas" in cmd}
            if compilers:
                break
            time.sleep(0.05)
        assert compilers, "the build never started a compiler"
        started = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in started):
            time.sleep(0.1)
        left = {pid: cmd for pid, cmd in started.items() if _alive(pid)}
        assert not left, f"still running after the CLI exited: {left}"
    finally:  # on failure: nothing of this test keeps compiling
        for pid in [proc.pid, *started]:
            if _alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


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


def test_cli_refuses_op_names_with_all_and_keeps_top_level_clangd_options(tmp_path: Path, capsys):
    """``build --all NAME`` is refused (the names would be ignored); ``--arch`` / ``--output`` given
    before ``clangd`` hold (the subcommand's defaults do not reset them)."""
    from sglang.jit_kernel.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["build", "--all", "no_such_op"])
    assert exc.value.code == 2
    assert "not both (got no_such_op)" in capsys.readouterr().err
    for argv in (
        ["--arch", "8.0", "--output", str(tmp_path / "a"), "clangd"],
        ["clangd", "--arch", "8.0", "--output", str(tmp_path / "b")],
    ):
        assert main(argv) == 0
        assert "--cuda-gpu-arch=sm_80" in Path(argv[3] if argv[0] == "--arch" else argv[4]).read_text()
