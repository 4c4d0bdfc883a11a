"""Tests for test/run_suite.py, run against fake repository trees (no GPU needed)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
try:
    import sglang.test.ci.ci_register  # noqa: F401
except ImportError:  # running from a checkout without installing the package
    sys.path.insert(0, str(REPO / "python"))

from sglang.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=20, suite="stage-a-kernel-cpu")

RUN_SUITE = REPO / "test" / "run_suite.py"
FIXTURES = Path(__file__).resolve().parent / "ci_fixtures"
TESTS_REL = Path("python/sglang/jit_kernel/tests")
BENCH_REL = Path("python/sglang/jit_kernel/benchmark")

CPU = "stage-a-kernel-cpu"
UNIT = "stage-b-kernel-unit-1-gpu-large"
BENCH = "stage-b-kernel-benchmark-1-gpu-large"
NIGHTLY = "nightly-kernel-1-gpu"


def _load_run_suite():
    spec = importlib.util.spec_from_file_location("run_suite_under_test", RUN_SUITE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


run_suite = _load_run_suite()


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------
def _write(root: Path, rel, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _script(reg_call: str, body: str = "print('ran ' + __file__)") -> str:
    """A fake test file: a registration, plus a body run under __main__."""
    return f"from sglang.test.ci.ci_register import *  # noqa\n{reg_call}\nif __name__ == '__main__':\n    {body}\n"


def _copy_fixture(root: Path, fixture: str, rel) -> Path:
    dest = root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / fixture, dest)
    return dest


def _cli(root: Path, *args, cwd=None, timeout=60, extra_env=None):
    env = dict(os.environ)
    env["SGLANG_RUN_SUITE_ROOT"] = str(root)
    env.pop("SGLANG_JIT_KERNEL_RUN_FULL_TESTS", None)
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, str(RUN_SUITE), *args],
        cwd=str(cwd or REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _main(root: Path, *args):
    return run_suite.main(["--repo-root", str(root), *args])


@pytest.fixture
def mixed_repo(tmp_path):
    """A fake repo with registrations across backends, suites and run kinds."""
    root = tmp_path / "repo"
    t = TESTS_REL
    _write(root, t / "test_cpu_a.py", _script(f'register_cpu_ci(est_time=3, suite="{CPU}")'))
    _write(root, t / "sub" / "test_cpu_b.py", _script(f'register_cpu_ci(4, "{CPU}")'))
    _write(
        root,
        t / "test_cpu_off.py",
        _script(f'register_cpu_ci(est_time=1, suite="{CPU}", disabled="needs a fix")'),
    )
    _write(
        root,
        t / "test_gpu.py",
        _script(
            f'register_cuda_ci(est_time=30, suite="{UNIT}")\n'
            f'register_cuda_ci(est_time=300, suite="{NIGHTLY}", nightly=True)\n'
            f'register_amd_ci(est_time=40, suite="{UNIT}", disabled="no ROCm port yet")'
        ),
    )
    _write(root, BENCH_REL / "bench_x.py", _script(f'register_cuda_ci(6, "{BENCH}")'))
    _write(root, "test/registered/extra.py", _script(f'register_cpu_ci(2, "{CPU}")'))
    # Never discovered: helpers, __init__ files, caches, wrong name patterns.
    _write(root, t / "__init__.py", "")
    _write(root, t / "helpers.py", "X = 1\n")
    _write(root, t / "__pycache__" / "test_stale.py", "X = 1\n")
    _write(root, BENCH_REL / "utils.py", "X = 1\n")
    _write(root, "test/registered/__init__.py", "")
    return root


# ---------------------------------------------------------------------------
# Discovery and selection.
# ---------------------------------------------------------------------------
def test_per_commit_and_nightly_suite_tables():
    """PER_COMMIT_SUITES (the tutorial's pointer for the PR suites) and NIGHTLY_SUITES split
    ci_register.SUITES by its nightly flag: the JIT unit tests run per commit, the full tests nightly."""
    assert "stage-b-kernel-unit-1-gpu-large" in run_suite.PER_COMMIT_SUITES["cuda"]
    assert run_suite.NIGHTLY_SUITES["cuda"] == ["nightly-kernel-1-gpu"]
    for backend, suites in run_suite.ci_register.SUITES.items():
        assert sorted(run_suite.PER_COMMIT_SUITES[backend] + run_suite.NIGHTLY_SUITES[backend]) == sorted(suites)


def test_discovery(mixed_repo):
    found = [p.relative_to(mixed_repo).as_posix() for p in run_suite.discover_files(mixed_repo)]
    assert found == [
        "python/sglang/jit_kernel/benchmark/bench_x.py",
        "python/sglang/jit_kernel/tests/sub/test_cpu_b.py",
        "python/sglang/jit_kernel/tests/test_cpu_a.py",
        "python/sglang/jit_kernel/tests/test_cpu_off.py",
        "python/sglang/jit_kernel/tests/test_gpu.py",
        "test/registered/extra.py",
    ]


def _listed(out: str):
    return sorted(
        line.strip().split(" (est")[0] for line in out.splitlines() if line.startswith("  ") and "(est " in line
    )


def test_select_cpu(mixed_repo, capsys):
    assert _main(mixed_repo, "--hw", "cpu", "--suite", CPU, "--list") == 0
    out = capsys.readouterr().out
    assert _listed(out) == [
        "python/sglang/jit_kernel/tests/sub/test_cpu_b.py",
        "python/sglang/jit_kernel/tests/test_cpu_a.py",
        "test/registered/extra.py",
    ]
    assert "estimated total 9s" in out
    assert "python/sglang/jit_kernel/tests/test_cpu_off.py: needs a fix" in out


def test_select_cuda_suites_and_nightly(mixed_repo, capsys):
    assert _main(mixed_repo, "--hw", "cuda", "--suite", UNIT, "--list") == 0
    assert _listed(capsys.readouterr().out) == ["python/sglang/jit_kernel/tests/test_gpu.py"]

    assert _main(mixed_repo, "--hw", "cuda", "--suite", BENCH, "--list") == 0
    assert _listed(capsys.readouterr().out) == ["python/sglang/jit_kernel/benchmark/bench_x.py"]

    # Nightly registrations are only picked with --nightly ...
    assert _main(mixed_repo, "--hw", "cuda", "--suite", NIGHTLY, "--list") == 0
    assert _listed(capsys.readouterr().out) == []
    assert _main(mixed_repo, "--hw", "cuda", "--suite", NIGHTLY, "--nightly", "--list") == 0
    out = capsys.readouterr().out
    assert _listed(out) == ["python/sglang/jit_kernel/tests/test_gpu.py"]
    assert "estimated total 300s" in out
    # ... and per-commit ones only without it.
    assert _main(mixed_repo, "--hw", "cuda", "--suite", UNIT, "--nightly", "--list") == 0
    assert _listed(capsys.readouterr().out) == []


def test_select_amd_disabled(mixed_repo, capsys):
    assert _main(mixed_repo, "--hw", "amd", "--suite", UNIT, "--list") == 0
    out = capsys.readouterr().out
    assert _listed(out) == []
    assert "Disabled files (1)" in out
    assert "test_gpu.py: no ROCm port yet" in out


def test_unknown_suite_lists_known_ones(mixed_repo, capsys):
    with pytest.raises(SystemExit) as info:
        _main(mixed_repo, "--hw", "cuda", "--suite", "stage-z-nope")
    assert info.value.code != 0
    err = capsys.readouterr().err
    assert "stage-z-nope" in err
    for name in (UNIT, BENCH, NIGHTLY):
        assert name in err
    assert CPU not in err


def test_registration_with_unknown_suite_fails(tmp_path, capsys):
    root = tmp_path / "repo"
    _write(root, TESTS_REL / "test_typo.py", _script('register_cpu_ci(1, "stage-a-kernel-cpux")'))
    assert _main(root, "--hw", "cpu", "--suite", CPU, "--list") == 1
    err = capsys.readouterr().err
    assert "test_typo.py" in err and "unknown suite 'stage-a-kernel-cpux'" in err


# ---------------------------------------------------------------------------
# Partitions.
# ---------------------------------------------------------------------------
def _fake_regs(est_times):
    return [
        run_suite.CIRegistration("cpu", float(t), CPU, False, None, f"test_{i:02d}.py") for i, t in enumerate(est_times)
    ]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 30])
def test_partitions_cover_and_balance(size):
    est = [300, 5, 60, 60, 45, 30, 30, 30, 12, 8, 8, 90, 120, 1, 2, 3, 240, 15, 15, 50]
    regs = _fake_regs(est)
    parts = run_suite.partition(regs, size)
    assert len(parts) == size
    names = [r.filename for p in parts for r in p]
    assert sorted(names) == sorted(r.filename for r in regs)  # exactly once each
    loads = [sum(r.est_time for r in p) for p in parts]
    total, biggest = sum(est), max(est)
    # Greedy longest-first bound: never above the average plus one file,
    # and never below the single largest file.
    assert max(loads) <= total / size + biggest
    # Longest-first greedy is within 4/3 of the optimum, itself >= both bounds.
    assert max(loads) <= 4 / 3 * max(biggest, total / size) + 1e-9
    assert run_suite.partition(list(reversed(regs)), size) == parts  # deterministic


def test_partition_cli_covers_every_file(tmp_path, capsys):
    root = tmp_path / "repo"
    est = [10, 20, 30, 40, 50, 5, 5]
    for i, t in enumerate(est):
        _write(root, TESTS_REL / f"test_p{i}.py", _script(f'register_cpu_ci({t}, "{CPU}")'))
    seen = []
    for pid in range(3):
        args = ("--hw", "cpu", "--suite", CPU, "--list")
        assert _main(root, *args, "--auto-partition-id", str(pid), "--auto-partition-size", "3") == 0
        out = capsys.readouterr().out
        assert f"partition={pid}/3" in out
        seen.extend(_listed(out))
    assert sorted(seen) == sorted(f"python/sglang/jit_kernel/tests/test_p{i}.py" for i in range(7))
    with pytest.raises(SystemExit):
        _main(root, "--hw", "cpu", "--suite", CPU, "--auto-partition-id", "3", "--auto-partition-size", "3")
    with pytest.raises(SystemExit):
        _main(root, "--hw", "cpu", "--suite", CPU, "--auto-partition-id", "0")


# ---------------------------------------------------------------------------
# Running (each file is a separate process).
# ---------------------------------------------------------------------------
def test_unregistered_file_fails_before_running(tmp_path):
    root = tmp_path / "repo"
    marker = tmp_path / "ran.txt"
    body = f"open({str(marker)!r}, 'w').write('x')"
    _write(root, TESTS_REL / "test_ok.py", _script(f'register_cpu_ci(1, "{CPU}")', body))
    _write(root, TESTS_REL / "test_orphan.py", "print('no registration here')\n")
    _write(root, BENCH_REL / "bench_orphan.py", "X = 1\n")
    res = _cli(root, "--hw", "cpu", "--suite", CPU)
    assert res.returncode != 0
    assert "No CI registry found in python/sglang/jit_kernel/tests/test_orphan.py" in res.stderr
    assert "No CI registry found in python/sglang/jit_kernel/benchmark/bench_orphan.py" in res.stderr
    assert not marker.exists()


def test_file_without_main_block_fails_before_running(tmp_path):
    """run_suite runs files as scripts: a registered file without a __main__ block would run no test."""
    root = tmp_path / "repo"
    marker = tmp_path / "ran.txt"
    body = f"open({str(marker)!r}, 'w').write('x')"
    _write(root, TESTS_REL / "test_ok.py", _script(f'register_cpu_ci(1, "{CPU}")', body))
    _write(
        root,
        TESTS_REL / "test_no_main.py",
        f'from sglang.test.ci.ci_register import *  # noqa\nregister_cpu_ci(1, "{CPU}")\ndef test_x():\n    pass\n',
    )
    res = _cli(root, "--hw", "cpu", "--suite", CPU)
    assert res.returncode == 1
    assert "python/sglang/jit_kernel/tests/test_no_main.py: no top-level `if __name__" in res.stderr
    assert not marker.exists()
    assert run_suite.has_main_block("if __name__ == '__main__':\n    pass\n")
    assert not run_suite.has_main_block("def f():\n    if __name__ == '__main__':\n        pass\n")


def test_every_registered_file_of_this_repo_has_a_main_block():
    regs, errors = run_suite.collect_all(REPO, run_suite.discover_files(REPO))
    assert not errors, errors
    assert regs


def test_list_runs_nothing_from_test_dir(tmp_path):
    root = tmp_path / "repo"
    marker = tmp_path / "ran.txt"
    body = f"open({str(marker)!r}, 'w').write('x')"
    _write(root, TESTS_REL / "test_one.py", _script(f'register_cpu_ci(7, "{CPU}")', body))
    _write(root, TESTS_REL / "test_two.py", _script(f'register_cpu_ci(est_time=2.5, suite="{CPU}")', body))
    res = _cli(root, "--hw", "cpu", "--suite", CPU, "--list", cwd=REPO / "test")
    assert res.returncode == 0, res.stderr
    assert "Selected 2 file(s)" in res.stdout
    assert "python/sglang/jit_kernel/tests/test_one.py (est 7s)" in res.stdout
    assert "python/sglang/jit_kernel/tests/test_two.py (est " in res.stdout
    assert "estimated total 10s" in res.stdout
    assert not marker.exists()


def test_help_documents_root_override():
    res = subprocess.run(
        [sys.executable, "run_suite.py", "--help"],
        cwd=str(REPO / "test"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0
    assert "SGLANG_RUN_SUITE_ROOT" in res.stdout
    assert "--timeout-per-file" in res.stdout and "--auto-partition-size" in res.stdout


def _proc_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
        return "Z" not in state.split()[1]
    except (FileNotFoundError, StopIteration, ProcessLookupError):
        return False


def test_fail_and_timeout_with_continue_on_error(tmp_path):
    root = tmp_path / "repo"
    _copy_fixture(root, "script_fail.py", TESTS_REL / "test_a_fail.py")
    _copy_fixture(root, "script_hang.py", TESTS_REL / "test_b_hang.py")
    _copy_fixture(root, "script_pass.py", TESTS_REL / "test_c_pass.py")
    pid_file = tmp_path / "grandchild.pid"
    start = time.monotonic()
    res = _cli(
        root,
        "--hw",
        "cpu",
        "--suite",
        CPU,
        "--timeout-per-file",
        "2",
        "--continue-on-error",
        extra_env={"CI_FIXTURE_HANG_PID_FILE": str(pid_file)},
    )
    assert time.monotonic() - start < 30
    assert res.returncode != 0
    out = res.stdout
    assert out.rstrip().splitlines()[-1] == "1 passed, 2 failed"
    assert "FAILED     python/sglang/jit_kernel/tests/test_a_fail.py" in out
    assert "exit code 3" in out
    assert "TIMED OUT  python/sglang/jit_kernel/tests/test_b_hang.py" in out
    assert "PASSED     python/sglang/jit_kernel/tests/test_c_pass.py" in out
    assert "FULL_TESTS=0" in out
    # The whole process group was killed, grandchild included.
    gpid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _proc_alive(gpid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _proc_alive(gpid)


def test_stops_at_first_failure_by_default(tmp_path):
    root = tmp_path / "repo"
    _copy_fixture(root, "script_fail.py", TESTS_REL / "test_a_fail.py")
    _copy_fixture(root, "script_pass.py", TESTS_REL / "test_b_pass.py")
    res = _cli(root, "--hw", "cpu", "--suite", CPU)
    assert res.returncode != 0
    out = res.stdout
    assert "FULL_TESTS=" not in out  # test_b_pass never ran
    assert "NOT RUN    python/sglang/jit_kernel/tests/test_b_pass.py" in out
    assert out.rstrip().splitlines()[-1] == "0 passed, 1 failed"


def test_interpreter_without_torch_runs_nothing(tmp_path, monkeypatch, capsys):
    root = tmp_path / "repo"
    marker = tmp_path / "ran.txt"
    body = f"open({str(marker)!r}, 'w').write('x')"
    _write(root, TESTS_REL / "test_one.py", _script(f'register_cpu_ci(1, "{CPU}")', body))
    real_find_spec = run_suite.importlib.util.find_spec
    monkeypatch.setattr(
        run_suite.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )
    assert _main(root, "--hw", "cpu", "--suite", CPU, "--list") == 0  # listing needs no torch
    assert _main(root, "--hw", "cpu", "--suite", CPU) == 2
    assert "torch is not importable by" in capsys.readouterr().err
    assert not marker.exists()


def test_all_pass_and_nightly_env(tmp_path):
    root = tmp_path / "repo"
    body = "import os; print('FULL_TESTS=' + os.environ.get('SGLANG_JIT_KERNEL_RUN_FULL_TESTS', '0'))"
    _write(root, TESTS_REL / "test_n1.py", _script(f'register_cuda_ci(60, "{NIGHTLY}", nightly=True)', body))
    _write(root, "test/registered/n2.py", _script(f'register_cuda_ci(60, "{NIGHTLY}", True)', body))
    _write(root, TESTS_REL / "test_pc.py", _script(f'register_cuda_ci(60, "{UNIT}")', body))
    res = _cli(root, "--hw", "cuda", "--suite", NIGHTLY, "--nightly")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("FULL_TESTS=1") == 2
    assert res.stdout.rstrip().splitlines()[-1] == "2 passed, 0 failed"

    res = _cli(root, "--hw", "cuda", "--suite", UNIT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FULL_TESTS=0" in res.stdout
    assert res.stdout.rstrip().splitlines()[-1] == "1 passed, 0 failed"


def test_empty_selection_passes(tmp_path):
    root = tmp_path / "repo"
    _write(root, TESTS_REL / "test_gpu_only.py", _script(f'register_cuda_ci(1, "{UNIT}")'))
    res = _cli(root, "--hw", "cpu", "--suite", CPU, cwd=REPO / "test")
    assert res.returncode == 0, res.stderr
    assert res.stdout.rstrip().splitlines()[-1] == "0 passed, 0 failed"


def _cuda_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


_GPU_SCRIPTS = sorted(
    p.name
    for pattern in ("bench_*.py", "sweep_*.py", "probe_*.py")
    for p in (REPO / "python" / "sglang" / "jit_kernel" / "benchmark").glob(pattern)
    if p.name != "bench_jit_cache.py"  # compiles without a GPU: it has its own CPU path
)


@pytest.mark.skipif(_cuda_visible(), reason="checks the path taken when no CUDA GPU is visible")
@pytest.mark.parametrize("script", _GPU_SCRIPTS)
def test_gpu_benchmark_skips_cleanly_without_gpu(script):
    """A GPU benchmark run where no GPU is visible (the benchmark suite on a CPU machine) exits 0
    with a one-line note instead of a CUDA traceback, so run_suite reports the remaining files."""
    path = REPO / "python" / "sglang" / "jit_kernel" / "benchmark" / script
    env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300)
    remedy = (
        f"{script} must exit 0 without a GPU: call exit_unless_gpu(__file__) (benchmark/utils.py) before "
        "importing triton (developer guide, Step 5)\n"
    )
    if result.returncode != 0:
        # pytest.fail, not assert: conftest reports an AssertionError that names a missing CUDA
        # driver (this benchmark's own traceback) as a skip.
        pytest.fail(remedy + result.stderr[-2000:])
    assert f"skip: {script} needs a CUDA GPU (none visible)" in result.stdout, remedy
    assert "Traceback" not in result.stderr


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))


def test_cuda_suite_without_gpu_says_so(tmp_path):
    """A cuda suite run where no GPU is visible passes when nothing failed, and says that its GPU
    tests skipped (before the files run and above the summary)."""
    root = tmp_path / "repo"
    _write(root, TESTS_REL / "test_pc.py", _script(f'register_cuda_ci(60, "{UNIT}")', "print('ran')"))
    res = _cli(root, "--hw", "cuda", "--suite", UNIT, extra_env={"CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("Note: no CUDA GPU is visible") == 2
    assert res.stdout.rstrip().splitlines()[-1] == "1 passed, 0 failed"
    res = _cli(root, "--hw", "cpu", "--suite", CPU, extra_env={"CUDA_VISIBLE_DEVICES": ""})
    assert "Note: no CUDA GPU" not in res.stdout
