"""Fixture: est_time is a bool."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cuda_ci(est_time=True, suite="stage-b-kernel-unit-1-gpu-large")
