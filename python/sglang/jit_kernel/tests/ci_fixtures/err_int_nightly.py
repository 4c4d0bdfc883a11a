"""Fixture: nightly is an int, not a bool."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cuda_ci(est_time=30, suite="nightly-kernel-1-gpu", nightly=1)
