"""The JIT build cache: never stale, builds once across processes, loads in milliseconds, cleans up.

Needs nvcc and a host compiler, not a GPU. Most cases compile a host-only C++ module (g++, ~2 s)
because they test cache mechanics; the arch, compile-error and resource-usage cases compile CUDA.
Every test gets its own cache directory (SGLANG_JIT_CACHE_DIR) and targets sm_90.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang.jit_kernel import _build
from sglang.jit_kernel.cache import cache_info, clear_cache, prune_cache
from sglang.jit_kernel.testing import requires_cuda, requires_nvcc
from sglang.jit_kernel.utils import JITCompileError, load_jit
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=200, suite="stage-a-kernel-cpu")

pytestmark = requires_nvcc

ANSWER_H = """\
#include <cstdint>
#include "answer_value.h"
#ifndef ANSWER_BONUS
#define ANSWER_BONUS 0
#endif
int64_t answer() { return ANSWER_VALUE + ANSWER_BONUS; }
"""

# A CUDA module whose host function reports the architecture it was compiled for (SGL_CUDA_ARCH is
# set by the loader from the lowest target) and which has a kernel, so ptxas has something to report.
ARCH_CUH = """\
#include <cstdint>
__global__ void fill_kernel(int64_t* out, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = SGL_CUDA_ARCH;
}
int64_t compiled_arch() { return SGL_CUDA_ARCH; }
"""

# The child of the multi-process cases: load the answer module, print its value as JSON.
CHILD = """\
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from sglang.jit_kernel.utils import load_jit
module = load_jit("answer", cpp_files=[sys.argv[1]], cpp_wrappers=[("answer", "answer")])
print(json.dumps({"answer": module.answer()}))
"""

# A host compiler that counts its compile (-c) invocations, one line each in $JIT_TEST_COUNTER, and can
# stall: sleep $JIT_TEST_SLEEP seconds, or write its pid to $JIT_TEST_HANG and hang.
COUNTING_CXX = """\
#!/bin/sh
case " $* " in
  *" -c "*)
    echo "$$" >> "$JIT_TEST_COUNTER"
    if [ -n "$JIT_TEST_SLEEP" ]; then sleep "$JIT_TEST_SLEEP"; fi
    if [ -n "$JIT_TEST_HANG" ]; then echo "$$" > "$JIT_TEST_HANG.tmp"; mv "$JIT_TEST_HANG.tmp" "$JIT_TEST_HANG"; exec sleep 600; fi
    ;;
esac
exec {real} "$@"
"""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, empty cache root for this test; sm_90 target; no cache-behaviour variables set;
    the loader's per-process state (toolchain memo, loaded modules) reset."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(root))
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    for name in (
        "SGLANG_JIT_FORCE_RECOMPILE",
        "SGLANG_JIT_CRASH_ON_COMPILE",
        "SGLANG_JIT_LOG_RESOURCE_USAGE",
        "SGLANG_JIT_QUIET",
        "CXX",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_build, "_memo", {})
    monkeypatch.setattr(_build, "_loaded", {})
    monkeypatch.setattr(_build, "_forced", set())
    return root


@pytest.fixture
def ninja_runs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every build this process runs (the staging directory of each ninja call)."""
    runs: list[Path] = []
    real = _build._run_ninja

    def counting(directory: Path) -> tuple[bool, str]:
        runs.append(directory)
        return real(directory)

    monkeypatch.setattr(_build, "_run_ninja", counting)
    return runs


@pytest.fixture
def answer_src(tmp_path: Path) -> Path:
    """``src/answer.h`` (listed by absolute path) including its sibling ``answer_value.h`` (41)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "answer.h").write_text(ANSWER_H)
    (src / "answer_value.h").write_text("#define ANSWER_VALUE 41\n")
    return src / "answer.h"


@pytest.fixture
def counting_cxx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Install COUNTING_CXX as $CXX; returns the counter file."""
    real = shutil.which("c++") or shutil.which("g++")
    assert real, "no host C++ compiler"
    wrapper = tmp_path / "bin" / "counting-c++"
    wrapper.parent.mkdir()
    wrapper.write_text(COUNTING_CXX.format(real=real))
    wrapper.chmod(0o755)
    counter = tmp_path / "compiles.txt"
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("JIT_TEST_COUNTER", str(counter))
    return counter


def load_answer(header: Path, **kwargs):
    return load_jit("answer", cpp_files=[str(header)], cpp_wrappers=[("answer", "answer")], **kwargs)


def load_arch_module(source: Path, archs: str):
    return load_jit(
        "compiled_arch",
        cuda_files=[str(source)],
        cuda_wrappers=[("compiled_arch", "compiled_arch")],
        cuda_archs=archs,
    )


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def compiles(counter: Path) -> int:
    return len(counter.read_text().split()) if counter.exists() else 0


