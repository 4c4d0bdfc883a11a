"""Fixture: the same keyword twice (parses, but is invalid)."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large", nightly=False, nightly=True)
