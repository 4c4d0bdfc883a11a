"""Fixture: valid registrations for several backends and run kinds."""
from sglang.test.ci.ci_register import register_amd_ci, register_cpu_ci, register_cuda_ci

register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(120.5, "nightly-kernel-1-gpu", True)
register_amd_ci(est_time=45, suite="stage-b-kernel-unit-1-gpu-large", disabled="flaky on MI300")
register_cpu_ci(est_time=2, suite="stage-a-kernel-cpu", nightly=False, disabled=None)


def test_nothing():
    register_cuda_ci(est_time=99, suite="ignored")
