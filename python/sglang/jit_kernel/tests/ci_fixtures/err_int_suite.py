"""Fixture: suite is an int."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cuda_ci(est_time=30, suite=1)
