"""Pytest hooks for the kernel tests.

On a machine without a CUDA GPU, a test that fails only because CUDA is unavailable (for example a
test written exactly as the tutorial shows, without ``@requires_cuda``) is reported as skipped, with
the reason, instead of failing CPU-only CI. Any other failure is still a failure. On a GPU, each
test's end returns PyTorch's cached CUDA memory past 1 GiB to the driver (parallel test processes
share one GPU).
"""

import gc
import os
import re
from pathlib import Path

import pytest

from sglang.jit_kernel.testing import HAS_CUDA

_NO_CUDA = re.compile(
    r"Found no NVIDIA driver|no CUDA GPUs are available|Torch not compiled with CUDA enabled|"
    r"CUDA driver initialization failed|No CUDA GPUs are available"
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if HAS_CUDA or call.excinfo is None or report.when != "call" and report.when != "setup":
        return
    if isinstance(call.excinfo.value, (RuntimeError, AssertionError)) and _NO_CUDA.search(str(call.excinfo.value)):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (item.location[1] or 0) + 1, "Skipped: needs a CUDA GPU (none visible)")


@pytest.fixture(scope="session")
def sm90_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The JIT cache directory of the session's compile-only tests (sm_90 builds, no GPU needed):
    ``test_build_all`` compiles every shipped variant into it, and the tests that read the build
    logs of some modules (``test_norm_compile``, ...) load those from it instead of compiling them
    again. Each test still compiles what it needs when run alone. Tests select their modules by
    exact directory-name patterns: ``rmsnorm_*`` would also match ``rmsnorm_quant_*``."""
    return tmp_path_factory.mktemp("sm90_cache")


#: Cached CUDA memory above which a test's end returns it to the driver.
_KEEP_CACHED_BYTES = 1 << 30
#: SGLANG_JIT_TEST_MEMLOG=1: print each test's CUDA memory (allocated / reserved) after it ends; 2: also
#: the CUDA tensors the garbage collector can see (count, bytes) and the referrer types of the largest,
#: which tells Python holders (frames, tracebacks, caches) from memory held outside Python.
_MEMLOG = os.environ.get("SGLANG_JIT_TEST_MEMLOG", "") in ("1", "2")
_MEMLOG_REFERRERS = os.environ.get("SGLANG_JIT_TEST_MEMLOG", "") == "2"


def _live_cuda_tensors_line() -> str:
    """``gc sees N CUDA tensors, X MiB; largest Y MiB (shape) <- referrer(its referrers), ...``."""
    import sys
    import warnings

    import torch

    with warnings.catch_warnings():  # isinstance on every object touches deprecated torch attributes
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    if not tensors:
        return "gc sees no CUDA tensors"
    total = sum(t.untyped_storage().nbytes() for t in tensors)
    largest = max(tensors, key=lambda t: t.untyped_storage().nbytes())
    skip = {id(tensors), id(sys._getframe())}
    chain = []
    for ref in gc.get_referrers(largest):
        if id(ref) not in skip:
            outer = [type(r).__name__ for r in gc.get_referrers(ref) if id(r) not in skip][:3]
            chain.append(f"{type(ref).__name__}({', '.join(outer)})")
    line = (
        f"gc sees {len(tensors)} CUDA tensors, {total / 2**20:.0f} MiB of storage; largest "
        f"{largest.untyped_storage().nbytes() / 2**20:.0f} MiB {tuple(largest.shape)} <- "
        + ("; ".join(chain[:4]) or "nothing")
    )
    del tensors, largest
    return line


@pytest.fixture(autouse=True)
def _release_cached_cuda_memory(request):
    """After each test: collects garbage when more than 1 GiB of CUDA tensors is still allocated
    (reference cycles holding tensors), then returns PyTorch's cached blocks to the driver once they
    exceed 1 GiB.

    Several tests allocate 8-20 GiB (64-bit offset cases); the caching allocator keeps those blocks
    reserved for the process, so test files run in parallel processes on one GPU (the device runs
    split the suite in groups) would find the memory taken by a neighbour. In one H200 run a pytest
    process under compute-sanitizer reached 139 GiB of PyTorch-allocated memory (only under the
    sanitizer; cause not found) and 19 tests of the processes beside it failed with CUDA OOM;
    SGLANG_JIT_TEST_MEMLOG=1 (with pytest -s) prints what each test leaves."""
    yield
    if HAS_CUDA:
        import torch

        if not torch.cuda.is_initialized():
            return
        devices = range(torch.cuda.device_count())  # the multi-GPU tests leave memory on others too
        try:
            if sum(torch.cuda.memory_allocated(d) for d in devices) > _KEEP_CACHED_BYTES:
                gc.collect()
            if sum(torch.cuda.memory_reserved(d) for d in devices) > _KEEP_CACHED_BYTES:
                torch.cuda.empty_cache()
        except RuntimeError:  # a sticky CUDA error the test itself reports: no second one in teardown
            return
        if _MEMLOG:
            allocated = sum(torch.cuda.memory_allocated(d) for d in devices)
            reserved = sum(torch.cuda.memory_reserved(d) for d in devices)
            print(
                f"\n[memlog] {request.node.nodeid}: allocated {allocated / 2**20:.0f} MiB, "
                f"reserved {reserved / 2**20:.0f} MiB",
                flush=True,
            )
            if _MEMLOG_REFERRERS:
                print(f"[memlog] {_live_cuda_tensors_line()}", flush=True)
