"""Pytest hooks for the kernel tests.

On a machine without a CUDA GPU, a test that fails only because CUDA is unavailable (for example a
test written exactly as the tutorial shows, without ``@requires_cuda``) is reported as skipped, with
the reason, instead of failing CPU-only CI. Any other failure is still a failure.
"""

import re

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