def set_in_past(path: Path, seconds: float = 3600.0) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def start_child(header: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(header)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang.jit_kernel", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# ---------------------------------------------------------------------------------------------
# (a) never stale
# ---------------------------------------------------------------------------------------------
def test_edited_header_with_older_mtime_rebuilds(cache_dir, ninja_runs, answer_src, tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "answer_offset.h").write_text("#define ANSWER_OFFSET 0\n")
    answer_src.write_text(
        "#include <answer_offset.h>\n" + ANSWER_H.replace("ANSWER_BONUS;", "ANSWER_BONUS + ANSWER_OFFSET;")
    )
    load = lambda: load_answer(answer_src, extra_include_paths=[str(inc)])  # noqa: E731

    assert load().answer() == 41
    assert len(ninja_runs) == 1

    # A header beside the listed file, edited, its mtime older than the artifact: a timestamp-based
    # build would keep the stale binary. In this same process a fresh load_jit returns the new code.
    (answer_src.parent / "answer_value.h").write_text("#define ANSWER_VALUE 50\n")
    set_in_past(answer_src.parent / "answer_value.h")
    assert load().answer() == 50
    assert len(ninja_runs) == 2

    # A header found through extra_include_paths, same treatment.
    (inc / "answer_offset.h").write_text("#define ANSWER_OFFSET 7\n")
    set_in_past(inc / "answer_offset.h")
    assert load().answer() == 57
    assert len(ninja_runs) == 3

    # The listed file itself.
    answer_src.write_text(answer_src.read_text().replace("ANSWER_VALUE +", "1000 + ANSWER_VALUE +"))
    set_in_past(answer_src)
    assert load().answer() == 1057
    assert len(ninja_runs) == 4

    # Content-addressed: restoring the first contents finds the first artifact, no build.
    (answer_src.parent / "answer_value.h").write_text("#define ANSWER_VALUE 41\n")
    (inc / "answer_offset.h").write_text("#define ANSWER_OFFSET 0\n")
    answer_src.write_text(answer_src.read_text().replace("1000 + ", ""))
    assert load().answer() == 41
    assert len(ninja_runs) == 4
    assert len(entries(cache_dir)) == 4


# ---------------------------------------------------------------------------------------------
# (b) flags and archs are part of the key; artifacts coexist
# ---------------------------------------------------------------------------------------------
@requires_nvcc
def test_stamp_skips_hashing_until_a_dependency_changes(cache_dir, ninja_runs, answer_src, monkeypatch):
    """A warm load reuses the stamped key without reading the headers; an edit that keeps size and
    mtime (but not ctime) makes the next load hash the contents again and rebuild."""
    assert load_answer(answer_src).answer() == 41
    _build._loaded.clear()
    real_key = _build.BuildSpec.key
    calls = []

    def counting_key(self):
        calls.append(self.name)
        return real_key(self)

    monkeypatch.setattr(_build.BuildSpec, "key", counting_key)
    assert load_answer(answer_src).answer() == 41
    assert calls == [], "warm load re-hashed the dependencies despite a matching stamp"
    value = answer_src.with_name("answer_value.h")
    st = value.stat()
    value.write_text("#define ANSWER_VALUE 50\n")  # same size as the 41 version
    os.utime(value, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back; ctime cannot be
    _build._loaded.clear()
    assert load_answer(answer_src).answer() == 50
    assert calls == ["answer"]
    assert len(ninja_runs) == 2


def test_flag_change_gets_its_own_artifact(cache_dir, ninja_runs, answer_src):
    assert load_answer(answer_src).answer() == 41
    assert load_answer(answer_src, extra_cflags=["-DANSWER_BONUS=1"]).answer() == 42
    assert len(ninja_runs) == 2
    assert len(entries(cache_dir)) == 2
    for _ in range(2):  # back and forth, each time from disk (as a new process would)
        _build._loaded.clear()
        assert load_answer(answer_src).answer() == 41
        _build._loaded.clear()
        assert load_answer(answer_src, extra_cflags=["-DANSWER_BONUS=1"]).answer() == 42
    assert len(ninja_runs) == 2


def test_arch_change_gets_its_own_artifact(cache_dir, ninja_runs, tmp_path, monkeypatch):
    monkeypatch.setitem(_build._memo, "device_archs", ("8.0", "9.0"))  # GPUs of both: both builds load
    monkeypatch.setitem(_build._memo, "host_device_archs", ("8.0", "9.0"))  # (before CUDA starts)
    source = tmp_path / "arch.cuh"
    source.write_text(ARCH_CUH)
    assert load_arch_module(source, "9.0").compiled_arch() == 900
    assert load_arch_module(source, "8.0").compiled_arch() == 800
    assert len(ninja_runs) == 2
    names = entries(cache_dir)
    assert len(names) == 2
    archs = sorted(json.loads((cache_dir / n / "manifest.json").read_text())["archs"][0] for n in names)
    assert archs == ["8.0", "9.0"]
    for _ in range(2):
        _build._loaded.clear()
        assert load_arch_module(source, "9.0").compiled_arch() == 900
        _build._loaded.clear()
        assert load_arch_module(source, "8.0").compiled_arch() == 800
    assert len(ninja_runs) == 2


def test_build_for_other_gpus_is_cached_not_loaded(cache_dir, ninja_runs, tmp_path, monkeypatch):
    """A CUDA module with code for none of the visible GPUs is compiled and cached, not loaded (its
    kernels would take over this process's own build of them in the CUDA runtime); calling one of its
    functions says why. Before torch initialises CUDA, NVML's answer decides; with no GPU known, it
    loads."""
    import torch

    monkeypatch.setitem(_build._memo, "device_archs", ("9.0",))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    source = tmp_path / "arch.cuh"
    source.write_text(ARCH_CUH)
    foreign = load_arch_module(source, "8.0")
    assert isinstance(foreign, _build.ForeignModule)
    call = foreign.compiled_arch  # an exported name: a stand-in that refuses to run
    with pytest.raises(
        RuntimeError,
        match=r"^JIT module compiled_arch was built for compute capability 8\.0, and the GPUs here are "
        r"9\.0: it is cached \(.*\) but not loaded, so compiled_arch cannot run here\. Build it ",
    ):
        call()
    with pytest.raises(AttributeError, match=r"has no function 'compiled_ach' \(did you mean 'compiled_arch'\?\)"):
        foreign.compiled_ach  # noqa: B018
    with pytest.raises(RuntimeError, match=r"built for compute capability 8\.0"):  # tvm_ffi.Module's methods too
        foreign.get_function("compiled_arch")
    assert len(ninja_runs) == 1 and len(entries(cache_dir)) == 1
    assert load_arch_module(source, "9.0").compiled_arch() == 900
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # torch not asked: NVML is
    monkeypatch.setitem(_build._memo, "host_device_archs", ("9.0",))
    assert isinstance(load_arch_module(source, "8.0"), _build.ForeignModule)
    monkeypatch.setitem(_build._memo, "host_device_archs", ("8.6", "10.0"))  # 8.0 code runs on 8.6
    assert load_arch_module(source, "8.0").compiled_arch() == 800  # from the cache
    _build._loaded.clear()
    monkeypatch.setitem(_build._memo, "host_device_archs", None)  # NVML did not answer
    assert load_arch_module(source, "8.0").compiled_arch() == 800
    _build._loaded.clear()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setitem(_build._memo, "device_archs", ())
    assert load_arch_module(source, "8.0").compiled_arch() == 800
    assert len(ninja_runs) == 2
    # Targets of the caller's own nvcc flags (here PTX for 8.0, which runs on 9.0) are not second-guessed.
    monkeypatch.setitem(_build._memo, "device_archs", ("9.0",))
    ptx = load_jit(
        "compiled_arch",
        cuda_files=[str(source)],
        cuda_wrappers=[("compiled_arch", "compiled_arch")],
        cuda_archs="8.0",
        extra_cuda_cflags=["-gencode=arch=compute_80,code=compute_80"],
    )
    assert ptx.compiled_arch() == 800


def test_toolchain_names_nvccs_own_host_compiler(cache_dir, monkeypatch, tmp_path):
    """nvcc compiles the host side with gcc from PATH (or NVCC_CCBIN), not $CXX: the key covers that
    compiler's binary too, so replacing it rebuilds."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    gcc = fake_bin / "gcc"
    gcc.write_text("#!/bin/sh\nexit 1\n")
    gcc.chmod(0o755)
    monkeypatch.delenv("NVCC_CCBIN", raising=False)
    before = _build.toolchain_fingerprint()["nvcc_host"]
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(_build, "_memo", {})
    after = _build.toolchain_fingerprint()["nvcc_host"]
    assert after.startswith(f"{gcc}:") and after != before
    # NVCC_CCBIN as nvcc takes it: a directory holding gcc, or a compiler; a missing one is recorded
    # as given (not resolved against the working directory).
    monkeypatch.setenv("NVCC_CCBIN", str(fake_bin))
    assert _build._nvcc_host_fingerprint() == after
    monkeypatch.setenv("NVCC_CCBIN", "/nonexistent/gcc")
    monkeypatch.chdir(tmp_path)
    assert _build._nvcc_host_fingerprint() == "/nonexistent/gcc:missing"


class _FakeNvml:
    """cuda.bindings.nvml's calls that host_device_archs makes, over the given capabilities."""

    def __init__(self, capabilities, fail_at=None):
        self.capabilities, self.fail_at, self.initialised = capabilities, fail_at, 0

    def _maybe_fail(self, where):
        if where == self.fail_at:
            raise RuntimeError(f"NVML failed at {where}")

    def init_v2(self):
        self._maybe_fail("init")
        self.initialised += 1

    def shutdown(self):
        self.initialised -= 1
        self._maybe_fail("shutdown")

    def device_get_count_v2(self):
        return len(self.capabilities)

    def device_get_handle_by_index_v2(self, index):
        return index

    def device_get_cuda_compute_capability(self, handle):
        self._maybe_fail("capability")
        return self.capabilities[handle]


def test_host_gpus_from_nvml(monkeypatch):
    """Before CUDA starts, the host's GPUs come from NVML: sorted, without repeats; None when NVML
    cannot answer, and NVML is shut down again after a query that got past init."""
    from sglang.jit_kernel import _arch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = _FakeNvml([(9, 0), (8, 6), (9, 0)])
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvml", nvml)
    assert _arch.host_device_archs() == ("8.6", "9.0") and nvml.initialised == 0
    nvml = _FakeNvml([(9, 0)], fail_at="capability")
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvml", nvml)
    assert _arch.host_device_archs() is None and nvml.initialised == 0
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvml", _FakeNvml([(9, 0)], fail_at="init"))
    assert _arch.host_device_archs() is None
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvml", _FakeNvml([(9, 0)], fail_at="shutdown"))
    assert _arch.host_device_archs() == ("9.0",)  # the answer stands
    for hidden in ("", "-1", "none"):  # CUDA_VISIBLE_DEVICES hiding every GPU: NVML not asked
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert _arch.host_device_archs() == ()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert _arch.host_device_archs() == ("9.0",)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvml", None)  # not installed: import fails
    assert _arch.host_device_archs() is None


def test_which_targets_run_on_a_gpu():
    assert _build.runs_on("8.0", "8.6") and _build.runs_on("9.0", "9.0") and _build.runs_on("10.0f", "10.3")
    assert not _build.runs_on("8.6", "8.0") and not _build.runs_on("8.0", "9.0")
    assert not _build.runs_on("9.0", "10.0") and not _build.runs_on("10.0", "9.0")
    assert _build.runs_on("9.0a", "9.0") and not _build.runs_on("10.0a", "10.3")


# A CUDA module with a launcher: fill(out) writes SGL_CUDA_ARCH into out[0] on the current device and
# returns the launch's error code (0: cudaSuccess; 209: cudaErrorNoKernelImageForDevice).
FILL_CUH = """\
#include <cstdint>
#include <tvm/ffi/container/tensor.h>
__global__ void fill_arch_kernel(int64_t* out) { *out = SGL_CUDA_ARCH; }
int64_t fill(tvm::ffi::TensorView out) {
  fill_arch_kernel<<<1, 1>>>(static_cast<int64_t*>(out.data_ptr()));
  return static_cast<int64_t>(cudaGetLastError());
}
"""


@requires_cuda
def test_build_for_other_gpus_leaves_this_process_build_working(cache_dir, tmp_path):
    """A build for another GPU first (as ``prebuild(archs=...)`` or ``override_jit_cuda_arch`` make),
    then this GPU's build of the same kernel: it launches. Loading the first one would have made
    the CUDA runtime launch its kernel here (no kernel image)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    other = "9.0" if major == 8 else "8.0"

    def load(archs: str):
        return load_jit("fill_arch", cuda_files=[str(source)], cuda_wrappers=[("fill", "fill")], cuda_archs=archs)

    source = tmp_path / "fill.cuh"
    source.write_text(FILL_CUH)
    out = torch.zeros(1, dtype=torch.int64, device="cuda")  # CUDA initialised, as in any op's process
    assert isinstance(load(other), _build.ForeignModule)
    assert load(f"{major}.{minor}").fill(out) == 0
    torch.cuda.synchronize()
    assert out.item() == major * 100 + minor * 10


FOREIGN_FIRST = """\
import sys, torch
from sglang.jit_kernel.utils import ForeignModule, load_jit
def load(archs):
    return load_jit("fill_arch", cuda_files=[sys.argv[1]], cuda_wrappers=[("fill", "fill")], cuda_archs=archs)
other = load(sys.argv[2])
assert not torch.cuda.is_initialized() and isinstance(other, ForeignModule), other
out = torch.zeros(1, dtype=torch.int64, device="cuda")
print(load(sys.argv[3]).fill(out), out.item())
"""


@requires_cuda
def test_build_for_other_gpus_before_cuda_starts_is_not_loaded(cache_dir, tmp_path):
    """The same before the process's first CUDA use (NVML names the GPUs): a fresh process loads
    the other GPU's build first, starts CUDA, then launches its own build."""
    import torch

    from sglang.jit_kernel import _arch

    if _arch.host_device_archs() is None:
        pytest.skip("NVML does not answer here (no cuda.bindings.nvml): builds load before CUDA starts")
    major, minor = torch.cuda.get_device_capability()
    other = "9.0" if major == 8 else "8.0"
    source = tmp_path / "fill.cuh"
    source.write_text(FILL_CUH)
    env = dict(os.environ, SGLANG_JIT_CACHE_DIR=str(cache_dir))
    run = subprocess.run(
        [sys.executable, "-c", FOREIGN_FIRST, str(source), other, f"{major}.{minor}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-2:] == ["0", str(major * 100 + minor * 10)]


# ---------------------------------------------------------------------------------------------
# (c) one build across processes
# ---------------------------------------------------------------------------------------------
def test_eight_processes_compile_once(cache_dir, answer_src, counting_cxx):
    # The compiler stalls 5 s so that processes arriving during the build wait on the lock.
    children = [start_child(answer_src, JIT_TEST_SLEEP="5") for _ in range(8)]
    outputs = [child.communicate(timeout=300) for child in children]
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"answer": 41}
    assert compiles(counting_cxx) == 1
    [name] = entries(cache_dir)
    builder = json.loads((cache_dir / name / "manifest.json").read_text())["built_by_pid"]
    assert builder in [child.pid for child in children]
    waiting = [err for _, err in outputs if "Waiting for pid" in err]
    assert waiting, "no process waited for the builder"
    # (A waiter that looks in the instant between the builder's lock and its .owner write says "unknown".)
    assert any(f"Waiting for pid {builder}, which is compiling JIT module answer" in err for err in waiting)


# ---------------------------------------------------------------------------------------------
# (d) a builder killed mid-compile
# ---------------------------------------------------------------------------------------------
def test_killed_builder_leaves_nothing_loadable(cache_dir, answer_src, counting_cxx, tmp_path):
    hang = tmp_path / "compiler.pid"
    victim = start_child(answer_src, JIT_TEST_HANG=str(hang))
    deadline = time.monotonic() + 120
    while not hang.exists():
        assert victim.poll() is None, victim.communicate()
        assert time.monotonic() < deadline, "the compiler never started"
        time.sleep(0.1)
    os.killpg(victim.pid, signal.SIGKILL)  # python and ninja
    victim.wait()
    os.kill(int(hang.read_text()), signal.SIGKILL)  # ninja runs each command in its own process group

    assert entries(cache_dir) == []  # nothing published
    assert cache_info().staging == 1  # the dead builder's directory, counted as a leftover

    survivor = start_child(answer_src)
    out, err = survivor.communicate(timeout=300)
    assert survivor.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"answer": 41}
    assert compiles(counting_cxx) == 2
    assert len(entries(cache_dir)) == 1

    assert prune_cache(max_age_days=30) == 0  # the fresh entry stays...
    info = cache_info()
    assert (info.entries, info.staging) == (1, 0)  # ...the leftover goes


# ---------------------------------------------------------------------------------------------
# (e) unsafe cache directories
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777], ids=["0770", "0707", "0777"])
def test_shared_cache_dir_refused(cache_dir, answer_src, mode):
    cache_dir.mkdir(mode=0o700)
    cache_dir.chmod(mode)
    with pytest.raises(RuntimeError, match="writable by group or others.*refusing to load code"):
        load_answer(answer_src)
    with pytest.raises(RuntimeError, match="writable by group or others"):
        cache_info()
    result = run_cli("cache", "info")
    assert result.returncode == 1
    assert "writable by group or others" in result.stderr
    assert list(cache_dir.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# (f) SGLANG_JIT_FORCE_RECOMPILE, (g) SGLANG_JIT_CRASH_ON_COMPILE
# ---------------------------------------------------------------------------------------------
def test_force_recompile_rebuilds_once_per_process(cache_dir, ninja_runs, answer_src, monkeypatch):
    assert load_answer(answer_src).answer() == 41
    _build._loaded.clear()
    monkeypatch.setenv("SGLANG_JIT_FORCE_RECOMPILE", "1")
    assert load_answer(answer_src).answer() == 41
    assert len(ninja_runs) == 2
    assert load_answer(answer_src).answer() == 41  # forced once per process, not per call
    assert len(ninja_runs) == 2
    assert len(entries(cache_dir)) == 1  # replaced, not duplicated
    assert cache_info().staging == 0  # the replaced entry is gone too


def test_crash_on_compile(cache_dir, ninja_runs, answer_src, monkeypatch):
    monkeypatch.setenv("SGLANG_JIT_CRASH_ON_COMPILE", "1")
    with pytest.raises(RuntimeError, match="SGLANG_JIT_CRASH_ON_COMPILE=1 forbids compiling"):
        load_answer(answer_src)
    assert ninja_runs == []
    assert entries(cache_dir) == []

    monkeypatch.delenv("SGLANG_JIT_CRASH_ON_COMPILE")
    assert load_answer(answer_src).answer() == 41
    _build._loaded.clear()
    monkeypatch.setenv("SGLANG_JIT_CRASH_ON_COMPILE", "1")
    assert load_answer(answer_src).answer() == 41  # cached: loading is allowed
    monkeypatch.setenv("SGLANG_JIT_FORCE_RECOMPILE", "1")
    with pytest.raises(RuntimeError, match="SGLANG_JIT_FORCE_RECOMPILE=1 .*SGLANG_JIT_CRASH_ON_COMPILE=1"):
        load_answer(answer_src)
    assert len(ninja_runs) == 1


# ---------------------------------------------------------------------------------------------
# (i) compile errors
# ---------------------------------------------------------------------------------------------
BROKEN = """\
#include <cstdint>
int64_t answer() {
  return undeclared_answer;
}
"""


@pytest.mark.parametrize("language", ["cuda", "cpp"])
def test_compile_error_names_module_line_and_log(cache_dir, tmp_path, language, capsys):
    source = tmp_path / ("broken.cuh" if language == "cuda" else "broken.h")
    source.write_text(BROKEN)
    files = {f"{language}_files": [str(source)], f"{language}_wrappers": [("answer", "answer")]}
    with pytest.raises(JITCompileError) as info:
        load_jit("broken_answer", **files)
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert "JIT module 'broken_answer' failed to compile" in message
    first_error = message.splitlines()[1]
    location = f"{source}(3)" if language == "cuda" else f"{source}:3:"
    assert first_error.startswith(location), message  # the user's file and line, not main.cu
    assert "undeclared_answer" in first_error
    log = Path(message.rsplit("Full log: ", 1)[1].strip())
    assert log.is_file() and "undeclared_answer" in log.read_text()
    # The parts, for callers that group failures (e.g. one error for every dtype of an op).
    assert (info.value.module_name, info.value.log_path) == ("broken_answer", log)
    assert info.value.first_error.startswith(first_error) and info.value.first_error in message
    assert "broken_answer for " in capsys.readouterr().err.splitlines()[-1]  # "... failed to compile after 2.1 s"
    assert entries(cache_dir) == []
    assert cache_info().staging == 0


ANSWER_DECL = """\
#include <cstdint>
template <int kValue>
int64_t answer_of() { return kValue; }
"""


@pytest.mark.parametrize("language", ["cuda", "cpp"])
@pytest.mark.parametrize("symbol", ["answr_of<42>", "answer_of"])
def test_compile_error_in_generated_binding_names_the_wrapper(cache_dir, tmp_path, symbol, language):
    """A misspelt wrapper symbol, or a template without its arguments, fails in the generated
    main.cu / main.cpp: the message says which wrapper entry and what it must name."""
    source = tmp_path / ("answer_decl.cuh" if language == "cuda" else "answer_decl.h")
    source.write_text(ANSWER_DECL)
    with pytest.raises(JITCompileError) as info:
        load_jit("bad_wrapper", **{f"{language}_files": [str(source)], f"{language}_wrappers": [("answer", symbol)]})
    message = str(info.value)
    expected = f"in the binding generated for {language}_wrappers entry ('answer', '{symbol}')"
    assert expected in message, message
    assert "with its template arguments" in message
    # An error on the generated line shows that line as written, not as nvcc prints it (the export
    # macro expanded, ~900 characters); a misspelt name gets the closest function name of the listed
    # file. (g++ puts the first error of a bare template name inside tvm-ffi's macro, in function.h.)
    first = info.value.first_error.splitlines()
    if first[0].startswith("main."):
        assert first[1:] == [f"  TVM_FFI_DLL_EXPORT_TYPED_FUNC(answer, ({symbol}));"]
    assert max(len(line) for line in message.splitlines()) < 300, message
    if symbol == "answr_of<42>":
        assert "did you mean 'answer_of<42>'?" in message, message
    else:  # the name exists: the template arguments are missing, not the name
        assert "; did you mean" not in message, message


def test_undefined_symbol_fails_the_build_not_the_first_call(cache_dir, tmp_path):
    """A function the module declares but nothing defines is a link error naming it (-z defs), not a
    "symbol lookup error" that ends the process at the first call."""
    header = tmp_path / "undefined.h"
    header.write_text("#include <cstdint>\nint64_t missing_helper();\nint64_t answer() { return missing_helper(); }\n")
    with pytest.raises(
        JITCompileError, match=r"in function `answer\(\)':\n.*undefined reference to `missing_helper\(\)'"
    ) as info:
        load_jit("undefined_symbol", cpp_files=[str(header)], cpp_wrappers=[("answer", "answer")])
    assert (
        "(missing_helper(), named at undefined.h:2, is declared but defined nowhere in the build: define it "
        "in a listed file, or link the library that defines it (extra_ldflags))"
    ) in str(info.value)


def test_undefined_device_function_names_it_and_its_file(cache_dir, tmp_path):
    """ptxas names a device function that is declared but not defined by its mangled name only; the
    error shows it demangled, with the line of the listed file that names it."""
    header = tmp_path / "undefined_device.cuh"
    header.write_text(
        "#include <tvm/ffi/container/tensor.h>\n"
        "__device__ float scale_of(float x);\n"
        "__global__ void scale_kernel(float* x) { x[0] = scale_of(x[0]); }\n"
        "void run(tvm::ffi::TensorView x) { scale_kernel<<<1, 1>>>(static_cast<float*>(x.data_ptr())); }\n"
    )
    with pytest.raises(JITCompileError, match=r"Unresolved extern function '_Z8scale_off'") as info:
        load_jit("undefined_device", cuda_files=[str(header)], cuda_wrappers=[("run", "run")])
    if shutil.which("c++filt"):
        assert "(scale_of(float), named at undefined_device.cuh:2, is a device function declared but not" in str(
            info.value
        )
    assert "compiled without relocatable device code, -rdc" in str(info.value)


def test_undefined_symbol_hint_finds_template_and_member_names(tmp_path):
    source = tmp_path / "names.h"
    source.write_text(
        "namespace ns {\ntemplate <int N> struct Cls { int method(int); };\n}\ntemplate <typename T> T foo(T);\n"
    )
    spec = _build.make_spec("names", [str(source)], [], [], [], [], [], [], [], None)

    def hint(symbol: str) -> str:
        return _build.undefined_symbol_hint(f"/usr/bin/ld: main.cpp:(.text): undefined reference to `{symbol}'", spec)

    assert "(int foo<int>(int), named at names.h:4, is declared" in hint("int foo<int>(int)")
    assert "(ns::Cls<3>::method(int), named at names.h:2, is declared" in hint("ns::Cls<3>::method(int)")
    assert hint("vtable for ns::Cls<3>") == ""  # the linker's own words (a missing key function) stand


@pytest.mark.parametrize("field,value", [(0x36, 8), (0x38, 60000)])  # e_phentsize too small; e_phnum huge
def test_truncation_check_leaves_a_malformed_header_to_dlopen(tmp_path, field, value):
    """A header whose tables make no sense is not called truncated (nor does the check raise): dlopen
    refuses it by itself, with its own message."""
    library = tmp_path / "odd.so"
    header = bytearray(b"\x7fELF\x02\x01\x01" + bytes(57))
    header[0x20:0x28] = (64).to_bytes(8, "little")
    header[field : field + 2] = value.to_bytes(2, "little")
    library.write_bytes(bytes(header) + bytes(200))
    result = _build._truncated_library(library)
    assert result is None or "shorter than" in result


def test_compile_error_says_how_many_errors_there_are(cache_dir, tmp_path):
    header = tmp_path / "two_errors.cuh"
    header.write_text("int first() { return undeclared_one; }\nint second() { return undeclared_two; }\n")
    with pytest.raises(JITCompileError, match=r'identifier "undeclared_one" is undefined') as info:
        load_jit("two_errors", cuda_files=[str(header)], cuda_wrappers=[("first", "first")])
    assert "(the first of 2 errors; the full log has them all)" in str(info.value)


def test_first_compiler_error_cuts_a_wide_context_line_around_the_caret():
    wide = "  " + "x" * 500 + "undeclared_answer" + "y" * 500
    log = f'k.cuh(3): error: identifier "undeclared_answer" is undefined\n{wide}\n{" " * 502}^\n\n1 error\n'
    header, source, caret = _build.first_compiler_error(log).splitlines()
    assert header == 'k.cuh(3): error: identifier "undeclared_answer" is undefined'
    assert len(source) <= _build.CONTEXT_WIDTH + 8 and source.startswith("... ") and source.endswith(" ...")
    assert source[caret.index("^") :].startswith("undeclared_answer")  # the caret still points at it
    assert caret.strip() == "^"
    long_note = "  " + "z" * 1000
    assert (
        _build.first_compiler_error(f"k.cuh(3): error: bad\n{long_note}\n").splitlines()[1]
        == long_note[: _build.CONTEXT_WIDTH] + " ..."
    )


def test_first_compiler_error_shows_the_linkers_cause():
    """The linker's error, not its warnings or collect2's line; an "in function" line with the
    undefined reference after it; nvcc's temporary host file named main.cu, offsets dropped."""
    log = (
        "/usr/bin/ld: warning: x.o: missing .note.GNU-stack section implies executable stack\n"
        "/usr/bin/ld: /tmp/tmpxft_00003b3b_00000000-6_main.cudafe1.cpp:(.text+0x2bf): undefined reference to "
        "`host_missing()'\ncollect2: error: ld returned 1 exit status\n"
    )
    assert (
        _build.first_compiler_error(log) == "/usr/bin/ld: /tmp/main.cu:(.text): undefined reference to `host_missing()'"
    )
    log = "/usr/bin/ld: cannot find -lfoo: No such file or directory\ncollect2: error: ld returned 1 exit status\n"
    assert _build.first_compiler_error(log) == "/usr/bin/ld: cannot find -lfoo: No such file or directory"


def test_first_compiler_error_finds_nvcc_fatal():
    log = "[1/2] nvcc ... -gencode=arch=compute_70,code=sm_70 ...\nnvcc fatal   : Unsupported gpu architecture 'compute_70'\nninja: build stopped: subcommand failed.\n"
    assert _build.first_compiler_error(log) == "nvcc fatal   : Unsupported gpu architecture 'compute_70'"
    # The complaint of the tool nvcc ran, just before nvcc's own line, names the cause.
    log = (
        "FAILED: [code=1] main_cu.o \n/usr/local/cuda/bin/nvcc -std=c++20 -x cu -c main.cu -o main_cu.o\n"
        "/nope/gcc: No such file or directory\nnvcc fatal   : Failed to preprocess host compiler properties.\n"
    )
    assert _build.first_compiler_error(log) == (
        "/nope/gcc: No such file or directory\nnvcc fatal   : Failed to preprocess host compiler properties."
    )


# ---------------------------------------------------------------------------------------------
# (j) warm loads: no subprocess, milliseconds; "last used" is recorded
# ---------------------------------------------------------------------------------------------
WARM_CHILD = """\
import json, os, subprocess, sys, time
import torch, tvm_ffi, tvm_ffi.libinfo  # imports are not part of the load
from sglang.jit_kernel.utils import load_jit

def forbidden(*args, **kwargs):
    raise AssertionError(f"a warm load started a subprocess: {args!r}")

subprocess.run = subprocess.Popen = subprocess.call = subprocess.check_output = forbidden
os.system = os.posix_spawn = os.posix_spawnp = os.fork = os.execv = forbidden
start = time.perf_counter()
module = load_jit("answer", cpp_files=[sys.argv[1]], cpp_wrappers=[("answer", "answer")])
seconds = time.perf_counter() - start
print(json.dumps({"answer": module.answer(), "seconds": seconds}))
"""


def test_warm_load_runs_no_subprocess_and_is_fast(cache_dir, answer_src):
    load_answer(answer_src)
    [name] = entries(cache_dir)
    set_in_past(cache_dir / name, 10 * 86400)
    assert cache_info().items[0].age_days > 9.9
    timings = []
    for _ in range(2):  # best of two fresh processes: the machine may be busy
        result = subprocess.run(
            [sys.executable, "-c", WARM_CHILD, str(answer_src)], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["answer"] == 41
        timings.append(report["seconds"])
    print(f"warm load_jit in a fresh process: {', '.join(f'{1e3 * t:.1f} ms' for t in timings)}")
    assert min(timings) < 0.05
    assert cache_info().items[0].age_days < 0.01  # the load marked the entry as used


# ---------------------------------------------------------------------------------------------
# (k) SGLANG_JIT_LOG_RESOURCE_USAGE
# ---------------------------------------------------------------------------------------------
def test_log_resource_usage(cache_dir, tmp_path, monkeypatch, caplog):
    source = tmp_path / "arch.cuh"
    source.write_text(ARCH_CUH)
    monkeypatch.setenv("SGLANG_JIT_LOG_RESOURCE_USAGE", "1")
    caplog.set_level(logging.INFO, logger="sglang.jit_kernel")
    load_arch_module(source, "9.0")
    built = [r.getMessage() for r in caplog.records if "ptxas" in r.getMessage()]
    assert any("fill_kernel" in m for m in built), built
    assert any("registers" in m for m in built), built

    caplog.clear()  # a warm load repeats them from the entry's build.log
    _build._loaded.clear()
    load_arch_module(source, "9.0")
    assert any("registers" in r.getMessage() for r in caplog.records)

    caplog.clear()
    _build._loaded.clear()
    monkeypatch.delenv("SGLANG_JIT_LOG_RESOURCE_USAGE")
    load_arch_module(source, "9.0")
    assert not any("ptxas" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# (l) cache info / prune / clear
# ---------------------------------------------------------------------------------------------
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_cache_cli_info_prune_clear(cache_dir, answer_src):
    from filelock import FileLock

    load_answer(answer_src)
    load_answer(answer_src, extra_cflags=["-DANSWER_BONUS=1"])
    old, recent = entries(cache_dir)
    set_in_past(cache_dir / old, 40 * 86400)
    staging = cache_dir / ".staging"
    (staging / f"answer-{'0' * 20}-{dead_pid()}-deadbeef").mkdir()  # a leftover: its key's lock is free
    (cache_dir / ".locks" / f"answer-{'0' * 20}.lock").touch()
    live = staging / f"answer-{'2' * 20}-{dead_pid()}-0badcafe"
    live.mkdir()  # a pid this process cannot see (another container's builder)...
    held = FileLock(str(cache_dir / ".locks" / f"answer-{'2' * 20}.lock"))  # ...whose build lock is held: live
    held.acquire()
    try:
        info = cache_info()
        assert (info.entries, info.staging) == (2, 1)
        assert [item.name for item in info.items] == [old, recent]  # least recently used first
        assert info.items[0].age_days == pytest.approx(40, abs=0.01)
        assert info.total_bytes == sum(item.size_bytes for item in info.items) > 0

        result = run_cli("cache", "info")
        assert result.returncode == 0, result.stderr
        assert f"cache root: {cache_dir}" in result.stdout
        assert "entries: 2" in result.stdout and "staging leftovers: 1" in result.stdout
        assert old in result.stdout and recent in result.stdout

        result = run_cli("cache", "prune", "--days", "30")
        assert result.returncode == 0, result.stderr
        assert "pruned 1 entries" in result.stdout
        assert entries(cache_dir) == [recent]
        assert cache_info().staging == 0
        assert live.is_dir()

        result = run_cli("cache", "clear")
        assert result.returncode == 0, result.stderr
        assert "removed 1 entries" in result.stdout
        assert entries(cache_dir) == []
        assert [p.name for p in (cache_dir / ".locks").glob("*.lock")] == [f"answer-{'2' * 20}.lock"]  # held
    finally:
        held.release()
    assert clear_cache() == 0
    assert list((cache_dir / ".locks").iterdir()) == []
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError, match="max_age_days must be >= 0"):
            prune_cache(bad)
    with pytest.raises(TypeError, match="max_age_days must be a number of days, got str"):
        prune_cache("30")
    for bad in ("-1", "nan"):
        result = run_cli("cache", "prune", "--days", bad)
        assert result.returncode == 2 and "must be a number of days >= 0" in result.stderr, result.stderr


def test_reload_after_entry_removed_elsewhere(cache_dir, ninja_runs, answer_src):
    """Another process's `cache clear` does not break a later load: it rebuilds."""
    load_answer(answer_src)
    assert clear_cache() == 1
    _build._loaded.clear()
    assert load_answer(answer_src).answer() == 41
    assert len(ninja_runs) == 2


def test_entry_without_its_library_is_rebuilt(cache_dir, ninja_runs, answer_src):
    """An entry whose .so is gone (deleted by hand, a full disk) is replaced by a new build, not kept
    as a directory that every later publish fails on."""
    module = load_answer(answer_src)
    library = Path(str(module._jit_artifact_))
    library.unlink()
    _build._loaded.clear()
    assert load_answer(answer_src).answer() == 41
    assert library.exists() and len(ninja_runs) == 2 and len(entries(cache_dir)) == 1


@pytest.mark.parametrize(
    "flags,answer",
    [
        (["-DANSWER_BONUS='(1 + 1)'"], 43),  # shell quotes: one argument with spaces and parentheses
        (["-DANSWER_BONUS=2 -DUNUSED=1"], 43),  # several words in one entry
        (["", "-DANSWER_BONUS=1", " "], 42),  # empty entries add nothing
        (["'-DANSWER_BONUS=sizeof(\"$HOME;x\")-1'"], 48),  # "$" reaches the shell, not read by ninja
    ],
)
def test_extra_flags_are_shell_text(cache_dir, answer_src, flags, answer):
    """Flags are shell text, as torch's cpp_extension takes them; ninja's "$" is escaped."""
    assert load_answer(answer_src, extra_cflags=flags).answer() == answer


@pytest.mark.parametrize(
    "kwargs,error,pattern",
    [
        (dict(cpp_files="answer.h"), TypeError, r"cpp_files must be a list of strings, got the string 'answer.h'"),
        (dict(extra_cflags="-O0"), TypeError, r"extra_cflags must be a list of strings, got the string '-O0'"),
        (dict(extra_dependencies="cutlass"), TypeError, r"extra_dependencies must be a list of strings"),
        (dict(extra_cuda_cflags=[None]), TypeError, r"extra_cuda_cflags entries must be strings, got NoneType"),
        (dict(extra_ldflags=3), TypeError, r"extra_ldflags must be a list of strings, got int"),
        (dict(header_only="no"), TypeError, r"header_only must be a bool, got str 'no'"),
        (dict(cuda_archs=""), ValueError, r"no CUDA architecture in the requested architectures"),
        (dict(cuda_archs=[]), ValueError, r"no CUDA architecture"),
        (dict(cuda_archs=[9.0]), TypeError, r"CUDA architecture 9.0 \(float\): expected a string"),
        (dict(cuda_archs=90), TypeError, r"CUDA architectures must be a string or a list of strings, got 90"),
        (dict(cuda_archs="9.10"), ValueError, r"invalid CUDA architecture '9.10'"),
    ],
)
def test_malformed_arguments_raise_before_a_build(cache_dir, ninja_runs, answer_src, kwargs, error, pattern):
    kwargs = {"cuda_files": [str(answer_src)], **kwargs} if "cpp_files" not in kwargs else kwargs
    with pytest.raises(error, match=pattern):
        load_jit("answer", **kwargs)
    assert not ninja_runs


def test_long_marker_is_a_short_unique_name(cache_dir, answer_src):
    """A marker longer than a file name allows becomes a readable prefix and a digest of the whole."""
    first = load_jit("x" * 300, "a", cpp_files=[str(answer_src)], cpp_wrappers=[("answer", "answer")])
    second = load_jit("x" * 300, "b", cpp_files=[str(answer_src)], cpp_wrappers=[("answer", "answer")])
    assert first.answer() == second.answer() == 41
    names = {Path(str(m._jit_artifact_)).name for m in (first, second)}
    assert len(names) == 2 and all(len(n) <= 123 and n.startswith("x" * 100) for n in names)


@pytest.mark.parametrize("kept", [0.002, 0.4, 0.9])
def test_damaged_library_is_rebuilt(cache_dir, answer_src, kept):
    """A truncated .so (a full disk, a partial copy) is built again instead of failing every later
    load: cut inside its ELF header dlopen says "file too short"; cut further on, dlopen would map
    pages past the end of the file and the process would die of SIGBUS, so the loader checks the
    library's tables against its size first."""
    library = Path(str(load_answer(answer_src)._jit_artifact_))
    damaged = library.with_name("damaged.tmp")  # a new file: this process maps the old one
    content = library.read_bytes()
    damaged.write_bytes(content[: max(100, int(len(content) * kept))])
    os.replace(damaged, library)
    child = start_child(answer_src)  # a new process: this one's dlopen would return its loaded copy
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"answer": 41}
    assert "is damaged" in err and "rebuilding it" in err
    assert library.stat().st_size == len(content) and len(entries(cache_dir)) == 1


def test_damaged_library_replaced_elsewhere_is_not_rebuilt_again(cache_dir, ninja_runs, answer_src):
    """Processes that found one library damaged rebuild it once: under the lock, a library that is no
    longer the damaged file (another process replaced it) is taken as it is."""
    artifact = Path(str(load_answer(answer_src)._jit_artifact_))
    spec = _build.make_spec("answer", [str(answer_src)], [], [("answer", "answer")], [], [], [], [], [], None)
    key = _build.stamped_key(spec, cache_dir)
    assert _build.build_artifact(spec, cache_dir, key, damaged=(0, 0)) == artifact  # replaced already
    assert len(ninja_runs) == 1
    assert _build.build_artifact(spec, cache_dir, key, damaged=_build._identity(artifact)) == artifact
    assert len(ninja_runs) == 2 and len(entries(cache_dir)) == 1


def test_stopped_builds_end_a_wait_on_another_builders_lock(cache_dir, ninja_runs, answer_src, monkeypatch):
    """After terminate_builds (a SIGTERM to `build` / `check`), a variant waiting on another process's
    lock gives up within a second instead of waiting for that build, and starts nothing."""
    import threading

    from filelock import FileLock

    load_answer(answer_src)
    (entry,) = entries(cache_dir)
    assert clear_cache() == 1
    _build._loaded.clear()
    monkeypatch.setattr(_build, "_BUILDS_STOPPED", threading.Event())  # this test's own flag
    held = FileLock(str(cache_dir / ".locks" / f"{entry}.lock"))
    held.acquire()
    errors: list[BaseException] = []

    def load() -> None:
        try:
            load_answer(answer_src)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    waiter = threading.Thread(target=load, daemon=True)
    try:
        waiter.start()
        time.sleep(0.3)
        _build._BUILDS_STOPPED.set()
        waiter.join(timeout=3)
        assert not waiter.is_alive(), "still waiting on the lock after terminate_builds"
    finally:
        held.release()
        waiter.join(timeout=30)
    assert len(errors) == 1 and isinstance(errors[0], JITCompileError), errors
    assert "stopping its builds" in str(errors[0])
    assert len(ninja_runs) == 1


# ---------------------------------------------------------------------------------------------
# (m) first-use messages on stderr; a missing function lists the module's functions
# ---------------------------------------------------------------------------------------------
def test_compile_prints_start_and_end_unless_quiet(cache_dir, answer_src, monkeypatch, capsys, caplog):
    module = load_answer(answer_src)
    err = capsys.readouterr().err
    assert "[sglang.jit_kernel] compiling answer for host (first use" in err, err
    assert re.search(r"^\[sglang\.jit_kernel\] compiled answer for host in \d+\.\d s$", err, re.M), err
    _build._loaded.clear()
    load_answer(answer_src)  # from the cache: silent
    assert capsys.readouterr().err == ""

    monkeypatch.setenv("SGLANG_JIT_QUIET", "1")
    assert load_answer(answer_src, extra_cflags=["-DANSWER_BONUS=1"]).answer() == 42  # compiled, silently
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("SGLANG_JIT_QUIET")
    caplog.set_level(logging.INFO, logger="sglang.jit_kernel")
    _build._announce("compiling x")  # the logger says it already: no second copy on stderr
    assert capsys.readouterr().err == ""

    assert module.answer() == 41 and "answer" in vars(module)  # a found function is an instance-dict hit
    with pytest.raises(
        AttributeError,
        match=r"^JIT module 'answer' has no function 'anwser' \(did you mean 'answer'\?\); its functions: answer$",
    ):
        module.anwser  # noqa: B018 (the attribute access is what raises)
    assert not hasattr(module, "nothing_like_it")


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))


def test_cache_once_keys_on_the_target_architecture():
    """A module memoized inside override_jit_cuda_arch (built for another target) is not returned
    outside it, nor is the host's inside it; the same target hits the memo."""
    from sglang.jit_kernel.utils import cache_once, override_jit_cuda_arch

    built = []

    @cache_once
    def module(tag: str, *, width: int = 1) -> tuple:
        built.append((tag, width))
        return (tag, width, len(built))

    first = module("a")
    assert module("a") is first
    with override_jit_cuda_arch(10, 0):
        other = module("a")
        assert other is not first and module("a") is other
    assert module("a") is first
    assert module("a", width=2) is not first and len(built) == 3
