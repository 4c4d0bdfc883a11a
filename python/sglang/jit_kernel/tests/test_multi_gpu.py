"""Multi-GPU behaviour of every shipped op and of the JIT cache (issue 21).

What runs where:

* CPU only: everything skips, with the GPU count it needs and the machine kind to run it on.
* One GPU: ``test_tensor_parallel_start[two-procs-share-cuda0]`` (two processes, both on
  cuda:0, compile each module once) and ``test_held_module_survives_other_builds`` (a loaded module
  keeps working while another process builds the same module name with another flag, then force-
  rebuilds its very artifact).
* Two GPUs: additionally, for every registered op and each of its check cases
  (``registry.all_ops()``):

  - ``test_runs_on_its_tensors_device``: all tensors on cuda:1 while cuda:0 is current, a fresh
    stream current on cuda:1: the right result; nothing allocated on cuda:0; the work queued behind a
    ~0.5 s ``torch.cuda._sleep`` on that stream (a snapshot taken from another cuda:1 stream while
    the sleep runs shows inputs untouched and any fresh output unwritten);
  - ``test_no_kernel_on_device_0``: the profiler sees the op's kernels on cuda:1 only;
  - ``test_cuda_graph_on_device_1``: captured in a CUDA graph on cuda:1, inputs refreshed in place,
    replayed, compared with the reference of the new inputs;
  - ``test_mixed_devices_refused``: each CUDA input moved alone to cuda:1 (the rest on cuda:0): a
    ValueError / RuntimeError / TypeError naming the op and both devices, every tensor unchanged;
  - ``test_tensor_parallel_start[two-procs-cuda0-cuda1]``: the tensor-parallel start, one process
    per GPU.

The op cases use the ``check`` inputs (up to 16384 x 8192 bf16, ~1.3 GB per case): fine on an H200.
On a fresh cache the first test compiles every module; prebuild first to keep one device call short
(``python -m sglang.jit_kernel build --all``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sglang.jit_kernel
from sglang.jit_kernel.registry import CheckCase, all_ops
from sglang.jit_kernel.testing import (
    NUM_GPUS,
    SENTINEL_BYTE,
    TOLERANCE,
    requires_cuda,
    requires_nvcc,
    requires_two_gpus,
)
from sglang.test.ci.ci_register import register_cuda_ci

# No CI suite has two GPUs: on the one-GPU suite the two-GPU tests skip and the two process tests run.
register_cuda_ci(est_time=180, suite="stage-b-kernel-unit-1-gpu-large")

needs_two_gpus = requires_two_gpus  # the skip reasons of every GPU test: sglang.jit_kernel.testing
needs_one_gpu = requires_cuda

#: ``torch.cuda._sleep`` cycles queued on cuda:1's current stream before the call: ~0.5 s at the
#: H200's 1.98 GHz, far longer than the call's host time plus the snapshot (the test checks that).
SLEEP_CYCLES = 1_000_000_000
#: Cycles the snapshot stream waits first (~10 ms): a kernel launched elsewhere, which would not
#: wait for the long sleep, is finished by then (the largest check case moves ~1.3 GB: < 1 ms).
SNAPSHOT_DELAY_CYCLES = 20_000_000

#: Ops whose check case has a single CUDA tensor: there is no second tensor to put on another device,
#: so the mixed-device test has nothing to mix (it skips them, saying so). Any other op with one CUDA
#: tensor fails the test until it is listed here.
ONE_TENSOR_OPS = {
    "clamp_position": "seq_lens is its only tensor (the output is allocated on its device)",
}
#: (op, input index) pairs whose tensor the op legitimately never reads nor writes, so moving it to
#: another device need not raise. None today: every check-case input is an argument of the op.
IGNORED_INPUTS: dict[tuple[str, int], str] = {}


def _cases() -> list[tuple[str, int, str]]:
    out = []
    for name in sorted(all_ops()):
        for index, case in enumerate(all_ops()[name].check_cases()):
            out.append((name, index, case.label))
    return out


CASES = _cases()
CASE_IDS = [f"{name}-{re.sub(r'[^0-9A-Za-z+]+', '_', label).strip('_')}" for name, _, label in CASES]


def _case(name: str, index: int) -> CheckCase:
    return all_ops()[name].check_cases()[index]


def _tensor_positions(inputs: tuple) -> list[int]:
    return [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.is_cuda]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A bitwise copy (NaN payloads of poisoned buffers compare equal to themselves)."""
    return t.detach().clone()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.contiguous(), b.contiguous()
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _mismatch(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> str | None:
    """None when ``actual`` matches the fp32 reference as ``python -m sglang.jit_kernel check`` judges
    it (TOLERANCE of the case dtype, integers exact), plus the same shape; else what differs."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if dtype.is_floating_point:
        rtol, atol = TOLERANCE[dtype]
        diff = (actual.float() - expected.float()).abs()
        ok = diff <= atol + rtol * expected.float().abs()
        if bool(ok.all()):
            return None
        return f"{int((~ok).sum())} of {ok.numel()} elements off; max error {float(diff.nan_to_num(float('inf')).max()):.3e}"
    if torch.equal(actual, expected):
        return None
    bad = int((actual != expected).sum())
    return f"{bad} of {actual.numel()} elements differ"


def _aliases_an_input(result: torch.Tensor, inputs: tuple) -> bool:
    ptr = result.untyped_storage().data_ptr()
    return any(t.untyped_storage().data_ptr() == ptr for t in inputs if isinstance(t, torch.Tensor))


def _poison_free_memory(nbytes: int) -> None:
    """Leave poisoned free blocks in the current stream's pools (large and small), so that a tensor
    the op allocates on this stream starts as SENTINEL_BYTE, never as an old copy of the result."""
    big = torch.empty(nbytes + (64 << 20), dtype=torch.uint8, device="cuda")
    small = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]  # 2 small segments
    for t in (big, *small):
        t.fill_(SENTINEL_BYTE)
    del big, small


@pytest.fixture(autouse=True)
def _cuda0_current():
    """Every test starts and ends with cuda:0 current and the default streams current."""
    if NUM_GPUS:
        torch.cuda.set_device(0)
    yield
    if NUM_GPUS:
        for device in range(min(NUM_GPUS, 2)):
            torch.cuda.synchronize(device)
            torch.cuda.set_stream(torch.cuda.default_stream(device))
        torch.cuda.set_device(0)
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# 1. all tensors on cuda:1, cuda:0 current: right result, cuda:1's current stream, nothing on cuda:0
# ---------------------------------------------------------------------------------------------
@needs_two_gpus
@pytest.mark.parametrize(("name", "index", "label"), CASES, ids=CASE_IDS)
def test_runs_on_its_tensors_device(name: str, index: int, label: str) -> None:
    case = _case(name, index)
    with torch.cuda.device(1):
        torch.manual_seed(1000 + index)
        warm = case.make_inputs()
        case.call(*warm)  # compiles / loads the module here, not inside the timed window below
        del warm
        torch.manual_seed(2000 + index)
        inputs = case.make_inputs()
        expected = case.reference(*inputs)  # before the call: in-place ops mutate their inputs
        positions = _tensor_positions(inputs)
        before = {i: _bits(inputs[i]) for i in positions}
        torch.cuda.synchronize()
    assert all(inputs[i].device == torch.device("cuda", 1) for i in positions)

    stream = torch.cuda.Stream(device=1)  # cuda:1's current stream during the call
    other = torch.cuda.Stream(device=1)  # the snapshot's stream
    previous = (torch.cuda.current_stream(0), torch.cuda.current_stream(1))
    start, slept, snapped = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    try:
        torch.cuda.set_stream(stream)  # makes cuda:1 current too
        _poison_free_memory(2 * expected.numel() * expected.element_size())
        start.record(stream)
        torch.cuda._sleep(SLEEP_CYCLES)
        slept.record(stream)
        torch.cuda.set_device(0)
        assert torch.cuda.current_device() == 0 and torch.cuda.current_stream(1) == stream
        allocated = torch.cuda.memory_allocated(0)

        actual = case.call(*inputs)

        allocated_after = torch.cuda.memory_allocated(0)
        with torch.cuda.stream(other):  # switches to cuda:1 and back
            torch.cuda._sleep(SNAPSHOT_DELAY_CYCLES)
            during = {i: _bits(inputs[i]) for i in positions}
            result_during = _bits(actual)
            snapped.record(other)
        assert torch.cuda.current_device() == 0
    finally:
        torch.cuda.set_stream(previous[1])
        torch.cuda.set_stream(previous[0])
        torch.cuda.set_device(0)
    torch.cuda.synchronize(1)

    assert allocated_after == allocated, f"{name} allocated {allocated_after - allocated} bytes on cuda:0"
    assert actual.device == torch.device("cuda", 1), f"{name} returned a tensor on {actual.device}"
    # The snapshot must have run while the sleep still held the stream, else it proves nothing.
    assert start.elapsed_time(snapped) < start.elapsed_time(slept), (
        f"inconclusive: the snapshot ended {start.elapsed_time(snapped):.1f} ms after the sleep began, the "
        f"sleep lasted {start.elapsed_time(slept):.1f} ms; raise SLEEP_CYCLES"
    )
    changed = [i for i in positions if not _same_bits(during[i], before[i])]
    assert not changed, (
        f"{name} wrote input(s) {changed} before cuda:1's current stream reached the call: "
        "it ran on another stream or device"
    )
    if not _aliases_an_input(actual, inputs):  # a tensor the call allocated: unwritten while the stream slept
        assert not _same_bits(result_during, actual), (
            f"{name}'s new output was complete before cuda:1's current stream reached the call"
        )
    problem = _mismatch(actual, expected, case.dtype)
    assert problem is None, f"{name} {label} on cuda:1 (cuda:0 current): {problem}"


@needs_two_gpus
@pytest.mark.parametrize(("name", "index", "label"), CASES, ids=CASE_IDS)
def test_no_kernel_on_device_0(name: str, index: int, label: str) -> None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    def device_indices(fn) -> list[int]:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
        return [e.device_index for e in prof.events() if e.device_type == DeviceType.CUDA]

    case = _case(name, index)
    with torch.cuda.device(1):
        torch.manual_seed(3000 + index)
        warm = case.make_inputs()
        case.call(*warm)
        del warm
        inputs = case.make_inputs()
        probe = torch.zeros(1024, device="cuda")
        torch.cuda.synchronize()
    control = device_indices(lambda: probe.add_(1))  # a torch kernel on cuda:1, cuda:0 current
    if not control or set(control) != {1}:
        pytest.skip(f"the profiler does not attribute a cuda:1 kernel to device 1 (got {control})")
    seen = device_indices(lambda: case.call(*inputs))
    assert seen, f"the profiler recorded no kernel of {name}"
    assert set(seen) == {1}, f"{name} ran work on devices {sorted(set(seen))} (tensors on cuda:1, cuda:0 current)"


@needs_two_gpus
@pytest.mark.parametrize(("name", "index", "label"), CASES, ids=CASE_IDS)
def test_cuda_graph_on_device_1(name: str, index: int, label: str) -> None:
    case = _case(name, index)
    allocated = torch.cuda.memory_allocated(0)
    with torch.cuda.device(1):
        torch.manual_seed(4000 + index)
        inputs = case.make_inputs()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as graph capture wants
            for _ in range(2):
                case.call(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = case.call(*inputs)
        torch.manual_seed(5000 + index)
        fresh = case.make_inputs()
        expected = case.reference(*fresh)  # from the untouched fresh tensors, before the replay
        for dst, src in zip(inputs, fresh):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)  # same storage: the graph reads the new values
        graph.replay()
        torch.cuda.synchronize()
        problem = _mismatch(out, expected, case.dtype)
        del graph
    assert torch.cuda.memory_allocated(0) == allocated, f"{name} allocated on cuda:0"
    assert problem is None, f"{name} {label} replayed from a CUDA graph on cuda:1: {problem}"


# ---------------------------------------------------------------------------------------------
# 2. one call's tensors on two devices: refused before any launch, naming the op and both devices
# ---------------------------------------------------------------------------------------------
@needs_two_gpus
@pytest.mark.parametrize(("name", "index", "label"), CASES, ids=CASE_IDS)
def test_mixed_devices_refused(name: str, index: int, label: str) -> None:
    case = _case(name, index)
    torch.manual_seed(6000 + index)
    warm = case.make_inputs()  # on cuda:0, the current device
    case.call(*warm)  # the module is loaded: the eager fast path (the C++ launcher's checks) is taken
    del warm
    inputs = case.make_inputs()
    positions = _tensor_positions(inputs)
    if len(positions) < 2:
        assert name in ONE_TENSOR_OPS, f"{name}'s check case has one CUDA tensor: list it in ONE_TENSOR_OPS"
        pytest.skip(f"{name}: {ONE_TENSOR_OPS[name]}; nothing to mix")
    tried = 0
    for i in positions:
        if (name, i) in IGNORED_INPUTS:
            continue
        mixed = list(inputs)
        mixed[i] = inputs[i].to("cuda:1")
        before = [_bits(t) if isinstance(t, torch.Tensor) else None for t in mixed]
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        with pytest.raises((ValueError, RuntimeError, TypeError)) as info:
            case.call(*mixed)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        message = str(info.value)
        assert name in message, f"{name} with input {i} on cuda:1: the error does not name the op: {message!r}"
        assert "cuda:0" in message and "cuda:1" in message, (
            f"{name} with input {i} on cuda:1: the error does not name both devices: {message!r}"
        )
        touched = [j for j, t in enumerate(mixed) if before[j] is not None and not _same_bits(t, before[j])]
        assert not touched, f"{name} with input {i} on cuda:1 raised, but after changing input(s) {touched}"
        tried += 1
    assert tried >= 2


# ---------------------------------------------------------------------------------------------
# 3. tensor-parallel start: two processes, an empty cache, each module compiled once
# ---------------------------------------------------------------------------------------------
TP_CHILD = r"""
import json, os, sys, time
rank, device, sync = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import torch
torch.cuda.set_device(device)
torch.zeros(1, device="cuda")  # the CUDA context exists before the barrier
from sglang.jit_kernel.activation import gated_reference, silu_and_mul
from sglang.jit_kernel.norm import rmsnorm
from sglang.jit_kernel.scale import scale
from sglang.jit_kernel.testing import TOLERANCE

open(os.path.join(sync, f"ready-{rank}"), "w").close()
deadline = time.monotonic() + 300
while not os.path.exists(os.path.join(sync, "go")):  # the barrier: both start compiling together
    if time.monotonic() > deadline:
        sys.exit("barrier: no go file within 300 s")
    time.sleep(0.002)

def close(actual, expected):
    rtol, atol = TOLERANCE[torch.bfloat16]
    diff = (actual.float() - expected.float()).abs()
    return actual.shape == expected.shape and bool((diff <= atol + rtol * expected.float().abs()).all())

torch.manual_seed(rank)
x = torch.randn(1000, 4096, dtype=torch.bfloat16, device="cuda")
w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
g = torch.randn(1000, 2 * 4096, dtype=torch.bfloat16, device="cuda")
ok = {}
ok["scale"] = close(scale(x, 1.5), (x.float() * 1.5).to(torch.bfloat16))
xf = x.float()
ok["rmsnorm"] = close(rmsnorm(x, w, 1e-6), (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(torch.bfloat16))
ok["silu_and_mul"] = close(silu_and_mul(g), gated_reference("silu", g))
torch.cuda.synchronize()
print(json.dumps({"pid": os.getpid(), "device": torch.cuda.current_device(), "ok": ok}))
"""

_COMPILING = re.compile(r"^\[sglang\.jit_kernel\] compiling (\S+) for .* \(first use", re.M)
_WAITING = re.compile(r"^\[sglang\.jit_kernel\] waiting for pid (\S+), which is compiling (\S+)$", re.M)


def _child_env(cache: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("SGLANG_JIT_QUIET", "SGLANG_JIT_FORCE_RECOMPILE", "SGLANG_JIT_CRASH_ON_COMPILE"):
        env.pop(name, None)
    package_root = str(Path(sglang.jit_kernel.__file__).resolve().parents[2])  # .../python
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
    env["SGLANG_JIT_CACHE_DIR"] = str(cache)
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra)
    return env


def _wait_for(path: Path, children: list[subprocess.Popen], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        for child in children:
            if child.poll() is not None:
                out, err = child.communicate()
                pytest.fail(f"child {child.pid} exited with {child.returncode} before {path.name}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"no {path.name} within {timeout} s"
        time.sleep(0.01)


@requires_nvcc
@pytest.mark.parametrize(
    "devices",
    [
        pytest.param((0, 1), id="two-procs-cuda0-cuda1", marks=needs_two_gpus),
        pytest.param((0, 0), id="two-procs-share-cuda0", marks=needs_one_gpu),
    ],
)
def test_tensor_parallel_start(devices: tuple[int, int], tmp_path: Path) -> None:
    cache, sync = tmp_path / "cache", tmp_path / "sync"
    sync.mkdir()
    env = _child_env(cache)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", TP_CHILD, str(rank), str(device), str(sync)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, device in enumerate(devices)
    ]
    try:
        for rank in range(2):
            _wait_for(sync / f"ready-{rank}", children)
        (sync / "go").touch()
        outputs = [child.communicate(timeout=600) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    pids = [child.pid for child in children]
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, f"pid {child.pid} failed:\n{err}"
        report = json.loads(out.strip().splitlines()[-1])
        assert report["pid"] == child.pid
        assert report["device"] == devices[pids.index(child.pid)]
        assert report["ok"] == {"scale": True, "rmsnorm": True, "silu_and_mul": True}, (child.pid, report, err)

    compiled_by: dict[str, list[int]] = {}
    for pid, (_, err) in zip(pids, outputs):
        for module in _COMPILING.findall(err):
            compiled_by.setdefault(module, []).append(pid)
    assert len(compiled_by) >= 3, f"expected a module per op (scale, norm, activation), compiled: {compiled_by}"
    assert all(len(by) == 1 for by in compiled_by.values()), f"a module compiled more than once: {compiled_by}"
    for module, [builder] in compiled_by.items():
        [entry] = [p for p in cache.iterdir() if re.fullmatch(rf"{re.escape(module)}-[0-9a-f]+", p.name)]
        assert json.loads((entry / "manifest.json").read_text())["built_by_pid"] == builder
        other = pids[1 - pids.index(builder)]
        err = outputs[pids.index(other)][1]
        waits = [pid for pid, name in _WAITING.findall(err) if name == module]
        # The other process either waited on the lock (and says for whom) or came after the build and
        # loaded the artifact silently. "unknown": it looked between the builder's lock and its .owner
        # write (a window of microseconds).
        assert all(pid in (str(builder), "unknown") for pid in waits), (module, builder, waits)
        if waits:
            assert str(builder) in waits, f"pid {other} waited for {module} without naming pid {builder}:\n{err}"


# ---------------------------------------------------------------------------------------------
# 4. a held module survives another process's builds of the same module name
# ---------------------------------------------------------------------------------------------
HELD_FIXTURE = Path(__file__).resolve().parent / "multi_gpu_fixtures" / "held_value.cuh"

HELD_CHILD = r"""
import json, os, sys, time
role, device, value, fixture, sync = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
import torch
from sglang.jit_kernel.utils import load_jit

torch.cuda.set_device(device)
module = load_jit("held_value", cuda_files=[fixture], cuda_wrappers=[("held_fill", "held_fill"), ("held_value", "held_value")],
                  extra_cuda_cflags=[f"-DHELD_VALUE={value}"])

def report(step):
    out = torch.zeros(4096, dtype=torch.int32, device="cuda")
    module.held_fill(out)
    torch.cuda.synchronize()
    values = sorted(set(out.tolist()))
    return {"step": step, "pid": os.getpid(), "artifact": str(module._jit_artifact_), "fill": values,
            "host": module.held_value()}

def wait(name):
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(sync, name)):
        if time.monotonic() > deadline:
            sys.exit(f"no {name} within 600 s")
        time.sleep(0.01)

def publish(record):
    path = os.path.join(sync, f"{role}-{record['step']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)

if role == "holder":
    publish(report(1))
    wait("rebuilt-other-flag")
    publish(report(2))  # the held module, after B built the same name with another flag
    wait("rebuilt-same-key")
    publish(report(3))  # after B force-rebuilt this very artifact (its directory replaced)
else:
    print(json.dumps(report(1)))
"""


@requires_nvcc
@needs_one_gpu
def test_held_module_survives_other_builds(tmp_path: Path) -> None:
    cache, sync = tmp_path / "cache", tmp_path / "sync"
    sync.mkdir()
    other_device = min(1, NUM_GPUS - 1)

    def argv(role: str, device: int, value: int) -> list[str]:
        return [sys.executable, "-c", HELD_CHILD, role, str(device), str(value), str(HELD_FIXTURE), str(sync)]

    def builder(value: int, **env: str) -> dict:
        result = subprocess.run(
            argv("builder", other_device, value),
            env=_child_env(cache, **env),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.strip().splitlines()[-1])

    holder = subprocess.Popen(
        argv("holder", 0, 11), env=_child_env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(sync / "holder-1.json", [holder], timeout=600)
        first = json.loads((sync / "holder-1.json").read_text())

        other = builder(22)  # the same module name, -DHELD_VALUE=22: its own key and artifact
        (sync / "rebuilt-other-flag").touch()
        _wait_for(sync / "holder-2.json", [holder], timeout=120)
        second = json.loads((sync / "holder-2.json").read_text())

        forced = builder(11, SGLANG_JIT_FORCE_RECOMPILE="1")  # holder's own key, rebuilt and replaced
        (sync / "rebuilt-same-key").touch()
        out, err = holder.communicate(timeout=120)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 0, err
    third = json.loads((sync / "holder-3.json").read_text())

    assert (first["fill"], first["host"]) == ([11], 11)
    assert (other["fill"], other["host"]) == ([22], 22)
    assert other["artifact"] != first["artifact"], "another flag must make another artifact"
    assert Path(first["artifact"]).exists() and Path(other["artifact"]).exists()
    for later in (second, third):
        assert later["artifact"] == first["artifact"]
        assert (later["fill"], later["host"]) == ([11], 11), f"the held module changed: {later}"
    assert forced["artifact"] == first["artifact"] and (forced["fill"], forced["host"]) == ([11], 11)
    manifest = json.loads((Path(forced["artifact"]).parent / "manifest.json").read_text())
    assert manifest["built_by_pid"] == forced["pid"], "SGLANG_JIT_FORCE_RECOMPILE=1 did not rebuild"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-rs"]))
